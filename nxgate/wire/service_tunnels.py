"""Service tunnels on the SSH connection (issue 25, :mod:`nxgate.wire.tunnel_registry`):
the channel that carries one TCP connection, and the server's listeners.

:class:`TunnelChannel` splices an SSH channel with a TCP connection, with
flow control both ways and per channel: when the socket cannot take more,
the channel stops granting window (the peer then waits) instead of pausing
the whole SSH connection, which carries the NX stream too.  Both ends use
it: the gateway for each connection it accepts from the session's smbnetfs
or cupsd, ``nxgate-client`` for the channels the gateway opens to it.

:class:`ServiceTunnels` is the gateway's side for one NX shell channel: it
answers the client's :data:`nxgate.wire.tunnel_registry.REQUEST` (the caller must own
the session and have been granted the service), listens on a fresh loopback
port, lets through only connections of the session's user, and goes with
the shell channel.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Any

from twisted.conch.ssh.channel import SSHChannel
from twisted.internet import defer, protocol
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.logger import Logger
from twisted.python.failure import Failure

from nxgate.wire import tunnel_registry as tunnels
from nxgate.wire.tcp import no_delay

log = Logger()

#: Window of a tunnel channel: large enough that a bulk copy does not wait
#: a round trip per window (the NX channel uses the same, see server.py).
WINDOW = 2 * 1024 * 1024
#: Bigger packets than Conch's 32 KiB (each costs Python work at both ends;
#: both are ours, and our transports take packets up to 1 MiB), but no
#: bigger than what one read of the SSH socket brings (Twisted's 64 KiB):
#: a longer packet is copied again with every read until it is complete.
MAX_PACKET = 64 * 1024 - 256
#: What a socket of a tunnel reads at once (Twisted's 64 KiB default), and
#: how much it buffers before pausing what feeds it.
SOCKET_BUFFER = 256 * 1024


def _tune(transport: Any) -> None:
    no_delay(transport)  # SMB and IPP are request/answer: no Nagle wait
    if hasattr(transport, "bufferSize"):
        transport.bufferSize = SOCKET_BUFFER


class _Socket(protocol.Protocol):
    """The TCP end of a tunnel channel."""

    def __init__(self, channel: TunnelChannel) -> None:
        self.channel = channel

    def connectionMade(self) -> None:
        _tune(self.transport)
        self.transport.registerProducer(self.channel, True)
        self.channel.socket_ready(self)

    def dataReceived(self, data: bytes) -> None:
        self.channel.write(data)

    def connectionLost(self, reason: Any = None) -> None:
        self.channel.socket_lost()


class TunnelChannel(SSHChannel):
    """An SSH channel spliced to one TCP connection.

    Data from the channel goes to the socket; when the socket's buffer is
    full (Twisted pauses us as its producer) the channel keeps its window
    closed until it drained.  Data from the socket goes to the channel;
    when the peer's window is used up, Conch calls :meth:`stopWriting` and
    the socket stops being read."""

    name = tunnels.CHANNEL

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("localWindow", WINDOW)
        kwargs.setdefault("localMaxPacket", MAX_PACKET)
        super().__init__(*args, **kwargs)
        self.socket: _Socket | None = None
        self.pending: list[bytes] = []  # from the channel, before the socket is up
        self._window = self.localWindowSize
        self._paused = False
        self._ended = False

    # ------------------------------------------------------------ socket
    def socket_protocol(self) -> _Socket:
        return _Socket(self)

    def socket_ready(self, socket: _Socket) -> None:
        self.socket = socket
        pending, self.pending = self.pending, []
        for data in pending:
            socket.transport.write(data)

    def socket_lost(self) -> None:
        self.socket = None
        if not self._ended:
            self._ended = True
            self.conn.sendEOF(self)
            self.loseConnection()

    # --------------------------------------------------- as the producer
    def pauseProducing(self) -> None:
        """The socket is full: grant the peer no more window (Conch only
        adjusts it when ``localWindowLeft`` falls below half the size)."""
        self._paused = True
        self.localWindowSize = 0

    def resumeProducing(self) -> None:
        self._paused = False
        self.localWindowSize = self._window
        if self.localWindowLeft < self._window // 2 and not self.closing:
            self.conn.adjustWindow(self, self._window - self.localWindowLeft)

    def stopProducing(self) -> None:
        self.loseConnection()

    # ----------------------------------------------------------- channel
    def dataReceived(self, data: bytes) -> None:
        if self.socket is not None:
            self.socket.transport.write(data)
        else:
            self.pending.append(data)

    def stopWriting(self) -> None:
        if self.socket is not None:
            self.socket.transport.pauseProducing()

    def startWriting(self) -> None:
        if self.socket is not None:
            self.socket.transport.resumeProducing()

    def eofReceived(self) -> None:
        if self.socket is not None:
            self.socket.transport.loseConnection()

    def closed(self) -> None:
        self._ended = True
        if self.socket is not None:
            self.socket.transport.loseConnection()
        self.pending = []

    def openFailed(self, reason: Failure) -> None:
        self._ended = True
        if self.socket is not None:
            self.socket.transport.abortConnection()


class ClientTunnelChannel(TunnelChannel):
    """``nxgate-client``'s end: the gateway opened it for one connection of
    the session's side; it connects to ``target`` (the private Samba, the
    print gate) on this machine's loopback."""

    def __init__(self, reactor: Any, target: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.reactor = reactor
        self.target = target

    def channelOpen(self, specificData: bytes) -> None:
        endpoint = TCP4ClientEndpoint(self.reactor, "127.0.0.1", self.target, timeout=10)
        d = endpoint.connect(protocol.Factory.forProtocol(self.socket_protocol))
        d.addErrback(self._unreachable)

    def _unreachable(self, failure: Failure) -> None:
        log.warn("a tunnel connection could not reach 127.0.0.1:{port}: {error}", port=self.target,
                 error=failure.getErrorMessage())
        self.loseConnection()


class _ServerTunnelChannel(TunnelChannel):
    """The gateway's end: opened for a connection it accepted (already up)."""

    def __init__(self, socket: _Inbound, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.inbound = socket

    def channelOpen(self, specificData: bytes) -> None:
        self.inbound.channel = self
        self.inbound.transport.registerProducer(self, True)
        self.socket_ready(self.inbound)  # type: ignore[arg-type]
        buffered, self.inbound.buffered = self.inbound.buffered, []
        for data in buffered:
            self.write(data)
        if self.areWriting:  # else the peer's window is full already: startWriting resumes it
            self.inbound.transport.resumeProducing()

    def openFailed(self, reason: Failure) -> None:
        """The client would not take it (it did not ask for this tunnel, or it is going)."""
        log.info("a tunnel connection was refused by the client: {reason}", reason=reason.getErrorMessage())
        self._ended = True
        self.inbound.channel = None
        self.inbound.transport.abortConnection()


class _Inbound(protocol.Protocol):
    """A connection from the session's side, before and after its channel opened."""

    def __init__(self, tunnel: _Listener) -> None:
        self.tunnel = tunnel
        self.channel: TunnelChannel | None = None
        self.buffered: list[bytes] = []

    def connectionMade(self) -> None:
        _tune(self.transport)
        self.transport.pauseProducing()  # nothing goes anywhere before the peer check
        self.tunnel.accepted(self)

    def dataReceived(self, data: bytes) -> None:
        if self.channel is not None:
            self.channel.write(data)
        else:
            self.buffered.append(data)

    def connectionLost(self, reason: Any = None) -> None:
        if self.channel is not None:
            self.channel.socket_lost()


class _Listener(protocol.ServerFactory):
    """One session service's loopback port on the gateway."""

    noisy = False  # its own log line says more than "Starting factory"

    def __init__(self, owner: ServiceTunnels, service: str, session_id: str, user: str, uid: int) -> None:
        self.owner = owner
        self.service = service
        self.session_id = session_id
        self.user = user
        self.uid = uid
        self.port: Any = None
        self.tunnel: tunnels.Tunnel | None = None

    def buildProtocol(self, addr: Any) -> _Inbound:
        return _Inbound(self)

    def accepted(self, inbound: _Inbound) -> None:
        peer, local = inbound.transport.getPeer(), inbound.transport.getHost()
        d = self.owner.blocking(tunnels.read_peer_uid, (peer.host, peer.port), (local.host, local.port))
        d.addCallbacks(lambda uid: self._checked(inbound, uid), lambda failure: self._checked(inbound, None, failure))

    def _checked(self, inbound: _Inbound, uid: int | None, failure: Failure | None = None) -> None:
        if inbound.transport.disconnected or self.owner.closed:
            inbound.transport.abortConnection()
            return
        if uid not in (self.uid, self.owner.own_uid):  # the gateway itself asks the client's printers
            log.warn("session {id} of {user}: refused a {service} connection to its tunnel from uid {uid} (only the "
                     "session's user may use it){error}", id=self.session_id, user=self.user, service=self.service,
                     uid="unknown" if uid is None else uid,
                     error=f": {failure.getErrorMessage()}" if failure is not None else "")
            inbound.transport.abortConnection()
            return
        channel = _ServerTunnelChannel(inbound, conn=self.owner.conn)
        self.owner.conn.openChannel(channel, tunnels.encode(self.service, self.session_id))


class ServiceTunnels:
    """The tunnels one NX shell channel asked for; they go with it.

    ``authorize(service, session_id)`` checks the caller (the NX login of
    that shell channel) and returns ``(user, uid)`` or raises with a reason
    for the log; ``blocking`` runs a function in a thread."""

    def __init__(self, reactor: Any, conn: Any, authorize: Callable[[str, str], Awaitable[tuple[str, int]]],
                 blocking: Callable[..., defer.Deferred[Any]],
                 registry: tunnels.TunnelRegistry = tunnels.REGISTRY) -> None:
        self.reactor = reactor
        self.conn = conn
        self.authorize = authorize
        self.blocking = blocking
        self.registry = registry
        self.listeners: dict[tuple[str, str], _Listener] = {}
        self.closed = False
        self.own_uid = os.getuid()

    def request(self, data: bytes) -> defer.Deferred[int]:
        """The client's :data:`nxgate.wire.tunnel_registry.REQUEST`: 1 granted, 0 refused."""
        return defer.ensureDeferred(self._request(data))

    async def _request(self, data: bytes) -> int:
        try:
            service, session_id = tunnels.decode(data)
        except tunnels.TunnelRequestError as problem:
            log.info("refused a service tunnel request: {problem}", problem=str(problem))
            return 0
        try:
            user, uid = await self.authorize(service, session_id)
        except Exception as problem:  # the reason the authorizer gives
            log.info("refused a {service} tunnel for session {id}: {problem}", service=service, id=session_id,
                     problem=str(problem))
            return 0
        if self.closed:
            return 0
        key = (service, session_id)
        if key in self.listeners:
            return 1
        listener = _Listener(self, service, session_id, user, uid)
        listener.port = self.reactor.listenTCP(0, listener, interface="127.0.0.1")
        listener.tunnel = tunnels.Tunnel(session_id, user, service, listener.port.getHost().port, listener)
        self.listeners[key] = listener
        self.registry.add(listener.tunnel)
        log.info("session {id} of {user}: {service} through its own SSH channel (tunnel on 127.0.0.1:{port})",
                 id=session_id, user=user, service=service, port=listener.tunnel.port)
        return 1

    def close(self) -> None:
        """The shell channel went: no more connections through it."""
        self.closed = True
        for listener in self.listeners.values():
            if listener.tunnel is not None:
                self.registry.remove(listener.tunnel)
            listener.port.stopListening()
        self.listeners.clear()
