"""End to end: real sessions on nxagent, drawn by the real nxproxy on an Xvfb.

Each test plays an nxssh-style client: OpenSSH to the gateway as ``nx``, the
NX dialogue, then ``bye`` and nxproxy through the same SSH channel, and
checks the pixels the session draws on the client's screen.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pwd
import re
import signal
import socket
import subprocess
import threading
import time

from twisted.trial.unittest import SkipTest, TestCase

from tests.harness.gateway import REPO, Gateway
from tests.harness.process import wait_for
from tests.harness.shared import class_fixture
from tests.harness.ssh import Attachment, NXClient, SessionInfo
from tests.harness.users import NEED_ROOT, create_user, is_root
from tests.harness.x11 import ClientScreen

RED = (255, 0, 0)
GREEN = (0, 255, 0)
BLUE = (0, 0, 255)
TYPES = {
    "unix-console": "xterm -bg #ff0000 -fg #ffff00 -geometry 60x15+10+10",
    "unix-bluebox": "xterm -bg #0000ff -geometry 50x10+40+40",
}
START = ('startsession --session="{name}" --type="{type}" --geometry="800x600" --screeninfo="800x600x24+render" '
         '--link="lan" --encryption="1" --cache="16M" --images="64M" --keyboard="pc105/us" --client="linux" '
         '--media="0" --backingstore="1" --cookie="0123456789abcdef" {extra}')


def agent_processes(user: str) -> list[int]:
    result = subprocess.run(["pgrep", "-u", user, "-x", "nxagent"], capture_output=True, text=True)
    return [int(pid) for pid in result.stdout.split()]


def proc_status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as handle:
        return dict(line.rstrip("\n").split(":\t", 1) for line in handle if ":\t" in line)


def proc_environ(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as handle:
        entries = handle.read().split(b"\0")
    return dict(entry.decode().split("=", 1) for entry in entries if b"=" in entry)


class SessionTestCase(TestCase):
    """A gateway, two users and a client screen shared by a class's tests."""

    timeout = 240
    options: dict[str, dict[str, str]] = {}
    screen_size = (800, 600)  # the client screen shared by the class's tests
    window_manager = False

    def setUp(self):
        if not is_root():
            raise SkipTest(NEED_ROOT)
        self.user, self.other, self.gateway, self.screen = class_fixture(type(self), self.make_fixture)
        self.addCleanup(self.end_all_sessions)

    def make_fixture(self):
        options = {"sessions": {"display_base": "700", "display_limit": "100", "connect_timeout": "60"},
                   "types": dict(TYPES)}
        for section, values in self.options.items():
            options.setdefault(section, {}).update(values)
        user, other = create_user(), create_user()
        gateway = Gateway(options).start()
        screen = ClientScreen(*self.screen_size, window_manager=self.window_manager)

        def teardown():
            screen.close()
            gateway.stop()
            user.remove()
            other.remove()

        return (user, other, gateway, screen), teardown

    def fixture_with_host(self, host, options: dict[str, dict[str, str]]):
        """The class fixture beside a remote test host (RDP, VNC) that the
        gateway's ``options`` point at; the host is closed with it."""
        type(self).options = options
        try:
            fixture, teardown = SessionTestCase.make_fixture(self)
        except BaseException:
            host.close()
            raise
        type(self).host = host

        def both():
            teardown()
            host.close()

        return fixture, both

    def end_all_sessions(self):
        """Leave no session behind for the next test."""
        for user in (self.user, self.other):
            for pid in agent_processes(user.name):
                with contextlib.suppress(ProcessLookupError):  # a watchdog that ended with its agent
                    os.kill(pid, signal.SIGTERM)
        for user in (self.user, self.other):
            wait_for(lambda u=user: not agent_processes(u.name), 20, "the agents to end")

    # -------------------------------------------------------------- helpers
    def login(self, user=None) -> NXClient:
        user = user or self.user
        client = NXClient(self.gateway.port)
        self.addCleanup(client.close)
        client.greet()
        self.assertIn(b"NX> 103 ", client.login(user.name, user.password))
        client.prompt()
        return client

    def start(self, client: NXClient, session_type="unix-console", name="test", extra="") -> SessionInfo:
        reply = client.command(START.format(name=name, type=session_type, extra=extra), timeout=60)
        self.assertIn(b"NX> 710 Session status: running", reply, reply)
        return SessionInfo.parse(reply)

    def attach(self, client: NXClient, info: SessionInfo, screen: ClientScreen | None = None) -> Attachment:
        attachment = Attachment(client, info, (screen or self.screen).name, self.gateway.workdir)
        self.addCleanup(attachment.detach)
        return attachment

    def running_session(self) -> tuple[NXClient, SessionInfo]:
        """A console session of the first user, attached and drawn."""
        client = self.login()
        info = self.start(client)
        self.attach(client, info)
        self.screen.wait_for_colour(RED, 20000)
        return client, info

    def xfce_desktop(self) -> SessionInfo:
        """An XFCE session of the first user, attached, once its panel and
        desktop are drawn on the client screen."""
        client = self.login()
        info = self.start(client, "unix-xfce")
        self.attach(client, info)

        def panel_drawn():
            shot = self.screen.shot()
            return shot.region_colours(0, 24) > 20 and shot.colours() > 200

        wait_for(panel_drawn, 60, "the XFCE panel and desktop", interval=0.5)
        return info

    def listing(self, user=None, params='--status="suspended,running"') -> dict[str, str]:
        """Session id -> status, from listsession as a client sees it."""
        client = self.login(user)
        reply = client.command(f"listsession {params}")
        client.close()
        rows = re.findall(rb"^\d+\s+[\w-]+\s+([0-9A-F]{32})\s+[A-Z-]{8}\s+\d+\s+\d+x\d+\s+(\w+)\s+\S.*$",
                          reply, re.MULTILINE)
        return {sid.decode(): status.decode() for sid, status in rows}

    def wait_status(self, session_id: str, status: str | None, timeout: float = 20.0) -> None:
        wait_for(lambda: self.listing().get(session_id) == status, timeout, f"{session_id} to be {status}")

    def suspended_session(self) -> SessionInfo:
        """A desktop that drew on the client's screen, then lost its client."""
        client = self.login()
        info = self.start(client)
        attachment = self.attach(client, info)
        self.screen.wait_for_colour(RED, 20000)
        attachment.detach()
        self.wait_status(info.session_id, "Suspended")
        return info

    def restore(self, client: NXClient, session_id: str) -> SessionInfo:
        reply = client.command(START.format(name="x", type="unix-console", extra="").replace(
            "startsession", "restoresession") + f' --id="{session_id}"', timeout=60)
        self.assertIn(b"NX> 710 Session status: running", reply, reply)
        return SessionInfo.parse(reply)


class HalfClosingAttachment(Attachment):
    """The harness's attachment as an OpenSSH-based client behaves: when
    nxproxy's connection ends, EOF on the channel (ssh's stdin closed), and
    ssh stays until the server closes the channel."""

    def upstream_ended(self) -> None:
        self.send_eof()

    def _down(self) -> None:
        pipe = self.client.out
        with contextlib.suppress(OSError, ValueError):
            while not pipe.eof:
                pipe.fill(0.5)
                data, pipe.buffer = pipe.buffer, b""
                if data:
                    with contextlib.suppress(OSError):
                        self.conn.sendall(data)  # nxproxy may be gone: ssh is still drained


class ConsoleSessionTests(SessionTestCase):
    def test_start_draws_on_the_client_screen(self):
        client = self.login()
        started = time.monotonic()
        info = self.start(client)
        self.assertRegex(info.full_id, r"^nxgate\.test-\d+-[0-9A-F]{32}$")
        self.assertEqual(info.cookie, info.agent_cookie)
        self.assertNotEqual(info.cookie, "0123456789abcdef")  # the client's --cookie is never used
        for code in (b"700", b"705", b"703", b"701", b"702", b"706", b"704", b"707", b"1009", b"710", b"1002",
                     b"1006"):
            self.assertIn(b"NX> " + code + b" ", info.lines)
        self.assertTrue(info.lines.endswith(b"NX> 1006 Session status: running\nNX> 105 "))
        self.attach(client, info)
        self.screen.wait_for_colour(RED, 20000)
        print(f"\n    login-to-picture (from startsession): {time.monotonic() - started:.2f} s")
        self.assertEqual(self.listing().get(info.session_id), "Running")

    def test_session_processes_run_as_the_user(self):
        subprocess.run(["groupadd", "-f", "nxgatetestgroup"], check=True)
        subprocess.run(["usermod", "-aG", "nxgatetestgroup", self.user.name], check=True)
        client = self.login()
        info = self.start(client)
        self.attach(client, info)
        self.screen.wait_for_colour(RED, 20000)
        entry = pwd.getpwnam(self.user.name)
        (agent,) = agent_processes(self.user.name)
        terms = subprocess.run(["pgrep", "-u", self.user.name, "-x", "xterm"], capture_output=True,
                               text=True).stdout.split()
        self.assertEqual(len(terms), 1)
        for pid in (agent, int(terms[0])):
            status = proc_status(pid)
            self.assertEqual(status["Uid"].split(), [str(entry.pw_uid)] * 4)
            self.assertEqual(status["Gid"].split(), [str(entry.pw_gid)] * 4)
            self.assertEqual(status["Umask"], "0077")
            group = subprocess.run(["getent", "group", "nxgatetestgroup"], capture_output=True, text=True)
            self.assertIn(group.stdout.split(":")[2], status["Groups"].split())
            self.assertEqual(os.getsid(pid), pid)  # its own session: outlives the gateway
        env = proc_environ(int(terms[0]))
        for name in ("HOME", "USER", "LOGNAME", "SHELL", "PATH", "LANG", "DISPLAY", "XAUTHORITY"):
            self.assertIn(name, env)
        self.assertEqual((env["HOME"], env["USER"], env["DISPLAY"]), (entry.pw_dir, self.user.name, f":{info.display}"))
        session_dir = os.path.dirname(env["XAUTHORITY"])
        st = os.stat(session_dir)
        self.assertEqual((st.st_uid, st.st_mode & 0o777), (entry.pw_uid, 0o700))
        self.assertEqual(os.stat(env["XAUTHORITY"]).st_mode & 0o777, 0o600)
        with open("/proc/%d/cmdline" % agent, "rb") as cmdline:
            self.assertNotIn(info.cookie.encode(), cmdline.read())

    def test_suspend_by_dropping_the_client_then_resume_with_a_new_cookie(self):
        client = self.login()
        info = self.start(client)
        attachment = self.attach(client, info)
        self.screen.wait_for_colour(RED, 20000)
        (agent,) = agent_processes(self.user.name)
        attachment.detach()
        self.wait_status(info.session_id, "Suspended")
        self.assertEqual(agent_processes(self.user.name), [agent])
        self.screen.wait_for_colour((0, 0, 0), 800 * 600 - 100)  # nothing drawn there any more
        second = self.login()
        started = time.monotonic()
        resumed = self.restore(second, info.session_id)
        self.assertNotEqual(resumed.cookie, info.cookie)
        self.assertEqual(resumed.cookie, resumed.agent_cookie)
        self.assertEqual(resumed.session_id, info.session_id)
        self.attach(second, resumed)
        self.screen.wait_for_colour(RED, 20000)
        print(f"\n    resume-to-picture (from restoresession): {time.monotonic() - started:.2f} s")
        self.assertEqual(agent_processes(self.user.name), [agent])
        self.assertEqual(self.listing().get(info.session_id), "Running")

    def test_take_over_a_running_session(self):
        other_screen = ClientScreen(800, 600)
        self.addCleanup(other_screen.close)
        first = self.login()
        info = self.start(first)
        attachment = self.attach(first, info)
        self.screen.wait_for_colour(RED, 20000)
        second = self.login()
        resumed = self.restore(second, info.session_id)
        wait_for(lambda: attachment.proxy.poll() is not None, 20, "the first client's proxy to be dropped")
        self.attach(second, resumed, other_screen)
        other_screen.wait_for_colour(RED, 20000)
        self.assertIn(f"session {info.session_id} is attached elsewhere", self.gateway.log())

    def test_terminate_from_the_list(self):
        client = self.login()
        info = self.start(client)
        self.attach(client, info)
        self.screen.wait_for_colour(RED, 20000)
        controller = self.login()
        reply = controller.command(f'Terminate --sessionid="{info.session_id}"', timeout=30)
        self.assertIn(f"NX> 900 Session id: {info.session_id} terminated.".encode(), reply)
        self.assertEqual(agent_processes(self.user.name), [])
        self.assertNotIn(info.session_id, self.listing())

    def test_terminate_a_suspended_session(self):
        info = self.suspended_session()
        reply = self.login().command(f'terminate --sessionid="{info.session_id}"', timeout=30)
        self.assertIn(b"NX> 900 ", reply)
        wait_for(lambda: not agent_processes(self.user.name), 10, "the agent to end")

    def test_the_eof_of_a_client_that_waits_for_the_server_to_close_reaches_the_agent(self):
        """An nxssh-style client whose nxproxy went sends EOF on its channel
        and waits for the server to close it (OpenSSH does): the agent hears
        the EOF, its display fails, the session is suspended, and the channel
        is closed.  Without the EOF passed on, the agent kept its link (and a
        suspend waited nxagent's own 10 s for its peer to close)."""
        client = self.login()
        info = self.start(client)
        attachment = HalfClosingAttachment(client, info, self.screen.name, self.gateway.workdir)
        self.addCleanup(attachment.detach)
        self.screen.wait_for_colour(RED, 20000)
        attachment.proxy.kill()  # nxproxy gone: its connection ends, ssh gets EOF on its stdin
        self.wait_status(info.session_id, "Suspended")
        wait_for(lambda: client.process.poll() is not None, 20, "the gateway to close the client's channel")
        self.assertIn(f"stream of session {info.session_id} closed by the agent", self.gateway.log())

    def test_closing_the_session_program_ends_the_session(self):
        client = self.login()
        info = self.start(client)
        self.attach(client, info)
        self.screen.wait_for_colour(RED, 20000)
        subprocess.run(["pkill", "-u", self.user.name, "-x", "xterm"], check=True)
        wait_for(lambda: not agent_processes(self.user.name), 20, "the session to end with its program")
        self.assertNotIn(info.session_id, self.listing())


class ApplicationSessionTests(SessionTestCase):
    def test_application_session(self):
        client = self.login()
        info = self.start(client, "unix-application", extra='--application="xterm%20-bg%20%2300ff00%20-geometry%2050x10%2B30%2B30"')
        self.attach(client, info)
        self.screen.wait_for_colour(GREEN, 10000)

    def test_rootless_application(self):
        client = self.login()
        info = self.start(client, "unix-application", extra='--rootless="1" --application="xterm -bg #00ff00 -geometry 50x10+30+30"')
        self.attach(client, info)
        self.screen.wait_for_colour(GREEN, 10000)

    def test_the_users_programs_share_one_compose_cache(self):
        """In the sessions' UTF-8 locale libX11 parses its compose table into
        every xterm (0.8 MB each): with the user's cache directory the first
        one writes the parsed table there and the next one, in another
        session, maps that file instead."""
        entry = pwd.getpwnam(self.user.name)
        cache = os.path.join(self.gateway.state_dir, "compose-cache", str(entry.pw_uid))

        def xterms() -> list[int]:
            out = subprocess.run(["pgrep", "-u", self.user.name, "-x", "xterm"], capture_output=True, text=True)
            return sorted(int(pid) for pid in out.stdout.split())

        def on_display(pids: set[int], display: int) -> list[int]:
            """The ones drawing on ``display`` (an earlier test's session may still be ending)."""
            found = []
            for pid in pids:
                try:
                    if proc_environ(pid).get("DISPLAY", "").endswith(f":{display}"):
                        found.append(pid)
                except OSError:  # gone meanwhile
                    pass
            return found

        for name, colour in (("one", "#00ff00"), ("two", "#0000ff")):
            before = set(xterms())
            client = self.login()
            info = self.start(client, "unix-application", name=name,
                              extra=f'--rootless="1" --application="xterm -bg {colour} -geometry 30x5+0+0"')
            self.attach(client, info)
            (pid,) = wait_for(lambda: on_display(set(xterms()) - before, info.display), 30, f"session {name}'s xterm")
            self.assertEqual(proc_environ(pid)["XCOMPOSECACHE"], cache)
            self.assertEqual(proc_environ(pid)["LANG"], "C.UTF-8")
            (table,) = wait_for(lambda: os.listdir(cache) if os.path.isdir(cache) else [], 30, "the cached table")
        st, parent = os.lstat(cache), os.lstat(os.path.dirname(cache))
        self.assertEqual((st.st_uid, st.st_mode & 0o777), (entry.pw_uid, 0o700))
        self.assertEqual((parent.st_uid, parent.st_mode & 0o777), (0, 0o711))

        def mapped() -> bool:
            with open(f"/proc/{pid}/maps") as maps:
                return os.path.join(cache, table) in maps.read()

        wait_for(mapped, 30, "the second xterm to map the cached table")

    def test_admin_defined_type(self):
        client = self.login()
        info = self.start(client, "unix-bluebox")
        self.attach(client, info)
        self.screen.wait_for_colour(BLUE, 10000)

    def test_keyboard_reaches_the_session(self):
        target = os.path.join(self.user.home, "typed.txt")
        client = self.login()
        info = self.start(client, "unix-application",
                          extra=f'--application="xterm -bg #00ff00 -geometry 50x10+30+30 -e sh -c \'cat > {target}\'"')
        self.attach(client, info)
        self.screen.wait_for_colour(GREEN, 10000)
        self.screen.xdotool("mousemove", "100", "80")
        time.sleep(0.3)
        self.screen.xdotool("type", "--delay", "30", "hello nx")
        self.screen.xdotool("key", "Return")
        wait_for(lambda: os.path.exists(target) and "hello nx" in open(target).read(), 15, "typed text")

    def test_start_chooses_its_own_id_and_display_and_says_it_ignored_the_clients(self):
        """FreeNX and Neatx ignore a client's --id and --display on a start;
        so does nxgate, but not silently."""
        wanted = "0123456789ABCDEF0123456789ABCDEF"
        client = self.login()
        info = self.start(client, "unix-bluebox", extra=f'--id="{wanted}" --display="7"')
        self.assertNotEqual(info.session_id, wanted)
        self.assertNotEqual(info.display, 7)
        self.assertIn(f"startsession of {self.user.name} from 127.0.0.1: ignored {{'id': '{wanted}', "
                      f"'display': '7'}} (the server chooses the session id and display)", self.gateway.log())

    def test_missing_application_and_type(self):
        client = self.login()
        reply = client.command(START.format(name="x", type="unix-application",
                                            extra='--application="no-such-program-here"'), timeout=30)
        self.assertIn(b"NX> 596 Error: Application 'no-such-program-here' is not installed on this server.", reply)
        self.assertIn(b"NX> 500 ERROR: Last operation failed.", reply)
        reply = client.command(START.format(name="x", type="unix-cde", extra=""), timeout=30)
        self.assertIn(b"NX> 596 Error: Session type 'unix-cde' is not supported. Available types: ", reply)
        self.assertIn(b"unix-console", reply)
        self.assertIn(b"NX> 597", client.command(START.format(name="x", type="unix-console", extra='--link="warp"')))
        self.assertEqual(agent_processes(self.user.name), [])


class DesktopSessionTests(SessionTestCase):
    def test_xfce_desktop_renders_its_panel(self):
        self.xfce_desktop()


class IsolationTests(SessionTestCase):
    def test_other_users_cannot_see_or_touch_a_session(self):
        client = self.login()
        info = self.start(client)
        self.attach(client, info)
        self.screen.wait_for_colour(RED, 20000)
        intruder = self.login(self.other)
        self.assertNotIn(info.session_id, intruder.command('listsession --status="suspended,running"').decode())
        for command in (f'restoresession --id="{info.session_id}" --type="unix-console"',
                        f'terminate --sessionid="{info.session_id}"', f'suspend --sessionid="{info.session_id}"'):
            reply = intruder.command(command, timeout=30)
            self.assertIn(f"NX> 596 Error: Could not find session {info.session_id}.".encode(), reply)
        self.assertEqual(self.listing().get(info.session_id), "Running")
        self.assertEqual(len(agent_processes(self.user.name)), 1)
        self.assertIn(f"{self.other.name} from 127.0.0.1 asked for session {info.session_id}", self.gateway.log())


# Another local user at the session's agent: where it listened before
# (127.0.0.1:4000+N), and at its socket, whose path is in everyone's ps.
STRANGER = """
import json, socket, sys
tried = {}
for name, family, address in (("tcp", socket.AF_INET, ("127.0.0.1", int(sys.argv[1]))),
                              ("unix", socket.AF_UNIX, sys.argv[2])):
    probe = socket.socket(family)
    try:
        probe.connect(address)
        probe.sendall(b"NXPROXY-1.5.0-3.5.0\\ncookie=00000000000000000000000000000000\\n")
        tried[name] = "connected"
    except OSError as error:
        tried[name] = type(error).__name__
    finally:
        probe.close()
print(json.dumps(tried))
"""


class LocalStrangerTests(SessionTestCase):
    """Other local Unix users can neither reach a session's agent nor read
    whose it is from ``ps``; a failed connection does not cost a resume."""

    def agent_socket(self, info: SessionInfo) -> str:
        return os.path.join(self.gateway.state_dir, "sessions", info.session_id, "agent.sock")

    def stranger_tries(self, info: SessionInfo) -> dict[str, str]:
        result = subprocess.run(["runuser", "-u", self.other.name, "--", "python3", "-c", STRANGER,
                                 str(4000 + info.display), self.agent_socket(info)],
                                capture_output=True, text=True, timeout=30, check=True)
        return json.loads(result.stdout)

    def test_a_stranger_cannot_reach_a_waiting_or_resuming_agent(self):
        client = self.login()
        info = self.start(client, name="Quarterly-Plans")
        self.assertEqual(self.stranger_tries(info), {"tcp": "ConnectionRefusedError", "unix": "PermissionError"})
        agents = agent_processes(self.user.name)  # the agent and its watchdog
        self.assertTrue(agents)
        for agent in agents:
            with open(f"/proc/{agent}/cmdline", "rb") as handle:
                argv = handle.read().decode()
            self.assertIn(f":{info.display}", argv)
            self.assertNotIn(self.user.name, argv)
            self.assertNotIn("Quarterly-Plans", argv)
        attachment = self.attach(client, info)
        self.screen.wait_for_colour(RED, 20000)
        self.wait_status(info.session_id, "Running")
        attachment.detach()
        self.wait_status(info.session_id, "Suspended")
        self.screen.wait_for_colour((0, 0, 0), 800 * 600 - 100)

        client = self.login()
        resumed = self.restore(client, info.session_id)
        self.assertEqual(self.stranger_tries(info), {"tcp": "ConnectionRefusedError", "unix": "PermissionError"})
        self.attach(client, resumed)
        self.screen.wait_for_colour(RED, 20000)
        self.wait_status(info.session_id, "Running")

    def test_a_failed_connection_does_not_cost_the_resume(self):
        """What only root or the user himself can still do (a stale client
        with an old cookie, a probe): the resumed agent suspends itself
        again, and the gateway makes it listen again for the real client."""
        info = self.suspended_session()
        self.screen.wait_for_colour((0, 0, 0), 800 * 600 - 100)
        client = self.login()
        resumed = self.restore(client, info.session_id)
        probe = socket.socket(socket.AF_UNIX)
        probe.connect(self.agent_socket(info))
        probe.sendall(b"NXPROXY-1.5.0-3.5.0\ncookie=00000000000000000000000000000000\n")
        probe.close()
        wait_for(lambda: f"session {info.session_id}: its agent suspended itself before" in self.gateway.log(), 20,
                 "the failed connection to be noticed")
        # At once: the relay waits for the agent to listen again.
        self.attach(client, resumed)
        self.screen.wait_for_colour(RED, 20000)
        self.wait_status(info.session_id, "Running")


class LeftoverTests(SessionTestCase):
    """When a session ends, everything it started ends, also what left its
    process group and session (gpg-agent after an XFCE session)."""

    options = {"types": {"unix-leaky": f"python3 {os.path.join(REPO, 'tests', 'fixtures', 'leaky_session.py')}"}}

    def processes_named(self, name: str) -> list[int]:
        result = subprocess.run(["pgrep", "-u", self.user.name, "-x", name], capture_output=True, text=True)
        return [int(pid) for pid in result.stdout.split()]

    def users_own_process(self) -> int:
        """A process of the same user that no session started: it stays."""
        entry = pwd.getpwnam(self.user.name)

        def become():
            os.setresgid(entry.pw_gid, entry.pw_gid, entry.pw_gid)
            os.setresuid(entry.pw_uid, entry.pw_uid, entry.pw_uid)

        process = subprocess.Popen(["python3", "-c", "open('/proc/self/comm', 'w').write('nxkeep')\n"
                                    "import time\nwhile True: time.sleep(60)"], preexec_fn=become)
        self.addCleanup(lambda: (process.kill(), process.wait()))
        wait_for(lambda: self.processes_named("nxkeep"), 10, "the user's own process")
        return process.pid

    def test_a_daemon_the_session_started_ends_with_it(self):
        own = self.users_own_process()
        client = self.login()
        info = self.start(client, session_type="unix-leaky")
        self.attach(client, info)
        self.screen.wait_for_colour(RED, 20000)
        (daemon,) = wait_for(lambda: self.processes_named("nxleak"), 20, "the session's daemon")
        (term,) = self.processes_named("xterm")
        self.assertEqual(proc_status(daemon)["PPid"], "1")
        self.assertNotEqual(os.getsid(daemon), os.getsid(term))  # out of the program's session and group
        reply = self.login().command(f'terminate --sessionid="{info.session_id}"', timeout=60)
        self.assertIn(f"NX> 900 Session id: {info.session_id} terminated.".encode(), reply)
        wait_for(lambda: not self.processes_named("nxleak"), 15, "the session's daemon to end")
        self.assertEqual(self.processes_named("nxkeep"), [own])
        self.assertRegex(self.gateway.log(), rf"session {info.session_id} of \S+: ending \d+ processes it started")


class LimitTests(SessionTestCase):
    options = {"sessions": {"max_sessions_per_user": "1"}}

    def test_user_limit(self):
        client = self.login()
        self.start(client)
        reply = client.command(START.format(name="second", type="unix-console", extra=""), timeout=30)
        self.assertIn(f"NX> 599 Server capacity: reached for user: {self.user.name}\n"
                      "NX> 500 ERROR: Last operation failed.\n".encode(), reply)
        listing = client.command('listsession --status="suspended,running"')
        self.assertIn(f"NX> 147 Server capacity: reached for user: {self.user.name}".encode(), listing)
        self.assertIn(b"NX> 148", self.login(self.other).command("listsession --type=\"unix-console\""))

    def test_unencrypted_is_refused(self):
        client = self.login()
        reply = client.command(START.format(name="x", type="unix-console", extra="").replace(
            '--encryption="1"', '--encryption="0"'), timeout=30)
        self.assertIn(b"NX> 596 Unencrypted sessions are not allowed.", reply)


class FailureTests(SessionTestCase):
    def test_agent_killed_behind_the_gateways_back(self):
        info = self.suspended_session()
        for pid in agent_processes(self.user.name):
            os.kill(pid, signal.SIGKILL)
        self.wait_status(info.session_id, None)
        reply = self.login().command(f'restoresession --id="{info.session_id}"', timeout=30)
        self.assertIn(f"NX> 596 Error: Could not find session {info.session_id}.".encode(), reply)
        self.assertRegex(self.gateway.log(), rf"session {info.session_id} of \S+ ended")


class RestartTests(SessionTestCase):
    def test_gateway_sigkill_and_restart_keeps_sessions(self):
        first = self.login()
        live = self.start(first, name="live")
        self.attach(first, live)
        self.screen.wait_for_colour(RED, 20000)
        second = self.login()
        parked = self.start(second, name="parked")
        parked_screen = ClientScreen(800, 600)
        self.addCleanup(parked_screen.close)
        parked_attachment = self.attach(second, parked, parked_screen)
        parked_screen.wait_for_colour(RED, 20000)
        parked_attachment.detach()
        self.wait_status(parked.session_id, "Suspended")
        agents = sorted(agent_processes(self.user.name))
        self.assertEqual(len(agents), 2)
        self.gateway.process.kill()
        self.gateway.process.wait()
        self.gateway.process.stderr.close()
        self.gateway.process = None
        time.sleep(1)
        self.assertEqual(sorted(agent_processes(self.user.name)), agents)  # nobody lost a session
        restarted = Gateway(state_dir=self.gateway.state_dir, options={
            "sessions": {"display_base": "700", "display_limit": "100"}, "types": dict(TYPES)}).start()
        self.addCleanup(restarted.stop)
        self.gateway, old = restarted, self.gateway
        self.addCleanup(lambda: setattr(self, "gateway", old))
        statuses = {}
        wait_for(lambda: statuses.update(self.listing()) or (statuses.get(live.session_id) == "Suspended"
                                                           and statuses.get(parked.session_id) == "Suspended"),
                 30, "both sessions listed as suspended after the restart")
        for info in (live, parked):
            # The dead gateway's client leaves its last picture; a new one must be drawn.
            self.screen.wait_for_colour((0, 0, 0), 800 * 600 - 100)
            client = self.login()
            resumed = self.restore(client, info.session_id)
            attachment = self.attach(client, resumed)
            self.screen.wait_for_colour(RED, 20000)
            # The picture comes before nxagent has finished resuming; a client
            # that drops in between makes nxagent reset its X clients.
            self.wait_status(info.session_id, "Running")
            attachment.detach()
            self.wait_status(info.session_id, "Suspended")
        self.assertIn("taken back", restarted.log())


def gateway_rss_mb(pid: int) -> float:
    return int(proc_status(pid)["VmRSS"].split()[0]) / 1024


class RelayTests(SessionTestCase):
    FLOOD = 128 * 1024 * 1024
    CHUNK = 1024 * 1024

    def take_agent_port(self, info: SessionInfo) -> socket.socket:
        """Stop the session's agent and listen on its socket in its place:
        the test reads the relayed stream (or not) at its own pace.  The
        session stays live meanwhile (its node opens streams of running
        sessions only); :meth:`end_agent` ends the agent once the stream is
        the test's."""
        self.stopped = agent_processes(self.user.name)
        for pid in self.stopped:
            os.kill(pid, signal.SIGSTOP)
        self.addCleanup(self.end_agent)
        path = os.path.join(self.gateway.state_dir, "sessions", info.session_id, "agent.sock")
        os.unlink(path)  # the stopped agent keeps its listener, unreachable by path
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.addCleanup(listener.close)
        listener.bind(path)
        listener.listen(1)
        return listener

    def end_agent(self) -> None:
        for pid in getattr(self, "stopped", []):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.stopped = []

    def test_a_client_faster_than_its_agent_is_held_back_and_loses_nothing(self):
        """Nothing reads the agent's end while the client floods the stream:
        the gateway stops reading from the client instead of buffering it, and
        once the agent end reads, every byte arrives, in order."""
        client = self.login()
        info = self.start(client)
        listener = self.take_agent_port(info)
        client.send("bye")
        client.expect(b"NX> 999 Bye.\n")
        listener.settimeout(20)
        agent_end, _ = listener.accept()
        self.addCleanup(agent_end.close)
        self.end_agent()  # the stream is the test's now: the session ends, its stream goes on
        gateway = self.gateway.process.pid
        rss_before = gateway_rss_mb(gateway)
        chunks = [hashlib.sha256(str(i).encode()).digest() * (self.CHUNK // 32) for i in range(self.FLOOD // self.CHUNK)]
        sent = [0]

        def flood():
            stdin = client.process.stdin.fileno()
            for chunk in chunks:
                view = memoryview(chunk)
                while view:
                    written = os.write(stdin, view)
                    view = view[written:]
                    sent[0] += written

        flooding = threading.Thread(target=flood, daemon=True)
        flooding.start()
        samples = [-1]

        def stalled() -> bool:
            samples.append(sent[0])
            return samples[-1] == samples[-2] or sent[0] == self.FLOOD

        wait_for(stalled, 60, "the client's flood to stall or finish", interval=1.0)
        held_back, grown = sent[0], gateway_rss_mb(gateway) - rss_before
        print(f"\n    flood held at {held_back / 2**20:.1f} MiB of {self.FLOOD / 2**20:.0f}; "
              f"gateway RSS grew {grown:.1f} MB")
        self.assertLess(held_back, self.FLOOD // 3)
        self.assertLess(grown, 48)
        digest, received = hashlib.sha256(), 0
        agent_end.settimeout(30)
        while received < self.FLOOD:
            data = agent_end.recv(1 << 20)
            self.assertTrue(data, f"the stream ended after {received} bytes")
            digest.update(data)
            received += len(data)
        flooding.join(30)
        self.assertEqual(digest.digest(), hashlib.sha256(b"".join(chunks)).digest())
        self.assertNotIn(info.session_id, self.listing())  # the gateway still answers, its agent is gone
