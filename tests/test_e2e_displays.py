"""End to end: another local user squats display numbers.

Bob, an ordinary local user, binds the abstract X sockets (from 1650, or
the first range above it nobody holds)
``@/tmp/.X11-unix/X1650`` ... ``X1689`` (the whole configured range of the
gateway; nxagent would die on them, and no file shows them), and writes 40
X lock files holding the pid of a process of his that lives,
``/tmp/.X1690-lock`` ... ``/tmp/.X1729-lock``.  The bound names hold their
displays: alice's session passes them over without counting them.  The
locks hold nothing (no X server listens there): the first is taken over for
her session, which draws.  ``nxgate-admin status`` names bob for each of
the others.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys

from tests.harness.cluster import admin_cli
from tests.harness.x11 import quiet_display_range
from tests.test_e2e_sessions import RED, SessionTestCase, agent_processes

LIMIT = 40
BASE = quiet_display_range(1650, 2 * LIMIT)

#: Bob's squatter: binds (and listens on) the abstract X sockets it is
#: given, says "bound", then sleeps until it is killed.
SQUATTER = """
import socket, sys, time
held = []
for n in sys.argv[1:]:
    s = socket.socket(socket.AF_UNIX)
    s.bind("\\0/tmp/.X11-unix/X" + n)
    s.listen(1)
    held.append(s)
print("bound", flush=True)
time.sleep(3600)
"""


class SquattedDisplayTests(SessionTestCase):
    options = {"sessions": {"display_base": str(BASE), "display_limit": str(LIMIT)}}

    def squat(self) -> None:
        bob = pwd.getpwnam(self.other.name)
        squatter = subprocess.Popen(
            [sys.executable, "-c", SQUATTER, *(str(n) for n in range(BASE, BASE + LIMIT))],
            user=bob.pw_uid, group=bob.pw_gid, extra_groups=[], stdout=subprocess.PIPE, text=True, cwd="/")
        self.addCleanup(lambda: (squatter.kill(), squatter.wait()))
        self.assertEqual(squatter.stdout.readline().strip(), "bound")
        for display in range(BASE + LIMIT, BASE + 2 * LIMIT):
            lock = f"/tmp/.X{display}-lock"
            self.assertFalse(os.path.lexists(lock), f"{lock} exists before the test")
            # As bob (the sticky /tmp makes them his), the pid of his live squatter.
            subprocess.run(["setpriv", f"--reuid={bob.pw_uid}", f"--regid={bob.pw_gid}", "--clear-groups",
                            "sh", "-c", f'printf "%10d\\n" {squatter.pid} > "{lock}"'], check=True)
            self.addCleanup(lambda path=lock: os.path.lexists(path) and os.unlink(path))
            self.assertEqual(os.lstat(lock).st_uid, bob.pw_uid)

    def test_squatted_displays_leave_sessions_starting_and_the_admin_sees_who(self):
        self.squat()
        client = self.login()
        info = self.start(client)
        # bob's 40 bound names passed over, not counted; his lock there held nothing: taken over.
        self.assertEqual(info.display, BASE + LIMIT)
        self.attach(client, info)
        self.screen.wait_for_colour(RED, 20000)

        socket_path = os.path.join(self.gateway.state_dir, "admin.sock")
        status = admin_cli("status", socket=socket_path).stdout
        held = {int(line.split()[0][1:]): line for line in status.splitlines() if line.startswith("  :")}
        for display in range(BASE, BASE + 2 * LIMIT):
            if display == info.display:
                continue
            self.assertIn(display, held, status)
            # The squatter among the holders (a machine that ran tests before may hold a stale socket too).
            holders = held[display].split(" held by ", 1)[1].split(":", 1)[0].split(", ")
            self.assertIn(self.other.name, holders, held[display])
        self.assertIn(f"abstract X socket @/tmp/.X11-unix/X{BASE}", held[BASE])
        self.assertIn(f"X lock /tmp/.X{BASE + LIMIT + 1}-lock of pid", held[BASE + LIMIT + 1])
        self.assertIn("no X server: the next start there takes it over", held[BASE + LIMIT + 1])
        self.assertNotIn(info.display, held)  # alice's own session is not somebody else's
        self.assertIn("display(s) in use by others passed over", self.gateway.log())


class AgentCommandLineTests(SessionTestCase):
    """nxagent's argv (world-readable) names no session, and its X display
    still wants the session's cookie (its -auth file is named relative to
    the session directory it runs in)."""

    def test_argv_names_no_session_and_the_display_wants_its_cookie(self):
        client = self.login()
        info = self.start(client)
        self.attach(client, info)
        self.screen.wait_for_colour(RED, 20000)
        for pid in agent_processes(self.user.name):
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                argv = handle.read().decode().split("\0")
            self.assertNotIn(info.session_id, " ".join(argv), argv)
            self.assertEqual(argv[-2], f":{info.display}")  # the X server takes its display in argv only
        authority = os.path.join(self.gateway.state_dir, "sessions", info.session_id, "authority")

        def xwd(authority_file: str) -> subprocess.CompletedProcess:
            return subprocess.run(["xwd", "-silent", "-root", "-display", f":{info.display}"], capture_output=True,
                                  env={"PATH": "/usr/bin:/bin", "XAUTHORITY": authority_file}, timeout=30)

        refused = xwd("/dev/null")
        self.assertNotEqual(refused.returncode, 0)
        self.assertIn(b"unable to open display", refused.stderr)
        allowed = xwd(authority)
        self.assertEqual(allowed.returncode, 0, allowed.stderr)
