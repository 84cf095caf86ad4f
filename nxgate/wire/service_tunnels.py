"""Service tunnels on the SSH connection (:mod:`nxgate.wire.tunnel_registry`):
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
import secrets
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from twisted.conch.ssh.channel import SSHChannel
from twisted.internet import defer, protocol
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.error import CannotListenError
from twisted.logger import Logger
from twisted.python.failure import Failure

from nxgate import local_peers
from nxgate.wire import tunnel_registry as tunnels
from nxgate.wire.tcp import no_delay

log = Logger(namespace="nxgate.ssh.tunnel")

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
    """A connection from the session's side, before and after its channel
    opened (``own``: the gateway's own, through a socket pair)."""

    def __init__(self, tunnel: _Listener, own: bool = False) -> None:
        self.tunnel = tunnel
        self.own = own
        self.channel: TunnelChannel | None = None
        self.buffered: list[bytes] = []

    def connectionMade(self) -> None:
        _tune(self.transport)
        self.transport.pauseProducing()  # not a byte is read before the peer is judged
        self.tunnel.accepted(self)

    def dataReceived(self, data: bytes) -> None:
        if self.channel is not None:
            self.channel.write(data)
        else:
            self.buffered.append(data)

    def connectionLost(self, reason: Any = None) -> None:
        if self.channel is not None:
            self.channel.socket_lost()


class _OwnSide(protocol.Factory):
    """The tunnel's end of a socket pair made for the gateway's own requests."""

    noisy = False

    def __init__(self, listener: _Listener) -> None:
        self.listener = listener

    def buildProtocol(self, addr: Any) -> _Inbound:
        return _Inbound(self.listener, own=True)


#: Refusals from one peer uid are logged at these counts (then summed up at
#: the tunnel's end): a flood of attempts is a few lines, not one each.
_SAY_AT = frozenset({1, 10, 100, 1000, 10000, 100000})


class _Listener(protocol.ServerFactory):
    """One session service's listening socket on the gateway (a Unix socket
    or a loopback TCP port, see :data:`UNIX_SOCKET_SERVICES`)."""

    noisy = False  # its own log line says more than "Starting factory"

    def __init__(self, owner: ServiceTunnels, service: str, session_id: str, user: str, uid: int) -> None:
        self.owner = owner
        self.service = service
        self.unix = service in UNIX_SOCKET_SERVICES
        self.session_id = session_id
        self.user = user
        self.uid = uid
        self.port: Any = None
        self.tunnel: tunnels.Tunnel | None = None
        self.refused: dict[str, int] = {}  # who -> how many of their connections were refused

    def buildProtocol(self, addr: Any) -> _Inbound:
        return _Inbound(self)

    def connect_own(self) -> socket.socket:
        """A connected socket for the gateway's own requests to the client
        (which printers it has): its other end is handed to this tunnel as
        an accepted connection, never through the listening socket, so no
        connection on that socket is ever taken for the gateway's."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            theirs.setblocking(False)
            self.owner.reactor.adoptStreamConnection(theirs.fileno(), socket.AF_UNIX, _OwnSide(self))
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()  # the reactor holds its own copy
        ours.setblocking(False)
        return ours

    def accepted(self, inbound: _Inbound) -> None:
        if inbound.own:
            self._open_channel(inbound)
            return
        transport = inbound.transport
        if self.unix:
            verdict = defer.succeed(local_peers.check_unix(transport.socket, self.uid))
        else:
            peer, local = transport.getPeer(), transport.getHost()
            verdict = self.owner.blocking(local_peers.check_tcp, (peer.host, peer.port), (local.host, local.port),
                                          self.uid)
        verdict.addCallbacks(lambda judged: self._judged(inbound, judged),
                             lambda failure: self._judged(inbound, local_peers.Verdict(
                                 False, f"it could not be checked: {failure.getErrorMessage()}", "an unknown peer")))

    def _judged(self, inbound: _Inbound, verdict: local_peers.Verdict) -> None:
        if inbound.transport.disconnected or self.owner.closed:
            inbound.transport.abortConnection()
            return
        if not verdict.admitted:
            inbound.transport.abortConnection()
            count = self.refused[verdict.who] = self.refused.get(verdict.who, 0) + 1
            if count in _SAY_AT:
                log.warn("session {id} of {user}: refused a {service} connection to its tunnel from {who}: "
                         "{reason} (only the session's user may use it){times}", id=self.session_id, user=self.user,
                         service=self.service, who=verdict.who, reason=verdict.reason,
                         times="" if count == 1 else f"; {count} refused from there so far")
            return
        self._open_channel(inbound)

    def _open_channel(self, inbound: _Inbound) -> None:
        channel = _ServerTunnelChannel(inbound, conn=self.owner.conn)
        self.owner.conn.openChannel(channel, tunnels.encode(self.service, self.session_id))

    def stop(self) -> None:
        if self.refused:
            log.info("session {id} of {user}: the {service} tunnel closed; it refused {summary}", id=self.session_id,
                     user=self.user, service=self.service,
                     summary=", ".join(f"{count} connection(s) from {who}" for who, count in self.refused.items()))
        self.port.stopListening()


#: The services whose tunnel is a Unix socket: the session's cupsd reaches
#: it (CUPS's ipp backend takes ``ipp://%2Fpath...``), and the kernel says
#: who connected.  Folders stay on loopback TCP: libsmbclient (smbnetfs)
#: connects to nothing else.
UNIX_SOCKET_SERVICES = frozenset({"printing"})


class ServiceTunnels:
    """The tunnels one NX shell channel asked for; they go with it.

    ``authorize(service, session_id)`` checks the caller (the NX login of
    that shell channel) and returns ``(user, uid)`` or raises with a reason
    for the log; ``blocking`` runs a function in a thread; the Unix sockets
    go into ``socket_directory`` (root's, 0711: the users reach a socket
    whose name they are told, and list none)."""

    def __init__(self, reactor: Any, conn: Any, authorize: Callable[[str, str], Awaitable[tuple[str, int]]],
                 blocking: Callable[..., defer.Deferred[Any]], socket_directory: str,
                 registry: tunnels.TunnelRegistry = tunnels.REGISTRY) -> None:
        self.reactor = reactor
        self.conn = conn
        self.authorize = authorize
        self.blocking = blocking
        self.socket_directory = socket_directory
        self.registry = registry
        self.listeners: dict[tuple[str, str], _Listener] = {}
        self.closed = False

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
        address: tunnels.Address
        try:
            if listener.unix:
                address = os.path.join(self.socket_directory, f"{service}-{secrets.token_hex(8)}")
                # The directory is root's: nobody can swap the path between the bind and the chmod.
                listener.port = self.reactor.listenUNIX(address, listener, mode=0o666, wantPID=False)
                where = f"at {address}"
            else:
                listener.port = self.reactor.listenTCP(0, listener, interface="127.0.0.1")
                address = listener.port.getHost().port
                where = f"on 127.0.0.1:{address}"
        except CannotListenError as problem:
            log.error("session {id} of {user}: no {service} tunnel: cannot listen ({problem})", id=session_id,
                      user=user, service=service, problem=str(problem))
            return 0
        listener.tunnel = tunnels.Tunnel(session_id, user, service, address, listener)
        self.listeners[key] = listener
        self.registry.add(listener.tunnel)
        log.info("session {id} of {user}: {service} through its own SSH channel (tunnel {where})",
                 id=session_id, user=user, service=service, where=where)
        return 1

    def close(self) -> None:
        """The shell channel went: no more connections through it."""
        self.closed = True
        for listener in self.listeners.values():
            if listener.tunnel is not None:
                self.registry.remove(listener.tunnel)
            listener.stop()
        self.listeners.clear()
