"""A session's stream to another member: the gateway's side.

After ``bye`` the client's NX bytes go to the session's agent.  When the
session runs on another member (``StreamTarget.node``), the gateway opens a
TLS connection to that member's listener (:func:`nxgate.wire.connection.dial`,
whose certificate must name the node), says ``NXSTREAM <id>\\n`` (or
``NXSTREAM <id> view\\n`` for a browser viewer's RFB stream) and, after
the node's ``OK\\n``, the connection carries the raw stream; the node relays
it to the agent's socket after its own owner checks
(:mod:`nxgate.wire.node_listener`).

:meth:`RemoteStreams.connect` gives the relay (:mod:`nxgate.wire.relay`) a
connected protocol, as a local agent socket would; :meth:`RemoteStreams.connect_socket`
gives a plain socket (one end of a socket pair the gateway splices to the
TLS connection) for the OpenSSH door, which hands a descriptor to
``nxgate-shell``.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

from twisted.internet import protocol
from twisted.internet.interfaces import IHalfCloseableProtocol
from twisted.logger import Logger
from zope.interface import implementer

from nxgate.wire.connection import dial
from nxgate.wire.tls import ClusterTLS
from nxgate.wire.splice import Splice, TransportEnd

log = Logger(namespace="nxgate.wire.member_stream")

class _StreamClient(protocol.Protocol):
    """Ask for the stream, then become ``inner``'s transport.

    Made without a session, it is a spare (see :class:`RemoteStreams`):
    connected and checked, it waits for :meth:`ask`."""

    def __init__(self, session_id: str = "", inner: protocol.Protocol | None = None,
                 failed: Callable[[str], None] | None = None, kind: str = "") -> None:
        self.session_id, self.inner, self.failed, self.kind = session_id, inner, failed, kind
        self.head = b""
        self.open = False
        self.lost = False
        #: Called once the node answered (or the stream failed): a spare for the next one may be dialled.
        self.answered: Callable[[], None] = lambda: None
        #: Called when a spare's connection ends before it was asked for a stream.
        self.spare_lost: Callable[[], None] = lambda: None

    def connectionMade(self) -> None:
        if self.session_id:
            self._ask()

    def idle(self) -> bool:
        """A spare that can still carry a stream."""
        return (not self.session_id and not self.lost and self.transport is not None
                and not self.transport.disconnecting)

    def ask(self, session_id: str, inner: protocol.Protocol, failed: Callable[[str], None], kind: str = "") -> None:
        self.session_id, self.inner, self.failed, self.kind = session_id, inner, failed, kind
        self._ask()

    def _ask(self) -> None:
        kind = b" " + self.kind.encode("ascii") if self.kind else b""
        self.transport.write(b"NXSTREAM " + self.session_id.encode("ascii") + kind + b"\n")

    def dataReceived(self, data: bytes) -> None:
        if self.open:
            self.inner.dataReceived(data)
            return
        if not self.session_id:
            self.transport.loseConnection()  # a node does not speak first
            return
        self.head += data
        if b"\n" not in self.head:
            if len(self.head) > 512:
                self._fail("the node's answer was unreadable")
            return
        line, _, rest = self.head.partition(b"\n")
        if line != b"OK":
            self._fail(line.decode("utf-8", "replace").removeprefix("ERR ") or "refused by the node")
            return
        self.open = True
        self.answered()
        self.inner.makeConnection(self.transport)
        if rest:
            self.inner.dataReceived(rest)

    def _fail(self, why: str) -> None:
        failed, self.failed = self.failed, None
        self.transport.loseConnection()
        if failed is not None:
            self.answered()
            failed(why)

    def connectionLost(self, reason: Any) -> None:
        self.lost = True
        if self.open:
            self.inner.connectionLost(reason)
        elif self.failed is not None:
            self._fail_lost(reason)
        elif not self.session_id:
            self.spare_lost()

    def _fail_lost(self, reason: Any) -> None:
        failed, self.failed = self.failed, None
        self.answered()
        failed(f"the node closed the stream before it was open ({reason.getErrorMessage()})")


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
    """The TLS stream's inner protocol for :meth:`RemoteStreams.connect_socket`."""

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

    def connect(self, target: Any, inner: protocol.Protocol, failed: Callable[[str], None], kind: str = "") -> None:
        """Connect ``inner`` to the stream of ``target`` (with ``node`` and
        ``address`` set), or call ``failed(why)``; never from inside this call."""
        key = (target.node, target.address)
        spare = self._take(key)
        if spare is not None:
            spare.answered = lambda: self._keep_spare(key)
            spare.ask(target.session_id, inner, failed, kind)
            return
        client = _StreamClient(target.session_id, inner, failed, kind)
        client.answered = lambda: self._keep_spare(key)
        d = dial(self.reactor, self.tls, target.node, target.address, client)

        def not_connected(failure: Any) -> None:
            if client.failed is not None:
                why, client.failed = failure.getErrorMessage(), None
                failed(f"cannot reach member {target.node}: {why}")

        d.addErrback(not_connected)

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

    def connect_socket(self, target: Any, done: Callable[[socket.socket | None, str], None]) -> None:
        """As :func:`nxgate.wire.agentsocket.connect_soon`: ``done(sock, "")``
        with a socket that carries the remote stream, or ``done(None, why)``."""
        theirs, mine = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        mine.setblocking(False)

        class _Handing(_Splice):
            def connectionMade(self) -> None:
                super().connectionMade()
                done(theirs, "")

        def failed(why: str) -> None:
            theirs.close()
            mine.close()
            done(None, why)

        self.connect(target, _Handing(self.reactor, mine), failed)
