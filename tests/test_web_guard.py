"""The web door's request guard with Twisted's in-memory channel: what the
end-to-end test (tests/test_e2e_web_hardening.py) cannot make the real
gateway do on purpose — a resource that raises — and the pure parts."""

from __future__ import annotations

from typing import Any

from twisted.logger import LogLevel, globalLogPublisher
from twisted.trial.unittest import TestCase
from twisted.web import resource
from twisted.web.test.requesthelper import DummyChannel

from nxgate.gateway.doors.web.guard import DoorRequest, DoorSite, Quota, clean_path
from nxgate.gateway.doors.web.logins import LoginTable
from nxgate.gateway.doors.web.site import Deferring, WebAuth
from tests.harness.clock import FakeReactor


class Boom(resource.Resource):
    isLeaf = True

    def render_GET(self, request: Any) -> bytes:
        raise RuntimeError("a bug in a page")


class LaterBoom(Deferring):
    def render_GET(self, request: Any) -> Any:
        async def fail() -> bytes:
            raise RuntimeError("a bug in a handler")
        return self.run(request, fail())


class GuardTests(TestCase):
    def setUp(self) -> None:
        self.clock = FakeReactor()
        self.auth = WebAuth(LoginTable(900, self.clock.seconds), tls=True)
        root = resource.Resource()
        root.putChild(b"boom", Boom())
        root.putChild(b"later", LaterBoom(self.auth))
        self.site = DoorSite(root, self.auth.header_items, self.clock.seconds)
        self.events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(self.events.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.events.append)

    def get(self, path: bytes) -> bytes:
        channel = DummyChannel()
        channel.site = self.site
        request = DoorRequest(channel)
        request.gotLength(0)
        request.requestReceived(b"GET", path, b"HTTP/1.1")
        return channel.transport.written.getvalue()

    def tracebacks(self) -> int:
        return sum(1 for event in self.events if "log_failure" in event)

    def assert_guarded(self, answer: bytes, status: bytes) -> None:
        head = answer.split(b"\r\n\r\n", 1)[0].lower()
        self.assertTrue(head.startswith(b"http/1.1 " + status), head)
        for name, value in self.auth.header_items():
            self.assertIn(name.lower() + b": " + value.lower(), head)
        self.assertNotIn(b"server:", head)
        self.assertNotIn(b"twisted", answer.lower())

    def test_render_failure(self) -> None:
        """A resource that raises: a 500 with the headers; its traceback once a minute."""
        for _ in range(5):
            self.assert_guarded(self.get(b"/boom"), b"500")
        self.assertEqual(self.tracebacks(), 1)
        self.clock.advance(61)
        self.get(b"/boom")
        self.assertEqual(self.tracebacks(), 2)
        last = [e for e in self.events if "log_failure" in e][-1]
        self.assertEqual(last["suppressed"], 4)
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 2)

    def test_handler_failure(self) -> None:
        self.assert_guarded(self.get(b"/later"), b"500")
        self.assert_guarded(self.get(b"/later"), b"500")
        self.assertEqual(self.tracebacks(), 1)
        quiet = [e for e in self.events if e.get("log_level") is LogLevel.warn and "error" in e]
        self.assertEqual(quiet[-1]["error"], "a bug in a handler")
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)

    def test_bad_paths(self) -> None:
        for path in (b"/static/portal.js%00.css", b"/%ff", b"/a/%c3%28"):
            self.assert_guarded(self.get(path), b"400")
        self.assert_guarded(self.get(b"/nothing"), b"404")
        self.assertEqual(self.tracebacks(), 0)


class PureTests(TestCase):
    def test_clean_path(self) -> None:
        self.assertTrue(clean_path(b"/static/portal.js"))
        self.assertTrue(clean_path(b"/view/open?x=%00"[:10]))
        self.assertTrue(clean_path(b"/caf%C3%A9"))
        self.assertFalse(clean_path(b"/static/portal.js%00.css"))
        self.assertFalse(clean_path(b"/a\x00b"))
        self.assertFalse(clean_path(b"/%ff"))

    def test_quota(self) -> None:
        clock = FakeReactor()
        quota = Quota(clock.seconds, 60)
        self.assertEqual(quota.take(), 0)
        self.assertIsNone(quota.take())
        self.assertIsNone(quota.take())
        clock.advance(60)
        self.assertEqual(quota.take(), 2)


class ListenTests(TestCase):
    """How ``[web] listen`` becomes the TLS endpoint (the handshakes themselves: the e2e test)."""

    def test_quoted_paths(self) -> None:
        from twisted.internet.endpoints import quoteStringArgument

        from nxgate.gateway.doors.web import tls
        path = "/etc/odd:dir\\x/key.pem"
        kind, options = tls.endpoint_options(f"ssl:4443:privateKey={quoteStringArgument(path)}:interface=\\:\\:1")
        self.assertEqual((kind, options["privateKey"], options["interface"], options["port"]),
                         ("ssl", path, "::1", "4443"))

    def test_unknown_ssl_option_refused(self) -> None:
        from nxgate.gateway.doors.web import tls
        error = self.assertRaises(tls.WebConfigError, tls.listening_endpoint, FakeReactor(),
                                  "ssl:4443:privateKey=/k.pem:sslmethod=TLSv1_METHOD")
        self.assertIn("sslmethod", str(error))

    def test_ciphers_are_aead_with_forward_secrecy(self) -> None:
        from nxgate.gateway.doors.web import tls
        for name in tls.CIPHERS.split(":"):
            self.assertTrue(name.startswith(("ECDHE-", "DHE-")), name)
            self.assertTrue(name.endswith(("GCM-SHA256", "GCM-SHA384", "CHACHA20-POLY1305")), name)
