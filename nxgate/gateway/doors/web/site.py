"""The browser door's twisted.web site: login, portal, admin page, thumbnails.

The door speaks to the session service only through its vocabulary
(:mod:`nxgate.vocabulary.api`); PAM, the throttle and the audit lines are
the NX door's (:class:`nxgate.gateway.auth.pam.Authenticator`,
:mod:`nxgate.gateway.doors.login_events`).  What a browser holds is a random
HttpOnly, Secure, SameSite=Strict cookie; pages name sessions by opaque
per-login handles (:mod:`nxgate.gateway.doors.web.logins`), and every POST carries
the login's CSRF token.  ``/view`` is where the in-browser viewer
(:mod:`nxgate.gateway.doors.web.viewer`) mounts.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web import resource, server, static

from nxgate.gateway.auth.pam import AuthResult, Authenticator, Verdict
from nxgate.gateway.doors.login_events import log_granted, log_refused
from nxgate.gateway.doors.web import pages
from nxgate.gateway.doors.web.guard import DoorSite, report_failure
from nxgate.gateway.doors.web.logins import COOKIE_NAME, Login, LoginTable, new_token, same_secret
from nxgate.vocabulary.api import SessionAPI
from nxgate.vocabulary.caller import Caller
from nxgate.vocabulary.errors import Kind, SessionError
from nxgate.vocabulary.results import SessionView

log = Logger()

PRELOGIN_COOKIE = "nxgate_prelogin"
STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
DRAWING_AT_ONCE = 2
THUMBNAIL_STATES = ("Running", "Suspended")
#: Sent by portal.js when it fetches the page again to refresh the list (see Portal.render_GET).
REFRESH_HEADER = b"x-nxgate-refresh"

#: ``(user, address) -> Caller`` of a logged-in user (off the reactor: NSS).
ResolveCaller = Callable[[str, str], Awaitable[Caller]]
#: A PNG of a session's screen (off the reactor).
#: Draws a PNG of ``view`` for ``caller`` (the router's thumbnail: on the session's node).
Thumbnailer = Callable[[Caller, SessionView], Awaitable[bytes]]


def client_address(request: server.Request) -> str:
    peer = request.getClientAddress()
    return str(getattr(peer, "host", "") or peer)


def form(request: server.Request, name: str) -> str:
    values = request.args.get(name.encode()) if request.args else None
    if not values:
        return ""
    return values[0].decode("utf-8", "replace")


class WebAuth:
    """Who a request comes from, and the page frame: given to every resource
    of the door, the viewer's too (``auth(request) -> Caller | None``)."""

    def __init__(self, logins: LoginTable, tls: bool = True) -> None:
        self.logins = logins
        self.tls = tls

    # ------------------------------------------------------------- logins
    def login(self, request: server.Request, touch: bool = True) -> Login | None:
        return self.logins.find(request.getCookie(COOKIE_NAME.encode()), touch)

    def __call__(self, request: server.Request, touch: bool = True) -> Caller | None:
        found = self.login(request, touch)
        return None if found is None else found.caller

    def admin_caller(self, request: server.Request, touch: bool = True) -> Caller | None:
        """The caller acting on everyone's sessions, for members of the admin groups; else None."""
        found = self.login(request, touch)
        if found is None or not found.admin:
            return None
        return dataclasses.replace(found.caller, admin=True)

    # The two look-ups below are no activity of their own: whoever asks has judged that (caller()).
    def session_id(self, request: server.Request, handle: str | None) -> str | None:
        found = self.login(request, touch=False)
        return None if found is None else found.session_id(handle)

    def handle(self, request: server.Request, session_id: str) -> str:
        found = self.login(request, touch=False)
        if found is None:
            raise KeyError("not logged in")
        return found.handle(session_id)

    def csrf_ok(self, request: server.Request) -> bool:
        found = self.login(request, touch=False)
        if found is None:
            return False
        return found.csrf_ok(form(request, "csrf") or request.getHeader(b"x-csrf-token"))

    def csrf_token(self, request: server.Request) -> str:
        found = self.login(request, touch=False)
        return "" if found is None else found.csrf

    def set_cookie(self, request: server.Request, name: str, value: str, max_age: int | None = None) -> None:
        request.addCookie(name.encode(), value.encode(), path=b"/", httpOnly=True, secure=True,
                          sameSite="strict", max_age=None if max_age is None else str(max_age).encode())

    # -------------------------------------------------------------- pages
    def header_items(self) -> list[tuple[bytes, bytes]]:
        """The security headers every answer of the door carries (see :mod:`nxgate.gateway.doors.web.guard`)."""
        items = list(pages.SECURITY_HEADERS.items())
        if self.tls:
            items.append((b"Strict-Transport-Security", b"max-age=31536000"))
        return items

    def secure_headers(self, request: server.Request) -> None:
        for name, value in self.header_items():
            request.setHeader(name, value)

    def page(self, request: server.Request, title: str, body: str, scripts: Sequence[str] = ()) -> bytes:
        self.secure_headers(request)
        request.setHeader(b"Content-Type", b"text/html; charset=utf-8")
        found = self.login(request, touch=False)
        user = found.caller.user if found else ""
        return pages.document(title, body, user, found.csrf if found else "", bool(found and found.admin),
                              scripts).encode("utf-8")


def redirect(request: server.Request, where: bytes) -> bytes:
    request.setResponseCode(303)
    request.setHeader(b"Location", where)
    return b""


def refuse(auth: WebAuth, request: server.Request, code: int, message: str) -> bytes:
    request.setResponseCode(code)
    return auth.page(request, "Refused", f'<p class="error" role="alert">{pages.escape(message)}</p>')


_SESSION_ID = re.compile(r"\b[0-9A-Fa-f]{32}\b")


def words_of(error: SessionError) -> str:
    """What a browser may read of a refusal: someone else's session is "not
    found", and no session id appears (pages name sessions by handles only)."""
    if error.kind in (Kind.NOT_YOURS, Kind.NOT_FOUND):
        return "No such session."
    return _SESSION_ID.sub("this session", error.message)


class Deferring(resource.Resource):
    """A resource whose handlers are coroutines: errors become a 500 page, never a hung request."""

    isLeaf = True

    def __init__(self, auth: WebAuth) -> None:
        super().__init__()
        self.auth = auth

    def run(self, request: server.Request, work: Awaitable[bytes]) -> int:
        finished = [False]
        request.notifyFinish().addBoth(lambda _: finished.__setitem__(0, True))

        def done(body: bytes) -> None:
            if not finished[0]:
                request.write(body)
                request.finish()

        def failed(failure: Failure) -> None:
            report_failure(request, failure, "handler")
            if not finished[0]:
                request.setResponseCode(500)
                done(self.auth.page(request, "Error", '<p class="error">Internal error.</p>'))

        defer.ensureDeferred(work).addCallbacks(done, failed)
        return server.NOT_DONE_YET


class LoginPage(Deferring):
    """``GET /login``: the form, with a fresh pre-login token in a cookie
    and the form (double submit: a cross-site form cannot log someone in
    as the attacker).  ``POST /login``: PAM, then the login cookie."""

    def __init__(self, auth: WebAuth, authenticator: Authenticator, resolve: ResolveCaller,
                 admin_groups: Callable[[], Sequence[str]]) -> None:
        super().__init__(auth)
        self.authenticator = authenticator
        self.resolve = resolve
        self.admin_groups = admin_groups
        self.failures: dict[str, int] = {}

    def form_page(self, request: server.Request, message: str = "", user: str = "") -> bytes:
        token = new_token()
        self.auth.set_cookie(request, PRELOGIN_COOKIE, token)
        return self.auth.page(request, "Log in", pages.login_form(token, message, user))

    def render_GET(self, request: server.Request) -> bytes:
        if self.auth.login(request, touch=False) is not None:
            return redirect(request, b"/")
        return self.form_page(request)

    def render_POST(self, request: server.Request) -> int | bytes:
        expected = request.getCookie(PRELOGIN_COOKIE.encode())
        if not expected or not same_secret(form(request, "csrf"), expected.decode("ascii", "replace")):
            log.warn("web login from {address} refused: no valid CSRF token", address=client_address(request))
            request.setResponseCode(403)
            return self.form_page(request, "The login form expired; please try again.")
        return self.run(request, self.log_in(request, form(request, "user"), form(request, "password")))

    async def log_in(self, request: server.Request, user: str, password: str) -> bytes:
        address = client_address(request)
        result: AuthResult = await self.authenticator.password(user, password, address)
        if not result.granted:
            attempt = self.failures[address] = self.failures.get(address, 0) + 1
            if len(self.failures) > 4096:
                self.failures.clear()
            log_refused(log, "web", result, address, attempt)
            request.setResponseCode(403 if result.verdict is Verdict.DENIED else 503)
            message = result.client_note or ("Login failed: wrong user name or password, or the account may not "
                                             "log in now." if result.verdict is Verdict.DENIED
                                             else "The server could not check the login; try again later.")
            if result.reason.startswith("throttled"):
                message = "Too many failed logins; try again later."
            return self.form_page(request, message, user if result.client_note == "" else "")
        self.failures.pop(address, None)
        caller = await self.resolve(result.username, address)
        admin = bool(caller.groups & set(self.admin_groups()))
        found = self.auth.logins.create(dataclasses.replace(caller, door="web", admin=False), admin=admin)
        log_granted(log, "web", result.username, address, "password")
        self.auth.set_cookie(request, COOKIE_NAME, found.cookie)
        self.auth.set_cookie(request, PRELOGIN_COOKIE, "", max_age=0)
        return redirect(request, b"/")


class Logout(resource.Resource):
    isLeaf = True

    def __init__(self, auth: WebAuth) -> None:
        super().__init__()
        self.auth = auth

    def render_POST(self, request: server.Request) -> bytes:
        if not self.auth.csrf_ok(request):
            return refuse(self.auth, request, 403, "Refused: this request did not come from the portal's page.")
        found = self.auth.logins.remove(request.getCookie(COOKIE_NAME.encode()))
        if found is not None:
            log.info("web logout: user {user!r} from {address}", user=found.caller.user,
                     address=client_address(request), audit="logout")
        self.auth.set_cookie(request, COOKIE_NAME, "", max_age=0)
        return redirect(request, b"/login")


class Portal(Deferring):
    """``GET /`` (the user's sessions) and ``POST /act`` (start, suspend, terminate)."""

    def __init__(self, auth: WebAuth, service: SessionAPI, types: Callable[[], Sequence[str]],
                 viewer: bool, admin: bool = False) -> None:
        super().__init__(auth)
        self.service = service
        self.types = types
        self.viewer = viewer
        self.admin = admin

    def caller(self, request: server.Request, touch: bool = True) -> Caller | None:
        return self.auth.admin_caller(request, touch) if self.admin else self.auth(request, touch)

    def render_GET(self, request: server.Request) -> int | bytes:
        # portal.js keeps an open page's list current: that is not the user's activity (the idle timeout).
        caller = self.caller(request, touch=request.getHeader(REFRESH_HEADER) is None)
        if caller is None:
            if self.admin and self.auth(request) is not None:
                return refuse(self.auth, request, 403, "Only members of the admin groups see all sessions.")
            return redirect(request, b"/login")
        notice = form(request, "m")
        return self.run(request, self.show(request, caller, pages.NOTICES.get(notice, ""), notice=notice))

    def rows(self, request: server.Request, views: Sequence[SessionView],
             shadowable: dict[str, bool] | None = None) -> list[pages.Row]:
        """``shadowable``: session id -> whether its owner is asked first, for those the admin may shadow."""
        shadowable = shadowable or {}
        rows = []
        for view in views:
            state = view.status or view.state.value
            rows.append(pages.Row(handle=self.auth.handle(request, view.id), name=view.name, type=view.type,
                                  state=view.shown_status or state, since=view.changed,
                                  # A session started for later has no screen until its first client comes.
                                  thumbnail=state in THUMBNAIL_STATES and view.attached_before and not view.lost,
                                  user=view.user, node=view.node, client=view.client_address,
                                  openable=state in THUMBNAIL_STATES and not view.lost,
                                  shadowable=view.id in shadowable and not view.lost,
                                  asks_owner=shadowable.get(view.id, False)))
        return rows

    async def shadowable(self, caller: Caller) -> dict[str, bool]:
        """The sessions the admin may shadow now (the shadow service's list: running, not jailed, the
        policy's yes), each with whether its owner is asked first: only those get a Shadow button."""
        if not self.viewer:
            return {}
        try:
            return {target.id: target.asks_owner for target in await self.service.shadow_targets(caller)}
        except SessionError as error:
            log.info("no shadow targets for {user}: {error}", user=caller.user, error=error.message)
            return {}

    async def show(self, request: server.Request, caller: Caller, message: str, error: bool = False,
                   notice: str = "") -> bytes:
        listing = await self.service.list(caller)
        csrf = self.auth.csrf_token(request)
        if self.admin:
            rows = self.rows(request, listing.sessions, await self.shadowable(caller))
            status = await self.service.status(caller)
            body = pages.admin(rows, csrf, self.viewer, status.draining, message, error)
            return self.auth.page(request, "All sessions", body, ("/static/portal.js",))
        rows = self.rows(request, listing.sessions)
        found = self.auth.login(request, touch=False)
        opening = ""
        if notice == "opening" and found is not None:
            opening, found.opening = found.opening, ""
        body = pages.portal(rows, csrf, self.types(), self.viewer, message, listing.capacity_reached, error,
                            opening)
        return self.auth.page(request, "My sessions", body, ("/static/portal.js",))

    def render_POST(self, request: server.Request) -> int | bytes:
        caller = self.caller(request)
        if caller is None:
            return refuse(self.auth, request, 403, "Please log in again.")
        if not self.auth.csrf_ok(request):
            log.warn("web request by {user} from {address} refused: bad CSRF token", user=caller.user,
                     address=client_address(request))
            return refuse(self.auth, request, 403, "Refused: this request did not come from the portal's page.")
        return self.run(request, self.act(request, caller, form(request, "op")))

    async def act(self, request: server.Request, caller: Caller, op: str) -> bytes:
        back = b"/admin" if self.admin else b"/"
        try:
            if op == "start" and not self.admin:
                session_type = form(request, "type")
                if session_type not in self.types():
                    raise SessionError(Kind.UNAVAILABLE, f"Sessions of type '{session_type}' cannot be started "
                                       "here: it is not installed on this server, or needs an NX client.")
                view = await self.service.start_for_later(caller, session_type, form(request, "name"))
                found = self.auth.login(request, touch=False)
                if form(request, "then") == "open" and self.viewer and found is not None:
                    # "Start and open": the next page (a GET, safe to reload) opens it in the viewer.
                    found.opening = self.auth.handle(request, view.id)
                    return redirect(request, back + b"?m=opening")
                return redirect(request, back + b"?m=started")
            if op in ("drain", "undrain") and self.admin:
                await self.service.set_draining(caller, op == "drain")
                return redirect(request, back + b"?m=" + op.encode())
            if op in ("suspend", "terminate"):
                session_id = self.auth.session_id(request, form(request, "handle"))
                if session_id is None:
                    raise SessionError(Kind.NOT_FOUND, "No such session.")
                if op == "suspend":
                    await self.service.suspend(caller, session_id)
                else:
                    reason = "terminated by the admin in the browser" if self.admin else "user request (browser)"
                    await self.service.terminate(caller, session_id, reason)
                return redirect(request, back + (b"?m=suspended" if op == "suspend" else b"?m=terminated"))
        except SessionError as error:
            log.info("web {op} by {user} refused: {error}", op=op, user=caller.user, error=error.message)
            request.setResponseCode(409 if error.kind is Kind.WRONG_STATE else 403)
            return await self.show(request, caller, words_of(error), error=True)
        request.setResponseCode(400)
        return await self.show(request, caller, "Unknown request.", error=True)


class Thumbnails(Deferring):
    """``GET /thumb/HANDLE``: the PNG of one of the caller's sessions (an
    admin: of any session), redrawn at most every ``ttl`` seconds."""

    isLeaf = True

    def __init__(self, auth: WebAuth, service: SessionAPI, thumbnailer: Thumbnailer, clock: Any,
                 ttl: Callable[[], float]) -> None:
        super().__init__(auth)
        self.service = service
        self.thumbnailer = thumbnailer
        self.clock = clock
        self.ttl = ttl
        self.cache: dict[str, tuple[float, bytes]] = {}
        self.pending: dict[str, defer.Deferred[bytes]] = {}
        # An admin page of many sessions asks for all pictures at once: a few
        # xwd at a time keep the node's CPU for the sessions themselves.
        self.drawing = defer.DeferredSemaphore(DRAWING_AT_ONCE)

    def render_GET(self, request: server.Request) -> int | bytes:
        self.auth.secure_headers(request)
        found = self.auth.login(request, touch=False)  # a page left open refreshes these: not activity
        handle = request.postpath[0].decode("ascii", "replace") if request.postpath else ""
        session_id = found.session_id(handle) if found else None
        if found is None or session_id is None:
            request.setResponseCode(404)
            return b"no such picture"
        caller = dataclasses.replace(found.caller, admin=True) if found.admin else found.caller
        return self.run(request, self.picture(request, caller, session_id))

    async def picture(self, request: server.Request, caller: Caller, session_id: str) -> bytes:
        try:
            view = await self.service.show(caller, session_id)  # the owner check
        except SessionError:
            request.setResponseCode(404)
            return b"no such picture"
        if not view.attached_before or (view.status or view.state.value) not in THUMBNAIL_STATES:
            request.setResponseCode(404)  # no screen yet (nxagent waits for its first client), or none any more
            return b"no picture"
        now = self.clock.seconds()
        cached = self.cache.get(view.id)
        if cached is None or now - cached[0] > self.ttl():
            try:
                cached = (now, await self.draw(caller, view))
            except Exception as error:  # an agent that just went away, xwd missing: no picture, no 500
                log.info("no thumbnail of session {id}: {error}", id=view.id, error=str(error))
                request.setResponseCode(404)
                return b"no picture"
            self.cache[view.id] = cached
            for stale in [key for key, (at, _) in self.cache.items() if now - at > 10 * self.ttl()]:
                del self.cache[stale]
        request.setHeader(b"Content-Type", b"image/png")
        return cached[1]

    async def draw(self, caller: Caller, view: SessionView) -> bytes:
        """One redraw per session at a time: concurrent viewers share it."""
        pending = self.pending.get(view.id)
        if pending is None:
            pending = self.pending[view.id] = self.drawing.run(
                lambda: defer.ensureDeferred(self.thumbnailer(caller, view)))
            pending.addBoth(lambda result: (self.pending.pop(view.id, None), result)[1])
        waiter: defer.Deferred[bytes] = defer.Deferred()
        pending.addBoth(lambda result: (waiter.errback(result) if isinstance(result, Failure)
                                        else waiter.callback(result), result)[1])
        return await waiter


class Root(resource.Resource):
    def __init__(self, auth: WebAuth, portal: Portal) -> None:
        super().__init__()
        self.auth = auth
        self.portal = portal

    def getChild(self, path: bytes, request: server.Request) -> resource.Resource:
        if path == b"":
            return self.portal
        return resource.NoResource()

    def render(self, request: server.Request) -> Any:
        return self.portal.render(request)


class Static(static.File):
    """Files under static/ with the security headers, no listing."""

    def __init__(self, auth: WebAuth, path: str) -> None:
        super().__init__(path)
        self.auth = auth

    def render(self, request: server.Request) -> Any:
        self.auth.secure_headers(request)
        request.setHeader(b"Cache-Control", b"no-cache")
        return super().render(request)

    def directoryListing(self) -> resource.Resource:
        return resource.NoResource()

    def createSimilarFile(self, path: str) -> Static:
        similar = Static(self.auth, path)
        similar.processors, similar.indexNames = self.processors, self.indexNames
        return similar


def web_site(*, reactor: Any, service: SessionAPI, authenticator: Authenticator, resolve: ResolveCaller,
             thumbnailer: Thumbnailer, settings: Callable[[], Any], types: Callable[[], Sequence[str]],
             viewers: Any = None, tls: bool = True) -> tuple[server.Site, WebAuth]:
    """The portal's Site.  ``settings()`` is the current ``[web]`` section
    (it follows a reload); ``types()`` the session types offered."""
    logins = LoginTable(settings().idle_timeout, reactor.seconds)
    auth = WebAuth(logins, tls)
    viewer = viewer_resource(service, viewers, auth)
    portal = Portal(auth, service, types, viewer is not None)
    root = Root(auth, portal)
    root.putChild(b"login", LoginPage(auth, authenticator, resolve, lambda: settings().admin_groups))
    root.putChild(b"logout", Logout(auth))
    root.putChild(b"act", portal)
    admin = Portal(auth, service, types, viewer is not None, admin=True)
    admin_root = Root(auth, admin)
    admin_root.putChild(b"act", admin)
    root.putChild(b"admin", admin_root)
    root.putChild(b"thumb", Thumbnails(auth, service, thumbnailer, reactor, lambda: settings().thumbnail_ttl))
    root.putChild(b"static", Static(auth, STATIC))
    root.putChild(b"favicon.ico", static.Data(b"", "image/x-icon"))
    if viewer is not None:
        root.putChild(b"view", viewer)

    def follow_settings() -> None:
        logins.idle_timeout = settings().idle_timeout
        for gone in logins.expire():
            log.info("web login of {user!r} ended after {idle:.0f} s idle", user=gone.caller.user,
                     idle=logins.idle_timeout, audit="logout", reason="idle timeout")

    site = DoorSite(root, auth.header_items, reactor.seconds)
    site.expire_logins = follow_settings  # type: ignore[attr-defined]
    return site, auth


def viewer_resource(service: SessionAPI, viewers: Any, auth: WebAuth) -> resource.Resource | None:
    """The in-browser viewer (web-viewer's module), if this tree has it."""
    try:
        from nxgate.gateway.doors.web.viewer import ViewerResource  # type: ignore[import-not-found]
    except ImportError:
        return None
    return ViewerResource(service, viewers, auth)
