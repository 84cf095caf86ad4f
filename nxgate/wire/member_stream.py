"""A session's stream on another member: the gateway's side.

``open_stream`` of a session that another member runs
(:meth:`nxgate.wire.remote_node.RemoteNode.open_stream`) opens a TLS
connection to that member's listener (:func:`nxgate.wire.connection.dial`,
whose certificate must name the node), whose first line is the request,
``NXSTREAM`` and the call's arguments: the caller, the session and the
kind (:func:`nxgate.wire.protocol.stream_request`).  The node checks
them as for any call and answers ``OK`` or ``ERR`` with the refusal's
kind and words (:mod:`nxgate.wire.node_listener`); after ``OK`` the
connection carries the raw stream.

The gateway then holds a :class:`MemberStream` (a
:class:`nxgate.vocabulary.streams.Stream`): attached, the taker's protocol
becomes the TLS connection's own (its bytes come straight from the TLS
layer: no copy, no hop in between); taken as a socket (the OpenSSH door),
one end of a socket pair that this process splices to the TLS connection.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

from twisted.internet import defer, protocol
from twisted.internet.interfaces import IHalfCloseableProtocol
from twisted.logger import Logger
from zope.interface import implementer

from nxgate.vocabulary.caller import Caller
from nxgate.vocabulary.errors import Kind, SessionError
from nxgate.vocabulary.streams import StreamKind
from nxgate.wire import protocol as wire
from nxgate.wire.connection import dial
from nxgate.wire.splice import Splice, TransportEnd
from nxgate.wire.tls import ClusterTLS

log = Logger()


class _StreamClient(protocol.Protocol):
    """One stream connection: asks for the stream, holds it once open, then
    gives the taker's protocol its transport.

    Made without a request, it is a spare (see :class:`RemoteStreams`):
    connected and checked, it waits for :meth:`ask`."""

    def __init__(self, request: bytes = b"", opened: defer.Deferred[Any] | None = None,
                 node: str = "") -> None:
        self.request, self.opened, self.node = request, opened, node
        #: Makes the stream the node opened (set with the request).
        self.stream: Callable[[_StreamClient], Any] = lambda client: None
        self.head = b""
        self.open = False  # the node said OK
        self.inner: Any = None  # the taker's protocol, once attached
        self.held: list[bytes] = []  # what came after OK, before the taker
        self.lost_reason: Any = None
        self.lost = False
        #: Called once the node answered (or the stream failed): a spare for the next one may be dialled.
        self.answered: Callable[[], None] = lambda: None
        #: Called when a spare's connection ends before it was asked for a stream.
        self.spare_lost: Callable[[], None] = lambda: None

    def connectionMade(self) -> None:
        if self.request:
            self.transport.write(self.request)

    def idle(self) -> bool:
        """A spare that can still carry a stream."""
        return (not self.request and not self.lost and self.transport is not None
                and not self.transport.disconnecting)

    def ask(self, request: bytes, opened: defer.Deferred[Any], node: str,
            stream: Callable[[_StreamClient], Any]) -> None:
        self.request, self.opened, self.node, self.stream = request, opened, node, stream
        self.transport.write(request)

    def dataReceived(self, data: bytes) -> None:
        if self.inner is not None:
            self.inner.dataReceived(data)
            return
        if self.open:
            self.held.append(data)
            return
        if not self.request:
            self.transport.loseConnection()  # a node does not speak first
            return
        self.head += data
        if b"\n" not in self.head:
            if len(self.head) > wire.MAX_STREAM_ANSWER:
                self._fail(SessionError(Kind.INTERNAL, "Internal error: the session node's answer was unreadable."))
            return
        line, _, rest = self.head.partition(b"\n")
        self.head = b""
        try:
            wire.read_stream_answer(line)
        except SessionError as refusal:
            self._fail(refusal)
            return
        except ValueError as error:
            log.error("member {node} answered a stream request with something this gateway cannot read: {error}",
                      node=self.node, error=str(error))
            self._fail(SessionError(Kind.INTERNAL, "Internal error: the session node's answer was unreadable."))
            return
        self.open = True
        self.transport.pauseProducing()  # the taker reads, once there is one
        if rest:
            self.held.append(rest)
        self.answered()
        opened, self.opened = self.opened, None
        if opened is not None:
            opened.callback(self.stream(self))

    def _fail(self, error: SessionError) -> None:
        opened, self.opened = self.opened, None
        self.transport.loseConnection()
        if opened is not None:
            self.answered()
            opened.errback(error)

    def give(self, inner: Any) -> None:
        """The taker's protocol gets the connection, and what came for it meanwhile."""
        self.inner = inner
        inner.makeConnection(self.transport)
        held, self.held = self.held, []
        for data in held:
            inner.dataReceived(data)
        if self.lost:
            inner.connectionLost(self.lost_reason)
        else:
            self.transport.resumeProducing()

    def connectionLost(self, reason: Any) -> None:
        self.lost, self.lost_reason = True, reason
        if self.inner is not None:
            self.inner.connectionLost(reason)
        elif self.opened is not None:
            opened, self.opened = self.opened, None
            self.answered()
            opened.errback(SessionError(
                Kind.UNAVAILABLE, f"The session node {self.node} closed the stream before it was open "
                                  f"({reason.getErrorMessage()}); try again."))
        elif not self.request:
            self.spare_lost()


class MemberStream:
    """A stream that another member opened (a :class:`nxgate.vocabulary.streams.Stream`)."""

    def __init__(self, reactor: Any, client: _StreamClient, session_id: str, kind: StreamKind) -> None:
        self.reactor, self.client = reactor, client
        self.session_id, self.kind = session_id, kind
        self.node = client.node
        self.taken = False

    def __repr__(self) -> str:
        return f"MemberStream({self.session_id!r}, {str(self.kind)!r}, on {self.node!r})"

    def attach(self, inner: Any) -> None:
        self._take()
        self.client.give(inner)

    def take_socket(self) -> socket.socket:
        """One end of a socket pair; the other end is spliced here to the member's stream."""
        self._take()
        theirs, mine = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        mine.setblocking(False)
        try:
            self.client.give(_Splice(self.reactor, mine))
        except BaseException:
            theirs.close()
            raise
        return theirs

    def _take(self) -> None:
        if self.taken:
            raise ValueError("this stream was taken already")
        self.taken = True

    def close(self) -> None:
        if not self.taken:
            self.taken = True
            self.client.held.clear()
        if self.client.transport is not None:
            self.client.transport.loseConnection()

    def ended(self) -> str:
        return ""  # a node's words about why it ended a stream do not travel (the raw stream just ends)

    def closed(self) -> bool:
        return self.client.lost


@implementer(IHalfCloseableProtocol)
class _PairEnd(protocol.Protocol):
    """The gateway's end of the socket pair, spliced to the TLS stream."""

    def __init__(self, tls: _Splice) -> None:
        self.tls = tls

    def connectionMade(self) -> None:
        self.tls.paired(self.transport)

    def dataReceived(self, data: bytes) -> None:
        self.tls.splice.received("pair", data)

    def readConnectionLost(self) -> None:
        self.tls.splice.eof("pair")  # TLS cannot half-close: the stream ends

    def writeConnectionLost(self) -> None:
        pass

    def connectionLost(self, reason: Any) -> None:
        self.tls.splice.lost("pair")


class _Splice(protocol.Protocol):
    """The TLS stream's protocol for :meth:`MemberStream.take_socket`: spliced to our end of the pair."""

    def __init__(self, reactor: Any, mine: socket.socket) -> None:
        self.reactor, self.mine = reactor, mine
        self.splice: Splice | None = None

    def connectionMade(self) -> None:
        self.transport.pauseProducing()  # until the pair's end is in the reactor
        try:
            self.reactor.adoptStreamConnection(self.mine.fileno(), socket.AF_UNIX,
                                               protocol.Factory.forProtocol(lambda: _PairEnd(self)))
        finally:
            self.mine.close()  # the reactor holds its own copy of the descriptor

    def paired(self, pair: Any) -> None:
        self.splice = Splice(TransportEnd(self.transport), TransportEnd(pair), names=("member", "pair"))
        self.transport.resumeProducing()

    def dataReceived(self, data: bytes) -> None:
        assert self.splice is not None  # adoptStreamConnection connected the pair at once
        self.splice.received("member", data)

    def connectionLost(self, reason: Any) -> None:
        if self.splice is not None:
            self.splice.lost("member")


class RemoteStreams:
    """Opens session streams on other members with this member's credentials.

    After a stream to a member opened, one *spare* connection to that member
    is dialled and kept ready for :data:`SPARE_SECONDS`: the next stream
    then costs one request and answer, not a TCP connect and a TLS handshake
    (issue 25: 8.7 ms against 2.3 ms for an agent on the same machine).  The
    node checks the gateway's membership again when a spare is used after a
    while (nxgate.wire.connection.RECHECK_AFTER), so a spare carries no
    permission that a new connection would not get."""

    SPARE_SECONDS = 60.0

    def __init__(self, reactor: Any, tls: ClusterTLS, spares: bool = True) -> None:
        self.reactor, self.tls = reactor, tls
        self.keep_spares = spares
        self.spares: dict[tuple[str, str], tuple[_StreamClient, Any]] = {}
        self.dialling: set[tuple[str, str]] = set()

    def open(self, node: str, address: str, caller: Caller, session_id: str,
             kind: StreamKind) -> defer.Deferred[MemberStream]:
        """``open_stream(caller, session_id, kind)`` on member ``node`` at
        ``address``: the stream once the node opened it, or the node's
        refusal (a SessionError: its kind and words), or UNAVAILABLE when the
        member cannot be reached."""
        request = wire.stream_request(caller, session_id, kind)
        opened: defer.Deferred[MemberStream] = defer.Deferred()
        key = (node, address)

        def stream(client: _StreamClient) -> MemberStream:
            return MemberStream(self.reactor, client, session_id, kind)

        spare = self._take(key)
        if spare is not None:
            spare.answered = lambda: self._keep_spare(key)
            spare.ask(request, opened, node, stream)
            return opened
        client = _StreamClient(request, opened, node)
        client.stream = stream
        client.answered = lambda: self._keep_spare(key)

        def not_connected(failure: Any) -> None:
            if client.opened is not None:
                client.opened = None
                log.warn("cluster member {name} at {address} cannot be reached for a stream: {why}", name=node,
                         address=address, why=failure.getErrorMessage(), event="cluster_member_unreachable")
                opened.errback(SessionError(Kind.UNAVAILABLE,
                                            f"The session node {node} cannot be reached; try again later."))

        dial(self.reactor, self.tls, node, address, client).addErrback(not_connected)
        return opened

    def _take(self, key: tuple[str, str]) -> _StreamClient | None:
        spare, expiry = self.spares.pop(key, (None, None))
        if spare is None:
            return None
        if expiry.active():
            expiry.cancel()
        if spare.idle():
            return spare
        return None

    def _keep_spare(self, key: tuple[str, str]) -> None:
        if not self.keep_spares or key in self.spares or key in self.dialling:
            return
        self.dialling.add(key)
        spare = _StreamClient()
        connected = dial(self.reactor, self.tls, key[0], key[1], spare)

        def ready(_: Any) -> None:
            self.dialling.discard(key)
            if not spare.idle():
                return
            expiry = self.reactor.callLater(self.SPARE_SECONDS, self._drop, key, spare)
            self.spares[key] = (spare, expiry)
            spare.spare_lost = lambda: self._drop(key, spare)

        def not_ready(failure: Any) -> None:  # the next stream dials on its own and says why if it fails
            self.dialling.discard(key)
            log.debug("no spare connection to member {node}: {why}", node=key[0], why=failure.getErrorMessage())

        connected.addCallbacks(ready, not_ready)

    def _drop(self, key: tuple[str, str], spare: _StreamClient) -> None:
        kept = self.spares.get(key)
        if kept is not None and kept[0] is spare:
            del self.spares[key]
            if kept[1].active():
                kept[1].cancel()
        if spare.transport is not None and not spare.lost:
            spare.transport.loseConnection()

    def close(self) -> None:
        """No more spares (the gateway stops)."""
        self.keep_spares = False
        for key, (spare, _expiry) in list(self.spares.items()):
            self._drop(key, spare)
