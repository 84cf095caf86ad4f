"""The shadow window's size: the X setup exchange and the fitting (pure)."""

import os
import shutil
import struct
import tempfile

from twisted.internet import defer, protocol, reactor
from twisted.trial.unittest import SynchronousTestCase, TestCase

from nxgate.node.agents import shadow_screen as screen
from nxgate.node.agents.shadow_screen import Incomplete, screen_size, setup_request, shadow_geometry, watched_size


def setup_reply(width: int, height: int, vendor: bytes = b"NoMachine", formats: int = 7, status: int = 1) -> bytes:
    """A setup reply as an X server sends it (little-endian), one screen."""
    vendor_padded = vendor + b"\0" * ((4 - len(vendor) % 4) % 4)
    fixed = struct.pack("<IIIIHHBBBBBBBB4x", 1, 0x200000, 0x1FFFFF, 256, len(vendor), 65535, 1, formats,
                        0, 0, 32, 32, 8, 255)
    screen = struct.pack("<IIIIIHHHHIIBBBB", 0x123, 0x20, 0xFFFFFF, 0, 0, width, height, 200, 150, 1, 1, 0x21, 0,
                         24, 1)
    body = fixed + vendor_padded + b"\0" * (8 * formats) + screen
    return struct.pack("<BBHHH", status, 0, 11, 0, len(body) // 4) + body


class SetupTests(SynchronousTestCase):
    def test_request_carries_the_cookie(self):
        request = setup_request("00112233445566778899aabbccddeeff")
        self.assertEqual(request[:12], struct.pack("<BxHHHHxx", ord("l"), 11, 0, 18, 16))
        self.assertEqual(request[12:30], b"MIT-MAGIC-COOKIE-1")
        self.assertEqual(request[32:48], bytes.fromhex("00112233445566778899aabbccddeeff"))
        self.assertEqual(len(request) % 4, 0)
        self.assertEqual(setup_request(None), struct.pack("<BxHHHHxx", ord("l"), 11, 0, 0, 0))

    def test_size_of_the_first_screen(self):
        self.assertEqual(screen_size(setup_reply(1280, 1024)), (1280, 1024))
        self.assertEqual(screen_size(setup_reply(800, 600, vendor=b"The X.Org Foundation", formats=3)), (800, 600))

    def test_partial_reply_asks_for_more(self):
        reply = setup_reply(1024, 768)
        for cut in (0, 5, 8, len(reply) - 1):
            with self.assertRaises(Incomplete):
                screen_size(reply[:cut])

    def test_refusal_and_nonsense_give_no_size(self):
        self.assertIsNone(screen_size(setup_reply(1024, 768, status=0)))
        self.assertIsNone(screen_size(struct.pack("<BBHHH", 1, 0, 11, 0, 2) + b"\0" * 8))  # too short to hold a screen
        lying = bytearray(setup_reply(1024, 768))
        lying[29] = 200  # 200 pixmap formats: the screen would lie past the end
        self.assertIsNone(screen_size(bytes(lying)))


class GeometryTests(SynchronousTestCase):
    def test_one_to_one_when_it_fits(self):
        self.assertEqual(shadow_geometry((800, 600), (1024, 768)), (800, 600))
        self.assertEqual(shadow_geometry((1024, 768), (1024, 768)), (1024, 768))

    def test_scaled_down_to_fit_keeping_the_aspect(self):
        self.assertEqual(shadow_geometry((1024, 768), (800, 600)), (800, 600))
        self.assertEqual(shadow_geometry((1280, 720), (800, 600)), (800, 450))  # width is the tighter side
        self.assertEqual(shadow_geometry((1280, 1024), (1280, 800)), (1000, 800))  # height is
        width, height = shadow_geometry((1366, 768), (1000, 700))
        self.assertLessEqual((width, height), (1000, 700))
        self.assertAlmostEqual(width / height, 1366 / 768, places=2)

    def test_unknown_or_absurd_watched_size_uses_the_area(self):
        self.assertEqual(shadow_geometry(None, (1024, 768)), (1024, 768))
        self.assertEqual(shadow_geometry((0, 0), (1024, 768)), (1024, 768))
        self.assertEqual(shadow_geometry((65535, 65535), (1024, 768)), (1024, 768))

    def test_never_below_the_minimum(self):
        self.assertEqual(shadow_geometry((16000, 100), (640, 480)), (640, 64))


class WatchedSizeTests(TestCase):
    """watched_size against a stand-in X server on a UNIX socket."""

    def serve(self, reply: bytes | None) -> int:
        directory = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, directory, True)
        self.patch(screen, "X_SOCKET", os.path.join(directory, "X{n}"))
        received: list[bytes] = []
        self.received = received

        class FakeX(protocol.Protocol):
            def dataReceived(self, data: bytes) -> None:
                received.append(data)
                if reply is not None:
                    self.transport.write(reply[:5])  # in two pieces, as a socket may deliver it
                    self.transport.write(reply[5:])

        factory = protocol.Factory.forProtocol(FakeX)
        port = reactor.listenUNIX(screen.X_SOCKET.format(n=42), factory)
        self.addCleanup(port.stopListening)
        return 42

    @defer.inlineCallbacks
    def test_size_from_the_setup_reply(self):
        display = self.serve(setup_reply(1366, 768))
        size = yield defer.ensureDeferred(watched_size(reactor, display, "00" * 16, timeout=5))
        self.assertEqual(size, (1366, 768))
        self.assertEqual(b"".join(self.received), setup_request("00" * 16))

    @defer.inlineCallbacks
    def test_no_answer_or_no_server_gives_none(self):
        display = self.serve(None)
        size = yield defer.ensureDeferred(watched_size(reactor, display, None, timeout=0.3))
        self.assertIsNone(size)
        size = yield defer.ensureDeferred(watched_size(reactor, 43, None, timeout=0.3))
        self.assertIsNone(size)
