"""Connecting to a session's agent: the Unix socket in its session directory.

An agent that listened on TCP ``4000+N`` could be reached by every local
user, and one connection with a wrong cookie makes a new nxagent abort (it
never gets a second chance to open its display).  So the agent listens on
``<session dir>/agent.sock`` instead: the directory is the user's, 0700,
and nxagent runs with umask 077, so only that user and root (the gateway)
can connect.

The gateway connects as root into a directory the user controls, so it
must not follow a link the user put there (a link to another user's
agent would hand this client's stream, and its failed handshake, to that
agent): the socket file is opened with ``O_PATH | O_NOFOLLOW``, checked to
be a socket of the session's user (or root's), and connected to through
``/proc/self/fd``.  The peer's credentials are checked once more after the
connect.  The connect itself never blocks: a Unix connect either succeeds
at once or fails (``EAGAIN`` when the listener's backlog is full).

A program that is about to listen (an agent made to listen again, a
viewer's x11vnc just started) is waited for by :func:`connect_soon`, the
one connect loop of nxgate.  A connected socket becomes a
:class:`SocketStream`, what the node interface's ``open_stream`` gives
for an end on this machine (:mod:`nxgate.vocabulary.streams`).
"""

from __future__ import annotations

import os
import socket
import stat
import struct
from collections.abc import Callable
from typing import Any

from twisted.internet import defer, protocol
from twisted.internet.interfaces import IHalfCloseableProtocol
from zope.interface import implementer

from nxgate.vocabulary.streams import StreamKind


_UCRED = struct.Struct("3i")
#: A resumed agent that the gateway makes listen again (it suspended itself
#: after a failed connection) has no socket for a moment: a client that
#: comes just then waits this long for it.
WAIT_SECONDS = 3.0
RETRY_INTERVAL = 0.1


class AgentSocketError(OSError):
    """The path is not the session's agent socket; the text says why."""


def connect(path: str, owner: int) -> socket.socket:
    """A connected, non-blocking socket to the agent listening at ``path``,
    which must belong to uid ``owner`` (or root)."""
    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISSOCK(st.st_mode):
            raise AgentSocketError(f"{path} is not a socket")
        if st.st_uid not in (owner, 0):
            raise AgentSocketError(f"{path} belongs to uid {st.st_uid}, not to the session's user {owner}")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.setblocking(False)
            sock.connect(f"/proc/self/fd/{fd}")
            _pid, uid, _gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
            if uid not in (owner, 0):
                raise AgentSocketError(f"the listener at {path} runs as uid {uid}, not as {owner}")
        except BaseException:
            sock.close()
            raise
        return sock
    finally:
        os.close(fd)


def connect_soon(reactor: Any, path: str, owner: int, done: Callable[[socket.socket | None, str], None],
                 wait: float = WAIT_SECONDS, every: float = RETRY_INTERVAL,
                 alive: Callable[[], bool] = lambda: True) -> None:
    """:func:`connect`, tried every ``every`` seconds for ``wait`` seconds
    while nothing listens at ``path`` yet (and ``alive()``, the program that
    is to listen still runs); then ``done(sock, "")`` or ``done(None, why)``,
    always from the reactor, never from inside this call."""
    deadline = reactor.seconds() + wait

    def attempt() -> None:
        try:
            sock = connect(path, owner)
        except (FileNotFoundError, ConnectionRefusedError) as error:
            if reactor.seconds() < deadline and alive():
                reactor.callLater(every, attempt)
            else:
                done(None, str(error))
        except OSError as error:
            done(None, str(error))
        else:
            done(sock, "")

    reactor.callLater(0, attempt)


def reach(reactor: Any, path: str, owner: int, wait: float = WAIT_SECONDS, every: float = RETRY_INTERVAL,
          alive: Callable[[], bool] = lambda: True) -> defer.Deferred[socket.socket]:
    """:func:`connect_soon` as a Deferred: the socket, or an
    :class:`AgentSocketError` that says why."""
    reached: defer.Deferred[socket.socket] = defer.Deferred()

    def done(sock: socket.socket | None, why: str) -> None:
        if sock is None:
            reached.errback(AgentSocketError(why))
        else:
            reached.callback(sock)

    connect_soon(reactor, path, owner, done, wait, every, alive)
    return reached


class StreamWatch:
    """What the node does around a stream it opened (a live view's x11vnc):
    ``first_write`` when the taker first writes to the end (its client spoke),
    ``ended`` once when the stream is over, however it ended."""

    def __init__(self, first_write: Callable[[], None] = lambda: None,
                 ended: Callable[[], None] = lambda: None) -> None:
        self.first_write: Callable[[], None] | None = first_write
        self.on_end: Callable[[], None] | None = ended

    def wrote(self) -> None:
        first, self.first_write = self.first_write, None
        if first is not None:
            first()

    def ended(self) -> None:
        on_end, self.on_end = self.on_end, None
        if on_end is not None:
            on_end()


class SocketStream:
    """A connected socket of this machine as a :class:`nxgate.vocabulary.streams.Stream`.

    Attached, the socket goes into the reactor with the taker's protocol as
    its own: the bytes reach it straight from the socket.  Only a watched
    stream (:class:`StreamWatch`) has a thin protocol and transport around
    the taker's, to see its first write and its end."""

    node = ""

    def __init__(self, reactor: Any, sock: socket.socket, session_id: str, kind: StreamKind,
                 watch: StreamWatch | None = None) -> None:
        self.reactor = reactor
        self.sock: socket.socket | None = sock
        self.session_id = session_id
        self.kind = kind
        self.watch = watch
        self.transport: Any = None
        self.why = ""
        self.done = False

    def __repr__(self) -> str:
        return f"SocketStream({self.session_id!r}, {str(self.kind)!r})"

    def attach(self, inner: Any) -> None:
        sock = self._take()
        taker = inner if self.watch is None else watched(inner, self.watch)
        try:
            self.reactor.adoptStreamConnection(sock.fileno(), sock.family, protocol.Factory.forProtocol(lambda: taker))
        finally:
            sock.close()  # the reactor holds its own copy of the descriptor
        self.transport = taker.transport

    def take_socket(self) -> socket.socket:
        if self.watch is not None:
            raise ValueError(f"a {self.kind} stream must be attached: the node watches its end")
        return self._take()

    def _take(self) -> socket.socket:
        if self.sock is None:
            raise ValueError(f"the {self.kind} stream of session {self.session_id} was taken or closed already")
        sock, self.sock = self.sock, None
        return sock

    def close(self) -> None:
        if self.done:
            return
        self.done = True
        if self.sock is not None:
            self.sock.close()
            self.sock = None
            if self.watch is not None:
                self.watch.ended()
        elif self.transport is not None:
            self.transport.loseConnection()  # a watched stream's end follows from the protocol's

    def end(self, why: str) -> None:
        """The node ends the stream: ``why`` is what the taker hears (:meth:`ended`)."""
        self.why = self.why or why
        self.close()

    def ended(self) -> str:
        return self.why

    def closed(self) -> bool:
        return self.done


class _WriteWatch:
    """The transport a watched stream's taker writes to: the real one, its first write noted."""

    def __init__(self, transport: Any, watch: StreamWatch) -> None:
        object.__setattr__(self, "_transport", transport)
        object.__setattr__(self, "_watch", watch)

    def write(self, data: bytes) -> None:
        self._watch.wrote()
        self._transport.write(data)

    def writeSequence(self, data: Any) -> None:
        self._watch.wrote()
        self._transport.writeSequence(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._transport, name, value)  # bufferSize and the like are the real transport's


class _Watched(protocol.Protocol):
    def __init__(self, inner: Any, watch: StreamWatch) -> None:
        self.inner, self.watch = inner, watch

    def makeConnection(self, transport: Any) -> None:
        self.transport = transport
        self.inner.makeConnection(_WriteWatch(transport, self.watch))

    def dataReceived(self, data: bytes) -> None:
        self.inner.dataReceived(data)

    def connectionLost(self, reason: Any = protocol.connectionDone) -> None:
        try:
            self.inner.connectionLost(reason)
        finally:
            self.watch.ended()


@implementer(IHalfCloseableProtocol)
class _HalfCloseableWatched(_Watched):
    def readConnectionLost(self) -> None:
        self.inner.readConnectionLost()

    def writeConnectionLost(self) -> None:
        self.inner.writeConnectionLost()


def watched(inner: Any, watch: StreamWatch) -> _Watched:
    """``inner`` with ``watch`` around it (half-closeable when ``inner`` is)."""
    if IHalfCloseableProtocol.providedBy(inner):
        return _HalfCloseableWatched(inner, watch)
    return _Watched(inner, watch)
