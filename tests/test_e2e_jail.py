"""End to end: jailed sessions ([jail] enabled) with the real bubblewrap.

Two users run jailed sessions at once.  Alice's session program is a probe
that writes what it can see (``ls /home``, ``ls -a /tmp``, ``ps ax``, Bob's
X display, a world-readable file in Bob's home and in /tmp) into her home,
then draws a green xterm through nxproxy.  Nothing of Bob's may show; the
session still suspends, survives a gateway SIGKILL, resumes and ends with
no process left behind.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

from twisted.trial.unittest import SkipTest

from nxgate.node.cgroups import SessionCgroups, own_cgroup
from tests.harness.gateway import Gateway
from tests.harness.process import wait_for
from tests.test_e2e_sessions import GREEN, TYPES, SessionTestCase, agent_processes

PROBE = r"""#!/bin/sh
out="$HOME/probe.out"
{
echo "== home"; ls -a /home
echo "== tmp"; ls -a /tmp /tmp/.X11-unix /var/tmp
echo "== ps"; ps ax -o pid=,user:32=,args=
echo "== bob"; cat "@BOBHOME@/public.txt" "/tmp/@BOB@-public.txt"
echo "== bobx"
python3 - <<'EOF'
import socket
for name in ("/tmp/.X11-unix/X@BOBDISPLAY@", "\0/tmp/.X11-unix/X@BOBDISPLAY@"):
    try:
        socket.socket(socket.AF_UNIX).connect(name)
        print("CONNECTED", repr(name))
    except OSError as error:
        print("refused", repr(name), error)
EOF
echo "== end"
} > "$out.part" 2>&1
mv "$out.part" "$out"
exec xterm -bg '#00ff00' -geometry 50x10+30+30
"""


def processes_of(user: str) -> list[str]:
    result = subprocess.run(["ps", "-u", user, "-o", "pid=,args="], capture_output=True, text=True)
    return [line.strip() for line in result.stdout.splitlines()]


def cgroup_of(pid: int) -> str | None:
    """The cgroup v2 path of process ``pid``."""
    with open(f"/proc/{pid}/cgroup") as handle:
        return own_cgroup(handle.read())


class JailTests(SessionTestCase):
    options = {"jail": {"enabled": "yes", "pids_max": "200"}}

    def setUp(self):
        if not shutil.which("bwrap"):
            raise SkipTest("bubblewrap (bwrap) is not installed")
        super().setUp()

    def test_alice_sees_nothing_of_bob_and_her_session_lives_on(self):
        alice, bob = self.user, self.other
        # Bob's session runs, and he leaves world-readable files around.
        bob_session = self.start(self.login(bob), name="bob")
        for bob_agent in agent_processes(bob.name):  # his session is jailed too
            self.assertNotEqual(os.readlink(f"/proc/{bob_agent}/ns/pid"), os.readlink("/proc/self/ns/pid"))
        os.chmod(bob.home, 0o755)
        for path in (os.path.join(bob.home, "public.txt"), f"/tmp/{bob.name}-public.txt"):
            with open(path, "w") as handle:
                handle.write("BOB-SECRET\n")
            os.chmod(path, 0o644)
            self.addCleanup(lambda p=path: os.path.exists(p) and os.unlink(p))
        probe = os.path.join(alice.home, "probe.sh")
        with open(probe, "w") as handle:
            handle.write(PROBE.replace("@BOBHOME@", bob.home).replace("@BOB@", bob.name)
                         .replace("@BOBDISPLAY@", str(bob_session.display)))
        shutil.chown(probe, alice.name)
        os.chmod(probe, 0o755)

        client = self.login(alice)
        info = self.start(client, "unix-application", name="jailed", extra=f'--application="{probe}"')
        attachment = self.attach(client, info)
        self.screen.wait_for_colour(GREEN, 10000)  # drawn through nxproxy from inside the jail
        output_path = os.path.join(alice.home, "probe.out")
        wait_for(lambda: os.path.exists(output_path), 15, "the probe's output")
        with open(output_path) as handle:
            output = handle.read()
        sections = dict(part.split("\n", 1) for part in output.split("== ")[1:])
        self.assertNotIn("BOB-SECRET", output)
        self.assertEqual(sections["bob"].count("No such file or directory"), 2)
        for name in ("home", "tmp", "ps", "bobx"):
            self.assertNotIn(bob.name, sections[name])
        self.assertEqual(sections["home"].split(), [".", "..", os.path.basename(alice.home)])
        # /tmp holds only the session's own X socket (and the path to the
        # test's state directory, which lives in /tmp); /var/tmp is empty.
        self.assertEqual(sorted(set(sections["tmp"].split()) - {".", "..", "/tmp:", "/tmp/.X11-unix:", "/var/tmp:"}),
                         sorted([".X11-unix", f".X{info.display}-lock", f"X{info.display}",
                                 os.path.basename(self.gateway.workdir)]))
        processes = [line.split(None, 2) for line in sections["ps"].splitlines() if line.strip()]
        # The jail's init (bubblewrap, root's) and the session's own processes.
        self.assertEqual(processes[0][:2], ["1", "root"])
        self.assertIn("bwrap", processes[0][2])
        self.assertEqual({user for _pid, user, _args in processes[1:]}, {alice.name})
        self.assertIn("nxagent", sections["ps"])
        self.assertLess(len(sections["ps"].splitlines()), 12)  # the session's processes, not the machine's
        self.assertNotIn("CONNECTED", sections["bobx"])
        # Resource limits: applied wherever this machine can (the test fails if they are not), else said once.
        groups = SessionCgroups(own=cgroup_of(self.gateway.process.pid))
        if groups.unavailable({"pids.max": "200"}) is None:
            with open(os.path.join(groups.parent, info.session_id, "pids.max")) as handle:
                self.assertEqual(handle.read().strip(), "200")
            with open(os.path.join(groups.parent, info.session_id, "cgroup.procs")) as handle:
                members = handle.read().split()
            self.assertTrue(members)
            self.assertTrue(set(map(str, agent_processes(alice.name))) & set(members))
        else:
            print(f"\njail limits cannot apply on this machine: {groups.unavailable({'pids.max': '200'})}")
            self.assertEqual(self.gateway.log().count("jailed sessions run WITHOUT their resource limits "
                                                      "(pids.max=200): "), 1)
        self.assertEqual(len([line for line in sections["bobx"].splitlines() if line.startswith("refused ")]), 2)

        # The gateway still manages the jailed agent: suspend...
        attachment.detach()
        self.wait_status(info.session_id, "Suspended")
        # ... survive a SIGKILL of the gateway and take the session back ...
        agents = sorted(agent_processes(alice.name))
        self.gateway.process.kill()
        self.gateway.process.wait()
        self.gateway.process.stderr.close()
        self.gateway.process = None
        time.sleep(1)
        self.assertEqual(sorted(agent_processes(alice.name)), agents)
        restarted = Gateway(state_dir=self.gateway.state_dir, options={
            "sessions": {"display_base": "700", "display_limit": "100"}, "types": dict(TYPES),
            "jail": {"enabled": "yes", "pids_max": "200"}}).start()
        self.addCleanup(restarted.stop)
        self.gateway, old = restarted, self.gateway
        self.addCleanup(lambda: setattr(self, "gateway", old))
        wait_for(lambda: self.listing().get(info.session_id) == "Suspended", 30, "the session taken back")
        # ... resume it ...
        self.screen.wait_for_colour((0, 0, 0), 800 * 600 - 100)
        client = self.login(alice)
        resumed = self.restore(client, info.session_id)
        self.attach(client, resumed)
        self.screen.wait_for_colour(GREEN, 10000)
        self.wait_status(info.session_id, "Running")
        # ... and end it with nothing of hers left running.
        reply = self.login(alice).command(f'terminate --sessionid="{info.session_id}"', timeout=30)
        self.assertIn(b"NX> 900 ", reply)
        wait_for(lambda: not processes_of(alice.name), 15, f"{alice.name}'s processes to end")
        self.assertIn(f"session {info.session_id} of {alice.name}: jailed", old.log())


class JailedDesktopTests(SessionTestCase):
    """A whole XFCE desktop (session bus, panel, window manager) in a jail."""

    options = {"jail": {"enabled": "yes", "types": "unix-xfce"}}

    def test_xfce_desktop_renders_its_panel_in_a_jail(self):
        if not shutil.which("bwrap"):
            raise SkipTest("bubblewrap (bwrap) is not installed")
        self.xfce_desktop()
        agent = min(agent_processes(self.user.name))
        self.assertNotEqual(os.readlink(f"/proc/{agent}/ns/pid"), os.readlink("/proc/self/ns/pid"))
        panels = subprocess.run(["pgrep", "-u", self.user.name, "-x", "xfce4-panel"], capture_output=True, text=True)
        (panel,) = panels.stdout.split()
        for namespace in ("pid", "mnt", "ipc"):  # the desktop shares the agent's jail
            self.assertEqual(os.readlink(f"/proc/{panel}/ns/{namespace}"), os.readlink(f"/proc/{agent}/ns/{namespace}"))
