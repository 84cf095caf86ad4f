"""The session's machine's side of reverse streams (see :mod:`nxgate.streams.reverse`):
the listeners a session's programs connect to, and the connections that
wait there for the gateway that holds the client.

:class:`ReverseListeners` is one per node, owned by its session service;
:class:`nxgate.node.local.LocalNode` opens its streams (a route for a kind
without a number, a waiting connection for a kind with one), and the
session's extras ask it where their programs should connect
(:meth:`ReverseListeners.address`) and how the node itself reaches the
client's side (:meth:`ReverseListeners.connect_own`: the printers the
client has).

A listener exists only while its route does: it is made when the gateway
opens the route and goes when the route ends (the client went, its
gateway went, a newer client took the session over, the session ended).
A Unix socket lies at a path that stays the same for the session and
service (:meth:`ReverseListeners.path`, in a directory of root's, mode
0711: users reach a socket whose name they are told, list none, and make
nothing there), so a program started once finds the listener of every
later client; a TCP listener gets a fresh loopback port each time (the
folders, remounted at each resume).

Who may connect: the session's user only.  A Unix socket's peer is known
from ``SO_PEERCRED``; a TCP peer from the kernel's table and the user's
processes (:mod:`nxgate.local_peers`, run off the reactor).  Nothing the
peer sent is read before the verdict; a refused peer is closed, and the
log says who, once a minute per peer with a count (:mod:`nxgate.ratelimit`),
and the sum at the end.  An admitted connection is not read at all here:
the gateway takes the socket as it is.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from twisted.internet import defer, protocol
from twisted.internet.interfaces import IReadDescriptor
from twisted.logger import Logger
from zope.interface import implementer

from nxgate import local_peers
from nxgate.ratelimit import RateLimiter
from nxgate.streams import reverse
from nxgate.streams.reverse import ReverseService, RouteError, Waiting
from nxgate.vocabulary.caller import Caller
from nxgate.vocabulary.errors import Kind, SessionError
from nxgate.vocabulary.model import Session, State
from nxgate.vocabulary.results import SessionEvent
from nxgate.vocabulary.streams import Stream
from nxgate.wire.agentsocket import SocketStream

log = Logger()

#: Connections a listener takes from the kernel in one turn of the reactor.
ACCEPTS_PER_TURN = 16
BACKLOG = 16
#: Descriptors a route holds on the node: its listener and the two ends of its stream's socket pair.
ROUTE_FILES = 3
#: Peers whose refusals a route sums up for its last line (the rest are in the per-minute lines only).
MAX_PEERS_COUNTED = 64
#: Refusals of one peer are logged once a minute per route (the rest counted, and summed up when the route ends).
REFUSALS_LOGGED_EVERY = 60.0

Setting = Callable[[Session, str, bytes], Awaitable[None]]


class ReverseListeners:
    """This node's reverse listeners (see the module's docstring).

    ``directory``: root's directory of the Unix listeners; ``blocking``:
    runs a blocking call off the reactor (the TCP peer check reads
    ``/proc``); ``session(id)``: the node's own record of a live session;
    ``enabled(service)``: whether ``[services]`` leaves it on; ``room(n)``:
    whether users' work may take ``n`` more descriptors (the gateway's
    reserve: a connection the node cannot hold stays in the kernel's
    backlog, and a route is refused)."""

    def __init__(self, reactor: Any, directory: str, blocking: Callable[..., Any],
                 session: Callable[[str], Session | None], enabled: Callable[[str], bool] = lambda name: True,
                 machine: Callable[[], str] = lambda: "this machine",
                 room: Callable[[int], bool] = lambda count: True) -> None:
        self.reactor = reactor
        self.room = room
        self.directory = directory
        self.blocking = blocking
        self.session = session
        self.enabled = enabled
        self.machine = machine
        self.waiting: Waiting[socket.socket] = Waiting()
        self.timers: dict[int, Any] = {}
        self.routes: dict[tuple[str, str], _Route] = {}
        self.settings: dict[str, Setting] = {}

    # --------------------------------------------------------- for extras
    def path(self, session_id: str, service: str) -> str:
        """Where the session's programs reach the Unix listener of ``service``
        (the same path for every route of the session)."""
        return os.path.join(self.directory, f"{session_id}.{service}")

    def address(self, session_id: str, service: str) -> str | int | None:
        """Where the listener of ``service`` is now (a socket path, or a
        loopback port), None while the session has no route for it."""
        route = self.routes.get((session_id, service))
        return route.address if route is not None else None

    def connect_own(self, session_id: str, service: str) -> socket.socket | None:
        """A connected socket whose other end goes to the client like one of the
        session's connections (the node's own questions to the client's side,
        never through the listener, so nothing there passes for the node's);
        None without a route or room."""
        route = self.routes.get((session_id, service))
        if route is None or not self.waiting.admit(session_id):
            return None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        ours.setblocking(False)
        theirs.setblocking(False)
        route.hold(theirs)
        return ours

    def on_setting(self, service: str, handler: Setting) -> None:
        """``handler(session, name, value)`` takes the settings a route of ``service`` brings."""
        self.settings[service] = handler

    # ----------------------------------------------------- for LocalNode
    def open_route(self, caller: Caller, session: Session, service: ReverseService) -> Stream:
        """The route of ``service``: a listener for the session, and the stream
        on which its connections are announced (see :mod:`nxgate.streams.reverse`)."""
        self._check(caller, session, service)
        if not self.enabled(service.word):
            raise SessionError(Kind.NOT_ALLOWED, f"{service.what.capitalize()} is switched off on machine "
                               f"{self.machine()}.", session_id=session.id)
        if session.state is State.TERMINATING:
            raise SessionError(Kind.WRONG_STATE, f"Session {session.id} is ending.", session_id=session.id)
        if not self.room(ROUTE_FILES):
            log.warn("session {id} of {user}: no {what} listener: the machine is short of open files ([server]"
                     " fd_reserve)", id=session.id, user=session.user, what=service.what)
            raise SessionError(Kind.LIMIT_REACHED, f"Machine {self.machine()} is short of open files; please try"
                               " again in a minute.", session_id=session.id)
        key = (session.id, service.word)
        old = self.routes.pop(key, None)
        if old is not None:
            old.close("a newer client took it over")
        try:
            listening, address = self._listen(session.id, service)
        except OSError as error:
            log.error("session {id} of {user}: no {what} listener: {error}", id=session.id, user=session.user,
                      what=service.what, error=str(error))
            raise SessionError(Kind.UNAVAILABLE, f"Machine {self.machine()} cannot listen for the {service.what} of "
                               f"session {session.id}.", session_id=session.id) from None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        route = _Route(self, session.id, session.user, session.uid, service, listening, address)
        self.routes[key] = route
        try:
            ours.setblocking(False)
            self.reactor.adoptStreamConnection(ours.fileno(), socket.AF_UNIX,
                                               protocol.Factory.forProtocol(lambda: _RouteEnd(route)))
        finally:
            ours.close()  # the reactor holds its own copy
        route.start()
        log.info("session {id} of {user}: the client takes its {what} back (listening {where})", id=session.id,
                 user=session.user, what=service.what, where=route.where)
        theirs.setblocking(False)
        return SocketStream(self.reactor, theirs, session.id, reverse.listener_kind(service.word))

    def take(self, caller: Caller, session: Session, service: ReverseService, number: int) -> Stream:
        """Connection ``number`` of the session's ``service``, once."""
        self._check(caller, session, service)
        sock = self.waiting.take(session.id, service.word, number)
        if sock is None:
            raise SessionError(Kind.NOT_FOUND, f"No {service.what} connection {number} waits in session "
                               f"{session.id}.", session_id=session.id)
        timer = self.timers.pop(number, None)
        if timer is not None and timer.active():
            timer.cancel()
        return SocketStream(self.reactor, sock, session.id, reverse.connection_kind(service.word, number))

    @staticmethod
    def _check(caller: Caller, session: Session, service: ReverseService) -> None:
        """A session's bytes go back only to its own user's client (an admin's too)."""
        if session.user != caller.user:
            log.warn("{user} from {address} asked for the {what} of session {id} of another user", user=caller.user,
                     address=caller.address, what=service.what, id=session.id, audit="session_denied")
            raise SessionError(Kind.NOT_YOURS, f"Could not find session {session.id}.", session_id=session.id)

    def session_changed(self, event: SessionEvent) -> None:
        """A session that ended keeps no route (the observer of the session service)."""
        if not event.new.live:
            self.close_session(event.view.id, "the session ended")

    def close_session(self, session_id: str, why: str) -> None:
        for key in [key for key in self.routes if key[0] == session_id]:
            self.routes.pop(key).close(why)

    def close(self) -> None:
        for key in list(self.routes):
            self.routes.pop(key).close("the node stops")

    # ---------------------------------------------------------- internal
    def _listen(self, session_id: str, service: ReverseService) -> tuple[socket.socket, str | int]:
        if service.over == "unix":
            path = self.path(session_id, service.word)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # a route's that ended badly: the directory is root's, nobody else's
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            try:
                sock.bind(path)
                os.chmod(path, 0o666)  # any user may connect; SO_PEERCRED says who did
                sock.listen(BACKLOG)
            except BaseException:
                sock.close()
                with contextlib.suppress(OSError):
                    os.unlink(path)
                raise
            address: str | int = path
        else:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            try:
                sock.bind(("127.0.0.1", 0))
                sock.listen(BACKLOG)
            except BaseException:
                sock.close()
                raise
            address = sock.getsockname()[1]
        sock.setblocking(False)
        return sock, address

    def _expire(self, route: _Route, number: int) -> None:
        self.timers.pop(number, None)
        sock = self.waiting.take(route.session_id, route.service.word, number)
        if sock is not None:
            sock.close()
            log.info("session {id}: {what} connection {number} was not taken within {patience:g} s; closed",
                     id=route.session_id, what=route.service.what, number=number, patience=reverse.PATIENCE)

    def _dropped(self, route: _Route) -> None:
        for sock in self.waiting.drop(route.session_id, route.service.word):
            sock.close()
        for number in [number for number in self.timers if number not in self.waiting.held]:
            timer = self.timers.pop(number)
            if timer.active():
                timer.cancel()
        if self.routes.get((route.session_id, route.service.word)) is route:
            del self.routes[(route.session_id, route.service.word)]


@implementer(IReadDescriptor)
class _Acceptor:
    """A listening socket in the reactor: each connection goes to the route."""

    def __init__(self, route: _Route, sock: socket.socket) -> None:
        self.route = route
        self.sock = sock

    def fileno(self) -> int:
        return self.sock.fileno()

    def doRead(self) -> None:
        for _ in range(ACCEPTS_PER_TURN):
            if not self.route.owner.room(1):
                self.route.short_of_files()
                return
            try:
                conn, _peer = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:  # out of files, say: the connection waits in the backlog
                log.warn("session {id}: the {what} listener cannot accept: {error}", id=self.route.session_id,
                         what=self.route.service.what, error=str(error))
                return
            conn.setblocking(False)
            self.route.accepted(conn)

    def connectionLost(self, reason: Any) -> None:
        pass

    def logPrefix(self) -> str:
        return "ReverseListener"


class _Route:
    """One session's listener for one service, and the node's end of its route."""

    def __init__(self, owner: ReverseListeners, session_id: str, user: str, uid: int, service: ReverseService,
                 sock: socket.socket, address: str | int) -> None:
        self.owner = owner
        self.session_id = session_id
        self.user = user
        self.uid = uid
        self.service = service
        self.sock = sock
        self.address = address
        self.acceptor = _Acceptor(self, sock)
        self.end: Any = None  # the transport of the node's end of the route
        self.closed = False
        self.refused: dict[str, int] = {}
        self.refusal_lines = RateLimiter(owner.reactor.seconds, window=REFUSALS_LOGGED_EVERY, capacity=256,
                                         reports=False)

    @property
    def where(self) -> str:
        return f"at {self.address}" if isinstance(self.address, str) else f"on 127.0.0.1:{self.address}"

    def start(self) -> None:
        self.owner.reactor.addReader(self.acceptor)

    def short_of_files(self) -> None:
        """The machine keeps its last descriptors: what connects waits in the
        kernel's backlog (and is refused there when it is full) until there
        is room; the listener is looked at again in a second."""
        self.owner.reactor.removeReader(self.acceptor)
        if self.refusal_lines.tell("the machine's open file limit") is not None:
            log.warn("session {id} of {user}: {what} connections wait: the machine is short of open files ([server]"
                     " fd_reserve)", id=self.session_id, user=self.user, what=self.service.what)

        def again() -> None:
            if not self.closed:
                self.owner.reactor.addReader(self.acceptor)
        self.owner.reactor.callLater(1.0, again)

    def accepted(self, conn: socket.socket) -> None:
        if self.closed:
            conn.close()
            return
        if not self.owner.waiting.admit(self.session_id):
            conn.close()
            self._refused("the session's connections", f"{reverse.MAX_WAITING} of its connections wait already")
            return
        if self.service.over == "unix":
            self._judged(conn, local_peers.check_unix(conn, self.uid))
            return
        try:
            peer, local = conn.getpeername(), conn.getsockname()
        except OSError as error:
            self._judged(conn, local_peers.Verdict(False, f"it is gone ({error})"))
            return
        checked = defer.maybeDeferred(self.owner.blocking, local_peers.check_tcp, peer[:2], local[:2], self.uid)
        checked.addErrback(lambda failure: local_peers.Verdict(False, f"it could not be checked: "
                                                                      f"{failure.getErrorMessage()}"))
        checked.addCallback(lambda verdict: self._judged(conn, verdict))

    def _judged(self, conn: socket.socket, verdict: local_peers.Verdict) -> None:
        if self.closed or not verdict.admitted:
            conn.close()
            self.owner.waiting.release(self.session_id)
            if not self.closed:
                self._refused(verdict.who, verdict.reason)
            return
        self.hold(conn)

    def hold(self, conn: socket.socket) -> None:
        """An admitted connection (counted already) waits for the gateway."""
        number = self.owner.waiting.hold(self.session_id, self.service.word, conn)
        self.owner.timers[number] = self.owner.reactor.callLater(reverse.PATIENCE, self.owner._expire, self,
                                                                  number)
        if self.end is not None:
            self.end.write(reverse.announcement(number))

    def _refused(self, who: str, reason: str) -> None:
        if who in self.refused or len(self.refused) < MAX_PEERS_COUNTED:
            self.refused[who] = self.refused.get(who, 0) + 1
        held = self.refusal_lines.tell(who)
        if held is not None:
            log.warn("session {id} of {user}: refused a {what} connection from {who}: {reason} (only the session's "
                     "user may use it){times}", id=self.session_id, user=self.user, what=self.service.what, who=who,
                     reason=reason, times=f"; {held} more refused from there in the last minute" if held else "")

    def setting(self, line: bytes) -> None:
        try:
            name, value = reverse.read_setting(line, self.service)
        except RouteError as error:
            log.warn("session {id}: the gateway sent a {what} route a line it may not: {error}; the route is closed",
                     id=self.session_id, what=self.service.what, error=str(error))
            self.close("a bad line")
            return
        handler = self.owner.settings.get(self.service.word)
        session = self.owner.session(self.session_id)
        if handler is None or session is None:
            return
        done = defer.ensureDeferred(handler(session, name, value))
        done.addErrback(lambda failure: log.failure("session {id}: the {what} setting {name} could not be applied",
                                                    failure, id=self.session_id, what=self.service.what, name=name))

    def close(self, why: str) -> None:
        """No more connections: the listener goes, what waits is closed, and the route ends."""
        if self.closed:
            return
        self.closed = True
        self.owner.reactor.removeReader(self.acceptor)
        self.sock.close()
        if isinstance(self.address, str):
            with contextlib.suppress(OSError):
                os.unlink(self.address)
        self.owner._dropped(self)
        if self.end is not None:
            self.end.loseConnection()
        summary = ", ".join(f"{count} from {who}" for who, count in self.refused.items())
        log.info("session {id}: the client no longer takes its {what} back ({why}){refused}", id=self.session_id,
                 what=self.service.what, why=why, refused=f"; refused {summary}" if summary else "")


class _RouteEnd(protocol.Protocol):
    """The node's end of a route: announcements out, the gateway's settings in; its end ends the route."""

    def __init__(self, route: _Route) -> None:
        self.route = route
        self.lines = reverse.LineReader()

    def connectionMade(self) -> None:
        self.route.end = self.transport

    def dataReceived(self, data: bytes) -> None:
        try:
            lines = self.lines.feed(data)
        except RouteError as error:
            log.warn("session {id}: the gateway's {what} route sent {error}; the route is closed",
                     id=self.route.session_id, what=self.route.service.what, error=str(error))
            self.route.close("a bad line")
            return
        for line in lines:
            self.route.setting(line)

    def connectionLost(self, reason: Any = protocol.connectionDone) -> None:
        self.route.end = None
        self.route.close("its client went")
