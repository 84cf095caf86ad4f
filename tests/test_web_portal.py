"""Unit tests of the browser door's pure parts and of its site against a
fake session service (no PAM, no agents): the cookie table, CSRF, handles,
the pages' security properties, the endpoint rules and the thumbnail codec.
The real thing, in a real browser, is tests/test_e2e_web.py."""

from __future__ import annotations

import io
import os
import re
import stat
import struct
import tempfile
from typing import Any

from twisted.internet import defer
from twisted.trial.unittest import TestCase
from twisted.web.resource import getChildForRequest
from twisted.web.test.requesthelper import DummyRequest

from nxgate.gateway.auth.pam import AuthResult, Verdict
from nxgate.config import WebSection
from nxgate.gateway.doors.web import pages, tls
from nxgate.gateway.doors.web.logins import COOKIE_NAME, LoginTable
from nxgate.gateway.doors.web.site import PRELOGIN_COOKIE, web_site, words_of
from nxgate.node import thumbnails
from nxgate.vocabulary.caller import Caller
from nxgate.vocabulary.errors import Kind, SessionError
from nxgate.vocabulary.results import Listing, ServiceStatus, SessionView, ShadowTarget
from nxgate.vocabulary.model import State
from tests.harness.fakes import FakeSessionAPI
from tests.harness.clock import FakeReactor


class LoginTableTests(TestCase):
    def setUp(self) -> None:
        self.clock = FakeReactor()
        self.table = LoginTable(60, self.clock.seconds)

    def test_cookie_and_csrf_are_random_and_distinct(self) -> None:
        a, b = self.table.create(Caller("alice")), self.table.create(Caller("bob"))
        self.assertEqual(len({a.cookie, a.csrf, b.cookie, b.csrf}), 4)
        self.assertGreaterEqual(len(a.cookie), 40)
        self.assertIs(self.table.find(a.cookie), a)
        self.assertIsNone(self.table.find("forged"))
        self.assertIsNone(self.table.find(None))
        self.assertIsNone(self.table.find(b"\xff\xfe"))

    def test_idle_timeout_and_touch(self) -> None:
        login = self.table.create(Caller("alice"))
        self.clock.advance(50)
        self.assertIs(self.table.find(login.cookie), login)  # touched: the clock restarts
        self.clock.advance(50)
        self.assertIs(self.table.find(login.cookie, touch=False), login)
        self.clock.advance(11)  # 61 s since the last touch
        self.assertIsNone(self.table.find(login.cookie))
        self.assertEqual(len(self.table), 0)

    def test_expire_drops_only_idle_logins(self) -> None:
        old = self.table.create(Caller("alice"))
        self.clock.advance(40)
        new = self.table.create(Caller("bob"))
        self.clock.advance(30)
        self.assertEqual(self.table.expire(), [old])
        self.assertIs(self.table.find(new.cookie), new)

    def test_csrf_check(self) -> None:
        login = self.table.create(Caller("alice"))
        self.assertTrue(login.csrf_ok(login.csrf))
        self.assertTrue(login.csrf_ok(login.csrf.encode()))
        for bad in (None, "", "x", login.cookie, login.csrf + "x", "é"):
            self.assertFalse(login.csrf_ok(bad), bad)

    def test_handles_are_per_login(self) -> None:
        a, b = self.table.create(Caller("alice")), self.table.create(Caller("bob"))
        handle = a.handle("SESSION1")
        self.assertEqual(a.handle("SESSION1"), handle)
        self.assertNotIn("SESSION1", handle)
        self.assertEqual(a.session_id(handle), "SESSION1")
        self.assertIsNone(b.session_id(handle))
        self.assertIsNone(a.session_id(""))
        self.assertNotEqual(b.handle("SESSION1"), handle)


class EndpointTests(TestCase):
    def test_plain_http_only_on_loopback(self) -> None:
        for listen in ("ssl:4443", "ssl:4443:interface=10.0.0.1", "tcp:8080:interface=127.0.0.1",
                       "tcp6:8080:interface=\\:\\:1"):
            tls.check_listen(listen)
        for listen in ("tcp:8080", "tcp:8080:interface=0.0.0.0", "tcp:8080:interface=10.0.0.1", "unix:/x"):
            self.assertRaises(tls.WebConfigError, tls.check_listen, listen)

    def test_certificate_generated_once_private(self) -> None:
        directory = os.path.join(tempfile.mkdtemp(), "web")
        cert, key = tls.ensure_certificate(directory, "gw.example.org")
        self.assertEqual(stat.S_IMODE(os.stat(key).st_mode), 0o600)
        self.assertEqual(stat.S_IMODE(os.stat(directory).st_mode), 0o700)
        with open(cert, "rb") as handle:
            first = handle.read()
        self.assertEqual(tls.ensure_certificate(directory, "gw.example.org"), (cert, key))
        with open(cert, "rb") as handle:
            self.assertEqual(handle.read(), first)
        endpoint = tls.server_endpoint("ssl:4443", "", "", directory)
        self.assertIn(f"privateKey={key}", endpoint)
        self.assertIn(f"certKey={cert}", endpoint)

    def test_admin_pem_files(self) -> None:
        self.assertEqual(tls.server_endpoint("ssl:4443", "/etc/c.pem", "/etc/k.pem", "/nonexistent"),
                         "ssl:4443:privateKey=/etc/k.pem:certKey=/etc/c.pem")


def xwd(width: int, height: int, pixels: list[tuple[int, int, int]]) -> bytes:
    """A 32-bpp little-endian TrueColor XWD dump as nxagent's xwd writes it."""
    name = b"x\0\0\0"
    header_size = 100 + len(name)
    header = struct.pack(">25I", header_size, 7, 2, 24, width, height, 0, 0, 32, 0, 32, 32, 4 * width, 4,
                         0xFF0000, 0xFF00, 0xFF, 8, 256, 0, width, height, 0, 0, 0)
    data = b"".join(bytes((b, g, r, 0)) for r, g, b in pixels)
    return header + name + data


class WordsTests(TestCase):
    def test_refusals_name_no_session_id(self) -> None:
        session_id = "0123456789ABCDEF0123456789ABCDEF"
        for kind in (Kind.NOT_FOUND, Kind.NOT_YOURS):
            self.assertEqual(words_of(SessionError(kind, f"Could not find session {session_id}.")), "No such session.")
        words = words_of(SessionError(Kind.WRONG_STATE, f"Session {session_id} is starting.", session_id=session_id))
        self.assertEqual(words, "Session this session is starting.")
        self.assertNotIn(session_id, words)
        self.assertEqual(words_of(SessionError(Kind.REFUSED_BY_OWNER, "Authorization refused by user: alice.")),
                         "Authorization refused by user: alice.")


class ThumbnailCodecTests(TestCase):
    def test_parse_scale_png(self) -> None:
        width, height = 8, 4
        pixels = [(x * 30, y * 60, (x + y) % 2 * 255) for y in range(height) for x in range(width)]
        w, h, rgb = thumbnails.parse_xwd(xwd(width, height, pixels))
        self.assertEqual((w, h), (8, 4))
        self.assertEqual(rgb[:6], bytes((0, 0, 0, 30, 0, 255)))
        self.assertEqual(thumbnails.fit(1024, 768, 240, 180), (240, 180))
        self.assertEqual(thumbnails.fit(100, 50, 240, 180), (100, 50))
        small = thumbnails.scale_nearest(w, h, rgb, 4, 2)
        expected = b"".join(bytes(pixels[(y * 4 // 2) * width + x * 8 // 4]) for y in range(2) for x in range(4))
        self.assertEqual(small, expected)
        from PIL import Image

        image = Image.open(io.BytesIO(thumbnails.png(4, 2, small)))
        self.assertEqual((image.size, image.mode), ((4, 2), "RGB"))
        self.assertEqual(image.tobytes(), small)

    def test_bad_dumps_are_refused(self) -> None:
        self.assertRaises(thumbnails.ThumbnailError, thumbnails.parse_xwd, b"short")
        self.assertRaises(thumbnails.ThumbnailError, thumbnails.parse_xwd, xwd(8, 4, [(0, 0, 0)] * 32)[:-10])


# ------------------------------------------------------------------ the site
def view(session_id: str, user: str, state: State = State.SUSPENDED) -> SessionView:
    return SessionView(id=session_id, full_id="FULL" + session_id, user=user, type="unix-console", name="desk",
                       display=1042, state=state, geometry="800x600", depth=24, render=True, fullscreen=False,
                       rootless=False, encrypted=True, client_address="192.0.2.9", created=1000.0, changed=1000.0,
                       attached_before=True, agent_pid=1, failure="")


class OwnedSessions:
    """The answers of the session API's owner checks, over a dict (the
    site is given ``FakeSessionAPI.over`` it)."""

    def __init__(self) -> None:
        self.sessions = {"S1ALICE": view("S1ALICE", "alice"), "S2BOB": view("S2BOB", "bob", State.RUNNING)}
        self.calls: list[tuple[str, str, str]] = []

    def owned(self, caller: Caller, session_id: str) -> SessionView:
        found = self.sessions.get(session_id)
        if found is None:
            raise SessionError(Kind.NOT_FOUND, "No such session.")
        if not caller.owns(found.user):
            raise SessionError(Kind.NOT_YOURS, "No such session.")
        return found

    async def list(self, caller: Caller) -> Listing:
        return Listing(tuple(v for v in self.sessions.values() if caller.owns(v.user)), False)

    async def show(self, caller: Caller, session_id: str) -> SessionView:
        return self.owned(caller, session_id)

    async def suspend(self, caller: Caller, session_id: str) -> SessionView:
        self.calls.append(("suspend", caller.user, self.owned(caller, session_id).id))
        return self.sessions[session_id]

    async def terminate(self, caller: Caller, session_id: str, reason: str = "") -> SessionView:
        self.calls.append(("terminate", caller.user, self.owned(caller, session_id).id))
        return self.sessions[session_id]

    async def start_for_later(self, caller: Caller, session_type: str, name: str) -> SessionView:
        self.calls.append(("start", caller.user, session_type))
        return view("S3NEW", caller.user)

    async def status(self, caller: Caller) -> ServiceStatus:
        return ServiceStatus(False, len(self.sessions), 0, ())

    async def shadow_targets(self, caller: Caller) -> tuple[ShadowTarget, ...]:
        """As the shadow service: running sessions only (a jailed one would be left out too)."""
        return tuple(ShadowTarget(v.id, v.user, v.display, v.name, v.type) for v in self.sessions.values()
                     if v.state is State.RUNNING)

    async def set_draining(self, caller: Caller, on: bool) -> bool:
        if not caller.admin:
            raise SessionError(Kind.NOT_ALLOWED, "Only the admin may drain the server.")
        self.calls.append(("drain", caller.user, str(on)))
        return on


class FakeAuthenticator:
    PASSWORDS = {"alice": "right", "bob": "bobs", "root": "x"}

    async def _check(self, user: str, password: str) -> AuthResult:
        if user == "root":
            return AuthResult(Verdict.DENIED, user, "user is in deny_users")
        if self.PASSWORDS.get(user) == password:
            return AuthResult(Verdict.GRANTED, user, "")
        return AuthResult(Verdict.DENIED, user, "PAM: Authentication failure (7)", 7)

    def password(self, user: str, password: str, address: str | None) -> defer.Deferred[AuthResult]:
        return defer.ensureDeferred(self._check(user, password))


class Request(DummyRequest):
    """DummyRequest with cookies and a client address."""

    def __init__(self, path: bytes, method: bytes = b"GET", args: dict[str, str] | None = None,
                 cookies: dict[str, str] | None = None, headers: dict[bytes, bytes] | None = None) -> None:
        super().__init__([part for part in path.split(b"/")[1:]])
        self.path, self.uri, self.method = path, path, method
        self.args = {k.encode(): [v.encode()] for k, v in (args or {}).items()}
        self.received_cookies = {k.encode(): v.encode() for k, v in (cookies or {}).items()}
        self.set_cookies: dict[str, tuple[str, dict[str, Any]]] = {}
        for name, value in (headers or {}).items():
            self.requestHeaders.setRawHeaders(name, [value])

    def getCookie(self, name: bytes) -> bytes | None:
        return self.received_cookies.get(name)

    def addCookie(self, name: bytes, value: bytes, **options: Any) -> None:
        self.set_cookies[name.decode()] = (value.decode(), options)

    @property
    def body(self) -> str:
        return b"".join(self.written).decode()


class SiteTests(TestCase):
    def setUp(self) -> None:
        self.clock = FakeReactor()
        self.service = OwnedSessions()
        self.drawn: list[str] = []
        self.settings = WebSection(listen="ssl:0", admin_groups=("wheel",), idle_timeout=300, thumbnail_ttl=3)

        async def resolve(user: str, address: str) -> Caller:
            return Caller(user, groups=frozenset({"wheel"} if user == "bob" else {"users"}), address=address)

        async def thumbnailer(caller: Caller, v: SessionView) -> bytes:
            self.drawn.append(v.id)
            return b"\x89PNG-" + v.id.encode()

        self.site, self.auth = web_site(reactor=self.clock, service=FakeSessionAPI.over(self.service), authenticator=FakeAuthenticator(),
                                        resolve=resolve, thumbnailer=thumbnailer, settings=lambda: self.settings,
                                        types=lambda: ["unix-console", "unix-xfce"])

    def request(self, path: bytes, method: bytes = b"GET", **kwargs: Any) -> Request:
        request = Request(path, method, **kwargs)
        resource = getChildForRequest(self.site.resource, request)
        result = resource.render(request)
        if isinstance(result, bytes):
            request.write(result)
            request.finish()
        self.assertTrue(request.finished, f"{path!r} did not finish")
        return request

    def log_in(self, user: str = "alice", password: str = "right") -> Request:
        form = self.request(b"/login")
        token = form.set_cookies[PRELOGIN_COOKIE][0]
        self.assertIn(f'value="{token}"', form.body)
        return self.request(b"/login", b"POST", args={"csrf": token, "user": user, "password": password},
                            cookies={PRELOGIN_COOKIE: token})

    def cookie(self, user: str = "alice", password: str = "right") -> dict[str, str]:
        answer = self.log_in(user, password)
        self.assertEqual(answer.responseCode, 303)
        return {COOKIE_NAME: answer.set_cookies[COOKIE_NAME][0]}

    def test_login_sets_a_strict_cookie(self) -> None:
        answer = self.log_in()
        self.assertEqual(answer.responseCode, 303)
        self.assertEqual(answer.responseHeaders.getRawHeaders(b"location"), [b"/"])
        value, options = answer.set_cookies[COOKIE_NAME]
        self.assertEqual(options, {"path": b"/", "httpOnly": True, "secure": True, "sameSite": "strict",
                                   "max_age": None})
        self.assertIsNotNone(self.auth.logins.find(value))

    def test_wrong_password_and_denied_user(self) -> None:
        answer = self.log_in(password="wrong")
        self.assertEqual(answer.responseCode, 403)
        self.assertNotIn(COOKIE_NAME, answer.set_cookies)
        self.assertIn("Login failed", answer.body)
        self.assertEqual(len(self.auth.logins), 0)
        answer = self.log_in("root", "x")
        self.assertIn("may not log in to this server", answer.body)

    def test_login_without_the_form_token_is_refused(self) -> None:
        """A cross-site form cannot log a victim in (as the attacker)."""
        for cookies, token in (({}, "t"), ({PRELOGIN_COOKIE: "a"}, "b"), ({PRELOGIN_COOKIE: "a"}, "")):
            answer = self.request(b"/login", b"POST", args={"csrf": token, "user": "alice", "password": "right"},
                                  cookies=cookies)
            self.assertEqual(answer.responseCode, 403)
            self.assertNotIn(COOKIE_NAME, answer.set_cookies)
        self.assertEqual(len(self.auth.logins), 0)

    def test_portal_lists_own_sessions_by_handle_only(self) -> None:
        page = self.request(b"/", cookies=self.cookie())
        body = page.body
        self.assertIn("desk", body)
        self.assertNotIn("S1ALICE", body)
        self.assertNotIn("1042", body)  # the display
        self.assertNotIn("S2BOB", body)
        headers = page.responseHeaders
        self.assertEqual(headers.getRawHeaders(b"content-security-policy"), [pages.CSP.encode()])
        self.assertNotIn("<script>", body)
        self.assertNotIn("style=", body)
        self.assertNotIn("<style", body)
        self.assertNotIn(COOKIE_NAME, page.set_cookies)  # the page request carries no new cookie
        self.assertEqual(body.count('name="csrf"'), body.count("<form"))

    def handle_of(self, cookies: dict[str, str], session_id: str) -> str:
        return self.auth.logins.find(cookies[COOKIE_NAME]).handle(session_id)

    def test_actions_need_the_csrf_token(self) -> None:
        cookies = self.cookie()
        login = self.auth.logins.find(cookies[COOKIE_NAME])
        handle = login.handle("S1ALICE")
        for token in (None, "", "forged", cookies[COOKIE_NAME]):
            args = {"op": "terminate", "handle": handle} | ({"csrf": token} if token is not None else {})
            self.assertEqual(self.request(b"/act", b"POST", args=args, cookies=cookies).responseCode, 403)
        self.assertEqual(self.service.calls, [])
        answer = self.request(b"/act", b"POST", args={"op": "terminate", "handle": handle, "csrf": login.csrf},
                              cookies=cookies)
        self.assertEqual(answer.responseCode, 303)
        self.assertEqual(self.service.calls, [("terminate", "alice", "S1ALICE")])
        answer = self.request(b"/act", b"POST", args={"op": "suspend", "handle": handle},
                              cookies=cookies, headers={b"x-csrf-token": login.csrf.encode()})
        self.assertEqual(self.service.calls[-1], ("suspend", "alice", "S1ALICE"))

    def test_start_offers_only_the_allowed_types(self) -> None:
        cookies = self.cookie()
        csrf = self.auth.logins.find(cookies[COOKIE_NAME]).csrf
        self.assertEqual(self.request(b"/act", b"POST", args={"op": "start", "type": "unix-console", "csrf": csrf},
                                      cookies=cookies).responseCode, 303)
        answer = self.request(b"/act", b"POST", args={"op": "start", "type": "unix-application", "csrf": csrf},
                              cookies=cookies)
        self.assertEqual(answer.responseCode, 403)
        self.assertEqual(self.service.calls, [("start", "alice", "unix-console")])

    def test_a_refusal_is_shown_as_an_error(self) -> None:
        """Issue 25: a refused start was shown in the success colour (class "notice")."""
        cookies = self.cookie()
        csrf = self.auth.logins.find(cookies[COOKIE_NAME]).csrf
        answer = self.request(b"/act", b"POST", args={"op": "start", "type": "unix-gnome", "csrf": csrf},
                              cookies=cookies)
        self.assertEqual(answer.responseCode, 403)
        self.assertIn('<p class="error" role="alert">Sessions of type &#x27;unix-gnome&#x27; cannot be started',
                      answer.body)
        self.assertNotIn('class="notice"', answer.body)

    def test_start_and_open_in_one_step(self) -> None:
        """Issue 25: "Start and open" starts the session, then the next page (a GET) opens it in the viewer."""
        cookies = self.cookie()
        login = self.auth.logins.find(cookies[COOKIE_NAME])
        page = self.request(b"/", cookies=cookies).body
        self.assertIn('name="then" value="open"', page)
        answer = self.request(b"/act", b"POST", args={"op": "start", "type": "unix-console", "then": "open",
                                                      "csrf": login.csrf}, cookies=cookies)
        self.assertEqual(answer.responseHeaders.getRawHeaders(b"location"), [b"/?m=opening"])
        page = self.request(b"/", args={"m": "opening"}, cookies=cookies).body
        self.assertIn('<form method="post" action="/view/open" class="open-now">', page)
        self.assertIn(f'name="handle" value="{login.handle("S3NEW")}"', page)
        self.assertNotIn("S3NEW", page)
        # Once only: a reload of that page opens nothing again.
        self.assertNotIn("open-now", self.request(b"/", args={"m": "opening"}, cookies=cookies).body)

    def test_the_pages_own_refresh_is_not_activity(self) -> None:
        """portal.js fetches the page again to keep the list current: the idle timeout still ends the login."""
        cookies = self.cookie()
        for _ in range(2):
            self.clock.advance(100)
            answer = self.request(b"/", cookies=cookies, headers={b"X-Nxgate-Refresh": b"1"})
            self.assertIn("My sessions", answer.body)
        self.clock.advance(150)  # 350 s after the login, 150 s after the last refresh (idle timeout: 300 s)
        self.site.expire_logins()
        self.assertEqual(len(self.auth.logins), 0)

    def test_shadow_is_offered_only_for_what_may_be_shadowed(self) -> None:
        """Issue 25: Shadow was offered for suspended (and jailed) sessions."""
        bob = self.cookie("bob", "bobs")
        login = self.auth.logins.find(bob[COOKIE_NAME])
        page = self.request(b"/admin", cookies=bob).body
        shadows = re.findall(r'action="/view/shadow".*?name="handle" value="([^"]+)"', page)
        self.assertEqual(shadows, [login.handle("S2BOB")])  # running; S1ALICE is suspended
        self.assertIn('name="asks" value="0"', page)  # the fake policy asks nobody: the viewer says "Connecting…"

    def test_another_users_session_is_out_of_reach(self) -> None:
        alice, bob = self.cookie(), self.cookie("bob", "bobs")
        alice_login = self.auth.logins.find(alice[COOKIE_NAME])
        bobs_handle = self.handle_of(bob, "S2BOB")
        # Bob's handle means nothing in Alice's login; a forged mapping meets the service's owner check.
        answer = self.request(b"/act", b"POST", args={"op": "terminate", "handle": bobs_handle,
                                                       "csrf": alice_login.csrf}, cookies=alice)
        self.assertEqual(answer.responseCode, 403)
        self.assertIn("No such session", answer.body)
        self.assertEqual(self.request(b"/thumb/" + bobs_handle.encode(), cookies=alice).responseCode, 404)
        alice_login.handles["forged"] = "S2BOB"
        self.assertEqual(self.request(b"/thumb/forged", cookies=alice).responseCode, 404)
        answer = self.request(b"/act", b"POST", args={"op": "terminate", "handle": "forged",
                                                       "csrf": alice_login.csrf}, cookies=alice)
        self.assertIn("No such session", answer.body)
        self.assertEqual(self.service.calls, [])
        self.assertEqual(self.drawn, [])

    def test_thumbnails_are_cached_and_owner_checked(self) -> None:
        cookies = self.cookie()
        handle = self.handle_of(cookies, "S1ALICE").encode()
        first = self.request(b"/thumb/" + handle, cookies=cookies)
        self.assertEqual(first.responseHeaders.getRawHeaders(b"content-type"), [b"image/png"])
        self.assertEqual(first.written, [b"\x89PNG-S1ALICE"])
        self.request(b"/thumb/" + handle, cookies=cookies)
        self.assertEqual(self.drawn, ["S1ALICE"])
        self.clock.advance(3.5)
        self.request(b"/thumb/" + handle, cookies=cookies)
        self.assertEqual(self.drawn, ["S1ALICE", "S1ALICE"])
        self.assertEqual(self.request(b"/thumb/" + handle).responseCode, 404)  # no cookie

    def test_admin_page_for_admin_groups_only(self) -> None:
        alice, bob = self.cookie(), self.cookie("bob", "bobs")
        self.assertEqual(self.request(b"/admin", cookies=alice).responseCode, 403)
        page = self.request(b"/admin", cookies=bob)
        self.assertIn("alice", page.body)
        self.assertIn("192.0.2.9", page.body)
        self.assertNotIn("S1ALICE", page.body)
        # The admin sees (and acts on) Alice's session through his own handle.
        login = self.auth.logins.find(bob[COOKIE_NAME])
        handle = login.handle("S1ALICE")
        self.assertEqual(self.request(b"/thumb/" + handle.encode(), cookies=bob).written, [b"\x89PNG-S1ALICE"])
        self.request(b"/admin/act", b"POST", args={"op": "terminate", "handle": handle, "csrf": login.csrf},
                     cookies=bob)
        self.request(b"/admin/act", b"POST", args={"op": "drain", "csrf": login.csrf}, cookies=bob)
        self.assertEqual(self.service.calls, [("terminate", "bob", "S1ALICE"), ("drain", "bob", "True")])
        alice_csrf = self.auth.logins.find(alice[COOKIE_NAME]).csrf
        answer = self.request(b"/admin/act", b"POST", args={"op": "drain", "csrf": alice_csrf}, cookies=alice)
        self.assertEqual(answer.responseCode, 403)
        self.assertEqual(len(self.service.calls), 2)

    def test_logout_and_idle_timeout(self) -> None:
        cookies = self.cookie()
        csrf = self.auth.logins.find(cookies[COOKIE_NAME]).csrf
        self.assertEqual(self.request(b"/logout", b"POST", args={"csrf": "bad"}, cookies=cookies).responseCode, 403)
        answer = self.request(b"/logout", b"POST", args={"csrf": csrf}, cookies=cookies)
        self.assertEqual(answer.responseHeaders.getRawHeaders(b"location"), [b"/login"])
        self.assertEqual(answer.set_cookies[COOKIE_NAME][1]["max_age"], b"0")
        self.assertEqual(self.request(b"/", cookies=cookies).responseCode, 303)
        cookies = self.cookie()
        handle = self.handle_of(cookies, "S1ALICE").encode()
        for _ in range(4):  # a page left open refreshes its pictures: that is not activity
            self.clock.advance(100)
            self.request(b"/thumb/" + handle, cookies=cookies)
        self.site.expire_logins()
        self.assertEqual(len(self.auth.logins), 0)
        answer = self.request(b"/", cookies=cookies)
        self.assertEqual(answer.responseHeaders.getRawHeaders(b"location"), [b"/login"])


class PagesTests(TestCase):
    def test_values_are_escaped(self) -> None:
        row = pages.Row(handle='h"<', name="<script>alert(1)</script>", type="t", state="Running", since=0,
                        thumbnail=True, openable=True)
        html = pages.portal([row], 'c"', ["unix-<x>"], viewer=True)
        self.assertNotIn("<script>", html)
        self.assertIn("&lt;script&gt;", html)
        self.assertIn('value="c&quot;"', html)
        self.assertIn("/view/open", html)
        self.assertNotIn("/view/open", pages.portal([row], "c", [], viewer=False))
