"""The raw NX stream after ``bye``: SSH channel <-> the session's agent.

From ``NX> 999 Bye.`` on, the channel carries only the client proxy's bytes;
they go to the agent and back, byte for byte.  Neither side can make the
gateway buffer without bound: when the client's SSH window is full the
agent connection is paused (the channel tells us), and when the agent reads
slower than the client sends, the client's input is paused.
Either side closing closes the other.

The agent's end comes from the node interface's ``open_stream`` (the
router's: the session's node checks the owner and connects): this
machine's agent socket, or a TLS stream to the member that runs the
session.  The relay does not know which, and needs not.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from twisted.internet import defer, protocol
from twisted.internet.interfaces import IPushProducer
from twisted.logger import Logger, LogLevel
from twisted.python.failure import Failure

from nxgate.wire.splice import Splice, TransportEnd
from nxgate import metrics
from nxgate.vocabulary.caller import Caller
from nxgate.vocabulary.errors import SessionError
from nxgate.vocabulary.streams import AGENT, Stream, StreamKind

log = Logger()

#: ``open_stream`` of the node interface (the router's, for a door).
OpenStream = Callable[[Caller, str, StreamKind], Awaitable[Stream]]


class ByteTransport(Protocol):
    """Where the conversation's bytes go."""

    def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...


class ClientStream(ByteTransport, Protocol):
    """The client's end of the stream (an SSH session channel)."""

    def pause_input(self) -> None: ...

    def resume_input(self) -> None: ...


class _ClientEnd:
    """The client's channel as one end of the splice (:mod:`nxgate.wire.splice`).

    Its send buffer is the client's SSH window: the channel says when it is
    full (:meth:`StreamRelay.pause_agent`), and the splice's producer for it
    (the agent's reading) is paused then."""

    def __init__(self, client: ClientStream) -> None:
        self.client = client
        self.producer: IPushProducer | None = None

    def write(self, data: bytes) -> None:
        self.client.write(data)

    def pause_reading(self) -> None:
        self.client.pause_input()

    def resume_reading(self) -> None:
        self.client.resume_input()

    def hold(self, producer: IPushProducer) -> None:
        self.producer = producer

    def write_eof(self) -> bool:
        return False

    def close(self) -> None:
        self.client.resume_input()  # the client's goodbye must still be read
        self.client.close()


class _AgentSide(protocol.Protocol):
    def __init__(self, relay: StreamRelay) -> None:
        self.relay = relay

    def connectionMade(self) -> None:
        self.relay.connected(self.transport)

    def dataReceived(self, data: bytes) -> None:
        self.relay.to_client += len(data)
        metrics.relayed_down(len(data))
        if self.relay.splice is not None:
            self.relay.splice.received("agent", data)

    def connectionLost(self, reason: Any) -> None:
        self.relay.agent_closed()


class StreamRelay:
    """One client's stream to its session's agent (``open_stream`` gives the agent's end)."""

    def __init__(self, client: Caller, session_id: str, channel: ClientStream, leftover: bytes,
                 open_stream: OpenStream, kind: StreamKind = AGENT) -> None:
        self.client = client
        self.session_id = session_id
        self.channel = channel
        self.pending = [leftover] if leftover else []
        self.agent: Any = None
        self.client_end = _ClientEnd(channel)
        self.splice: Splice | None = None
        self.closed = False
        self.input_ended = False  # the client sent EOF: the agent is told once connected
        self.to_agent = len(leftover)
        self.to_client = 0
        channel.pause_input()  # nothing piles up before the agent is connected
        log.debug("relaying {user}'s stream from {address} to session {id}", user=client.user,
                 address=client.address, id=session_id)
        self.stream: Stream | None = None
        opened = defer.ensureDeferred(open_stream(client, session_id, kind))  # type: ignore[arg-type]
        opened.addCallbacks(self._opened, self._not_opened)

    def _opened(self, stream: Stream) -> None:
        if self.closed:  # the client left while the node opened the stream
            stream.close()
            return
        self.stream = stream
        stream.attach(_AgentSide(self))

    def _not_opened(self, failure: Failure) -> None:
        if failure.check(SessionError):
            self._failed(failure.value.message)
            return
        log.failure("opening the stream of session {id} failed", failure, id=self.session_id)
        self._failed("internal error (see the log)")

    def connected(self, transport: Any) -> None:
        if self.closed:
            transport.loseConnection()
            return
        self.agent = transport
        for chunk in self.pending:
            transport.write(chunk)
        self.pending.clear()
        self.splice = Splice(self.client_end, TransportEnd(transport), names=("client", "agent"))
        self.channel.resume_input()
        if self.input_ended:
            self._end_agent_input()

    def _failed(self, error: str) -> None:
        log.warn("cannot reach the agent of session {id}: {error}", id=self.session_id, error=error)
        self.agent_closed()

    # client side -------------------------------------------------------
    def write(self, data: bytes) -> None:
        self.to_agent += len(data)
        metrics.relayed_up(len(data))
        if self.splice is not None:
            self.splice.received("client", data)
        elif not self.closed:
            self.pending.append(data)

    def end_of_input(self) -> None:
        """The client will send no more (its channel's EOF: an OpenSSH-style
        client whose nxproxy closed, which then waits for us to close).

        The agent is told with a half-close, as nxcopy does in the OpenSSH
        mode: nxagent waits for its peer to close before it says suspended
        or terminated, and without the EOF it waited out its own 10-second
        limit.  It then closes its end, which closes the channel
        (:meth:`agent_closed`); what it still writes reaches the client."""
        if self.closed or self.input_ended:
            return
        self.input_ended = True
        if self.agent is not None:
            self._end_agent_input()

    def _end_agent_input(self) -> None:
        half_close = getattr(self.agent, "loseWriteConnection", None)
        if half_close is not None:
            half_close()
        else:  # a stream without half-close (another member's): end it all
            self.agent.loseConnection()

    def close(self) -> None:
        """The client went away."""
        if self.closed:
            return
        self.closed = True
        if self.splice is not None:
            self.splice.lost("client")
        self._log_end("client")

    def pause_agent(self) -> None:
        """The client's SSH window is full."""
        if self.client_end.producer is not None:
            self.client_end.producer.pauseProducing()

    def resume_agent(self) -> None:
        if self.client_end.producer is not None:
            self.client_end.producer.resumeProducing()

    # agent side --------------------------------------------------------
    def agent_closed(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.splice is not None:
            self.splice.lost("agent")
        else:
            self.client_end.close()
        self._log_end("agent")

    def _log_end(self, side: str) -> None:
        # A client leaving is its connection's line; the agent dropping the client is worth one of its own.
        log.emit(LogLevel.info if side == "agent" else LogLevel.debug,
                 "stream of session {id} closed by the {side} ({up} bytes up, {down} down)",
                 id=self.session_id, side=side, up=self.to_agent, down=self.to_client)
