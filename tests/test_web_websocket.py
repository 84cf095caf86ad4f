"""Unit tests of the browser viewer's pure parts: WebSocket framing and
handshake, one-time tickets, the Origin check, and the argv/options the
node gives Xvfb, nxproxy and x11vnc."""

from __future__ import annotations

import os
import struct

from twisted.internet import defer
from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SkipTest, TestCase
from twisted.web.test.requesthelper import DummyRequest

from nxgate.protocols import websocket as ws
from nxgate.gateway.doors.web.viewer import login_key, same_origin
from nxgate.node import browser_viewer as bv
from tests.harness.clock import FakeReactor

MASK = b"\x37\xfa\x21\x3d"


def masked(opcode: int, payload: bytes, fin: bool = True) -> bytes:
    frame = ws.encode_frame(opcode, payload, mask=MASK)
    return frame if fin else bytes([frame[0] & 0x7F]) + frame[1:]


class HandshakeTests(TestCase):
    def test_accept_key_of_rfc_6455(self) -> None:
        """The example of RFC 6455 §1.3."""
        self.assertEqual(ws.accept_key("dGhlIHNhbXBsZSBub25jZQ=="), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")

    def test_bad_keys(self) -> None:
        for key in ("", "not base64!", "c2hvcnQ=", "dGhlIHNhbXBsZSBub25jZQ==AA"):
            self.assertIsNone(ws.accept_key(key), key)

    def request(self, **headers: str) -> DummyRequest:
        request = DummyRequest([b"ws"])
        base = {"upgrade": "websocket", "connection": "keep-alive, Upgrade", "sec-websocket-version": "13",
                "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ=="}
        base.update(headers)
        for name, value in base.items():
            if value is not None:
                request.requestHeaders.setRawHeaders(name.encode(), [value.encode()])
        return request

    def test_handshake_problems(self) -> None:
        self.assertIsNone(ws.handshake_problem(self.request()))
        self.assertEqual(ws.handshake_problem(self.request(upgrade="h2c")), "no Upgrade: websocket")
        self.assertEqual(ws.handshake_problem(self.request(connection="close")), "no Connection: upgrade")
        self.assertEqual(ws.handshake_problem(self.request(**{"sec-websocket-version": "8"})),
                         "not WebSocket version 13")
        self.assertEqual(ws.handshake_problem(self.request(**{"sec-websocket-key": "x"})), "bad Sec-WebSocket-Key")
        post = self.request()
        post.method = b"POST"
        self.assertEqual(ws.handshake_problem(post), "not a GET")

    def test_origin_must_be_our_own(self) -> None:
        def origin(value: str, host: str = "gw.example:4443", secure: bool = True) -> bool:
            request = self.request(origin=value, host=host)
            request.isSecure = lambda: secure  # type: ignore[method-assign]
            return same_origin(request)

        self.assertTrue(origin("https://gw.example:4443"))
        self.assertTrue(origin("https://GW.example:4443"))
        self.assertFalse(origin("https://evil.example"))
        self.assertFalse(origin("http://gw.example:4443"))  # a plain-HTTP page on our name
        self.assertFalse(origin("https://gw.example:4443.evil.example", host="gw.example:4443"))
        self.assertFalse(origin("null"))
        self.assertFalse(origin(""))
        self.assertTrue(origin("http://127.0.0.1:8080", host="127.0.0.1:8080", secure=False))


class FramingTests(TestCase):
    def test_small_medium_large_frames_and_byte_by_byte(self) -> None:
        for size in (0, 1, 125, 126, 65535, 65536, 200000):
            payload = os.urandom(size)
            frame = masked(ws.BINARY, payload)
            self.assertEqual(ws.FrameParser().feed(frame), [ws.Message(ws.BINARY, payload)], size)
        parser, out = ws.FrameParser(), []
        for byte in masked(ws.BINARY, b"hello") * 2:
            out += parser.feed(bytes([byte]))
        self.assertEqual(out, [ws.Message(ws.BINARY, b"hello")] * 2)

    def test_server_frames_are_unmasked(self) -> None:
        self.assertEqual(ws.encode_frame(ws.BINARY, b"ab"), b"\x82\x02ab")
        self.assertEqual(ws.encode_frame(ws.BINARY, b"x" * 300)[:4], b"\x82\x7e\x01\x2c")
        self.assertEqual(ws.encode_frame(ws.BINARY, b"x" * 70000)[:10], b"\x82\x7f" + struct.pack(">Q", 70000))

    def test_fragments_are_joined_and_controls_may_interleave(self) -> None:
        data = (masked(ws.BINARY, b"ab", fin=False) + masked(ws.PING, b"p")
                + masked(ws.CONTINUATION, b"cd", fin=False) + masked(ws.CONTINUATION, b"ef"))
        self.assertEqual(ws.FrameParser().feed(data), [ws.Message(ws.PING, b"p"), ws.Message(ws.BINARY, b"abcdef")])

    def assert_refused(self, data: bytes, code: int, parser: ws.FrameParser | None = None) -> None:
        with self.assertRaises(ws.WebSocketError) as caught:
            (parser or ws.FrameParser()).feed(data)
        self.assertEqual(caught.exception.code, code)

    def test_protocol_errors(self) -> None:
        self.assert_refused(ws.encode_frame(ws.BINARY, b"unmasked"), ws.PROTOCOL_ERROR)
        self.assert_refused(bytes([0xC2]) + masked(ws.BINARY, b"x")[1:], ws.PROTOCOL_ERROR)  # RSV1
        self.assert_refused(bytes([0x83]) + masked(ws.BINARY, b"x")[1:], ws.PROTOCOL_ERROR)  # opcode 3
        self.assert_refused(masked(ws.PING, b"x" * 126), ws.PROTOCOL_ERROR)
        self.assert_refused(masked(ws.PING, b"x", fin=False), ws.PROTOCOL_ERROR)
        self.assert_refused(masked(ws.CONTINUATION, b"x"), ws.PROTOCOL_ERROR)
        self.assert_refused(masked(ws.BINARY, b"a", fin=False) + masked(ws.BINARY, b"b"), ws.PROTOCOL_ERROR)
        self.assert_refused(masked(ws.CLOSE, b"\x03"), ws.PROTOCOL_ERROR)
        self.assert_refused(masked(ws.TEXT, b"\xff\xfe"), ws.INVALID_DATA)
        self.assert_refused(b"\x82\xff" + struct.pack(">Q", 1 << 63) + MASK, ws.PROTOCOL_ERROR)

    def test_size_limit_counts_fragments_and_needs_no_payload(self) -> None:
        self.assert_refused(b"\x82\xff" + struct.pack(">Q", 10 ** 9), ws.TOO_BIG)  # refused from its header alone
        parser = ws.FrameParser(max_message=10)
        parser.feed(masked(ws.BINARY, b"x" * 6, fin=False))
        self.assert_refused(masked(ws.CONTINUATION, b"x" * 6), ws.TOO_BIG, parser)

    def test_close_code(self) -> None:
        [message] = ws.FrameParser().feed(masked(ws.CLOSE, ws.close_payload(1001, "bye")))
        self.assertEqual((message.close_code, message.payload[2:]), (1001, b"bye"))


class Handler:
    def __init__(self) -> None:
        self.messages: list[bytes] = []
        self.closed: list[tuple[int | None, str]] = []

    def ws_message(self, payload: bytes) -> None:
        self.messages.append(payload)

    def ws_closed(self, code: int | None, reason: str) -> None:
        self.closed.append((code, reason))


class RefusalTests(TestCase):
    def test_an_rfb_refusal_carries_the_reason_in_utf8(self) -> None:
        self.assertEqual(ws.RFB_VERSION, b"RFB 003.008\n")
        answer = ws.rfb_refusal("Authorization refused by user: zoë.")
        text = "Authorization refused by user: zoë.".encode()
        self.assertEqual(answer, b"\x00" + struct.pack(">I", len(text)) + text)

    def test_a_long_reason_is_cut(self) -> None:
        answer = ws.rfb_refusal("x" * 5000)
        self.assertEqual(struct.unpack(">I", answer[1:5])[0], 1000)
        self.assertEqual(len(answer), 1005)


class BridgeRefusalTests(TestCase):
    """A viewer that cannot start answers the page as an RFB server refusing the connection."""

    def test_the_reason_reaches_novnc_after_its_version(self) -> None:
        from types import SimpleNamespace

        from nxgate.gateway.doors.web.viewer import ViewerBridge

        clock = FakeReactor()
        parent = SimpleNamespace(reactor=clock, bridges=set(), viewers=None, service=None)
        connection = ws.WebSocketConnection(clock)
        transport = StringTransport()
        connection.makeConnection(transport)
        bridge = ViewerBridge(parent, SimpleNamespace(user="alice"), SimpleNamespace(purpose="open"), connection)
        connection.handler = bridge
        bridge.start()  # no viewers on this node: refused
        self.assertEqual(transport.value(), ws.encode_frame(ws.BINARY, ws.RFB_VERSION))
        transport.clear()
        connection.dataReceived(masked(ws.BINARY, b"RFB 003.008\n"))
        words = "The browser viewer is not available on this server."
        self.assertEqual(transport.value(), ws.encode_frame(ws.BINARY, ws.rfb_refusal(words))
                         + ws.encode_frame(ws.CLOSE, ws.close_payload(ws.REFUSED, "refused")))
        self.assertEqual(parent.bridges, set())
        clock.advance(11)  # the fallback close finds the socket closed already: nothing more
        self.assertTrue(transport.disconnecting)


class ConnectionTests(TestCase):
    def setUp(self) -> None:
        self.clock = FakeReactor()
        self.handler = Handler()
        self.connection = ws.WebSocketConnection(self.clock, self.handler)
        self.transport = StringTransport()
        self.connection.makeConnection(self.transport)

    def test_messages_pings_and_the_browsers_close(self) -> None:
        self.connection.dataReceived(masked(ws.BINARY, b"rfb") + masked(ws.PING, b"hi"))
        self.assertEqual(self.handler.messages, [b"rfb"])
        self.assertEqual(self.transport.value(), ws.encode_frame(ws.PONG, b"hi"))
        self.transport.clear()
        self.connection.send(b"picture")
        self.assertEqual(self.transport.value(), ws.encode_frame(ws.BINARY, b"picture"))
        self.transport.clear()
        self.connection.dataReceived(masked(ws.CLOSE, ws.close_payload(1001)))
        self.assertEqual(self.transport.value(), ws.encode_frame(ws.CLOSE, ws.close_payload(1001)))
        self.assertTrue(self.transport.disconnecting)
        self.assertEqual(self.handler.closed, [(1001, "")])

    def test_our_close_then_abort_if_the_browser_does_not_answer(self) -> None:
        self.connection.close(ws.REFUSED, "No such session.")
        self.assertEqual(self.transport.value(), ws.encode_frame(ws.CLOSE, ws.close_payload(4001, "No such session.")))
        self.assertEqual(self.handler.closed, [(4001, "No such session.")])
        self.connection.send(b"late")  # nothing after the close frame
        self.assertEqual(self.transport.value(), ws.encode_frame(ws.CLOSE, ws.close_payload(4001, "No such session.")))
        self.clock.advance(2.5)
        self.assertTrue(self.transport.disconnecting)

    def test_protocol_error_closes_with_its_code(self) -> None:
        self.connection.dataReceived(ws.encode_frame(ws.BINARY, b"unmasked"))
        self.assertEqual(self.transport.value()[:4], b"\x88" + bytes([2 + len("a browser's frames must be masked")])
                         + struct.pack(">H", ws.PROTOCOL_ERROR))
        self.assertEqual(self.handler.messages, [])
        self.assertEqual(self.handler.closed[0][0], ws.PROTOCOL_ERROR)


class TicketTests(TestCase):
    def setUp(self) -> None:
        self.clock = FakeReactor()
        self.tickets = ws.Tickets(self.clock.seconds)

    def issue(self, user: str = "alice") -> str:
        return self.tickets.issue(user, login_key("csrf-of-alice"), "A" * 32, "open", 800, 600)

    def test_one_time(self) -> None:
        secret = self.issue()
        self.assertGreaterEqual(len(secret), 43)
        ticket = self.tickets.take(secret)
        self.assertEqual((ticket.user, ticket.session_id, ticket.width), ("alice", "A" * 32, 800))
        self.assertIsNone(self.tickets.take(secret))

    def test_expiry(self) -> None:
        secret = self.issue()
        self.clock.advance(ws.Tickets.TTL + 0.1)
        self.assertIsNone(self.tickets.take(secret))
        self.assertEqual(self.tickets.pending, {})

    def test_forged_and_odd_secrets(self) -> None:
        self.issue()
        for forged in ("", "A" * 43, "x" * 5000, "\udcff"):
            self.assertIsNone(self.tickets.take(forged))
        self.assertEqual(len(self.tickets.pending), 1)

    def test_kept_by_hash_and_bounded_per_user(self) -> None:
        secrets_ = [self.issue() for _ in range(ws.Tickets.PER_USER + 3)]
        self.issue("bob")
        self.assertEqual(len(self.tickets.pending), ws.Tickets.PER_USER + 1)
        self.assertNotIn(secrets_[-1].encode(), b"".join(self.tickets.pending))
        self.assertIsNone(self.tickets.take(secrets_[0]))  # the oldest went first
        self.assertIsNotNone(self.tickets.take(secrets_[-1]))

    def test_login_key_is_not_the_csrf_token(self) -> None:
        self.assertNotIn("csrf-of-alice", login_key("csrf-of-alice"))
        self.assertNotEqual(login_key("a"), login_key("b"))


class ProgramTests(TestCase):
    def test_xvfb_listens_on_no_tcp_and_needs_the_cookie(self) -> None:
        argv = bv.xvfb_argv("Xvfb", 3100, 1024, 768, "/v/auth")
        self.assertEqual(argv[:2], ["Xvfb", ":3100"])
        for pair in (["-displayfd", "3"], ["-nolisten", "tcp"], ["-auth", "/v/auth"], ["-screen", "0", "1024x768x24"],
                     ["-extension", "GLX"]):
            self.assertIn(" ".join(pair), " ".join(argv))

    def test_x11vnc_on_a_unix_socket_only(self) -> None:
        argv = bv.x11vnc_argv("x11vnc", 3100, "/v/vnc.sock")
        joined = " ".join(argv)
        for part in ("-display :3100", "-unixsock /v/vnc.sock", "-rfbport 0", "-rfbportv6 0", "-no6", "-noipv6",
                     "-norc", "-xkb", "-once", "-sb 0"):
            self.assertIn(part, joined)
        self.assertNotIn("-forever", argv)
        self.assertNotIn("-localhost", argv)  # it refuses Unix-socket clients (not 127.0.0.1)

    def test_the_selection_nudge_empties_cut_buffer_zero(self) -> None:
        self.assertEqual(bv.selection_nudge_argv("xprop"),
                         ["xprop", "-root", "-f", "CUT_BUFFER0", "8s", "-set", "CUT_BUFFER0", ""])

    def test_nxproxy_options_carry_the_cookie_and_refuse_injection(self) -> None:
        line = bv.nxproxy_options("0123abcd" * 4, "host-830-ABC", "my desk,top", "/v/nx.sock", 830)
        self.assertEqual(line, "nx/nx,session=my_desk_top,cookie=" + "0123abcd" * 4
                         + ",id=host-830-ABC,connect=unix:/v/nx.sock:830")
        for cookie in ("abc,connect=evil", "", "x" * 200):
            self.assertRaises(ValueError, bv.nxproxy_options, cookie, "id", "n", "/v/nx.sock", 830)
        self.assertRaises(ValueError, bv.nxproxy_options, "abc", "id", "n", "/v:/nx.sock", 830)

    def test_sizes_are_clamped(self) -> None:
        self.assertEqual(bv.clamp_size(1023, 700), (1022, 700))
        self.assertEqual(bv.clamp_size(10, 10), bv.MIN_SIZE)
        self.assertEqual(bv.clamp_size(99999, 99999), bv.MAX_SIZE)


class LimitTests(TestCase):
    def test_per_user_and_total(self) -> None:
        import shutil
        import tempfile

        if os.geteuid() != 0:
            raise SkipTest("viewer directories are given to their user: needs root")
        root = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, root, True)
        viewers = bv.BrowserViewers(FakeReactor(), None, os.path.join(root, "viewers"), root, bv.ViewerLimits(2, 3))

        def open_one(user):
            return self.successResultOf(defer.ensureDeferred(viewers.open(user, 800, 600)))

        def refused(user):
            return self.failureResultOf(defer.ensureDeferred(viewers.open(user, 800, 600)), bv.ViewerRefused).value
        first = open_one("root")
        self.assertEqual(os.stat(first.directory).st_mode & 0o777, 0o700)
        self.assertEqual(os.stat(viewers.root).st_mode & 0o777, 0o711)
        self.assertEqual(first.home, "/root")
        open_one("root")
        self.assertIn("already has 2", str(refused("root")))
        open_one("daemon")
        self.assertIn("already shows 3", str(refused("bin")))
        first.close()
        open_one("bin")  # a closed viewer frees its place
        viewers.close_all()
        self.assertEqual(viewers.count(), 0)


class EarlyVersionTests(TestCase):
    """The bridge says the browser's RFB version to x11vnc before the browser does (x11vnc waits 100 ms for
    a first word of the client's otherwise), and gives the browser what x11vnc says in RFB's order."""

    def test_the_browsers_version_is_dropped_and_the_rest_passes(self) -> None:
        from nxgate.gateway.doors.web.viewer import EarlyVersion

        early = EarlyVersion()
        self.assertEqual(early.feed(b"RFB 003"), b"")
        self.assertFalse(early.done)
        self.assertEqual(early.feed(b".008\n\x01"), b"\x01")
        self.assertTrue(early.done)
        self.assertEqual(early.feed(b"\x00\x01"), b"\x00\x01")

    def test_another_version_is_refused(self) -> None:
        from nxgate.gateway.doors.web.viewer import EarlyVersion

        early = EarlyVersion()
        self.assertRaises(ValueError, early.feed, b"RFB 003.003\n")
        self.assertRaises(ValueError, EarlyVersion().feed, b"GET / HTTP/1.1\r\n")

    def test_the_servers_security_types_wait_for_the_browsers_version(self) -> None:
        """noVNC given x11vnc's version and security types in one message answered its version and then
        nothing: the types reach it after it spoke, as from an RFB server that waited for it."""
        from nxgate.gateway.doors.web.viewer import EarlyVersion

        early = EarlyVersion()
        self.assertEqual(early.from_server(b"RFB 003.008\n\x01\x01"), b"RFB 003.008\n")
        self.assertEqual(early.from_server(b"\x00"), b"")
        early.feed(b"RFB 003.008\n")
        self.assertEqual(early.release(), b"\x01\x01\x00")
        self.assertEqual(early.from_server(b"\x00\x00\x00\x00"), b"\x00\x00\x00\x00")


class LiveViewerTests(TestCase):
    """A live viewer: x11vnc on the session's own display (pure parts: its argv, and who ends it)."""

    def test_x11vnc_of_a_live_viewer(self) -> None:
        argv = bv.live_x11vnc_argv("x11vnc", 1230, "/state/sessions/ABC/view-12345678")
        self.assertEqual(argv[argv.index("-display") + 1], ":1230")
        self.assertEqual(argv[argv.index("-unixsock") + 1], "/state/sessions/ABC/view-12345678")
        for port_option in ("-rfbport", "-rfbportv6"):
            self.assertEqual(argv[argv.index(port_option) + 1], "0")
        self.assertEqual(argv[argv.index("-sb") + 1], "0")  # no slow polling after a minute without change
        self.assertIn("-once", argv)
        self.assertIn("-timeout", argv)
        self.assertNotIn("-xrandr", argv)
        # Polls an unchanged screen every 10 ms, every 3 ms right after the page's input; X DAMAGE kept.
        self.assertEqual(argv[argv.index("-wait") + 1], "10")
        self.assertEqual(argv[argv.index("-wait_ui") + 1], "3.33")
        self.assertNotIn("-noxdamage", argv)
        self.assertEqual(bv.x11vnc_argv("x11vnc", 3100, "/v/vnc.sock").count("-wait_ui"), 1)

    def test_a_resume_or_the_end_of_the_session_ends_its_live_viewers_only(self) -> None:
        from nxgate.vocabulary.model import State
        from nxgate.vocabulary.results import SessionEvent

        viewers = bv.BrowserViewers(FakeReactor(), None, "/nonexistent", "/nonexistent")
        ended: list[tuple[str, str]] = []

        def live(viewer_id: str, session_id: str) -> bv.BrowserViewer:
            viewer = bv.BrowserViewer(viewers, viewer_id, "alice", 1000, 1000, "/nonexistent", "/")
            viewer.session_id = session_id
            viewer.on_close = lambda why: ended.append((viewer_id, why))
            viewers.open_viewers[viewer_id] = viewer
            return viewer

        live("v1", "S1"), live("v2", "S2"), live("v3", "S1")

        class View:
            def __init__(self, id: str, state: State) -> None:
                self.id, self.state = id, state

        viewers.session_changed(SessionEvent(View("S1", State.SUSPENDED), State.RUNNING))  # type: ignore[arg-type]
        self.assertEqual(ended, [])
        viewers.session_changed(SessionEvent(View("S1", State.RESUMING), State.SUSPENDED))  # type: ignore[arg-type]
        self.assertEqual(sorted(ended), [("v1", "The session was resumed elsewhere."),
                                         ("v3", "The session was resumed elsewhere.")])
        self.assertEqual(sorted(viewers.open_viewers), ["v2"])
        viewers.session_changed(SessionEvent(View("S2", State.TERMINATED), State.SUSPENDED))  # type: ignore[arg-type]
        self.assertEqual(ended[-1], ("v2", "The session ended."))
        self.assertEqual(viewers.count(), 0)
