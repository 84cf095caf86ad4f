"""The RDP viewer engine (``python -m nxgate.clients.engines.rdp``): its pure parts,
then the real program against a real xrdp and against broken servers, and
xfreerdp (the native engine) against the same xrdp.

The picture to look for is xrdp's login screen in the colours
:class:`~tests.harness.rdphost.RDPHost` configures (magenta desktop, green
login box); typed text shows up as dark pixels in its username field.
xrdp has no NLA: the NLA tests use FreeRDP's shadow server (Debian package
freerdp2-shadow-x11) and are skipped without it.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from OpenSSL import SSL
from twisted.internet.error import ConnectionDone
from twisted.python.failure import Failure
from twisted.trial.unittest import SkipTest, SynchronousTestCase, TestCase

from nxgate.clients.engines import rdp
from tests.harness.process import wait_for
from tests.harness.rdphost import (GREEN, MAGENTA, PASSWORD_FIELD, USERNAME_FIELD, X224_CONFIRM_TLS, NLAHost,
                                   RDPHost, ScriptedServer, free_port, rdp_viewer, silent_listener, xfreerdp)
from tests.harness.x11 import ClientScreen, Screenshot
from tests.harness.clock import FakeReactor

FULL = 1024 * 768
SECRET = "pw-Zq8x!s3cret"


def dark_pixels(shot: Screenshot, rect: tuple[int, int, int, int]) -> int:
    """Pixels darker than mid-grey inside ``rect`` (x, y, w, h): text in a white field."""
    x, y, w, h = rect
    pixels = np.frombuffer(shot.rgba, np.uint8).reshape(shot.height, shot.width, 4)[y : y + h, x : x + w, :3]
    return int((pixels.astype(int).sum(axis=2) < 384).sum())


def colour_near(shot: Screenshot, colour: tuple[int, int, int], tolerance: int = 8) -> int:
    """Pixels within ``tolerance`` of ``colour`` in every channel."""
    pixels = np.frombuffer(shot.rgba, np.uint8).reshape(-1, 4)[:, :3].astype(int)
    return int((np.abs(pixels - np.array(colour)) <= tolerance).all(axis=1).sum())


# -- the pure parts

class KeyboardLayoutTests(SynchronousTestCase):
    def test_nx_values(self):
        self.assertEqual(rdp.keyboard_layout("pc105/de"), "GERMAN")
        self.assertEqual(rdp.keyboard_layout("pc105/fr"), "FRENCH")
        self.assertEqual(rdp.keyboard_layout("pc105/us"), "US")
        self.assertEqual(rdp.keyboard_layout("jp"), "JAPANESE")

    def test_variants_and_lists_use_the_first_layout(self):
        self.assertEqual(rdp.keyboard_layout("pc105/de(nodeadkeys)"), "GERMAN")
        self.assertEqual(rdp.keyboard_layout("pc104/it,us"), "ITALIAN")
        self.assertEqual(rdp.keyboard_layout(" pc105/DK "), "DANISH")

    def test_unknown_layouts_fall_back_to_us(self):
        for value in ("pc105/gb", "", "pc105/", "query", "pc105/xx"):
            self.assertEqual(rdp.keyboard_layout(value), "US", value)

    def test_every_target_is_a_layout_rdpy_knows(self):
        for name in rdp.LAYOUTS.values():
            self.assertTrue(hasattr(rdp.gcc.KeyboardLayout, name), name)


class ScancodeTests(SynchronousTestCase):
    """X keycodes of an evdev keymap (Xvfb, Xorg, nxagent with a Linux client)."""

    def test_main_block_is_the_evdev_code(self):
        self.assertEqual(rdp.scancode(9), (0x01, False))    # Escape
        self.assertEqual(rdp.scancode(38), (0x1E, False))   # a
        self.assertEqual(rdp.scancode(50), (0x2A, False))   # Shift_L
        self.assertEqual(rdp.scancode(37), (0x1D, False))   # Control_L
        self.assertEqual(rdp.scancode(64), (0x38, False))   # Alt_L
        self.assertEqual(rdp.scancode(94), (0x56, False))   # the ISO key left of Z
        self.assertEqual(rdp.scancode(96), (0x58, False))   # F12
        self.assertEqual(rdp.scancode(87), (0x4F, False))   # KP_End (keypad 1)

    def test_extended_keys(self):
        expected = {111: 0x48, 116: 0x50, 113: 0x4B, 114: 0x4D,   # arrows
                    110: 0x47, 115: 0x4F, 112: 0x49, 117: 0x51,   # Home End Prior Next
                    118: 0x52, 119: 0x53,                         # Insert Delete
                    105: 0x1D, 108: 0x38,                         # Control_R, Alt_R (AltGr)
                    104: 0x1C, 106: 0x35,                         # KP_Enter, KP_Divide
                    133: 0x5B, 134: 0x5C, 135: 0x5D, 107: 0x37}   # Super_L/R, Menu, Print
        for keycode, code in expected.items():
            self.assertEqual(rdp.scancode(keycode), (code, True), keycode)

    def test_keys_without_a_scancode(self):
        for keycode in (0, 8, 92, 127, 255):  # nothing, nothing, evdev 84, Pause, beyond
            self.assertIsNone(rdp.scancode(keycode), keycode)


def planar(rows: list[list[tuple[int, int, int]]]) -> bytes:
    """A 32 bpp planar (RLE flag, no alpha) bitmap with raw runs only:
    rows bottom-up as on the wire, each plane's later rows as deltas."""
    out = bytearray([0x30])
    for channel in (0, 1, 2):  # red, green, blue planes
        previous = None
        for row in rows:
            values = [pixel[channel] for pixel in row]
            out.append(len(values) << 4)
            if previous is None:
                out += bytes(values)
            else:
                for value, above in zip(values, previous):
                    delta = (value - above + 128) % 256 - 128
                    out.append(2 * delta if delta >= 0 else -2 * delta - 1)
            previous = values
    return bytes(out)


class DecodeTests(SynchronousTestCase):
    def test_32bpp_uncompressed_is_bottom_up(self):
        data = bytes([1, 2, 3, 0, 4, 5, 6, 0]) + bytes([7, 8, 9, 0, 10, 11, 12, 0])  # bottom row first
        pixels = rdp.decode(2, 2, 32, 0, data)
        self.assertEqual(pixels.shape, (2, 2, 4))
        self.assertEqual(pixels[0, :, :3].tolist(), [[7, 8, 9], [10, 11, 12]])
        self.assertEqual(pixels[1, :, :3].tolist(), [[1, 2, 3], [4, 5, 6]])

    def test_32bpp_rle_is_bottom_up_bgrx(self):
        red, blue, grey, white = (255, 0, 0), (0, 0, 255), (100, 120, 140), (255, 255, 255)
        pixels = rdp.decode(2, 2, 32, 1, planar([[red, blue], [grey, white]]))
        self.assertEqual(pixels[0, :, :3].tolist(), [[140, 120, 100], [255, 255, 255]])  # top row, BGR
        self.assertEqual(pixels[1, :, :3].tolist(), [[0, 0, 255], [255, 0, 0]])

    def test_gfx_is_top_down(self):
        data = bytes(range(16))
        self.assertEqual(rdp.decode(2, 2, 32, "gfx", data).tobytes(), data)

    def test_24bpp_uncompressed_rows_are_padded_and_bottom_up(self):
        bottom = bytes([1, 2, 3]) + b"\0"   # 1 pixel = 3 bytes, padded to 4
        top = bytes([4, 5, 6]) + b"\0"
        pixels = rdp.decode(1, 2, 24, 0, bottom + top)
        self.assertEqual(pixels[:, 0, :3].tolist(), [[4, 5, 6], [1, 2, 3]])

    def test_16bpp_is_rgb565(self):
        words = [0xF800, 0x07E0, 0x001F, 0xFFFF]  # red, green, blue, white; one row of 4
        pixels = rdp.decode(4, 1, 16, 0, np.array(words, "<u2").tobytes())
        self.assertEqual(pixels[0, :, :3].tolist(), [[0, 0, 255], [0, 255, 0], [255, 0, 0], [255, 255, 255]])

    def test_15bpp_is_rgb555(self):
        pixels = rdp.decode(2, 1, 15, 0, np.array([0x7C00, 0x03E0], "<u2").tobytes())
        self.assertEqual(pixels[0, :, :3].tolist(), [[0, 0, 255], [0, 255, 0]])

    def test_short_data_is_an_error(self):
        self.assertRaises(ValueError, rdp.decode, 64, 64, 32, 0, b"\0" * 100)


class ErrorKindTests(SynchronousTestCase):
    def test_lost_connection_by_stage(self):
        done = Failure(ConnectionDone())
        self.assertEqual(rdp.lost_error("negotiate", done).kind, "protocol")
        self.assertEqual(rdp.lost_error("tls", done).kind, "tls")
        self.assertEqual(rdp.lost_error("nla", done).kind, "protocol")
        self.assertEqual(rdp.lost_error("nla-auth", done).kind, "auth")
        self.assertEqual(rdp.lost_error("rdp", done).kind, "protocol")

    def test_ssl_errors_are_tls(self):
        failure = Failure(SSL.Error([("SSL routines", "", "wrong version number")]))
        error = rdp.lost_error("rdp", failure)
        self.assertEqual((error.kind, error.message), ("tls", "TLS handshake failed (wrong version number)"))

    def test_negotiation_failures(self):
        error = rdp.stack_error(rdp.RDPSecurityNegoFail("negotiation failure code 5"))
        self.assertEqual(error.kind, "tls")
        self.assertIn("NLA", error.message)
        self.assertEqual(rdp.stack_error(ValueError("bad")).kind, "protocol")


class FakeController:
    def __init__(self) -> None:
        self._gfxPending = True
        self.sent: list[tuple] = []

    def sendKeyEventScancode(self, *args):
        self.sent.append(("key", *args))

    def sendPointerEvent(self, *args):
        self.sent.append(("pointer", *args))

    def sendWheelEvent(self, *args):
        self.sent.append(("wheel", *args))


class InputQueueTests(SynchronousTestCase):
    """Input that arrives while rdpy still blocks it waits, in order, motion coalesced."""

    def setUp(self):
        self.clock = FakeReactor()
        args = argparse.Namespace(geometry="1024x768", timeout=10.0)
        self.viewer = rdp.Viewer(self.clock, args, "", status=None)
        self.viewer.controller = self.controller = FakeController()

    def test_held_until_rdpy_lets_input_through(self):
        send = self.viewer.send
        send("pointer", 1, 1, 0, False)
        send("pointer", 2, 2, 0, False)
        send("key", 0x1E, True, False)
        send("pointer", 3, 3, 1, True)
        send("pointer", 4, 4, 0, False)
        self.clock.advance(1)
        self.assertEqual(self.controller.sent, [])
        self.controller._gfxPending = False
        self.clock.advance(0.2)
        self.assertEqual(self.controller.sent, [("pointer", 2, 2, 0, False), ("key", 0x1E, True, False),
                                                ("pointer", 3, 3, 1, True), ("pointer", 4, 4, 0, False)])
        send("wheel", 5, 5, -120, False)
        self.assertEqual(self.controller.sent[-1], ("wheel", 5, 5, -120, False))

    def test_bounded(self):
        for number in range(rdp.MAX_PENDING + 50):
            self.viewer.send("key", 0x1E, number % 2 == 0, False)
        self.assertEqual(len(self.viewer.pending), rdp.MAX_PENDING)
        self.viewer.timer.cancel()


class Event:
    def __init__(self, type: int, detail: int = 0, x: int = 0, y: int = 0) -> None:
        self.type, self.detail, self.event_x, self.event_y = type, detail, x, y


class InputMappingTests(SynchronousTestCase):
    """X events -> rdpy calls (once rdpy lets input through)."""

    def setUp(self):
        from Xlib import X

        self.X = X
        args = argparse.Namespace(geometry="1024x768", timeout=10.0)
        self.viewer = rdp.Viewer(FakeReactor(), args, "", status=None)
        self.viewer.controller = self.controller = FakeController()
        self.controller._gfxPending = False
        self.viewer.canvas = argparse.Namespace(X=X)

    def events(self, *events: Event) -> list[tuple]:
        for event in events:
            self.viewer.x_event(event)
        sent, self.controller.sent = self.controller.sent, []
        return sent

    def test_buttons(self):
        X = self.X
        self.assertEqual(self.events(Event(X.ButtonPress, 1, 10, 20), Event(X.ButtonRelease, 1, 10, 20)),
                         [("pointer", 10, 20, 1, True), ("pointer", 10, 20, 1, False)])
        self.assertEqual(self.events(Event(X.ButtonPress, 2, 1, 1), Event(X.ButtonPress, 3, 1, 1)),
                         [("pointer", 1, 1, 3, True), ("pointer", 1, 1, 2, True)])  # middle, right
        self.assertEqual(self.events(Event(X.ButtonPress, 8, 1, 1), Event(X.ButtonPress, 9, 1, 1)),
                         [("pointer", 1, 1, 4, True), ("pointer", 1, 1, 5, True)])  # back, forward

    def test_wheel_on_press_only(self):
        X = self.X
        sent = self.events(*(Event(kind, button, 5, 6) for button in (4, 5, 6, 7)
                             for kind in (X.ButtonPress, X.ButtonRelease)))
        self.assertEqual(sent, [("wheel", 5, 6, 120, False), ("wheel", 5, 6, -120, False),
                                ("wheel", 5, 6, -120, True), ("wheel", 5, 6, 120, True)])

    def test_motion_is_clipped_to_the_remote_screen(self):
        X = self.X
        self.assertEqual(self.events(Event(X.MotionNotify, 0, 2000, -5)), [("pointer", 1023, 0, 0, False)])

    def test_keys_and_focus_out(self):
        X = self.X
        sent = self.events(Event(X.KeyPress, 114), Event(X.KeyPress, 50), Event(X.KeyPress, 127), Event(X.FocusOut))
        self.assertEqual(sent, [("key", 0x4D, True, True), ("key", 0x2A, True, False),  # Right, Shift_L; not Pause
                                ("key", 0x2A, False, False), ("key", 0x4D, False, True)])  # released on FocusOut
        self.assertEqual(self.events(Event(X.KeyRelease, 114)), [("key", 0x4D, False, True)])


# -- the real program

class ViewerTestCase(TestCase):
    timeout = 120

    def screen(self, width: int = 1024, height: int = 768) -> ClientScreen:
        screen = ClientScreen(width, height)
        self.addCleanup(screen.close)
        return screen

    def host(self, security: str = "tls") -> RDPHost:
        host = RDPHost(security)
        self.addCleanup(host.close)
        return host

    def viewer(self, port: int, display: str, **options):
        viewer = rdp_viewer(port, display, **options)
        self.addCleanup(viewer.close)
        return viewer

    def assertFails(self, viewer, kind: str, code: int, within: float) -> str:
        """The status line is ``error KIND: ...`` and the viewer exits with ``code`` by itself.
        ``within``: how long that takes; the waits are deadlines with room for a loaded machine
        (a viewer that hangs fails them), and the kind says which of its limits ended it."""
        line = viewer.status_line(within + 30)
        self.assertTrue(line.startswith(f"error {kind}: "), line)
        self.assertEqual(viewer.wait(5), code, viewer.output())
        return line


class LoginScreenTests(ViewerTestCase):
    def test_ready_then_the_picture_only_after_sigusr1(self):
        host, screen = self.host(), self.screen()
        viewer = self.viewer(host.port, screen.name)
        self.assertEqual(viewer.status_line(20), "ready 1024x768")
        time.sleep(2)  # the whole login screen has arrived by now, into memory only
        self.assertEqual(screen.shot().count(MAGENTA), 0)
        viewer.attach()
        shot = screen.wait_for_colour(MAGENTA, FULL // 2, timeout=20)
        self.assertGreater(shot.count(GREEN), 90_000)  # the login box (350x430 less its contents)
        self.assertIsNone(viewer.poll())
        self.assertEqual(viewer.output()[0], "")  # nothing on stdout (rdpy prints there)

    def test_typing_and_clicking_reach_the_login_box(self):
        """Keys typed at once wait out rdpy's input block, later ones go straight through."""
        host, screen = self.host(), self.screen()
        viewer = self.viewer(host.port, screen.name, attach_now=True)
        self.assertEqual(viewer.status_line(20), "ready 1024x768")
        blank = screen.wait_for_colour(MAGENTA, FULL // 2, timeout=20)
        self.assertLess(dark_pixels(blank, USERNAME_FIELD), 40)  # at most the caret
        screen.xdotool("type", "--delay", "30", "wwwww")  # within the first 5 s: queued
        wait_for(lambda: dark_pixels(screen.shot(), USERNAME_FIELD) > 120, 20, "text in the username field",
                 interval=0.2)
        screen.xdotool("key", "--delay", "30", "Home", *["Delete"] * 5)  # extended keys (E0 prefix)
        wait_for(lambda: dark_pixels(screen.shot(), USERNAME_FIELD) < 40, 15, "the username field to be empty again",
                 interval=0.2)
        empty = dark_pixels(screen.shot(), PASSWORD_FIELD)
        screen.xdotool("mousemove", str(PASSWORD_FIELD[0] + 100), str(PASSWORD_FIELD[1] + 8), "click", "1")
        screen.xdotool("type", "--delay", "30", "abcdef")  # the password field shows stars
        wait_for(lambda: dark_pixels(screen.shot(), PASSWORD_FIELD) > empty + 60, 15, "stars in the password field",
                 interval=0.2)

    def test_geometry_and_keyboard_reach_the_server(self):
        host, screen = self.host(), self.screen(800, 600)
        viewer = self.viewer(host.port, screen.name, attach_now=True, extra=("--geometry", "800x600",
                                                                             "--keyboard", "pc105/de"))
        self.assertEqual(viewer.status_line(20), "ready 800x600")
        screen.wait_for_colour(MAGENTA, 800 * 600 // 3, timeout=20)
        wait_for(lambda: "keylayout:[0x00000407]" in host.server_log(), 10, "xrdp to log the German layout")

    def test_negotiate_server(self):
        host, screen = self.host("negotiate"), self.screen()
        viewer = self.viewer(host.port, screen.name, attach_now=True)
        self.assertEqual(viewer.status_line(20), "ready 1024x768")
        screen.wait_for_colour(MAGENTA, FULL // 2, timeout=20)

    def test_server_killed_while_drawing(self):
        host, screen = self.host(), self.screen()
        viewer = self.viewer(host.port, screen.name, attach_now=True)
        self.assertEqual(viewer.status_line(20), "ready 1024x768")
        screen.wait_for_colour(MAGENTA, FULL // 2, timeout=20)
        host.kill()
        self.assertEqual(viewer.wait(10), 0)
        self.assertIn("the RDP server closed the connection", viewer.output()[1])

    def test_display_gone(self):
        host, screen = self.host(), self.screen()
        viewer = self.viewer(host.port, screen.name, attach_now=True)
        self.assertEqual(viewer.status_line(20), "ready 1024x768")
        screen.wait_for_colour(MAGENTA, FULL // 2, timeout=20)
        screen.close()
        self.assertEqual(viewer.wait(10), 0)
        self.assertIn("the X display closed", viewer.output()[1])

    def test_password_stays_secret(self):
        host, screen = self.host(), self.screen()
        viewer = self.viewer(host.port, screen.name, password=SECRET, extra=("--user", "alice", "--domain", "LAB"))
        self.assertEqual(viewer.status_line(20), "ready 1024x768")
        for name in ("cmdline", "environ"):
            with open(f"/proc/{viewer.pid}/{name}", "rb") as handle:
                self.assertNotIn(SECRET.encode(), handle.read())
        viewer.close()
        self.assertNotIn(SECRET, "".join(viewer.output()))


class FailureTests(ViewerTestCase):
    """Each failure gives its status line and exit code in time; nothing hangs."""

    def test_nothing_listening(self):
        viewer = self.viewer(free_port(), ":0", password=SECRET, timeout=10)
        line = self.assertFails(viewer, "unreachable", 3, within=5)
        self.assertIn("refused", line)
        self.assertNotIn(SECRET, line + "".join(viewer.output()))

    def test_listener_that_never_answers(self):
        server, port = silent_listener()
        self.addCleanup(server.close)
        viewer = self.viewer(port, ":0", timeout=3)
        self.assertFails(viewer, "timeout", 7, within=3 + 3)

    def test_server_that_closes_at_once(self):
        server = ScriptedServer([])
        self.addCleanup(server.close)
        self.assertFails(self.viewer(server.port, ":0", timeout=10), "protocol", 6, within=5)

    def test_server_that_is_not_rdp(self):
        server = ScriptedServer([b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"], hold=30)
        self.addCleanup(server.close)
        line = self.assertFails(self.viewer(server.port, ":0", timeout=10), "protocol", 6, within=5)
        self.assertIn("not an RDP server", line)
        self.assertEqual(server.received[0][:2], b"\x03\x00")  # it did get an X.224 connection request

    def test_tls_handshake_with_garbage(self):
        server = ScriptedServer([X224_CONFIRM_TLS, b"this is not TLS\r\n" * 4], hold=30)
        self.addCleanup(server.close)
        self.assertFails(self.viewer(server.port, ":0", timeout=10), "tls", 5, within=5)

    def test_tls_accepted_then_closed(self):
        server = ScriptedServer([X224_CONFIRM_TLS])
        self.addCleanup(server.close)
        self.assertFails(self.viewer(server.port, ":0", timeout=10), "tls", 5, within=5)

    def test_server_without_tls(self):
        """xrdp with security_layer=rdp picks standard RDP security, which rdpy gets wrong."""
        host = self.host("rdp")
        line = self.assertFails(self.viewer(host.port, ":0", timeout=10), "tls", 5, within=5)
        self.assertIn("standard RDP security", line)


class NLATests(ViewerTestCase):
    """NLA (CredSSP) against FreeRDP's shadow server, sharing a sky-blue Xvfb."""

    SKY = (0, 160, 255)

    def setUp(self):
        if not NLAHost.available:
            raise SkipTest("freerdp-shadow-cli (Debian package freerdp2-shadow-x11) is not installed")
        self.nla = NLAHost("alice", SECRET, self.SKY)
        self.addCleanup(self.nla.close)

    def test_right_password(self):
        screen = self.screen()
        viewer = self.viewer(self.nla.port, screen.name, password=SECRET, extra=("--user", "alice", "--security", "nla"))
        self.assertEqual(viewer.status_line(20), "ready 1024x768")
        viewer.attach()
        screen.wait_for_colour(self.SKY, FULL // 2, timeout=20)

    def test_wrong_password(self):
        viewer = self.viewer(self.nla.port, ":0", password="not-" + SECRET, extra=("--user", "alice", "--security", "nla"))
        self.assertFails(viewer, "auth", 4, within=10)

    def test_unknown_user(self):
        viewer = self.viewer(self.nla.port, ":0", password=SECRET, extra=("--user", "bob", "--security", "nla"))
        self.assertFails(viewer, "auth", 4, within=10)

    def test_tls_to_an_nla_only_server(self):
        viewer = self.viewer(self.nla.port, ":0", password=SECRET, extra=("--user", "alice"))
        line = self.assertFails(viewer, "tls", 5, within=10)
        self.assertIn("requires NLA", line)


class FreeRDPTests(ViewerTestCase):
    """xfreerdp, the native engine, against the same xrdp."""

    def freerdp(self, port: int, display: str, **options):
        process = xfreerdp(port, display, **options)
        self.addCleanup(process.close)
        return process

    def test_draws_the_login_screen_like_the_rdpy_engine(self):
        host, screen, other = self.host(), self.screen(), self.screen()
        process = self.freerdp(host.port, screen.name)
        native = screen.wait_for_colour(MAGENTA, FULL // 2, timeout=20)
        viewer = self.viewer(host.port, other.name, attach_now=True)
        self.assertEqual(viewer.status_line(20), "ready 1024x768")
        ours = other.wait_for_colour(MAGENTA, native.count(MAGENTA), timeout=20)
        time.sleep(0.5)
        differ = np.any(np.frombuffer(native.rgba, np.uint8).reshape(-1, 4)
                        != np.frombuffer(other.shot().rgba, np.uint8).reshape(-1, 4), axis=1)
        self.assertLess(int(differ.sum()), 200, "pixels that differ (the caret may blink)")
        self.assertEqual(ours.count(GREEN), native.count(GREEN))
        self.assertIsNone(process.poll())
        self.assertTrue(process.output()[1].startswith("Password: "))  # the prompt goes to stderr

    def test_password_from_stdin_is_used(self):
        """With a user and a password xrdp tries to log in at once (no
        sesman here), instead of showing its login box."""
        host, screen = self.host(), self.screen()
        self.freerdp(host.port, screen.name, user="alice", password=SECRET)
        wait_for(lambda: "connecting to sesman" in host.server_log(), 20, "xrdp to try the autologon")

    def test_exit_codes(self):
        display = self.screen().name  # xfreerdp opens the display first (exit 1 without one)
        unreachable = self.freerdp(free_port(), display)
        self.assertEqual(unreachable.wait(15), 147)  # ERRCONNECT_CONNECT_TRANSPORT_FAILED
        server = ScriptedServer([X224_CONFIRM_TLS, b"this is not TLS\r\n" * 4], hold=30)
        self.addCleanup(server.close)
        self.assertEqual(self.freerdp(server.port, display).wait(15), 143)  # ERRCONNECT_TLS_CONNECT_FAILED
        no_tls = self.host("rdp")
        self.assertEqual(self.freerdp(no_tls.port, display).wait(15), 133)  # ERRCONNECT_SECURITY_NEGO_CONNECT_FAILED

    def test_nla(self):
        """Right password: a picture (lossy: the shadow server sends xfreerdp
        a lossy codec); wrong password: exit 147, the server just hangs up."""
        if not NLAHost.available:
            raise SkipTest("freerdp-shadow-cli (Debian package freerdp2-shadow-x11) is not installed")
        nla, screen = NLAHost("alice", SECRET, NLATests.SKY), self.screen()
        self.addCleanup(nla.close)
        self.freerdp(nla.port, screen.name, user="alice", password=SECRET, extra=("/sec:nla",))
        wait_for(lambda: colour_near(screen.shot(), NLATests.SKY) > FULL // 2, 20, "the shared screen", interval=0.2)
        wrong = self.freerdp(nla.port, screen.name, user="alice", password="not-" + SECRET, extra=("/sec:nla",))
        self.assertEqual(wrong.wait(15), 147)

    def test_user_and_domain_must_be_in_argv(self):
        """Without /u: xfreerdp prompts "Username: " and "Domain:   " on stdout
        and reads them with stdio, which swallows the rest of stdin; the
        password is then read from the bare fd and finds nothing."""
        if not NLAHost.available:
            raise SkipTest("freerdp-shadow-cli (Debian package freerdp2-shadow-x11) is not installed")
        nla, screen = NLAHost("alice", SECRET, NLATests.SKY), self.screen()
        self.addCleanup(nla.close)
        three_lines = self.freerdp(nla.port, screen.name, password=f"alice\n\n{SECRET}", extra=("/sec:nla",))
        self.assertEqual(three_lines.wait(15), 147)
        self.assertEqual(three_lines.output()[0], "Username: Domain:   ")

    def test_server_killed(self):
        host, screen = self.host(), self.screen()
        process = self.freerdp(host.port, screen.name)
        screen.wait_for_colour(MAGENTA, FULL // 2, timeout=20)
        host.kill()
        self.assertEqual(process.wait(10), 131)
