"""End to end: ``nxgate-client`` reaching every session type the gateway serves.

Shadowing one's own running session, Windows desktops (the real xrdp, and
FreeRDP's shadow server for a real NLA login) and VNC desktops (x11vnc and
Xtigervnc with a VNC password), all through the real gateway, nxagent and
nxproxy; the client runs as a separate process the way users run it.  The
pictures are checked pixel by pixel against what the watched or remote
screen shows, and the remote password, given in $NXGATE_REMOTE_PASSWORD,
must appear in no process's argv and not in the gateway's log.
"""

from __future__ import annotations

import os
import pty
import re
import signal
import subprocess
import time

import numpy as np
from twisted.trial.unittest import SkipTest

from tests.harness.process import stop, wait_for
from tests.harness.rdphost import GREEN, MAGENTA, NLAHost, RDPHost
from tests.harness.shared import class_fixture
from tests.harness.vnchost import ORANGE, VNCHost
from tests.harness.x11 import ClientScreen, Screenshot
from tests.test_e2e_client import TYPES, ClientTestCase, agent_processes

RED = (255, 0, 0)
BLUE = (0, 0, 255)
SKY = (0, 160, 255)
SECRET = "Remote-Secret-7"


def equal_fraction(one: Screenshot, other: Screenshot, area: tuple[int, int] | None = None) -> float:
    """The share of pixels that are the same in two pictures of one size
    (in their top left ``area``, width and height, if given)."""
    width, height = area or (one.width, one.height)
    first, second = (np.frombuffer(shot.rgba, np.uint8).reshape(shot.height, shot.width, 4)[:height, :width, :3]
                     for shot in (one, other))
    return float(np.all(first == second, axis=2).mean())


def cmdline(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as handle:
        return handle.read()


def children(pid: int, name: str) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid), "-x", name], capture_output=True, text=True).stdout
    return [int(child) for child in out.split()]


class ClientScreensTestCase(ClientTestCase):
    """A gateway, a user and client screens (Xvfb) shared by a class's tests,
    and a remote host when the class names one."""

    width, height = 800, 600
    screen_count = 1
    window_manager = False  # xfwm4 on the client screens, as on a desktop

    def setUp(self):
        super().setUp()
        fixture = class_fixture(type(self), self.make_fixture)
        self.screens: list[ClientScreen] = fixture[2]
        self.screen = self.screens[0]
        self.addCleanup(self.end_all_sessions)

    def make_host(self):
        return None, {}

    def make_fixture(self):
        host, options = self.make_host()
        type(self).host = host
        type(self).options = {"sessions": {"display_base": "640", "display_limit": "60", "connect_timeout": "60"},
                              "types": TYPES, **options}
        screens: list[ClientScreen] = []
        try:
            (user, gateway), teardown = ClientTestCase.make_fixture(self)
            try:
                for _ in range(self.screen_count):
                    screens.append(ClientScreen(self.width, self.height, window_manager=self.window_manager))
            except BaseException:
                teardown()
                raise
        except BaseException:
            for screen in screens:
                screen.close()
            if host is not None:
                host.close()
            raise

        def teardown_all():
            for screen in screens:
                screen.close()
            teardown()
            if host is not None:
                host.close()

        return (user, gateway, screens), teardown_all

    def end_all_sessions(self):
        for pid in agent_processes(self.user.name):
            os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not agent_processes(self.user.name), 20, "the agents to end")

    def run_client(self, *args: str, screen: ClientScreen | None = None, **env: str) -> subprocess.Popen[str]:
        """The client in the background, drawing on ``screen``."""
        return self.background(self.argv("--geometry", f"{self.width}x{self.height}", *args),
                               DISPLAY=(screen or self.screen).name, **env)

    def assert_password_hidden(self, client: subprocess.Popen[str], password: str) -> None:
        """Not in the argv of the client, its nxproxy or any other process,
        not in nxproxy's environment, not in the gateway's log."""
        (proxy,) = wait_for(lambda: children(client.pid, "nxproxy"), 10, "nxproxy")
        secret = password.encode()
        self.assertNotIn(secret, cmdline(client.pid))
        self.assertNotIn(secret, cmdline(proxy))
        with open(f"/proc/{proxy}/environ", "rb") as handle:
            self.assertNotIn(secret, handle.read())
        self.assertNotIn(password, subprocess.run(["ps", "-eww", "-o", "args"], capture_output=True, text=True).stdout)
        self.assertNotIn(password, self.gateway.log())

    def same_picture(self, expected: ClientScreen, actual: ClientScreen,
                     area: tuple[int, int] | None = None) -> float | None:
        first, second = expected.shot(), actual.shot()
        fraction = equal_fraction(first, second, area)
        if fraction >= 0.99:
            return fraction
        self.last_pictures = (first, second, fraction)
        return None

    def assert_same_picture(self, expected: ClientScreen, actual: ClientScreen, what: str,
                            area: tuple[int, int] | None = None) -> float:
        """``actual`` shows what ``expected`` does (99% of the pixels equal,
        in the top left ``area`` if given); both pictures are kept in
        _trial_temp if not."""
        try:
            return wait_for(lambda: self.same_picture(expected, actual, area), 20, what)
        except AssertionError:
            first, second, fraction = self.last_pictures
            base = os.path.abspath(self.mktemp())  # in _trial_temp
            first.save(base + "-expected.ppm")
            second.save(base + "-actual.ppm")
            raise AssertionError(f"{what}: only {fraction:.2%} of the pixels equal; pictures in {base}-*.ppm") from None

    def assert_remote_screen(self, remote: ClientScreen) -> None:
        """The client's screen shows the remote one pixel for pixel, in the
        top left 640x480 (with the xterm's edges and the background): the
        session is 768x576 on this 1024x768 screen until issue 10's
        "requested size is ignored" is fixed on another branch."""
        fraction = self.assert_same_picture(remote, self.screen, "the client to show the remote screen", (640, 480))
        print(f"\n    {fraction:.4%} of the client's pixels equal to the remote screen's")


class ShadowTests(ClientScreensTestCase):
    """alice watches her own running session from a second screen."""

    screen_count = 3
    window_manager = True  # without one nxagent forces a 3/4-size "full screen" of its own

    def watched_session(self, name: str = "watched desk", *args: str) -> tuple[subprocess.Popen[str], str]:
        owner_screen = self.screens[0]
        owner = self.run_client("--name", name, *args, screen=owner_screen)
        owner_screen.wait_for_colour(RED, 20000, timeout=60)
        ((session_id, _),) = self.sessions().items()
        return owner, session_id

    def test_shadow_own_session(self):
        owner_screen, viewer_screen = self.screens[:2]
        owner, session_id = self.watched_session()
        # No id: the only session there is, picked and said so (the target
        # after a bare --shadow is not taken for an id).
        viewer = self.run_client("--shadow", screen=viewer_screen)
        viewer_screen.wait_for_colour(RED, 20000, timeout=60)
        self.assertIn(f"watches {session_id} of {self.user.name} (interactive)", self.gateway.log())
        self.assertEqual(viewer_screen.shot().count(BLUE), 0)

        # What happens in the watched session, the viewer sees: a window
        # started from inside it, by typing into its xterm.
        self.xterm_in_session(owner_screen, BLUE)
        owned = owner_screen.wait_for_colour(BLUE, 10000, timeout=30).count(BLUE)
        seen = viewer_screen.wait_for_colour(BLUE, owned // 2, timeout=30).count(BLUE)
        print(f"\n    shadow viewer: {seen} blue pixels for the owner's {owned}")

        viewer.send_signal(signal.SIGTERM)
        code, stderr = self.finished(viewer, 60)
        self.assertEqual(code, 0, stderr)
        self.assertIn(f"shadowing {session_id} (watched desk {self.user.name}), the only session you may shadow",
                      stderr)
        # A shadow ends with its viewer (issue 25: it said the session "stays on the server").
        self.assertIn(f"SIGTERM: disconnecting; the shadow of session {session_id} ends (that session goes on)",
                      stderr)
        self.assertNotIn("stays on the server", stderr)
        wait_for(lambda: list(self.sessions()) == [session_id], 30, "the shadow to end")
        self.assertIsNone(owner.poll())  # the watched session goes on

        # With the id, view-only: the viewer's typing does not reach the session.
        viewer = self.run_client("--shadow", session_id, "--view-only", screen=viewer_screen)
        viewer_screen.wait_for_colour(RED, 20000, timeout=60)
        self.assertIn(f"watches {session_id} of {self.user.name} (view-only)", self.gateway.log())
        viewer_screen.xdotool("mousemove", "100", "100")
        viewer_screen.xdotool("type", "--delay", "20", "xterm -bg '#00ff00' -geometry 30x8+300+100 &")
        viewer_screen.xdotool("key", "Return")
        time.sleep(4)
        self.assertEqual(owner_screen.shot().count((0, 255, 0)), 0)

        # The watched session ends: so does the shadow, and the viewer says so.
        self.assertEqual(self.client("--terminate", session_id).returncode, 0)
        code, stderr = self.finished(viewer, 60)
        self.assertEqual(code, 0, stderr)
        self.assertIn(f"the shadow of session {session_id} ended (", stderr)
        self.assertNotIn("stays on the server", stderr)

    def test_shadow_picture_is_the_owners_screen(self):
        """The viewer's screen, as big as the owner's, shows the same pixels
        (both full screen: the whole of each screen is the session)."""
        owner_screen, viewer_screen = self.screens[:2]
        self.watched_session("watched desk", "--fullscreen")
        self.run_client("--shadow", "--fullscreen", screen=viewer_screen)
        viewer_screen.wait_for_colour(RED, 20000, timeout=60)
        watched = self.assert_same_picture(owner_screen, viewer_screen, "the same picture")
        print(f"\n    shadow viewer: {watched:.4%} of the pixels equal to the owner's screen")

    def xterm_in_session(self, owner_screen: ClientScreen, colour: tuple[int, int, int]) -> None:
        """Another window in the watched session, started from inside it:
        typing a command into its xterm (the session's first window)."""
        owner_screen.xdotool("mousemove", "100", "100")
        owner_screen.xdotool("type", "--delay", "20",
                             "xterm -bg '#%02x%02x%02x' -geometry 30x8+300+300 &" % colour)
        owner_screen.xdotool("key", "Return")

    def test_choose_among_several(self):
        first_screen, second_screen, viewer_screen = self.screens
        for name, screen in (("first desk", first_screen), ("second desk", second_screen)):
            self.run_client("--name", name, screen=screen)
            screen.wait_for_colour(RED, 20000, timeout=60)
        names = {name: session_id for session_id, (_, _, _, name) in self.sessions().items()}
        self.assertEqual(set(names), {"first desk", "second desk"})

        # No terminal to ask on: the list, and how to name one.
        result = self.client("--shadow", env=self.env(DISPLAY=viewer_screen.name))
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn("several sessions may be shadowed; name one with --shadow ID", result.stderr)
        listed = {line.split()[0]: line for line in result.stdout.splitlines()}
        self.assertEqual(set(listed), set(names.values()))
        self.assertTrue(listed[names["second desk"]].endswith(f"Running second desk {self.user.name}"))

        # On a terminal: asked, and answered with the second one's number.
        controller, terminal = pty.openpty()
        self.addCleanup(os.close, controller)
        viewer = subprocess.Popen(self.argv("--geometry", "800x600", "--shadow"),
                                  env=self.env(DISPLAY=viewer_screen.name), stdin=terminal,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        os.close(terminal)
        self.addCleanup(stop, viewer)
        self.addCleanup(viewer.stderr.close)
        os.write(controller, b"x\n2\n")  # a wrong answer first: asked again
        viewer_screen.wait_for_colour(RED, 20000, timeout=60)
        viewer.send_signal(signal.SIGTERM)
        code, stderr = self.finished(viewer, 60)
        self.assertEqual(code, 0, stderr)
        rows = dict(re.findall(r"^ +(\d)  ([0-9A-F]{32}) ", stderr, re.MULTILINE))
        self.assertEqual(set(rows.values()), set(names.values()))
        self.assertIn("'x' is not one of them", stderr)
        self.assertIn(f"watches {rows['2']} of {self.user.name}", self.gateway.log())
        self.assertNotIn(f"watches {rows['1']} ", self.gateway.log())

    def test_nothing_to_shadow(self):
        result = self.client("--shadow", env=self.env(DISPLAY=self.screen.name))
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn("the server lists no session that you may shadow", result.stderr)
        # ...and what decides it (issue 25).
        self.assertIn("shadow policy allows it ([shadow] allow_own)", result.stderr)
        self.assertIn("([shadow] allow_others: admins or everyone)", result.stderr)


class VNCTests(ClientScreensTestCase):
    """x11vnc with a VNC password, reached by address; the client's screen
    is as big as the VNC host's, so the remote screen shows 1:1."""

    width, height = 1024, 768

    def make_host(self):
        return VNCHost("x11vnc", password=SECRET), {"remote": {"allow_any_host": "yes"}}

    def test_password_from_the_environment(self):
        self.host.set_background(ORANGE)
        typed = os.path.join(self.host.dir, "typed.txt")
        self.host.xterm_typing_into(typed, BLUE)
        client = self.run_client("--vnc", f"127.0.0.1::{self.host.port}", NXGATE_REMOTE_PASSWORD=SECRET)
        self.screen.wait_for_colour(ORANGE, 100000, timeout=60)
        self.screen.wait_for_colour(BLUE, 50000, timeout=30)
        self.assert_remote_screen(self.host.screen)
        self.assert_password_hidden(client, SECRET)
        ((_, (_, session_type, status, _)),) = self.sessions().items()
        self.assertEqual((session_type, status), ("vnc", "Running"))
        # Typing on the client reaches the VNC host's xterm.
        self.screen.xdotool("mousemove", "50", "50")
        self.screen.xdotool("type", "--delay", "30", "through nxgate-client")
        self.screen.xdotool("key", "Return")
        wait_for(lambda: "through nxgate-client" in open(typed).read(), 20, "the typing on the VNC host")

    def test_wrong_password(self):
        result = self.client("--geometry", "800x600", "--vnc", f"127.0.0.1::{self.host.port}",
                             env=self.env(DISPLAY=self.screen.name, NXGATE_REMOTE_PASSWORD="not-" + SECRET))
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn(f"NX> 596 Error: The remote desktop 127.0.0.1:{self.host.port} refused the login:",
                      result.stderr)
        self.assertNotIn(SECRET, self.gateway.log())

    def test_no_password_and_no_terminal_to_ask_on(self):
        logins = self.gateway.log().count("SSH login of ")
        result = self.client("--vnc", f"127.0.0.1::{self.host.port}", env=self.env(DISPLAY=self.screen.name))
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("no password given", result.stderr)
        self.assertEqual(self.gateway.log().count("SSH login of "), logins)  # asked before connecting

class TigerVNCTargetTests(ClientScreensTestCase):
    """Xtigervnc (VNC auth), reached by the name the admin gave it."""

    width, height = 1024, 768

    def make_host(self):
        host = VNCHost("tigervnc", password=SECRET)
        return host, {"remote": {"allow_any_host": "no"},
                      "target lab": {"protocol": "vnc", "host": "127.0.0.1", "port": str(host.port)}}

    def test_password_from_the_environment(self):
        self.host.set_background(ORANGE)
        client = self.run_client("--vnc", "lab", NXGATE_REMOTE_PASSWORD=SECRET)
        self.screen.wait_for_colour(ORANGE, 100000, timeout=60)
        self.assert_remote_screen(self.host.screen)
        self.assert_password_hidden(client, SECRET)

    def test_address_refused_when_only_targets_are_served(self):
        result = self.client("--vnc", f"127.0.0.1::{self.host.port}",
                             env=self.env(DISPLAY=self.screen.name, NXGATE_REMOTE_PASSWORD=SECRET))
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn("is not a remote desktop this server serves. Available: lab (vnc).", result.stderr)


class RDPTests(ClientScreensTestCase):
    """The real xrdp showing its login screen (no user given: nothing to log
    in with, so no password is asked)."""

    width, height = 1024, 768

    def make_host(self):
        host = RDPHost("tls")
        return host, {"remote": {"allow_any_host": "yes"},
                      "target win": {"protocol": "rdp", "host": "127.0.0.1", "port": str(host.port),
                                     "security": "tls"}}

    def check_login_screen(self) -> None:
        """xrdp's desktop colour around its login box, whose top left corner
        is where xrdp puts the 350x430 box on a 1024x768 screen: the remote
        screen at 1:1.  (Its bottom is cut off while the session is 768x576
        on this screen, issue 10's "requested size is ignored".)"""
        self.screen.wait_for_colour(MAGENTA, 250000, timeout=60)
        shot = self.screen.wait_for_colour(GREEN, 50000, timeout=30)
        pixels = np.frombuffer(shot.rgba, np.uint8).reshape(self.height, self.width, 4)[:, :, :3]
        ys, xs = np.nonzero(np.all(pixels == GREEN, axis=2))
        box = (int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1)
        print(f"\n    RDP: login box at {box}, {shot.count(MAGENTA)} desktop pixels")
        self.assertLessEqual(abs(box[0] - (1024 - 350) // 2), 2, box)
        self.assertLessEqual(abs(box[1] - (768 - 430) // 2), 2, box)
        self.assertLessEqual(abs(box[2] - box[0] - 350), 2, box)
        self.assertGreaterEqual(box[3] - box[1], 400, box)

    def test_login_screen_by_address(self):
        self.run_client("--rdp", f"127.0.0.1:{self.host.port}")  # no $NXGATE_REMOTE_PASSWORD: none is asked
        self.check_login_screen()
        ((_, (_, session_type, _, _)),) = self.sessions().items()
        self.assertEqual(session_type, "windows")

    def test_target_by_name(self):
        self.run_client("--rdp", "win")
        self.check_login_screen()


class NLATests(ClientScreensTestCase):
    """A real NLA login (FreeRDP's shadow server with a SAM file): the user
    and the password from $NXGATE_REMOTE_PASSWORD must be right."""

    width, height = 1024, 768

    def setUp(self):
        if not NLAHost.available:
            raise SkipTest("freerdp-shadow-cli (Debian package freerdp2-shadow-x11) is not installed")
        super().setUp()

    def make_host(self):
        host = NLAHost("carol", SECRET, SKY, self.width, self.height)
        return host, {"target nla": {"protocol": "rdp", "host": "127.0.0.1", "port": str(host.port),
                                     "security": "nla"}}

    def test_user_and_password(self):
        client = self.run_client("--rdp", "nla", "--remote-user", "carol", NXGATE_REMOTE_PASSWORD=SECRET)
        self.screen.wait_for_colour(SKY, self.width * self.height // 2, timeout=60)
        self.assert_password_hidden(client, SECRET)

    def test_wrong_password(self):
        result = self.client("--geometry", "800x600", "--rdp", "nla", "--remote-user", "carol",
                             env=self.env(DISPLAY=self.screen.name, NXGATE_REMOTE_PASSWORD="not-" + SECRET))
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn("NX> 596 Error: The remote desktop nla refused the login", result.stderr)
