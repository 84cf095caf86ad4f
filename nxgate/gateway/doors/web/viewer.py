"""``/view``: a session of the logged-in user drawn in the browser.

The page (``POST /view/open`` from the portal, CSRF-checked) holds only the
session's opaque per-login handle.  Its script (``viewer_static/viewer.js``)
asks ``POST /view/ticket`` (CSRF header) for a one-time ticket bound to this
login, this session and the window's size, then opens
``wss://<us>/view/ws?ticket=...`` with noVNC (Debian's ``novnc``, served
from ``/view/novnc/``).  The upgrade checks the Origin, the login cookie and
the ticket, which is used up; nothing else is in any URL.

Then :class:`ViewerBridge` shows the session.  A session that a client
drew before is shown *live*: the router's ``open_stream(..., VIEW)`` has
the session's node (this machine or another member) start an x11vnc on the
session's own display for this tab, and the bridge splices its RFB to the
WebSocket (a session an NX client shows is suspended there first, as a
resume elsewhere would).  Otherwise (a session started for later that never
had a client, an admin's shadow) the bridge does what an NX client does: it
starts a private Xvfb, nxproxy and x11vnc here
(:mod:`nxgate.node.browser_viewer`, given to the door by the composition
root), takes the session over with the session API's ``restore`` (or
``attach_shadow``), relays the NX stream between the viewer's nxproxy and
the agent's stream (``open_stream(..., AGENT)``, :mod:`nxgate.wire.relay`,
as after ``bye``) and splices that x11vnc's RFB to the WebSocket.  When the
tab closes the programs stop; the agent loses its proxy and suspends,
ready for nxclient.
"""

from __future__ import annotations

import hashlib
import json
from html import escape
import os
import socket
import struct
from typing import Any
from urllib.parse import urlsplit

from twisted.internet import defer, protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web import resource, server, static

from nxgate.protocols import websocket
from nxgate.gateway.doors.web.site import words_of
from nxgate.vocabulary.caller import Caller
from nxgate.vocabulary.errors import Kind, SessionError
from nxgate.vocabulary.requests import DisplaySettings, RestoreRequest, ShadowRequest
from nxgate.vocabulary.results import Ready, SessionView, State
from nxgate.vocabulary.streams import VIEW, Stream
from nxgate.wire import agentsocket
from nxgate.wire.agentsocket import SocketStream
from nxgate.wire.guarded import user_logged_in
from nxgate.wire.relay import StreamRelay
from nxgate.wire.splice import Splice, TransportEnd

log = Logger()

NOVNC = "/usr/share/novnc"
STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "viewer_static")
#: The portal's policy, plus ``data:`` images: noVNC draws the remote cursor as a data: URL.
CSP = (b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       b"font-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
_UCRED = struct.Struct("3i")


def login_key(csrf: str) -> str:
    """What a ticket remembers of the login that asked (its CSRF secret, hashed)."""
    return hashlib.sha256(csrf.encode()).hexdigest()


def same_origin(request: Any) -> bool:
    """Whether the upgrade comes from one of our own pages: its Origin is
    the scheme and host the browser addressed (a cross-site page's Origin
    is its own)."""
    origin = (request.getHeader(b"origin") or b"").decode("latin-1")
    host = (request.getHeader(b"host") or b"").decode("latin-1")
    if not origin or not host:
        return False
    parts = urlsplit(origin)
    scheme = "https" if request.isSecure() else "http"
    return parts.scheme == scheme and parts.netloc.lower() == host.lower() and not parts.path


def _size(text: str, default: int) -> int:
    return int(text) if text.isdigit() and len(text) < 6 else default


def _form(request: Any, name: str) -> str:
    values = request.args.get(name.encode()) if request.args else None
    return values[0].decode("utf-8", "replace") if values else ""


class _Static(static.File):
    """Files only, no directory listings, JavaScript as JavaScript (module
    scripts need the right type under ``nosniff``)."""

    contentTypes = {**static.File.contentTypes, ".js": "text/javascript", ".css": "text/css"}

    def directoryListing(self) -> resource.Resource:
        return resource.NoResource()

    def render_GET(self, request: Any) -> Any:
        request.setHeader(b"X-Content-Type-Options", b"nosniff")
        request.setHeader(b"Cache-Control", b"public, max-age=3600")
        return super().render_GET(request)


class ViewerResource(resource.Resource):
    """``/view``: ``open`` and ``shadow`` (pages), ``ticket``, ``ws``, and the scripts."""

    def __init__(self, service: Any, viewers: Any, auth: Any, reactor: Any = None) -> None:
        super().__init__()
        if reactor is None:
            from twisted.internet import reactor as default_reactor
            reactor = default_reactor
        self.reactor = reactor
        self.service = service
        self.viewers = viewers
        self.auth = auth
        self.tickets = websocket.Tickets(reactor.seconds)
        self.bridges: set[ViewerBridge] = set()
        #: (login key, session id) -> a live viewer started when the page was asked for, until its WebSocket.
        self.prepared: dict[tuple[str, str], Prepared] = {}
        self.putChild(b"open", _Page(self, "open"))
        self.putChild(b"shadow", _Page(self, "shadow"))
        self.putChild(b"ticket", _TicketResource(self))
        self.putChild(b"ws", _SocketResource(self))
        novnc = resource.Resource()
        for part in ("core", "vendor"):
            novnc.putChild(part.encode(), _Static(os.path.join(NOVNC, part)))
        self.putChild(b"novnc", novnc)
        self.putChild(b"static", _Static(STATIC))

    def caller_for(self, request: Any, purpose: str) -> Caller | None:
        if purpose == "shadow":
            return self.auth.admin_caller(request)
        return self.auth(request)

    def close_all(self) -> None:
        for bridge in list(self.bridges):
            bridge.stop("the gateway stops")
        for key in list(self.prepared):
            self.prepared.pop(key).discard()

    def prepare(self, caller: Caller, login: str, session_id: str) -> None:
        """Open the live view of a session while the browser loads the
        viewer's page, asks its ticket and opens its WebSocket (together
        about as long as x11vnc takes to start): its WebSocket then finds
        the stream open (:meth:`take_prepared`).  Bound to this login and
        session; not taken within :data:`PREPARED_SECONDS`, it is closed.
        Anything that goes wrong here is the WebSocket's to find and say."""
        old = self.prepared.pop((login, session_id), None)
        if old is not None:
            old.discard()  # the page asked again (a reload): one prepared viewer per page
        prepared = Prepared(defer.ensureDeferred(prepared_stream(self.service, caller, session_id)))
        self.prepared[(login, session_id)] = prepared
        prepared.expiry = self.reactor.callLater(PREPARED_SECONDS, self._expire, login, session_id, prepared)

    def _expire(self, login: str, session_id: str, prepared: Prepared) -> None:
        if self.prepared.get((login, session_id)) is prepared:
            del self.prepared[(login, session_id)]
            prepared.discard()

    def take_prepared(self, login: str, session_id: str) -> Prepared | None:
        prepared = self.prepared.pop((login, session_id), None)
        if prepared is not None and prepared.expiry is not None and prepared.expiry.active():
            prepared.expiry.cancel()
        return prepared


#: How long a viewer started with its page waits for the page's WebSocket.
PREPARED_SECONDS = 15.0


def shown_live(view: SessionView) -> bool:
    """Whether the session's node can show it live (a client drew it before, its agent runs); the node
    checks again with its own record."""
    return (view.attached_before and bool(view.agent_pid) and not view.lost
            and view.state in (State.RUNNING, State.SUSPENDED, State.SUSPENDING))


async def prepared_stream(service: Any, caller: Caller, session_id: str) -> Stream | None:
    """For :meth:`ViewerResource.prepare`: the live view of ``caller``'s
    session, or None when its node cannot show it live."""
    view = await service.show(caller, session_id)  # the owner check
    if not shown_live(view):
        return None
    await suspend_for_browser(service, caller, view)
    return await service.open_stream(caller, view.id, VIEW)  # limits: SessionError


async def suspend_for_browser(service: Any, caller: Caller, view: Any) -> None:
    """An NX client that shows the session is suspended first, as a resume elsewhere would."""
    if view.state is not State.SUSPENDED:
        log.info("session {id} is attached elsewhere: suspending it for {user}'s browser", id=view.id,
                 user=caller.user, audit="session_takeover")
        await service.suspend(caller, view.id)


class Prepared:
    """A live view being opened for a page (see :meth:`ViewerResource.prepare`)."""

    def __init__(self, opened: defer.Deferred[Any]) -> None:
        self.stream: Stream | None = None
        self.failure: Failure | None = None
        self.expiry: Any = None
        self.waiters: list[defer.Deferred[Any]] = []
        self.done = False
        opened.addCallbacks(self._opened, self._failed)

    def _opened(self, stream: Stream | None) -> None:
        self.stream, self.done = stream, True
        for waiter in self.waiters:
            waiter.callback(stream)

    def _failed(self, failure: Failure) -> None:
        self.failure, self.done = failure, True
        if not failure.check(SessionError):
            log.failure("a browser viewer started with its page failed", failure)
        for waiter in self.waiters:
            waiter.callback(None)

    def wait(self) -> defer.Deferred[Any]:
        """The stream, or None (not live, or it failed: the WebSocket tries again and says why)."""
        if self.done:
            return defer.succeed(self.stream)
        waiter: defer.Deferred[Any] = defer.Deferred()
        self.waiters.append(waiter)
        return waiter

    def discard(self) -> None:
        """Not taken: close the stream (now, or once it is open); its node stops the viewer."""
        self.wait().addCallback(lambda stream: stream is not None and stream.close())


class _Page(resource.Resource):
    isLeaf = True

    def __init__(self, parent: ViewerResource, purpose: str) -> None:
        super().__init__()
        self.parent = parent
        self.purpose = purpose

    def render_GET(self, request: Any) -> bytes:
        request.setResponseCode(303)
        request.setHeader(b"Location", b"/")
        return b""

    def render_POST(self, request: Any) -> bytes:
        auth = self.parent.auth
        caller = self.parent.caller_for(request, self.purpose)
        if caller is None:
            request.setResponseCode(403)
            return auth.page(request, "Refused", '<p class="error" role="alert">Log in first.</p>')
        if not auth.csrf_ok(request):
            request.setResponseCode(403)
            return auth.page(request, "Refused", '<p class="error" role="alert">Stale form: reload the page.</p>')
        handle = _form(request, "handle")
        session_id = auth.session_id(request, handle)
        if session_id is None:
            request.setResponseCode(404)
            return auth.page(request, "Refused", '<p class="error" role="alert">No such session.</p>')
        if self.purpose == "open":
            self.parent.prepare(caller, login_key(auth.csrf_token(request)), session_id)
        # data-asks: the admin page's word that the owner is asked first (only the waiting line's text).
        asks = "1" if self.purpose == "shadow" and _form(request, "asks") == "1" else "0"
        body = (f'<section id="viewer" data-handle="{escape(handle)}" data-purpose="{self.purpose}" '
                f'data-asks="{asks}">'
                '<div id="viewer-bar"><p id="viewer-status" role="status">Connecting…</p>'
                '<details id="viewer-clipboard-panel"><summary>Clipboard</summary>'
                '<textarea id="viewer-clipboard" rows="3" cols="40" spellcheck="false" '
                'aria-label="The session\'s clipboard: what is copied there shows here; edit and send"></textarea>'
                '<button type="button" id="viewer-clipboard-send">Send to the session</button>'
                '</details></div>'
                '<div id="viewer-screen"></div></section>')
        page = auth.page(request, "Session", body, scripts=("/view/static/viewer.js",))
        request.setHeader(b"Content-Security-Policy", CSP)
        return page.replace(b'<link rel="stylesheet" href="/static/portal.css">',
                            b'<link rel="stylesheet" href="/static/portal.css">'
                            b'<link rel="stylesheet" href="/view/static/viewer.css">', 1)


class _TicketResource(resource.Resource):
    """``POST /view/ticket`` (``X-CSRF-Token``; ``handle``, ``purpose``,
    ``width``, ``height``): ``{"ticket": ...}`` for one WebSocket."""

    isLeaf = True

    def __init__(self, parent: ViewerResource) -> None:
        super().__init__()
        self.parent = parent

    def render_POST(self, request: Any) -> bytes:
        auth = self.parent.auth
        request.setHeader(b"Content-Type", b"application/json")
        request.setHeader(b"Cache-Control", b"no-store")
        purpose = "shadow" if _form(request, "purpose") == "shadow" else "open"
        caller = self.parent.caller_for(request, purpose)
        if caller is None or not auth.csrf_ok(request):
            request.setResponseCode(403)
            return b'{"error": "refused"}'
        session_id = auth.session_id(request, _form(request, "handle"))
        if session_id is None:
            request.setResponseCode(404)
            return b'{"error": "no such session"}'
        ticket = self.parent.tickets.issue(caller.user, login_key(auth.csrf_token(request)), session_id, purpose,
                                           _size(_form(request, "width"), 1024), _size(_form(request, "height"), 768))
        return json.dumps({"ticket": ticket}).encode()


class _SocketResource(resource.Resource):
    """``GET /view/ws?ticket=...``: the upgrade, after every check."""

    isLeaf = True

    def __init__(self, parent: ViewerResource) -> None:
        super().__init__()
        self.parent = parent

    def _refuse(self, request: Any, code: int, why: str, user: str = "") -> bytes:
        log.warn("browser viewer WebSocket refused ({why}) for {user} from {address}", why=why, user=user or "-",
                 address=request.getClientAddress().host if hasattr(request.getClientAddress(), "host") else "?",
                 audit="web_viewer_refused")
        request.setResponseCode(code)
        request.setHeader(b"Content-Type", b"text/plain")
        return why.encode() + b"\n"

    def render_GET(self, request: Any) -> Any:
        problem = websocket.handshake_problem(request)
        if problem:
            return self._refuse(request, 400, problem)
        # The ticket is used up by any attempt, whatever refuses it next: one try each.
        ticket = self.parent.tickets.take(_form(request, "ticket"))
        if ticket is None:
            return self._refuse(request, 403, "unknown, used or expired ticket")
        if not same_origin(request):
            return self._refuse(request, 403, "foreign origin", ticket.user)
        caller = self.parent.caller_for(request, ticket.purpose)
        if caller is None or caller.user != ticket.user:
            return self._refuse(request, 403, "ticket of another login", caller.user if caller else "")
        if login_key(self.parent.auth.csrf_token(request)) != ticket.login:
            return self._refuse(request, 403, "ticket of another login", caller.user)
        # A WebSocket is a connection of its user's from now on (the cap over every door).
        refusal = user_logged_in(getattr(request.channel, "transport", None), caller.user)
        if refusal is not None:
            return self._refuse(request, 429, refusal, caller.user)
        connection = websocket.WebSocketConnection(self.parent.reactor)
        bridge = ViewerBridge(self.parent, caller, ticket, connection)
        connection.handler = bridge
        websocket.upgrade(request, connection)
        bridge.start()
        return server.NOT_DONE_YET


# ----------------------------------------------------------------------------------------------------------
# The bridge: browser <-> x11vnc, and nxproxy <-> agent


class _VNCSide(protocol.Protocol):
    """The x11vnc end of the bridge (the node's live view, or this viewer's own x11vnc)."""

    def __init__(self, bridge: ViewerBridge) -> None:
        self.bridge = bridge

    def connectionMade(self) -> None:
        self.bridge.vnc_connected(self.transport)

    def dataReceived(self, data: bytes) -> None:
        if self.bridge.splice is not None:
            self.bridge.splice.received("vnc", data)

    def connectionLost(self, reason: Failure = protocol.connectionDone) -> None:
        stream = self.bridge.stream
        why = stream.ended() if stream is not None else ""
        self.bridge.stop(why or "the viewer's VNC server ended")


class _BrowserEnd:
    """The page's WebSocket as one end of the bridge's splice (:mod:`nxgate.wire.splice`):
    RFB in WebSocket messages, x11vnc's first words in RFB's order (:class:`EarlyVersion`)."""

    def __init__(self, bridge: ViewerBridge) -> None:
        self.bridge = bridge

    def write(self, data: bytes) -> None:
        data = self.bridge.early.from_server(data)
        if data:
            self.bridge.ws.send(data)

    def pause_reading(self) -> None:
        self.bridge.ws.transport.pauseProducing()

    def resume_reading(self) -> None:
        self.bridge.ws.transport.resumeProducing()

    def hold(self, producer: Any) -> None:
        self.bridge.ws.transport.registerProducer(producer, True)

    def write_eof(self) -> bool:
        return False

    def close(self) -> None:
        pass  # the bridge closes the WebSocket with its words (ViewerBridge.stop)


def _screen_size(geometry: str) -> tuple[int, int] | None:
    """``WxH`` (as listings show a session's screen) as numbers, None if it is not that."""
    width, _, height = geometry.partition("x")
    return (int(width), int(height)) if width.isdigit() and height.isdigit() else None


class _ProxyChannel:
    """The viewer's nxproxy connection as the relay's client stream."""

    def __init__(self, transport: Any) -> None:
        self.transport = transport

    def write(self, data: bytes) -> None:
        self.transport.write(data)

    def close(self) -> None:
        self.transport.loseConnection()

    def pause_input(self) -> None:
        self.transport.pauseProducing()

    def resume_input(self) -> None:
        self.transport.resumeProducing()


class _AgentOutput:
    """The agent's output as a producer for the nxproxy connection."""

    def __init__(self, relay: StreamRelay) -> None:
        self.relay = relay

    def pauseProducing(self) -> None:
        self.relay.pause_agent()

    def resumeProducing(self) -> None:
        self.relay.resume_agent()

    def stopProducing(self) -> None:
        self.relay.close()


class _ProxySide(protocol.Protocol):
    """nxproxy's connection to the viewer's ``nx.sock``: relayed to the agent."""

    def __init__(self, bridge: ViewerBridge) -> None:
        self.bridge = bridge
        self.relay: StreamRelay | None = None

    def connectionMade(self) -> None:
        bridge = self.bridge
        handle = self.transport.getHandle()
        _pid, uid, _gid = _UCRED.unpack(handle.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
        if bridge.relay is not None or bridge.ready is None or uid != bridge.viewer.uid:
            log.warn("unexpected connection to browser viewer {id}'s NX socket (uid {uid})", id=bridge.viewer.id,
                     uid=uid)
            self.transport.loseConnection()
            return
        bridge.stop_listening()
        self.relay = bridge.relay = StreamRelay(bridge.caller, bridge.ready.view.id, _ProxyChannel(self.transport),
                                                b"", bridge.parent.service.open_stream)
        self.transport.registerProducer(_AgentOutput(self.relay), True)

    def dataReceived(self, data: bytes) -> None:
        if self.relay is not None:
            self.relay.write(data)

    def connectionLost(self, reason: Failure = protocol.connectionDone) -> None:
        if self.relay is not None:
            self.relay.close()
            self.bridge.stop("the viewer's NX proxy ended")


class EarlyVersion:
    """The browser's RFB version, said to x11vnc for it as soon as x11vnc
    answers the connection (sans-IO: :meth:`feed` takes what the browser
    sends and returns what is left to pass on; :meth:`from_server` does the
    same for what x11vnc sends).

    x11vnc's libvncserver waits 100 ms after each accept for a WebSocket
    or TLS hello from the client before it sends its own version, unless
    the client spoke first; RFB clients never do, so every open paid those
    100 ms (measured: 100.7 ms between accept and x11vnc's version).  The
    bridge sends ``RFB 003.008`` (what noVNC answers x11vnc's 3.8) at
    once, and drops the browser's own answer when it comes; any other
    answer ends the viewer.  x11vnc then sends its security types at once
    too; the browser gets them only after its own version, as from any RFB
    server (noVNC given both in one message answered its version and then
    nothing more)."""

    def __init__(self, version: bytes = websocket.RFB_VERSION) -> None:
        self.version = version
        self.heard = b""
        self.told = 0  # bytes of the server's version passed to the browser
        self.held = b""  # what the server sent after its version, until the browser said its own

    @property
    def done(self) -> bool:
        return len(self.heard) == len(self.version)

    def feed(self, data: bytes) -> bytes:
        """What the browser sent, less its version."""
        if self.done:
            return data
        need = len(self.version) - len(self.heard)
        self.heard += data[:need]
        if not self.version.startswith(self.heard):
            raise ValueError(f"the browser answered RFB version {self.heard[:12]!r}, not {self.version!r}")
        return data[need:]

    def from_server(self, data: bytes) -> bytes:
        """What to pass to the browser now of what the server sent (the rest waits for :meth:`release`)."""
        if self.done and not self.held:
            return data
        need = len(self.version) - self.told
        now, later = data[:need], data[need:]
        self.told += len(now)
        self.held += later
        return now

    def release(self) -> bytes:
        """Once the browser said its version: what the server sent meanwhile."""
        held, self.held = self.held, b""
        return held


class ViewerBridge:
    """One browser tab showing one session."""

    def __init__(self, parent: ViewerResource, caller: Caller, ticket: websocket.Ticket,
                 ws: websocket.WebSocketConnection) -> None:
        self.parent = parent
        self.reactor = parent.reactor
        self.caller = caller
        self.ticket = ticket
        self.ws = ws
        self.viewer: Any = None  # this machine's resumed viewer (Xvfb, nxproxy, x11vnc), when not live
        self.stream: Stream | None = None  # the x11vnc's stream
        self.ready: Ready | None = None
        self.relay: StreamRelay | None = None
        self.listener: Any = None
        self.vnc: Any = None
        self.splice: Splice | None = None
        self.pending: list[bytes] = []
        #: Set when the viewer cannot start: the RFB answer that says why, sent after the client's version.
        self.refusal: bytes | None = None
        self.heard = b""
        self.early = EarlyVersion()
        self.stopped = False
        self.started = self.reactor.seconds()

    def start(self) -> None:
        self.parent.bridges.add(self)
        defer.ensureDeferred(self._start()).addErrback(self._failed)

    async def _start(self) -> None:
        viewers = self.parent.viewers  # this machine's, for what a live view cannot show
        if viewers is None:
            raise SessionError(Kind.NOT_ALLOWED, "The browser viewer is not available on this server.")
        if self.ticket.purpose == "open" and (await self._open_prepared() or await self._open_live()):
            return
        await self._start_resumed(viewers)

    async def _open_prepared(self) -> bool:
        """The live view this page's request opened (:meth:`ViewerResource.prepare`), if any."""
        prepared = self.parent.take_prepared(self.ticket.login, self.ticket.session_id)
        stream = await prepared.wait() if prepared is not None else None
        if stream is None:
            return False
        if stream.closed():  # ended meanwhile (an NX resume): open again, and say why if it cannot
            return False
        if self.stopped:
            stream.close()
            raise _Gone()
        self._use(stream)
        return True

    async def _open_live(self) -> bool:
        """Show the session's own screen with an x11vnc its node starts next
        to its agent (the router's ``open_stream`` of kind ``view``); False
        when the session never had a client: then the viewer resumes it.  A
        session an NX client shows is suspended there first, as a resume would."""
        view = await self.parent.service.show(self.caller, self.ticket.session_id)  # the owner check
        if not shown_live(view):
            return False
        await suspend_for_browser(self.parent.service, self.caller, view)
        if self.stopped:
            raise _Gone()
        stream = await self.parent.service.open_stream(self.caller, view.id, VIEW)  # limits: SessionError
        if self.stopped:
            stream.close()  # the browser left while it opened
            raise _Gone()
        self._use(stream)
        return True

    def _use(self, stream: Stream) -> None:
        """Show the page what this live view's x11vnc serves."""
        where = f"live, on member {stream.node}" if stream.node else "live"
        log.info("{user} opens session {id} in a browser ({where})", user=self.caller.user, id=stream.session_id,
                 where=where, audit="web_viewer_open")
        self.stream = stream
        stream.attach(_VNCSide(self))

    async def _start_resumed(self, viewers: Any) -> None:
        width, height = self.ticket.width, self.ticket.height
        if self.ticket.purpose == "shadow":
            # The watched screen's own size: in a screen of that size the shadow agent shows it 1:1
            # (in a bigger one, with no window manager, nxagent stretches it over the whole screen);
            # the page scales the canvas to the window with its aspect kept.
            targets = await self.parent.service.shadow_targets(self.caller)
            watched = next((t.geometry for t in targets if t.id == self.ticket.session_id), "")
            width, height = _screen_size(watched) or (width, height)
        self.viewer = await viewers.open(self.caller.user, width, height)  # limits: SessionError
        viewer = self.viewer
        display = defer.ensureDeferred(viewer.start_display())
        # Full screen in the viewer's Xvfb, which has the browser window's size: the session takes that
        # size at this resume (nxagent's resize=1), and a new window size is a new resume (viewer.js).
        # The session's keymap is the viewer display's (keyboard=clone): the keys x11vnc presses for the
        # page's keysyms mean the same in the session (node.browser_viewer.keymap_argv).
        settings = DisplaySettings(geometry=f"{viewer.width}x{viewer.height}", fullscreen=True, client="browser",
                                   keyboard="clone", link="lan", clipboard="both")
        try:
            if self.ticket.purpose == "shadow":
                ready = await self.parent.service.attach_shadow(
                    self.caller, ShadowRequest(self.ticket.session_id, settings, view_only=False))
            else:
                ready = await self.parent.service.restore(
                    self.caller, RestoreRequest(self.ticket.session_id, settings, encrypted=True))
        finally:
            await display  # never left running unwatched, even when the restore failed
        if self.stopped:
            raise _Gone()
        if ready.stream is None:
            raise SessionError(Kind.INTERNAL, "The session offers no stream to relay.")
        self.ready = ready
        log.info("{user} opens session {id} in a browser (viewer {viewer})", user=self.caller.user,
                 id=ready.view.id, viewer=viewer.id, audit="web_viewer_open")
        self.listener = self.reactor.listenUNIX(viewer.nx_socket, protocol.Factory.forProtocol(
            lambda: _ProxySide(self)), mode=0o600, backlog=1)
        os.chown(viewer.nx_socket, viewer.uid, viewer.gid)
        await defer.gatherResults([
            defer.ensureDeferred(viewer.start_proxy(ready.cookie, ready.view.full_id, ready.view.name,
                                                    ready.view.display)),
            defer.ensureDeferred(viewer.start_vnc())], consumeErrors=True)
        if self.stopped:
            raise _Gone()
        try:
            sock = await agentsocket.reach(self.reactor, viewer.vnc_socket, viewer.uid, wait=10.0)
        except OSError as error:
            self.stop(f"the viewer's VNC server did not listen: {error}")
            return
        if self.stopped:
            sock.close()
            return
        self.stream = SocketStream(self.reactor, sock, ready.view.id, VIEW)
        self.stream.attach(_VNCSide(self))
        # Once noVNC is through the RFB handshake (loopback: well within a second), x11vnc is told to
        # stop holding the clipboard back (its first 15 seconds; see browser_viewer.selection_nudge_argv).
        # (A live view's node does the same for its own x11vnc.)
        self.reactor.callLater(1.0, self._nudge_selection)

    def vnc_connected(self, transport: Any) -> None:
        if self.stopped:
            transport.loseConnection()
            return
        self.vnc = transport
        transport.write(self.early.version)  # see EarlyVersion
        for data in self.pending:
            transport.write(data)
        self.pending.clear()
        # Neither side buffers without bound: each pauses the other when its own send buffer fills.
        self.splice = Splice(TransportEnd(transport), _BrowserEnd(self), names=("vnc", "browser"))
        log.debug("browser viewer of {user}: first VNC bytes path ready after {seconds:.2f}s", user=self.caller.user,
                 seconds=self.reactor.seconds() - self.started)

    def _nudge_selection(self) -> None:
        if self.stopped or self.viewer is None:
            return
        defer.ensureDeferred(self.viewer.nudge_selection()).addErrback(
            lambda failure: log.failure("browser viewer {id}: cannot nudge the clipboard", failure,
                                        id=self.viewer.id))

    def stop_listening(self) -> None:
        if self.listener is not None:
            listener, self.listener = self.listener, None
            listener.stopListening()

    # WebSocket handler ------------------------------------------------------------------------------
    def ws_message(self, payload: bytes) -> None:
        if self.refusal is not None:
            self.heard += payload[:len(websocket.RFB_VERSION)]
            if len(self.heard) >= len(websocket.RFB_VERSION):
                refusal, self.refusal = self.refusal, None
                self.ws.send(refusal)
                self.ws.close(websocket.REFUSED, "refused")
            return
        try:
            was_done = self.early.done
            payload = self.early.feed(payload)
        except ValueError as error:
            self.stop(str(error))
            return
        if self.early.done and not was_done:
            held = self.early.release()
            if held:
                self.ws.send(held)
        if not payload:
            return
        if self.splice is not None:
            self.splice.received("browser", payload)
        elif len(self.pending) < 64:
            self.pending.append(payload)

    def ws_closed(self, code: int | None, reason: str) -> None:
        self.stop("the browser went away")

    # -------------------------------------------------------------------------------------------------
    def _failed(self, failure: Failure) -> None:
        if failure.check(_Gone):
            self.stop("the browser went away")
            return
        if failure.check(SessionError):
            error = failure.value
            words = words_of(error)
            log.info("browser viewer for {user} refused: {why}", user=self.caller.user, why=error.message)
        else:
            log.failure("browser viewer for {user} failed", failure, user=self.caller.user)
            words = "The viewer could not start (see the server log)."
        self.stop(words, close_socket=False)
        self.refuse(words)

    def refuse(self, words: str) -> None:
        """Tell the page why, as an RFB server refusing the connection would
        (noVNC shows it); the WebSocket closes after that, or soon anyway."""
        if self.ws.closing or self.ws.gone:
            return
        self.refusal = websocket.rfb_refusal(words)
        self.ws.send(websocket.RFB_VERSION)
        self.reactor.callLater(10.0, self.ws.close, websocket.REFUSED, words[:100])

    def stop(self, why: str, close_socket: bool = True) -> None:
        if self.stopped:
            return
        self.stopped = True
        self.parent.bridges.discard(self)
        log.info("browser viewer of {user} ends: {why}", user=self.caller.user, why=why)
        if close_socket:
            self.ws.close(websocket.VIEWER_ENDED, why[:100])
        self.stop_listening()
        if self.splice is not None:
            self.splice.close()
        elif self.vnc is not None:
            self.vnc.loseConnection()
        elif self.stream is not None:
            self.stream.close()
        if self.ticket.purpose == "shadow" and self.ready is not None:
            # A shadow ends with its viewer; ended first, so that the audit says why rather than the shadow
            # agent's "Please check the state of your network" on losing its client.
            defer.ensureDeferred(self.parent.service.terminate(self.caller, self.ready.view.id,
                                                               f"its viewer left: {why}")).addErrback(
                lambda failure: log.info("browser shadow {id}: {error}", id=self.ready.view.id,
                                         error=failure.getErrorMessage()))
        if self.relay is not None:
            self.relay.close()  # the agent loses its client and suspends (closing the tab = suspend)
        if self.viewer is not None:
            self.viewer.close()


class _Gone(Exception):
    """The browser left while the viewer was starting."""
