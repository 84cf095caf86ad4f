"""The SSH channel that carries one reverse stream to the client, at both ends.

The gateway opens it on the client's SSH connection for each connection a
route announced (:mod:`nxgate.streams.reverse_route`): X2Go's clients get
``forwarded-tcpip`` (the port they asked to forward), ``nxgate-client`` gets
``service-connection@nxgate`` (the service and the session).  When the
client accepts it, the session's stream is attached and the two are
spliced (:class:`nxgate.wire.splice.Splice`, the one splice): until then
nothing of the stream is read, so what the session's program sent waits in
the kernel; if the client refuses, the stream is closed.

Flow control is per channel (:class:`ChannelEnd`): the SSH connection
carries the session's picture too, so a slow session-side reader must not
pause the whole connection.  When the stream cannot take more, the channel
stops granting window (the client then waits); when the client's window is
full, the stream stops being read.

:class:`SplicedChannel` is the channel with its splice; the gateway's end
(:class:`ReverseChannel`) attaches the session's stream, ``nxgate-client``'s
end (:class:`TargetChannel`) connects to its print gate or private Samba on
its own loopback.
"""

from __future__ import annotations

from typing import Any

from twisted.conch.ssh.channel import SSHChannel
from twisted.internet import protocol
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.interfaces import IHalfCloseableProtocol, IPushProducer
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from nxgate.vocabulary.streams import Stream
from nxgate.wire.heap import keep_freed_memory
from nxgate.wire.splice import Splice, TransportEnd
from nxgate.wire.tcp import no_delay, send_now, socket_transport

log = Logger()

#: Window of a reverse channel: a bulk copy (a folder) must not wait a round trip per window.
WINDOW = 2 * 1024 * 1024
#: Packets that hold a whole SMB read or write (128 KiB and its header), so that
#: each reaches the far end in one piece.
MAX_PACKET = 256 * 1024
#: What one read of the SSH connection's socket may bring: a whole packet at once.
SSH_READ = 512 * 1024
#: Reverse channels one SSH connection carries at once (a session's sound streams, print jobs, folder
#: connections): each holds a descriptor of the gateway, and the session's programs make them.
MAX_PER_CONNECTION = 32


class _FarEnd(TransportEnd):
    """The far side's transport as an end: what the channel brings goes to its socket at once."""

    def write(self, data: bytes) -> None:
        send_now(self.transport, data)


class ChannelEnd:
    """An SSH channel as an end of a :class:`~nxgate.wire.splice.Splice`."""

    def __init__(self, channel: SplicedChannel) -> None:
        self.channel = channel
        self.window = channel.localWindowSize
        self.producer: IPushProducer | None = None

    def write(self, data: bytes) -> None:
        self.channel.write(data)

    def pause_reading(self) -> None:
        """Grant the client no more window (Conch adjusts it only when less than half is left)."""
        self.channel.localWindowSize = 0

    def resume_reading(self) -> None:
        channel = self.channel
        channel.localWindowSize = self.window
        if channel.localWindowLeft < self.window // 2 and not channel.closing:
            channel.conn.adjustWindow(channel, self.window - channel.localWindowLeft)

    def hold(self, producer: IPushProducer) -> None:
        self.producer = producer

    def write_eof(self) -> bool:
        if not self.channel.closing:
            self.channel.conn.sendEOF(self.channel)
        return True

    def close(self) -> None:
        self.channel.loseConnection()


@implementer(IHalfCloseableProtocol)
class _FarSide(protocol.Protocol):
    """The channel's other end (the session's stream, or the client's local service), once connected."""

    def __init__(self, channel: SplicedChannel) -> None:
        self.channel = channel

    def connectionMade(self) -> None:
        self.channel.far_connected(self.transport)

    def dataReceived(self, data: bytes) -> None:
        if self.channel.splice is not None:
            self.channel.splice.received("session", data)

    def readConnectionLost(self) -> None:
        if self.channel.splice is not None:
            self.channel.splice.eof("session")

    def writeConnectionLost(self) -> None:
        pass

    def connectionLost(self, reason: Any = protocol.connectionDone) -> None:
        if self.channel.splice is not None:
            self.channel.splice.lost("session")


class SplicedChannel(SSHChannel):
    """An SSH channel spliced to one byte stream (see the module's docstring):
    a subclass connects the far end with :meth:`far_side` as its protocol.

    Its bytes take the transport's lean path when it has one
    (:meth:`nxgate.wire.ssh_etm.EtmTransport.send_channel_data`, and views
    of received packets: ``takes_views``)."""

    takes_views = True

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("localWindow", WINDOW)
        kwargs.setdefault("localMaxPacket", MAX_PACKET)
        super().__init__(**kwargs)
        self.splice: Splice | None = None
        self.pending: list[bytes] = []  # from the peer before the far end is connected
        self.pending_eof = False

    def _ready_for_bulk(self) -> None:
        """Let the SSH connection's socket be read in pieces that hold a whole
        packet (Twisted reads 64 KiB at a time: a 256 KiB packet took four
        turns of the reactor and as many copies of the growing buffer before
        it could be opened), and this process's ``malloc`` keep the memory
        of those reads and packets (:func:`nxgate.wire.heap.keep_freed_memory`)."""
        keep_freed_memory()
        below = socket_transport(self.conn.transport.transport)
        if below is not None and below.bufferSize < SSH_READ:
            below.bufferSize = SSH_READ

    def far_side(self) -> _FarSide:
        return _FarSide(self)

    def far_connected(self, transport: Any) -> None:
        no_delay(transport)  # SMB and IPP are request and answer: no Nagle wait (nothing on a Unix socket)
        end = ChannelEnd(self)
        self.splice = Splice(end, _FarEnd(transport), names=("client", "session"))
        for data in self.pending:
            self.splice.received("client", data)
        self.pending = []
        if self.pending_eof:
            self.splice.eof("client")

    def far_failed(self) -> None:
        """The far end could not be connected (or is gone before it was)."""
        self.loseConnection()

    def write(self, data: bytes) -> None:
        """Conch's ``SSHChannel.write`` when the window is short or the
        transport has no lean path; else each packet's share goes out as a view."""
        send = getattr(self.conn.transport, "send_channel_data", None)
        if send is None or self.buf or len(data) > self.remoteWindowLeft or self.localClosed:
            super().write(data)
            return
        view, step = memoryview(data), self.remoteMaxPacket
        recipient = self.conn.channelsToRemoteChannel[self]
        for offset in range(0, len(data), step):
            send(recipient, view[offset:offset + step])
        self.remoteWindowLeft -= len(data)
        if self.closing:
            self.loseConnection()  # Conch's: the close waited for what was buffered

    # ------------------------------------------------- from the connection
    def dataReceived(self, data: bytes | memoryview) -> None:
        if self.splice is not None:
            self.splice.received("client", data)
        else:
            self.pending.append(bytes(data))

    def eofReceived(self) -> None:
        if self.splice is not None:
            self.splice.eof("client")
        else:
            self.pending_eof = True

    def stopWriting(self) -> None:
        """The client's window is full: stop reading the session's stream."""
        producer = self.splice.ends["client"].producer if self.splice is not None else None  # type: ignore[attr-defined]
        if producer is not None:
            producer.pauseProducing()

    def startWriting(self) -> None:
        producer = self.splice.ends["client"].producer if self.splice is not None else None  # type: ignore[attr-defined]
        if producer is not None:
            producer.resumeProducing()

    def closed(self) -> None:
        if self.splice is not None:
            self.splice.lost("client")
        else:
            self.far_failed()


class ReverseChannel(SplicedChannel):
    """The gateway's channel to the client for one reverse stream.

    ``kind``: the channel type (``forwarded-tcpip``, ``service-connection@nxgate``);
    ``what``: words for the log.  It counts on its connection from its
    making to its end (:func:`send_back`)."""

    def __init__(self, stream: Stream, kind: bytes, what: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.name = kind
        self.stream = stream
        self.what = what
        self.counted = self.conn is not None
        if self.counted:
            self.conn.nxgate_reverse_channels = _carried(self.conn) + 1

    def _uncount(self) -> None:
        if self.counted:
            self.counted = False
            self.conn.nxgate_reverse_channels = _carried(self.conn) - 1

    def channelOpen(self, specificData: bytes) -> None:
        self._ready_for_bulk()
        self.stream.attach(self.far_side())

    def openFailed(self, reason: Failure) -> None:
        self._uncount()
        log.info("the client refused a channel for {what}: {reason}", what=self.what,
                 reason=reason.getErrorMessage())
        self.stream.close()

    def closed(self) -> None:
        self._uncount()
        super().closed()

    def far_failed(self) -> None:
        self.stream.close()


def _carried(conn: Any) -> int:
    return int(getattr(conn, "nxgate_reverse_channels", 0))


def send_back(conn: Any, stream: Stream, kind: bytes, what: str, data: bytes) -> bool:
    """Open a :class:`ReverseChannel` for ``stream`` on the SSH connection
    ``conn`` (``data``: the channel type's own fields), if the connection
    carries fewer than :data:`MAX_PER_CONNECTION`; else close the stream
    (its program gets an end, as when a client refuses) and say False."""
    if _carried(conn) >= MAX_PER_CONNECTION:
        stream.close()
        return False
    conn.openChannel(ReverseChannel(stream, kind, what, conn=conn), data)
    return True


class TargetChannel(SplicedChannel):
    """``nxgate-client``'s end: a channel the gateway opened for one connection
    of the session, connected to ``port`` (the print gate, the private Samba)
    on this machine's loopback."""

    def __init__(self, reactor: Any, port: int, kind: bytes, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.name = kind
        self.reactor = reactor
        self.port = port

    def channelOpen(self, specificData: bytes) -> None:
        self._ready_for_bulk()
        endpoint = TCP4ClientEndpoint(self.reactor, "127.0.0.1", self.port, timeout=10)
        connecting = endpoint.connect(protocol.Factory.forProtocol(self.far_side))
        connecting.addErrback(self._unreachable)

    def _unreachable(self, failure: Failure) -> None:
        log.warn("a connection of the session could not reach 127.0.0.1:{port}: {error}", port=self.port,
                 error=failure.getErrorMessage())
        self.loseConnection()
