"""End to end: shadowing with real agents, real screens and a real consent dialog."""

from __future__ import annotations

import os
import pwd
import re
import subprocess
import time

from tests.harness import pixels
from tests.harness.pixels import Pattern, Rect
from tests.harness.process import stop, wait_for
from tests.harness.ssh import SessionInfo
from tests.harness.users import create_user
from tests.harness.x11 import ClientScreen
from tests.test_e2e_sessions import RED, SessionTestCase
from tests.test_e2e_text import XFT_TERM, InSession, shows_text

TK_GREY = (217, 217, 217)  # the consent dialog's background
ADMINS = "nxgatetestadmins"


class ShadowTestCase(SessionTestCase):
    """alice (self.user) owns sessions; bob (self.other) is a shadowing admin."""

    options = {"shadow": {"admin_groups": ADMINS, "consent_timeout": "8"}}

    def setUp(self):
        super().setUp()
        subprocess.run(["groupadd", "-f", ADMINS], check=True)
        subprocess.run(["usermod", "-aG", ADMINS, self.other.name], check=True)
        self.viewer_screen = ClientScreen(800, 600)
        self.addCleanup(self.viewer_screen.close)

    def master(self, extra=""):
        client = self.login()
        info = self.start(client, "unix-application" if extra else "unix-console", extra=extra)
        self.attach(client, info)
        self.screen.wait_for_colour(RED if not extra else (0, 255, 0), 10000)
        return info

    def shadow_rows(self, user) -> dict[str, str]:
        reply = self.login(user).command('listsession --type="shadow"')
        self.assertTrue(reply.endswith(b"NX> 105 "))
        self.assertNotIn(b"NX> 148", reply)
        rows = re.findall(rb"^\d+\s+[\w-]+\s+([0-9A-F]{32})\s+[A-Z-]{8}\s+\d+\s+\d+x\d+\s+(\w+)\s+(\S.*)$", reply,
                          re.MULTILINE)
        return {sid.decode(): name.decode() for sid, _status, name in rows}

    def attach_shadow(self, user, target_id, extra="", answer=None) -> bytes:
        """Send attachsession; answer the owner's dialog with ``answer`` (a key) if given."""
        client = self.login(user)
        client.send(f'attachsession --type="shadow" --id="{target_id}" --display="0" '
                    f'--geometry="800x600" --link="lan" --encryption="1" {extra}')
        if answer is not None:
            client.expect(b"NX> 726 Asking user for authorization to attach to session\n")
            self.screen.wait_for_colour(TK_GREY, 2000, timeout=20)
            time.sleep(0.5)
            self.screen.xdotool("key", answer)
        reply = client.prompt(timeout=40)
        self.shadow_client = client
        return reply


class OwnSessionTests(ShadowTestCase):
    def test_same_user_shadow_mirrors_the_master(self):
        info = self.master()
        rows = self.shadow_rows(self.user)
        self.assertIn(info.session_id, rows)
        self.assertEqual(rows[info.session_id].split()[-1], self.user.name)  # OpenNX reads the owner here
        reply = self.attach_shadow(self.user, info.session_id)
        self.assertNotIn(b"NX> 726", reply)  # one's own session: no question
        shadow = SessionInfo.parse(reply)
        self.assertNotEqual(shadow.cookie, info.cookie)  # the viewer never gets the master's cookie
        self.attach(self.shadow_client, shadow, self.viewer_screen)
        self.viewer_screen.wait_for_colour(RED, 10000)
        self.assertIn(f"shadow attach: {self.user.name} from 127.0.0.1 watches {info.session_id}", self.gateway.log())

    def test_shadow_ends_with_the_master(self):
        info = self.master()
        shadow = SessionInfo.parse(self.attach_shadow(self.user, info.session_id))
        attachment = self.attach(self.shadow_client, shadow, self.viewer_screen)
        self.viewer_screen.wait_for_colour(RED, 10000)
        self.login().command(f'terminate --sessionid="{info.session_id}"', timeout=30)
        wait_for(lambda: attachment.proxy.poll() is not None, 30, "the shadow viewer to be dropped")
        wait_for(lambda: "shadow detach" in self.gateway.log(), 20, "the detach in the audit log")
        self.assertNotIn(shadow.session_id, self.listing())

    def test_interactive_and_view_only(self):
        typed = os.path.join(self.user.home, "typed.txt")
        info = self.master(f'--application="xterm -bg #00ff00 -geometry 80x30+0+0 -e sh -c \'cat > {typed}\'"')
        self.screen.xdotool("mousemove", "100", "100")
        view_only = SessionInfo.parse(self.attach_shadow(self.user, info.session_id, '--viewonly="1"'))
        attachment = self.attach(self.shadow_client, view_only, self.viewer_screen)
        self.viewer_screen.wait_for_colour((0, 255, 0), 10000)
        self.viewer_screen.xdotool("mousemove", "100", "100")
        self.viewer_screen.xdotool("type", "--delay", "30", "watching only")
        self.viewer_screen.xdotool("key", "Return")
        time.sleep(3)
        self.assertNotIn("watching", open(typed).read() if os.path.exists(typed) else "")
        attachment.detach()
        wait_for(lambda: len([p for p in self.listing().values()]) == 1, 20, "the view-only shadow to end")
        interactive = SessionInfo.parse(self.attach_shadow(self.user, info.session_id))
        self.attach(self.shadow_client, interactive, self.viewer_screen)
        self.viewer_screen.wait_for_colour((0, 255, 0), 10000)
        self.viewer_screen.xdotool("mousemove", "100", "100")
        self.viewer_screen.xdotool("type", "--delay", "30", "helping")
        self.viewer_screen.xdotool("key", "Return")
        wait_for(lambda: os.path.exists(typed) and "helping" in open(typed).read(), 15, "the viewer's typing")


class ConsentTests(ShadowTestCase):
    def test_admin_with_consent(self):
        info = self.master()
        self.assertIn(info.session_id, self.shadow_rows(self.other))
        reply = self.attach_shadow(self.other, info.session_id, answer="a")  # fails without NX> 726
        shadow = SessionInfo.parse(reply)
        self.attach(self.shadow_client, shadow, self.viewer_screen)
        self.viewer_screen.wait_for_colour(RED, 10000)
        self.assertIn(f"shadow attach: {self.other.name} from 127.0.0.1 watches {info.session_id} of "
                      f"{self.user.name}", self.gateway.log())
        # The shadow runs as the owner, never as root.
        shadow_agents = subprocess.run(["pgrep", "-u", self.user.name, "-f", f"nxagent.*:{shadow.display}$"],
                                       capture_output=True, text=True).stdout.split()
        self.assertEqual(len(shadow_agents), 1)

    def test_owner_refuses(self):
        info = self.master()
        reply = self.attach_shadow(self.other, info.session_id, answer="r")
        self.assertIn(f"NX> 596 Error: Authorization refused by user: {self.user.name}.\n".encode(), reply)
        self.assertIn(b"NX> 500 ERROR: Last operation failed.", reply)

    def test_owner_does_not_answer(self):
        info = self.master()
        started = time.monotonic()
        reply = self.attach_shadow(self.other, info.session_id)
        self.assertGreaterEqual(time.monotonic() - started, 7.5)
        self.assertIn(f"NX> 596 Error: Authorization refused by user: {self.user.name}. "
                      "(no answer within 8 seconds)".encode(), reply)

    def test_policy_denies_plain_users(self):
        info = self.master()
        carol = create_user()
        self.addCleanup(carol.remove)
        self.assertNotIn(info.session_id, self.shadow_rows(carol))
        reply = self.attach_shadow(carol, info.session_id)
        self.assertIn(f"NX> 596 Error: Could not find shadowed session {info.session_id}. Session failed.".encode(),
                      reply)
        self.assertNotIn(b"NX> 726", reply)


class ConsoleTests(ShadowTestCase):
    """An Xvfb run by a user stands in for the machine's console."""

    CONSOLE = 4690  # outside every range of displays the other modules' gateways and client screens use
    options = {"shadow": {"admin_groups": ADMINS, "console_display": f":{CONSOLE}", "consent_timeout": "8"}}

    def setUp(self):
        super().setUp()
        entry = pwd.getpwnam(self.user.name)
        self.console = subprocess.Popen(
            ["Xvfb", f":{self.CONSOLE}", "-screen", "0", "800x600x24", "-nolisten", "tcp", "-noreset"],
            user=entry.pw_uid, group=entry.pw_gid, extra_groups=[], cwd="/",
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.addCleanup(stop, self.console)
        env = dict(os.environ, DISPLAY=f":{self.CONSOLE}")
        wait_for(lambda: subprocess.run(["xdpyinfo"], env=env, capture_output=True).returncode == 0, 15, "the console")
        subprocess.run(["xsetroot", "-solid", "#00ff00"], env=env, check=True)

    def test_console_owner_and_admin(self):
        rows = self.shadow_rows(self.user)
        (console_id,) = [sid for sid, name in rows.items() if name.startswith(f"Console :{self.CONSOLE}")]
        self.assertEqual(rows[console_id].split()[-1], self.user.name)
        shadow = SessionInfo.parse(self.attach_shadow(self.user, console_id))
        attachment = self.attach(self.shadow_client, shadow, self.viewer_screen)
        self.viewer_screen.wait_for_colour((0, 255, 0), 50000)
        attachment.detach()
        # An admin is asked for: the dialog appears on the console itself.
        client = self.login(self.other)
        client.send(f'attachsession --type="shadow" --id="{console_id}" --encryption="1"')
        client.expect(b"NX> 726 ")
        env = dict(os.environ, DISPLAY=f":{self.CONSOLE}")
        wait_for(lambda: subprocess.run(["xdotool", "search", "--name", "nxgate: shadowing request"], env=env,
                                        capture_output=True).returncode == 0, 20, "the dialog on the console")
        time.sleep(0.5)
        subprocess.run(["xdotool", "key", "a"], env=env, check=True)
        self.assertIn(b"NX> 710", client.prompt(timeout=40))

    def test_console_hidden_from_plain_users(self):
        carol = create_user()
        self.addCleanup(carol.remove)
        self.assertFalse(any(name.startswith("Console") for name in self.shadow_rows(carol).values()))


class ShadowPictureTests(InSession, ShadowTestCase):
    """The viewer sees the whole watched screen: 1:1 when his window has
    room for it, uniformly scaled to fit when it has not; never a crop.

    The watched screen is a console (an Xvfb of a chosen size, run by the
    user) showing a test card; the viewer's screen has a window manager,
    as a user's desktop has."""

    CONSOLE = 4692  # outside every range of displays the other modules' gateways and client screens use
    options = {"shadow": {"admin_groups": ADMINS, "console_display": f":{CONSOLE}", "consent_timeout": "8"}}

    def start_console(self, width: int, height: int) -> Pattern:
        entry = pwd.getpwnam(self.user.name)
        console = subprocess.Popen(
            ["Xvfb", f":{self.CONSOLE}", "-screen", "0", f"{width}x{height}x24", "-nolisten", "tcp", "-noreset"],
            user=entry.pw_uid, group=entry.pw_gid, extra_groups=[], cwd="/",
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.addCleanup(stop, console)
        env = dict(os.environ, DISPLAY=f":{self.CONSOLE}")
        wait_for(lambda: subprocess.run(["xdpyinfo"], env=env, capture_output=True).returncode == 0, 15, "the console")
        pattern = Pattern(width, height)
        pixels.paint_root(f":{self.CONSOLE}", None, pattern, self.gateway.workdir)
        card = pixels.grab(f":{self.CONSOLE}")
        self.assertEqual(pattern.mismatches(card, Rect(0, 0, width, height)), [])  # the card is up
        return pattern

    def watch(self, viewer: ClientScreen, geometry: str) -> None:
        """Shadow the console from ``viewer`` asking for a ``geometry`` window."""
        wm = pixels.start_window_manager(viewer.name)
        self.addCleanup(stop, wm)
        (console_id,) = [sid for sid, name in self.shadow_rows(self.user).items() if name.startswith("Console")]
        client = self.login()
        client.send(f'attachsession --type="shadow" --id="{console_id}" --display="0" --geometry="{geometry}" '
                    f'--screeninfo="{viewer.width}x{viewer.height}x24+render" --link="lan" --encryption="1"')
        shadow = SessionInfo.parse(client.prompt(timeout=40))
        self.attach(client, shadow, viewer)

    @staticmethod
    def window(viewer: ClientScreen) -> Rect:
        """Where the NX window is now (the window manager moves it into its frame)."""
        return pixels.find_window(viewer.name, "NX - ", min_size=64) or Rect(0, 0, 0, 0)

    def saved(self, shot, name: str) -> str:
        return pixels.save_png(shot, os.path.join(self.gateway.workdir, f"{self.id().rsplit('.', 1)[-1]}-{name}.png"))

    def keep(self, viewer: ClientScreen) -> None:
        """With NXGATE_KEEP_TEST_DIRS, keep the viewer's picture to look at."""
        if os.environ.get("NXGATE_KEEP_TEST_DIRS"):
            print(f"\n    viewer's picture: {self.saved(viewer.shot(), 'viewer')}")

    def test_whole_screen_at_one_to_one_when_the_window_has_room(self):
        self.start_console(640, 480)
        viewer = ClientScreen(1024, 768)
        self.addCleanup(viewer.close)
        self.watch(viewer, "1000x700")
        watched = pixels.grab(f":{self.CONSOLE}")
        shares: list[float] = [0.0]

        def same() -> bool:
            window = self.window(viewer)
            shares[:] = [pixels.equal_share(pixels.crop(viewer.shot(), window), watched)]
            return (window.width, window.height) == (640, 480) and shares[0] >= 0.99

        try:
            wait_for(same, 20, "the watched screen at 1:1 in the viewer's window", interval=0.3)
        except AssertionError:
            raise AssertionError(f"only {shares[0]:.1%} of the pixels equal in {self.window(viewer)}; viewer: "
                                 f"{self.saved(viewer.shot(), 'viewer')}") from None
        self.keep(viewer)

    def test_a_session_at_one_to_one(self):
        """A session (an nxagent, which wants its cookie) as the watched screen."""
        info = self.master()
        authority = os.path.join(self.gateway.state_dir, "sessions", info.session_id, "authority")
        master = pixels.grab(f":{info.display}", authority)
        pixels.paint_root(f":{info.display}", authority, Pattern(master.width, master.height), self.gateway.workdir)
        viewer = ClientScreen(1024, 768)
        self.addCleanup(viewer.close)
        wm = pixels.start_window_manager(viewer.name)
        self.addCleanup(stop, wm)
        client = self.login()
        client.send(f'attachsession --type="shadow" --id="{info.session_id}" --display="0" --geometry="1000x700" '
                    f'--link="lan" --encryption="1"')
        self.attach(client, SessionInfo.parse(client.prompt(timeout=40)), viewer)
        shares: list[float] = [0.0]

        def same() -> bool:
            window, watched = self.window(viewer), pixels.grab(f":{info.display}", authority)
            shares[:] = [pixels.equal_share(pixels.crop(viewer.shot(), window), watched)]
            return (window.width, window.height) == (watched.width, watched.height) and shares[0] >= 0.99

        try:
            wait_for(same, 20, "the session at 1:1 in the viewer's window", interval=0.3)
        except AssertionError:
            raise AssertionError(f"only {shares[0]:.1%} of the pixels equal in {self.window(viewer)}; viewer: "
                                 f"{self.saved(viewer.shot(), 'viewer')}") from None
        self.assertIn(f"shadow of :{info.display} ({master.width}x{master.height})", self.gateway.log())
        self.keep(viewer)

    def test_an_xfce_desktop_with_its_text(self):
        """The helper sees the desktop the owner sees, text included: the
        shadow reads the watched agent's framebuffer, which XFIXES made
        show the wallpaper where a terminal was."""
        client = self.login()
        info = self.start(client, "unix-xfce")
        self.attach(client, info)
        self.wait_for_xfce(info)
        _, region = self.show_text(info, XFT_TERM, "nxgate-shadow-text")
        authority = self.authority(info)
        wait_for(lambda: shows_text(pixels.crop(pixels.grab(f":{info.display}", authority), region)), 20,
                 "the text in the watched session's framebuffer", interval=0.5)
        viewer = ClientScreen(1024, 768)
        self.addCleanup(viewer.close)
        wm = pixels.start_window_manager(viewer.name)
        self.addCleanup(stop, wm)
        shadow_client = self.login()
        shadow_client.send(f'attachsession --type="shadow" --id="{info.session_id}" --display="0" '
                           f'--geometry="1000x700" --link="lan" --encryption="1"')
        self.attach(shadow_client, SessionInfo.parse(shadow_client.prompt(timeout=40)), viewer)
        shares: list[float] = [0.0]

        def same() -> bool:
            window, watched = self.window(viewer), pixels.grab(f":{info.display}", authority)
            seen = pixels.crop(viewer.shot(), window)
            shares[:] = [pixels.equal_share(seen, watched)]
            text = pixels.crop(seen, region)
            return shares[0] >= 0.99 and shows_text(text)

        try:
            wait_for(same, 30, "the XFCE desktop and its text in the viewer's window", interval=0.5)
        except AssertionError:
            raise AssertionError(f"only {shares[0]:.1%} of the pixels equal in {self.window(viewer)}; viewer: "
                                 f"{self.saved(viewer.shot(), 'viewer')}") from None
        self.keep(viewer)

    def test_whole_screen_scaled_to_fit_a_smaller_window(self):
        pattern = self.start_console(1024, 768)
        viewer = ClientScreen(800, 600)
        self.addCleanup(viewer.close)
        self.watch(viewer, "800x560")
        wrong: list = []

        def complete() -> bool:
            window = self.window(viewer)
            wrong[:] = pattern.mismatches(viewer.shot(), window)
            # 746x560: the card's aspect, inside the window asked for
            return (window.width, window.height) == pixels.fit(1024, 768, 800, 560) and not wrong

        try:
            wait_for(complete, 20, "the whole test card, scaled, in the viewer's window", interval=0.3)
        except AssertionError:
            raise AssertionError(f"{len(wrong)} probes wrong in {self.window(viewer)}, e.g. {wrong[:3]}; viewer: "
                                 f"{self.saved(viewer.shot(), 'viewer')}") from None
        self.keep(viewer)
