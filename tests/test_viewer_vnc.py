"""The VNC viewer engine (nxgate.clients.engines.vnc).

Unit tests drive the RFB client with scripted server bytes (handshake
outcomes, Hextile decoding) and test the key/button/clipping logic.  The
end-to-end tests run the engine as a child process the way the gateway
does (password on stdin, status line on fd 3, SIGUSR1) against real x11vnc
and Xtigervnc servers, and look at the viewer's Xvfb screen and at what
arrives on the VNC host.
"""

from __future__ import annotations

import argparse
import io
import os
import random
import socket
import struct
import subprocess
import sys
import threading
import time
import warnings

import numpy as np
from twisted.internet.testing import StringTransport
from twisted.trial import unittest

from nxgate.clients.engines import vnc
from tests.harness.process import wait_for
from tests.harness.viewer import ViewerProcess
from tests.harness.vnchost import BLUE, ORANGE, ButtonRecorder, VNCHost, free_port, vnc_viewer
from tests.harness.x11 import ClientScreen, Screenshot
from tests.harness.clock import FakeReactor

BLACK = (0, 0, 0)
SECRET = "pa55-wörd"  # non-ASCII on purpose: only its first 8 UTF-8 bytes count in VNC auth


# -- unit tests ---------------------------------------------------------------


class LogicTests(unittest.TestCase):
    def test_clip(self):
        self.assertEqual(vnc.clip(10, 20, 30, 40, 100, 100), (10, 20, 30, 40))
        self.assertEqual(vnc.clip(90, 80, 30, 40, 100, 100), (90, 80, 10, 20))
        self.assertEqual(vnc.clip(-5, -5, 10, 10, 100, 100), (0, 0, 5, 5))
        self.assertIsNone(vnc.clip(100, 0, 10, 10, 100, 100))
        self.assertIsNone(vnc.clip(0, 0, 0, 10, 100, 100))

    def test_bounding_box(self):
        self.assertEqual(vnc.bounding_box([(10, 10, 5, 5), (0, 30, 2, 2), (50, 0, 1, 1)]), (0, 0, 51, 32))

    def test_button_mask(self):
        mask = 0
        for button in (1, 2, 3, 4, 5):
            mask = vnc.button_mask(mask, button, True)
        self.assertEqual(mask, 0b11111)
        self.assertEqual(vnc.button_mask(mask, 4, False), 0b10111)
        self.assertEqual(vnc.button_mask(0, 9, True), 0)  # no RFB bit for it
        self.assertEqual(vnc.button_mask(0, 0, True), 0)

    def test_choose_keysym(self):
        # core keymap columns as XKB writes them: a/A; keypad 7 (KP_Home / KP_7);
        # de "q" with '@' on level 3; us,ru "f" with Cyrillic in group 2
        letter = [ord("a"), ord("A"), ord("a"), ord("A")]
        keypad = [0xFF95, 0xFFB7]
        level3 = [ord("q"), ord("Q"), ord("q"), ord("Q"), ord("@"), 0x7D9]
        group2 = [ord("f"), ord("F"), 0x6C1, 0x6E1]
        column = lambda codes: (lambda i: codes[i] if i < len(codes) else 0)  # noqa: E731
        masks = dict(numlock=0x10, altgr=0x80)
        cases = [
            (letter, 0, ord("a")), (letter, 1, ord("A")),
            (letter, 2, ord("a")),  # Caps Lock is left to the remote side
            (keypad, 0, 0xFF95), (keypad, 0x10, 0xFFB7), (keypad, 0x11, 0xFF95), (letter, 0x10, ord("a")),
            (level3, 0x80, ord("@")), (level3, 0x81, 0x7D9),
            (group2, 0x80, 0x6C1), (group2, 0x81, 0x6E1),
            (letter, 0x80, ord("a")), (letter, 0x81, ord("A")),
            ([0xFFE1], 1, 0xFFE1),  # Shift_L while shifted: it has no column 1
            ([0xFE03], 0x80, 0xFE03),  # AltGr itself on its release
        ]
        for codes, state, keysym in cases:
            self.assertEqual(vnc.choose_keysym(column(codes), state, **masks), keysym, (codes, hex(state)))

    def test_release_sends_the_pressed_keysym(self):
        keys = vnc.PressedKeys()
        self.assertEqual(keys.press(10, ord("!")), ord("!"))
        self.assertEqual(keys.release(10, ord("1")), ord("!"))  # Shift went up first
        self.assertEqual(keys.release(10, ord("1")), ord("1"))  # not held: as computed
        keys.press(38, ord("a"))
        keys.press(50, 0xFFE1)
        self.assertEqual(sorted(keys.release_all()), [ord("a"), 0xFFE1])
        self.assertEqual(keys.release_all(), [])

    def test_encodings_preferred_first(self):
        from vncdotool.const import Encoding

        for name, first in (("hextile", Encoding.HEXTILE), ("raw", Encoding.RAW), ("zrle", Encoding.ZRLE)):
            offered = vnc.encodings(name)
            self.assertEqual(offered[:2], [Encoding.COPY_RECTANGLE, first])
            self.assertIn(Encoding.PSEUDO_DESKTOP_SIZE, offered)
            self.assertEqual(len(offered), len(set(offered)))


class FakeStatus:
    def __init__(self):
        self.lines: list[str] = []

    def ready(self, width, height):
        self.lines.append(f"ready {width}x{height}")

    def error(self, problem):
        self.lines.append(f"error {problem.kind}: {problem.message}")


def pixel_format() -> bytes:
    return vnc.PIXEL_FORMAT.to_bytes()


def server_init(width: int, height: int, name: bytes = b"test") -> bytes:
    return struct.pack("!HH16sI", width, height, pixel_format(), len(name)) + name


class ScriptedServer(unittest.TestCase):
    """The RFB client against scripted server bytes (no network, fake clock)."""

    def make(self, password: str = "", timeout: float = 5.0):
        self.clock = FakeReactor()
        self.clock.stop = lambda: None  # what the viewer calls when it is done
        self.status = FakeStatus()
        args = argparse.Namespace(timeout=timeout, encoding="hextile", title="t", host="h", port=1)
        self.viewer = vnc.Viewer(self.clock, args, password, self.status)
        self.client = vnc.Factory(self.viewer).buildProtocol(None)
        self.transport = StringTransport()
        self.client.makeConnection(self.transport)
        return self.client

    def written(self) -> bytes:
        data = self.transport.value()
        self.transport.clear()
        return data


class HandshakeTests(ScriptedServer):
    def test_none_auth_and_ready(self):
        client = self.make()
        client.dataReceived(b"RFB 003.008\n")
        self.assertEqual(self.written(), b"RFB 003.008\n")
        client.dataReceived(b"\x02\x02\x01")  # offers VNC and None: None wins
        self.assertEqual(self.written(), b"\x01")
        client.dataReceived(b"\0\0\0\0" + server_init(640, 480))
        self.assertEqual(self.status.lines, ["ready 640x480"])
        self.assertIn(pixel_format(), self.written())  # SetPixelFormat: BGRX
        self.assertIsNone(self.viewer.exit_code)
        self.clock.advance(10)  # the connect timeout was cancelled
        self.assertIsNone(self.viewer.exit_code)

    def test_vnc_auth_response(self):
        client = self.make(password="secret")
        client.dataReceived(b"RFB 003.008\n\x01\x02")
        self.written()
        challenge = bytes(range(16))
        client.dataReceived(challenge)
        response = self.written()
        key = vnc.reverse_bits(b"secret\0\0")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # cryptography: TripleDES "decrepit"
            self.assertEqual(response, vnc.des_encrypt(key, challenge))
        client.dataReceived(b"\0\0\0\0" + server_init(800, 600))
        self.assertEqual(self.status.lines, ["ready 800x600"])

    def test_wrong_password(self):
        client = self.make(password="secret")
        client.dataReceived(b"RFB 003.008\n\x01\x02" + bytes(16))
        reason = b"Authentication failed"
        client.dataReceived(b"\0\0\0\x01" + struct.pack("!I", len(reason)) + reason)
        self.assertEqual(self.status.lines, ["error auth: authentication failed (Authentication failed)"])
        self.assertEqual(self.viewer.exit_code, 4)

    def test_rfb33_hangs_up_after_a_wrong_password(self):
        client = self.make(password="secret")
        client.dataReceived(b"RFB 003.003\n\0\0\0\x02" + bytes(16))
        client.connectionLost(None)
        self.assertEqual(self.status.lines[0][:11], "error auth:")
        self.assertEqual(self.viewer.exit_code, 4)

    def test_password_needed_but_none_given(self):
        client = self.make()
        client.dataReceived(b"RFB 003.008\n\x01\x02" + bytes(16))
        self.assertEqual(self.status.lines, ["error auth: the server requires a password"])
        self.assertEqual(self.viewer.exit_code, 4)

    def test_only_unsupported_security(self):
        client = self.make(password="x")
        client.dataReceived(b"RFB 003.008\n\x02\x12\x13")
        self.assertEqual(self.status.lines,
                         ["error protocol: no supported security type (the server offers TLS, VeNCrypt)"])
        self.assertEqual(self.viewer.exit_code, 6)

    def test_server_refuses(self):
        client = self.make()
        reason = b"Too many security failures"
        client.dataReceived(b"RFB 003.008\n\0" + struct.pack("!I", len(reason)) + reason)
        self.assertTrue(self.status.lines[0].startswith("error protocol:"), self.status.lines)
        self.assertIn("Too many security failures", self.status.lines[0])

    def test_not_vnc(self):
        client = self.make()
        client.dataReceived(b"SSH-2.0-OpenSSH_9.2p1 Debian\r\n")
        self.assertTrue(self.status.lines[0].startswith("error protocol:"), self.status.lines)
        self.assertEqual(self.viewer.exit_code, 6)

    def test_unknown_old_version(self):
        client = self.make()
        client.dataReceived(b"RFB 002.000\n")  # vncdotool fails inside; we report it
        self.assertTrue(self.status.lines[0].startswith("error protocol:"), self.status.lines)

    def test_closed_during_handshake(self):
        client = self.make()
        client.dataReceived(b"RFB 003.008\n")
        client.connectionLost(None)
        self.assertTrue(self.status.lines[0].startswith("error protocol:"), self.status.lines)

    def test_silence_times_out(self):
        client = self.make(timeout=3)
        client.dataReceived(b"RFB 003.008\n")
        self.clock.advance(2.9)
        self.assertEqual(self.status.lines, [])
        self.clock.advance(0.2)
        self.assertEqual(self.status.lines, ["error timeout: the VNC server was not ready within 3s"])
        self.assertEqual(self.viewer.exit_code, 7)

    def test_only_the_first_failure_counts(self):
        client = self.make(password="x")
        client.dataReceived(b"RFB 003.008\n\x01\x02" + bytes(16) + b"\0\0\0\x01\0\0\0\x01x")
        client.connectionLost(None)
        self.clock.advance(100)
        self.assertEqual(len(self.status.lines), 1)
        self.assertEqual(self.viewer.exit_code, 4)


def encode_hextile(rng: random.Random, image: np.ndarray, x: int, y: int, width: int, height: int) -> bytes:
    """Paint random tiles of every Hextile kind into ``image`` and encode them."""
    out = bytearray()
    bg = None
    pix = lambda value: struct.pack("<I", value)  # noqa: E731
    for ty in range(y, y + height, 16):
        for tx in range(x, x + width, 16):
            tw, th = min(16, x + width - tx), min(16, y + height - ty)
            tile = image[ty : ty + th, tx : tx + tw]
            kinds = ["raw", "bg", "fg"] if bg is None else ["raw", "bg", "same", "same", "fg", "coloured"]
            kind = rng.choice(kinds)
            if kind == "raw":
                tile[:] = np.array([[rng.getrandbits(24) for _ in range(tw)] for _ in range(th)], np.uint32)
                out += b"\x01" + tile.astype("<u4").tobytes()
                bg = None  # undefined after a raw tile
                continue
            flags = 0
            head = b""
            if kind != "same":
                bg = rng.getrandbits(24)
                flags |= 2
                head += pix(bg)
            tile[:] = bg
            subrects = b""
            if kind in ("fg", "coloured"):
                count = rng.randint(1, 5)
                flags |= 8
                if kind == "fg":
                    fg = rng.getrandbits(24)
                    flags |= 4
                    head += pix(fg)
                else:
                    flags |= 16
                for _ in range(count):
                    sx, sy = rng.randrange(tw), rng.randrange(th)
                    sw, sh = rng.randint(1, tw - sx), rng.randint(1, th - sy)
                    colour = fg if kind == "fg" else rng.getrandbits(24)
                    tile[sy : sy + sh, sx : sx + sw] = colour
                    subrects += (b"" if kind == "fg" else pix(colour)) + bytes([sx << 4 | sy, (sw - 1) << 4 | (sh - 1)])
                head += bytes([count])
            out += bytes([flags]) + head + subrects
    return bytes(out)


class DecodingTests(ScriptedServer):
    """Framebuffer updates through the client, fed in chunks of every size."""

    def connected(self, width, height):
        client = self.make()
        client.dataReceived(b"RFB 003.008\n\x01\x01\0\0\0\0" + server_init(width, height))
        self.written()
        return client

    def feed(self, client, message: bytes, chunk: int) -> None:
        for offset in range(0, len(message), chunk):
            client.dataReceived(message[offset : offset + chunk])

    def test_hextile(self):
        rng = random.Random(7)
        for chunk in (1, 2, 5, 13, 64, 1 << 20):
            client = self.connected(100, 70)
            expected = np.zeros((70, 100), np.uint32)
            rects = [(3, 5, 37, 21), (0, 30, 100, 40), (64, 0, 36, 16)]
            message = struct.pack("!BxH", 0, len(rects))
            for rect in rects:
                message += struct.pack("!HHHHi", *rect, 5) + encode_hextile(rng, expected, *rect)
            raw = struct.pack("!HHHHi", 0, 0, 2, 1, 0) + b"\x11\x22\x33\0\x44\x55\x66\0"  # a second update
            message += struct.pack("!BxH", 0, 1) + raw
            expected[0, 0:2] = [0x332211, 0x665544]
            self.feed(client, message, chunk)
            self.assertIsNone(self.viewer.exit_code, self.status.lines)
            np.testing.assert_array_equal(client.framebuffer, expected, err_msg=f"chunk {chunk}")
            # every complete update asks for the next one
            self.assertEqual(self.written().count(struct.pack("!BB", 3, 1)), 2)

    def test_copyrect_overlapping(self):
        client = self.connected(8, 4)
        client.framebuffer[:] = np.arange(32, dtype=np.uint32).reshape(4, 8)
        expected = client.framebuffer.copy()
        expected[1:3, 2:7] = expected[0:2, 1:6].copy()
        client.dataReceived(struct.pack("!BxH", 0, 1) + struct.pack("!HHHHiHH", 2, 1, 5, 2, 1, 1, 0))
        np.testing.assert_array_equal(client.framebuffer, expected)

    def test_desktop_size(self):
        client = self.connected(8, 4)
        client.dataReceived(struct.pack("!BxH", 0, 1) + struct.pack("!HHHHi", 0, 0, 20, 10, -223))
        self.assertEqual(client.framebuffer.shape, (10, 20))
        self.assertEqual((client.width, client.height), (20, 10))
        full_request = struct.pack("!BBHHHH", 3, 0, 0, 0, 20, 10)
        self.assertEqual(self.written(), full_request)

    def test_bad_rectangle_is_a_protocol_error(self):
        client = self.connected(8, 4)
        self.patch(sys, "stderr", io.StringIO())  # after "ready", errors go to stderr
        client.dataReceived(struct.pack("!BxH", 0, 1) + struct.pack("!HHHHi", 6, 0, 4, 1, 0) + bytes(16))
        self.assertEqual(self.viewer.exit_code, 6)
        self.assertIn("protocol: bad data from the server", sys.stderr.getvalue())


# -- end to end -------------------------------------------------------------------


def differing(a: Screenshot, b: Screenshot) -> int:
    """How many pixels differ between two same-sized screenshots."""
    left = np.frombuffer(a.rgba, np.uint32)
    right = np.frombuffer(b.rgba, np.uint32)
    return int(np.count_nonzero(left != right))


class EngineTestCase(unittest.TestCase):
    server = "x11vnc"

    def host(self, password: str | None = None, width: int = 1024, height: int = 768) -> VNCHost:
        host = VNCHost(self.server, password, width, height)
        self.addCleanup(host.close)
        return host

    def screen(self, width: int = 1024, height: int = 768) -> ClientScreen:
        screen = ClientScreen(width, height)
        self.addCleanup(screen.close)
        return screen

    def viewer(self, port: int, display: str, password: str | None = None, **options) -> ViewerProcess:
        viewer = vnc_viewer(port, display, password, **options)
        self.addCleanup(viewer.close)
        return viewer

    def attached(self, host: VNCHost, screen: ClientScreen, password: str | None = None) -> ViewerProcess:
        viewer = self.viewer(host.port, screen.name, password)
        self.assertEqual(viewer.status_line(), f"ready {host.screen.width}x{host.screen.height}")
        viewer.attach()
        return viewer

    def assertNoWindow(self, screen: ClientScreen) -> None:
        found = subprocess.run(["xdotool", "search", "--name", "nxgate viewer"], capture_output=True, text=True,
                               env=dict(os.environ, DISPLAY=screen.name))
        self.assertEqual(found.stdout.strip(), "")


class ServerTests:
    """The same tests against each VNC server (mixed into a TestCase below)."""

    def test_draws_only_after_sigusr1(self):
        host, screen = self.host(), self.screen()
        viewer = self.viewer(host.port, screen.name)
        self.assertEqual(viewer.status_line(), "ready 1024x768")
        time.sleep(1.0)
        shot = screen.shot()
        self.assertEqual((shot.colours(), shot.pixel(512, 384)), (1, BLACK))
        self.assertNoWindow(screen)
        viewer.attach()
        screen.wait_for_colour(ORANGE, 1024 * 768 - 2000)
        self.assertIsNone(viewer.poll())

    def test_password(self):
        host, screen = self.host(password=SECRET), self.screen()
        viewer = self.attached(host, screen, SECRET)
        screen.wait_for_colour(ORANGE, 1024 * 768 - 2000)
        with open(f"/proc/{viewer.pid}/cmdline", "rb") as cmdline, open(f"/proc/{viewer.pid}/environ", "rb") as env:
            self.assertNotIn(SECRET.encode(), cmdline.read() + env.read())

    def test_wrong_password(self):
        host, screen = self.host(password=SECRET), self.screen()
        viewer = self.viewer(host.port, screen.name, "not-" + SECRET)
        line = viewer.status_line()
        self.assertTrue(line.startswith("error auth: "), line)
        self.assertEqual(viewer.wait(10), 4)
        self.assertNotIn(SECRET, line + viewer.errors())

    def test_password_missing(self):
        host, screen = self.host(password=SECRET), self.screen()
        viewer = self.viewer(host.port, screen.name, None)
        self.assertEqual(viewer.status_line(), "error auth: the server requires a password")
        self.assertEqual(viewer.wait(10), 4)

    def test_picture_and_typing(self):
        host, screen = self.host(), self.screen()
        typed = os.path.join(host.dir, "typed")
        host.xterm_typing_into(typed)
        viewer = self.attached(host, screen)
        screen.wait_for_colour(BLUE, 100000)
        screen.xdotool("type", "--delay", "20", "Hello, World! ~|@#_")
        screen.xdotool("key", "Return")
        wait_for(lambda: open(typed).read() == "Hello, World! ~|@#_\n", 15, f"the typed line in {typed}")
        # The xterm's text and all: the viewer shows what the host shows, but for the cursor the server draws in.
        wait_for(lambda: differing(host.screen.shot(), screen.shot()) < 600, 15, "the same picture on both screens")
        self.assertIsNone(viewer.poll())

    def test_german_keyboard_on_a_us_host(self):
        # The NX client's keyboard is German (so is the agent's keymap); the VNC host's is US.
        host, screen = self.host(), self.screen()
        subprocess.run(["setxkbmap", "-layout", "de"], env=dict(os.environ, DISPLAY=screen.name), check=True)
        typed = os.path.join(host.dir, "typed")
        host.xterm_typing_into(typed)
        self.attached(host, screen)
        screen.wait_for_colour(BLUE, 100000)
        screen.xdotool("key", "--delay", "30", "ISO_Level3_Shift+q", "y", "z", "ISO_Level3_Shift+7", "shift+7",
                       "Return")
        wait_for(lambda: open(typed).read() == "@yz{/\n", 15, f"the typed line in {typed}")

    def test_pointer_and_buttons(self):
        host, screen = self.host(), self.screen()
        recorder = ButtonRecorder(host.name, 600, 400, 200, 200)
        self.addCleanup(recorder.close)
        self.attached(host, screen)
        screen.wait_for_colour((255, 255, 255), 200 * 200 - 500)
        screen.xdotool("mousemove", "123", "234")
        wait_for(lambda: host.mouse_location() == (123, 234), 10, "the host's pointer at 123,234")
        screen.xdotool("mousemove", "650", "450")
        for button in ("1", "3", "4", "5", "2"):
            screen.xdotool("click", button)
        wanted = [(kind, button, 50, 50) for button in (1, 3, 4, 5, 2) for kind in ("press", "release")]
        wait_for(lambda: recorder.poll() == wanted, 10, f"clicks {wanted}; got {recorder.events}")

    def test_server_killed_while_drawing(self):
        host, screen = self.host(), self.screen()
        viewer = self.attached(host, screen)
        screen.wait_for_colour(ORANGE, 1024 * 768 - 2000)
        for colour in ((0, 200, 0), (200, 0, 200), (0, 0, 200)):
            host.set_background(colour)
        host.kill_server()
        self.assertEqual(viewer.wait(10), 0)  # a deadline: the viewer ends by itself, it does not hang
        self.assertIn("the VNC server closed the connection", viewer.errors())

    def test_sigterm_is_quiet(self):
        host, screen = self.host(), self.screen()
        viewer = self.attached(host, screen)
        screen.wait_for_colour(ORANGE, 1024 * 768 - 2000)
        viewer.close()
        self.assertEqual((viewer.returncode, viewer.errors()), (0, ""))


class X11vncTests(ServerTests, EngineTestCase):
    server = "x11vnc"

    def test_remote_larger_than_window(self):
        host, screen = self.host(width=1280, height=1024), self.screen(800, 600)
        self.attached(host, screen)
        screen.wait_for_colour(ORANGE, 800 * 600 - 1000)

    def test_remote_smaller_than_window(self):
        host, screen = self.host(width=640, height=480), self.screen(800, 600)
        self.attached(host, screen)
        shot = screen.wait_for_colour(ORANGE, 640 * 480 - 1000)
        self.assertLessEqual(shot.count(ORANGE), 640 * 480)
        self.assertGreaterEqual(shot.count(BLACK), 800 * 600 - 640 * 480)
        self.assertEqual((shot.pixel(639, 479), shot.pixel(640, 100), shot.pixel(100, 480)), (ORANGE, BLACK, BLACK))

    def test_expose_redraws(self):
        host, screen = self.host(), self.screen()
        self.attached(host, screen)
        screen.wait_for_colour(ORANGE, 1024 * 768 - 2000)
        cover = ButtonRecorder(screen.name, 100, 100, 300, 300)  # any window on top will do
        screen.wait_for_colour((255, 255, 255), 300 * 300)
        cover.close()  # its X connection goes: the window goes, the viewer's is exposed
        screen.wait_for_colour(ORANGE, 1024 * 768 - 2000)

    def test_display_gone(self):
        host, screen = self.host(), self.screen()
        viewer = self.attached(host, screen)
        screen.wait_for_colour(ORANGE, 1024 * 768 - 2000)
        screen.close()
        self.assertEqual(viewer.wait(10), 0)
        self.assertIn("the X display closed", viewer.errors())


class TigerVncTests(ServerTests, EngineTestCase):
    server = "tigervnc"

    def test_remote_resizes(self):
        host, screen = self.host(), self.screen()
        viewer = self.attached(host, screen)
        screen.wait_for_colour(ORANGE, 1024 * 768 - 2000)
        subprocess.run(["xrandr", "-s", "800x600"], env=host.env(), check=True)
        wait_for(lambda: screen.shot().count(BLACK) >= 1024 * 768 - 800 * 600, 15, "black beyond 800x600")
        shot = screen.shot()
        self.assertEqual((shot.pixel(799, 599), shot.pixel(800, 10), shot.pixel(10, 600)), (ORANGE, BLACK, BLACK))
        subprocess.run(["xrandr", "-s", "1024x768"], env=host.env(), check=True)
        screen.wait_for_colour(ORANGE, 1024 * 768 - 2000)
        self.assertIsNone(viewer.poll())


class FailureTests(EngineTestCase):
    """Phase 1 failures end the process, in bounded time, with the right code."""

    def test_nothing_listening(self):
        viewer = self.viewer(free_port(), ":0")
        line = viewer.status_line()
        self.assertTrue(line.startswith("error unreachable: "), line)
        self.assertEqual(viewer.wait(10), 3)

    def test_silent_listener_times_out(self):
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(5)  # never accepted: the kernel completes the TCP handshake, nobody speaks RFB
        self.addCleanup(listener.close)
        viewer = self.viewer(listener.getsockname()[1], ":0", timeout=2.0)
        line = viewer.status_line(timeout=30)  # a deadline: without its own 2 s timeout the viewer waits for good
        self.assertEqual(line, "error timeout: the VNC server was not ready within 2s")
        self.assertEqual(viewer.wait(5), 7)

    def test_not_a_vnc_server(self):
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(5)
        self.addCleanup(listener.close)

        def answer():
            conn, _ = listener.accept()
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            time.sleep(1)
            conn.close()

        threading.Thread(target=answer, daemon=True).start()
        viewer = self.viewer(listener.getsockname()[1], ":0")
        line = viewer.status_line()
        self.assertTrue(line.startswith("error protocol: "), line)
        self.assertEqual(viewer.wait(10), 6)

    def test_phase_one_needs_no_display(self):
        host = self.host()
        viewer = self.viewer(host.port, ":4999")  # no such display: touching X would fail
        self.assertEqual(viewer.status_line(), "ready 1024x768")
        time.sleep(0.5)
        self.assertIsNone(viewer.poll())
        viewer.attach()
        self.assertEqual(viewer.wait(10), 1)
        self.assertIn("cannot draw on the display", viewer.errors())

    def test_attach_now(self):
        host, screen = self.host(), self.screen(800, 600)
        viewer = self.viewer(host.port, screen.name, attach_now=True)
        self.assertEqual(viewer.status_line(), "ready 1024x768")
        screen.wait_for_colour(ORANGE, 800 * 600 - 1000)
