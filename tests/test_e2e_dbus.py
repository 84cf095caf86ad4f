"""End to end: session control over D-Bus (issue 16) with a real dbus-daemon.

The test starts its own ``dbus-daemon`` with a system-bus-like policy (deny by
default) that includes the shipped ``conf/dbus/org.nxgate.Gateway1.conf``,
points the gateway at it (``[dbus] address``), and calls it as real users
with ``gdbus`` and ``nxgate-session`` run through ``setpriv`` (argv only).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from tests.harness.gateway import REPO
from tests.harness.process import wait_for
from tests.harness.users import create_user
from tests.test_e2e_sessions import RED, START, SessionTestCase, proc_environ

BUS_CONFIG = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-BUS Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path={socket}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <deny own="*"/>
    <deny send_type="method_call"/>
    <allow send_type="signal"/>
    <allow send_requested_reply="true" send_type="method_return"/>
    <allow send_requested_reply="true" send_type="error"/>
    <allow receive_type="method_call"/>
    <allow receive_type="method_return"/>
    <allow receive_type="error"/>
    <allow receive_type="signal"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus.Introspectable"/>
  </policy>
  <include>{policy}</include>
</busconfig>
"""
NAME, PATH = "org.nxgate.Gateway1", "/org/nxgate/Gateway1"
ADMIN_GROUP = "nxgatetestdbusadm"
CONNECT_TIMEOUT = 15


class SystemBus:
    """A dbus-daemon of our own, configured like a system bus."""

    def __init__(self) -> None:
        self.directory = tempfile.mkdtemp(prefix="nxgate-dbus-")
        os.chmod(self.directory, 0o755)
        self.socket = os.path.join(self.directory, "system_bus_socket")
        self.address = f"unix:path={self.socket}"
        config = os.path.join(self.directory, "bus.conf")
        with open(config, "w", encoding="utf-8") as handle:
            handle.write(BUS_CONFIG.format(socket=self.socket,
                                           policy=os.path.join(REPO, "conf", "dbus", "org.nxgate.Gateway1.conf")))
        with open(os.path.join(self.directory, "bus.log"), "wb") as log:  # its refusals, for a failing test
            self.process = subprocess.Popen(["dbus-daemon", "--config-file", config, "--nofork", "--nopidfile"],
                                            stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        wait_for(lambda: os.path.exists(self.socket), 10, "the bus socket")

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(10)
        shutil.rmtree(self.directory, ignore_errors=True)


def as_user(user, argv, env=None, timeout=30):
    """Run ``argv`` as ``user`` (uid, gid, groups), no shell."""
    entry = user.entry
    return subprocess.run(["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--init-groups",
                           "--", *argv], env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, cwd="/")


class Watcher:
    """``nxgate-session watch`` as a user: the signals it hears, line by line."""

    def __init__(self, test, user, bus: SystemBus) -> None:
        entry = user.entry
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--init-groups", "--",
             *nxgate_session("watch")], env=user_env(user, bus), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, cwd="/")
        test.addCleanup(self.close)
        threading.Thread(target=self._read, daemon=True).start()
        wait_for(lambda: any("subscribed" in line for line in self.lines), 20, "the watcher to subscribe")

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line)

    def signals(self, session_id: str) -> list[str]:
        return [entry["signal"] for entry in map(json.loads, list(self.lines))
                if "signal" in entry and entry["args"] and entry["args"][0] == session_id]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
        self.process.wait(10)
        self.process.stdout.close()
        self.process.stderr.close()


def nxgate_session(*args: str) -> list[str]:
    return [sys.executable, "-c", "import sys; from nxgate.gateway.doors.dbus.cli import main; sys.exit(main())", *args]


def user_env(user, bus: SystemBus, base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(base or {"PATH": "/usr/bin:/bin", "HOME": user.home, "USER": user.name})
    env.update(DBUS_SYSTEM_BUS_ADDRESS=bus.address, PYTHONPATH=REPO)
    return env


def fixture_with_bus(case: Any, options: Callable[[str], dict],
                     make: Callable[[Any], Any] = SessionTestCase.make_fixture) -> tuple[Any, Callable[[], None]]:
    """A class's fixture (``make``: SessionTestCase's unless said) beside a private
    system bus (``case.bus``); ``options(bus address)`` are the gateway's settings."""
    bus = SystemBus()
    type(case).bus = bus
    type(case).options = options(bus.address)
    try:
        fixture, teardown = make(case)
    except BaseException:
        bus.close()
        raise

    def both() -> None:
        teardown()
        bus.close()

    return fixture, both


#: A session program that asks nxgate-session about its own session from
#: inside it, with nothing but the environment the session gave it (no
#: PYTHONPATH: the checkout goes on sys.path here), then shows a red xterm.
ASKS_FROM_INSIDE = """import json, os, subprocess, sys
cli = "import sys; sys.path.insert(0, {repo!r}); from nxgate.gateway.doors.dbus.cli import main; sys.exit(main())"
answers = []
for args in (["--json", "info"], ["list"]):
    done = subprocess.run([sys.executable, "-c", cli, *args], capture_output=True, text=True, timeout=60)
    answers.append([done.returncode, done.stdout, done.stderr])
path = os.path.join(os.environ["HOME"], "asked-from-inside.json")
with open(path + ".tmp", "w") as handle:
    json.dump(answers, handle)
os.replace(path + ".tmp", path)
os.execvp("xterm", ["xterm", "-bg", "#ff0000", "-geometry", "60x15+10+10"])
"""


class DBusSessionTests(SessionTestCase):
    def make_fixture(self):
        scripts = tempfile.mkdtemp(prefix="nxgate-dbus-inside-")
        os.chmod(scripts, 0o755)
        script = os.path.join(scripts, "asks_from_inside.py")
        with open(script, "w", encoding="utf-8") as handle:
            handle.write(ASKS_FROM_INSIDE.format(repo=REPO))
        os.chmod(script, 0o644)
        # A short connect timeout: a session started for later must outlive it.
        fixture, teardown = fixture_with_bus(self, lambda address: {
            "dbus": {"address": address, "admin_groups": ADMIN_GROUP},
            "sessions": {"connect_timeout": str(CONNECT_TIMEOUT)},
            "types": {"unix-asksinside": f"{sys.executable} {script}"}})

        def both() -> None:
            teardown()
            shutil.rmtree(scripts, ignore_errors=True)

        return fixture, both

    def gdbus(self, user, method, *args):
        return as_user(user, ["gdbus", "call", "--system", "--dest", NAME, "--object-path", PATH,
                              "--method", f"{NAME}.{method}", *args], env=user_env(user, self.bus))

    def test_a_user_controls_her_own_session_only_and_hears_only_its_signals(self):
        self.assertIn("D-Bus: org.nxgate.Gateway1", self.gateway.log())
        introspection = as_user(self.user, ["gdbus", "introspect", "--system", "--dest", NAME, "--object-path", PATH],
                                env=user_env(self.user, self.bus))
        for member in ("ListSessions", "StartSession", "Suspend", "Terminate", "Rename", "SessionResumed",
                       "SessionSuspended"):
            self.assertIn(member, introspection.stdout, introspection.stderr)
        hers, theirs = Watcher(self, self.user, self.bus), Watcher(self, self.other, self.bus)
        _, info = self.running_session()

        listed = self.gdbus(self.user, "ListSessions")
        self.assertEqual(listed.returncode, 0, listed.stderr)
        self.assertIn(info.session_id, listed.stdout)
        self.assertIn("'running'", listed.stdout)
        self.assertNotIn(info.session_id, self.gdbus(self.other, "ListSessions").stdout)

        for method in ("Suspend", "Terminate", "GetSession"):
            refused = self.gdbus(self.other, method, info.session_id)
            self.assertNotEqual(refused.returncode, 0)
            self.assertIn("org.nxgate.Error.NotYours", refused.stderr)
        subprocess.run(["groupadd", "-f", ADMIN_GROUP], check=True)
        admin = create_user()
        self.addCleanup(admin.remove)
        subprocess.run(["usermod", "-aG", ADMIN_GROUP, admin.name], check=True)
        self.assertIn(info.session_id, self.gdbus(admin, "ListSessions").stdout)
        self.assertIn(f"'user': <'{self.user.name}'>", self.gdbus(admin, "GetSession", info.session_id).stdout)
        missing = self.gdbus(self.user, "GetSession", "0" * 32)
        self.assertIn("org.nxgate.Error.NotFound", missing.stderr)
        renamed = self.gdbus(self.user, "Rename", info.session_id, "Project X")
        self.assertIn("'Project X'", renamed.stdout, renamed.stderr)

        suspended = self.gdbus(self.user, "Suspend", info.session_id)
        self.assertEqual(suspended.stdout.strip(), "('suspended',)", suspended.stderr)
        self.wait_status(info.session_id, "Suspended")
        wait_for(lambda: "SessionSuspended" in hers.signals(info.session_id), 10, "the suspended signal")
        for expected in ("SessionCreated", "SessionRunning", "SessionSuspended", "StateChanged"):
            self.assertIn(expected, hers.signals(info.session_id))
        self.assertEqual(theirs.signals(info.session_id), [])
        self.assertFalse([line for line in theirs.lines if info.session_id in line])

    def test_nxgate_session_suspend_inside_a_session_then_a_client_resumes_it(self):
        hers = Watcher(self, self.user, self.bus)
        _, info = self.running_session()
        terms = subprocess.run(["pgrep", "-u", self.user.name, "-x", "xterm"], capture_output=True, text=True)
        environment = proc_environ(int(terms.stdout.split()[0]))  # what a menu entry in the session gets
        self.assertEqual(environment["NXGATE_SESSION_ID"], info.session_id)
        env = user_env(self.user, self.bus, environment)

        shown = as_user(self.user, nxgate_session("--json", "info"), env=env)
        self.assertEqual(shown.returncode, 0, shown.stderr)
        self.assertEqual(json.loads(shown.stdout)["state"], "running")
        done = as_user(self.user, nxgate_session("--json", "suspend"), env=env)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(json.loads(done.stdout), {"id": info.session_id, "state": "suspended"})
        self.wait_status(info.session_id, "Suspended")

        other = as_user(self.other, nxgate_session("--json", "suspend"), env=user_env(self.other, self.bus, environment))
        self.assertEqual(other.returncode, 1)
        self.assertEqual(json.loads(other.stdout.splitlines()[0])["error"], "org.nxgate.Error.NotYours")

        wait_for(lambda: self.screen.shot().count(RED) < 20000, 20, "the suspended session to leave the screen")
        client = self.login()
        resumed = self.restore(client, info.session_id)
        self.attach(client, resumed)
        self.screen.wait_for_colour(RED, 20000)
        self.assertEqual(self.listing().get(info.session_id), "Running")
        wait_for(lambda: "SessionResumed" in hers.signals(info.session_id), 10, "the resumed signal")
        (address,) = [entry["args"][1] for entry in map(json.loads, list(hers.lines))
                      if entry.get("signal") == "SessionResumed"]
        self.assertIn("127.0.0.1", address)  # where the client came from

    def test_nxgate_session_inside_a_session_reaches_the_gateway_on_its_private_bus(self):
        """Issue 25: the gateway's door is on a bus of its own ([dbus] address),
        and a program in the session, with only the environment the session
        gave it, reaches the gateway: NXGATE_DBUS_ADDRESS names that bus,
        while the session's system bus stays the machine's."""
        client = self.login()
        info = self.start(client, "unix-asksinside")
        self.attach(client, info)
        self.screen.wait_for_colour(RED, 20000)
        with open(os.path.join(self.user.home, "asked-from-inside.json"), encoding="utf-8") as handle:
            (info_code, info_out, info_err), (list_code, list_out, list_err) = json.load(handle)
        self.assertEqual(info_code, 0, info_err)
        shown = json.loads(info_out)
        self.assertEqual((shown["id"], shown["user"], shown["type"]), (info.session_id, self.user.name,
                                                                        "unix-asksinside"))
        self.assertEqual(list_code, 0, list_err)
        self.assertIn(info.session_id, list_out)
        terms = subprocess.run(["pgrep", "-u", self.user.name, "-x", "xterm"], capture_output=True, text=True)
        environment = proc_environ(int(terms.stdout.split()[0]))
        self.assertEqual(environment.get("NXGATE_DBUS_ADDRESS"), self.bus.address)
        self.assertNotIn("DBUS_SYSTEM_BUS_ADDRESS", environment)

    def test_nxgate_session_says_plainly_what_is_wrong(self):
        """No bus, someone else's session, no sessions: sentences, not
        txdbus's exception text or an empty line (issue 25)."""
        env = {key: value for key, value in user_env(self.other, self.bus).items() if key != "DBUS_SYSTEM_BUS_ADDRESS"}
        nobus = as_user(self.other, nxgate_session("list"),
                        env=dict(env, NXGATE_DBUS_ADDRESS=f"unix:path={self.bus.directory}/no-such-socket"))
        self.assertEqual(nobus.returncode, 1)
        self.assertEqual(nobus.stderr, f"nxgate-session: cannot reach the bus at unix:path={self.bus.directory}/"
                                       "no-such-socket (there is no bus socket there), over which nxgate-session "
                                       "talks to the gateway: is dbus-daemon running? (--bus ADDRESS or "
                                       "$NXGATE_DBUS_ADDRESS names another bus.) (org.freedesktop.DBus.Error."
                                       "NoServer)\n")
        self.assertNotIn("ConnectError", nobus.stderr)

        env = user_env(self.other, self.bus)
        empty = as_user(self.other, nxgate_session("list"), env=env)
        self.assertEqual((empty.returncode, empty.stdout, empty.stderr), (0, "No sessions.\n", ""))

        _, info = self.running_session()
        theirs = as_user(self.other, nxgate_session("--id", info.session_id, "info"), env=env)
        self.assertEqual(theirs.returncode, 1)
        self.assertEqual(theirs.stderr, f"nxgate-session: Session {info.session_id} belongs to another user. "
                                        "(org.nxgate.Error.NotYours)\n")
        gone = as_user(self.other, nxgate_session("--id", "0" * 32, "info"), env=env)
        self.assertEqual(gone.stderr, f"nxgate-session: Could not find session {'0' * 32}. (org.nxgate.Error.NotFound)\n")

    def test_a_session_started_over_dbus_waits_as_suspended_and_an_nx_client_resumes_it(self):
        started = self.gdbus(self.user, "StartSession", "unix-console", "Later")
        self.assertEqual(started.returncode, 0, started.stderr)
        self.assertIn("'name': <'Later'>", started.stdout)
        self.assertIn("'state': <'waiting'>", started.stdout)
        (session_id,) = re.findall(r"'id': <'([0-9A-F]{32})'>", started.stdout)
        self.assertEqual(self.listing().get(session_id), "Suspended")  # what NX clients offer to resume
        self.assertNotIn(session_id, self.listing(self.other))
        time.sleep(CONNECT_TIMEOUT + 5)  # no client was expected yet: the connect timeout leaves it waiting
        self.assertEqual(self.listing().get(session_id), "Suspended")
        self.assertEqual(self.screen.shot().count(RED), 0)

        stranger = self.login(self.other)
        reply = stranger.command(START.format(name="x", type="unix-console", extra="").replace(
            "startsession", "restoresession") + f' --id="{session_id}"', timeout=60)
        self.assertNotIn(b"NX> 710 Session status: running", reply)
        self.assertRegex(reply, rb"NX> 5\d\d ")
        refused = self.gdbus(self.other, "Suspend", session_id)
        self.assertIn("org.nxgate.Error.NotYours", refused.stderr)

        client = self.login()
        resumed = self.restore(client, session_id)
        self.attach(client, resumed)
        self.screen.wait_for_colour(RED, 20000)  # its xterm starts at the first attach and draws
        self.wait_status(session_id, "Running")
        shown = self.gdbus(self.user, "GetSession", session_id)
        self.assertIn("'attached_before': <true>", shown.stdout, shown.stderr)

    def test_start_session_refuses_what_it_cannot_start_with_an_error_name(self):
        for session_type, error in (("unix-cde", "org.nxgate.Error.Unavailable"),
                                    ("unix-application", "org.nxgate.Error.InvalidRequest"),
                                    ("shadow", "org.nxgate.Error.InvalidRequest")):
            refused = self.gdbus(self.user, "StartSession", session_type, "")
            self.assertNotEqual(refused.returncode, 0)
            self.assertIn(error, refused.stderr)
        started = as_user(self.user, nxgate_session("--json", "start", "unix-bluebox"),
                          env=user_env(self.user, self.bus))
        self.assertEqual(started.returncode, 0, started.stderr)
        view = json.loads(started.stdout)
        self.assertEqual((view["type"], view["name"], view["state"]), ("unix-bluebox", "unix-bluebox", "waiting"))
        self.assertEqual(self.listing().get(view["id"]), "Suspended")
