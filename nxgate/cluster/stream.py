"""A session's stream to another member: the gateway's side.

After ``bye`` the client's NX bytes go to the session's agent.  When the
session runs on another member (``StreamTarget.node``), the gateway opens a
TLS connection to that member's listener (:func:`nxgate.cluster.connection.dial`,
whose certificate must name the node), says ``NXSTREAM <id>\\n`` (or
``NXSTREAM <id> view\\n`` for a browser viewer's RFB stream) and, after
the node's ``OK\\n``, the connection carries the raw stream; the node relays
it to the agent's socket after its own owner checks
(:mod:`nxgate.cluster.node_server`).

:meth:`RemoteStreams.connect` gives the relay (:mod:`nxgate.stream.relay`) a
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
from twisted.internet.interfaces import IPushProducer
from twisted.logger import Logger
from zope.interface import implementer

from nxgate.cluster.connection import dial
from nxgate.cluster.tls import ClusterTLS

log = Logger(namespace="nxgate.cluster.stream")

#: What may wait in a stream's send buffer before its source is paused
#: (Twisted's 64 KiB default pauses a bulk transfer thousands of times a second).
STREAM_BUFFER = 1024 * 1024


@implementer(IPushProducer)
class Pauser:
    """A transport as the producer that fills another one's buffer."""

    def __init__(self, transport: Any) -> None:
        self.transport = transport

    def pauseProducing(self) -> None:
        self.transport.pauseProducing()

    def resumeProducing(self) -> None:
        self.transport.resumeProducing()

    def stopProducing(self) -> None:
        self.transport.resumeProducing()


def close(transport: Any) -> None:
    """Close one side of a stream.  A TLS transport with a producer
    registered would wait for that producer forever (it has no end of its
    own): it is unregistered first."""
    transport.unregisterProducer()
    transport.loseConnection()


class _Closing:
    """A TLS transport as the relay's agent connection: closing it first
    lets go of the relay's producer (see :func:`close`)."""

    def __init__(self, transport: Any) -> None:
        self._transport = transport

    def loseConnection(self) -> None:
        close(self._transport)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def set_buffer(transport: Any, size: int = STREAM_BUFFER) -> None:
    """A bigger send buffer on ``transport`` (the TCP one under TLS)."""
    transport.bufferSize = size
    below = getattr(transport, "transport", None)
    if below is not None and hasattr(below, "bufferSize"):
        below.bufferSize = size


class _StreamClient(protocol.Protocol):
    """Ask for the stream, then become ``inner``'s transport."""

    def __init__(self, session_id: str, inner: protocol.Protocol, failed: Callable[[str], None],
                 kind: str = "") -> None:
        self.session_id, self.inner, self.failed, self.kind = session_id, inner, failed, kind
        self.head = b""
        self.open = False

    def connectionMade(self) -> None:
        kind = b" " + self.kind.encode("ascii") if self.kind else b""
        self.transport.write(b"NXSTREAM " + self.session_id.encode("ascii") + kind + b"\n")

    def dataReceived(self, data: bytes) -> None:
        if self.open:
            self.inner.dataReceived(data)
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
        set_buffer(self.transport)
        self.inner.makeConnection(_Closing(self.transport))
        if rest:
            self.inner.dataReceived(rest)

    def _fail(self, why: str) -> None:
        failed, self.failed = self.failed, None
        self.transport.loseConnection()
        if failed is not None:
            failed(why)

    def connectionLost(self, reason: Any) -> None:
        if self.open:
            self.inner.connectionLost(reason)
        elif self.failed is not None:
            self._fail_lost(reason)

    def _fail_lost(self, reason: Any) -> None:
        failed, self.failed = self.failed, None
        failed(f"the node closed the stream before it was open ({reason.getErrorMessage()})")


class _PairEnd(protocol.Protocol):
    """The gateway's end of the socket pair, spliced to the TLS stream."""

    def __init__(self, tls_transport: Any) -> None:
        self.tls = tls_transport

    def connectionMade(self) -> None:
        set_buffer(self.transport)
        self.transport.registerProducer(Pauser(self.tls), True)
        self.tls.registerProducer(Pauser(self.transport), True)
        self.tls.resumeProducing()

    def dataReceived(self, data: bytes) -> None:
        self.tls.write(data)

    def connectionLost(self, reason: Any) -> None:
        close(self.tls)


class _Splice(protocol.Protocol):
    """The TLS stream's inner protocol for :meth:`RemoteStreams.connect_socket`."""

    def __init__(self, reactor: Any, mine: socket.socket) -> None:
        self.reactor, self.mine = reactor, mine
        self.pair: _PairEnd | None = None

    def connectionMade(self) -> None:
        self.transport.pauseProducing()  # until the pair's end is in the reactor

        def build() -> _PairEnd:
            self.pair = _PairEnd(self.transport)
            return self.pair

        try:
            self.reactor.adoptStreamConnection(self.mine.fileno(), socket.AF_UNIX,
                                               protocol.Factory.forProtocol(build))
        finally:
            self.mine.close()  # the reactor holds its own copy of the descriptor

    def dataReceived(self, data: bytes) -> None:
        assert self.pair is not None  # adoptStreamConnection connected it at once
        self.pair.transport.write(data)

    def connectionLost(self, reason: Any) -> None:
        if self.pair is not None and self.pair.transport is not None:
            close(self.pair.transport)


class RemoteStreams:
    """Opens session streams on other members with this member's credentials."""

    def __init__(self, reactor: Any, tls: ClusterTLS) -> None:
        self.reactor, self.tls = reactor, tls

    def connect(self, target: Any, inner: protocol.Protocol, failed: Callable[[str], None], kind: str = "") -> None:
        """Connect ``inner`` to the stream of ``target`` (with ``node`` and
        ``address`` set), or call ``failed(why)``; never from inside this call.
        ``kind``: what the stream reaches on the node (:data:`nxgate.cluster.node_server.STREAM_KINDS`):
        the agent (``""``), or ``"view"``, a browser viewer's x11vnc on the session's display."""
        client = _StreamClient(target.session_id, inner, failed, kind)
        d = dial(self.reactor, self.tls, target.node, target.address, client)

        def not_connected(failure: Any) -> None:
            if client.failed is not None:
                why, client.failed = failure.getErrorMessage(), None
                failed(f"cannot reach member {target.node}: {why}")

        d.addErrback(not_connected)

    def connect_socket(self, target: Any, done: Callable[[socket.socket | None, str], None]) -> None:
        """As :func:`nxgate.stream.agentsocket.connect_soon`: ``done(sock, "")``
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
