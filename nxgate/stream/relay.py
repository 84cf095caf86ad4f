"""The raw NX stream after ``bye``: SSH channel <-> the agent's Unix socket.

From ``NX> 999 Bye.`` on, the channel carries only the client proxy's bytes;
they go to the agent's socket (:mod:`nxgate.stream.agentsocket`) and back, byte for
byte.  Neither side can make the gateway buffer without bound: when the
client's SSH window is full the agent connection is paused (the channel
tells us), and when the agent reads slower than the client sends, the
client's input is paused.
Either side closing closes the other.

A session on another cluster member (``target.node`` set) is reached the
same way through ``streams`` (:class:`nxgate.cluster.stream.RemoteStreams`):
a TLS connection to that member instead of the local socket; everything
else here is the same.
"""

from __future__ import annotations

import socket
from typing import Any, Protocol

from twisted.internet import protocol
from twisted.internet.interfaces import IPushProducer
from twisted.logger import Logger
from zope.interface import implementer

from nxgate.stream import agentsocket
from nxgate import metrics
from nxgate.doors.conversation import ByteTransport
from nxgate.sessions.caller import Caller

log = Logger(namespace="nxgate.relay")


class ClientStream(ByteTransport, Protocol):
    """The client's end of the stream (an SSH session channel)."""

    def pause_input(self) -> None: ...

    def resume_input(self) -> None: ...


@implementer(IPushProducer)
class _ClientInput:
    """The client's input as seen by the agent connection: Twisted pauses it
    when that connection's send buffer is full, resumes it once drained, and
    stops it when the connection is gone (the client is never left paused)."""

    def __init__(self, client: ClientStream) -> None:
        self.client = client

    def pauseProducing(self) -> None:
        self.client.pause_input()

    def resumeProducing(self) -> None:
        self.client.resume_input()

    def stopProducing(self) -> None:
        self.client.resume_input()


class _AgentSide(protocol.Protocol):
    def __init__(self, relay: StreamRelay) -> None:
        self.relay = relay

    def connectionMade(self) -> None:
        self.relay.connected(self.transport)

    def dataReceived(self, data: bytes) -> None:
        self.relay.to_client += len(data)
        metrics.relayed_down(len(data))
        self.relay.channel.write(data)

    def connectionLost(self, reason: Any) -> None:
        self.relay.agent_closed()


class StreamRelay:
    """One client's stream to its session's agent."""

    #: What may wait for the agent before the client is held back: Twisted's
    #: 64 KiB default paused and resumed the client thousands of times a
    #: second during a bulk upload.
    AGENT_BUFFER = 1024 * 1024

    def __init__(self, reactor: Any, client: Caller, target: Any, channel: ClientStream, leftover: bytes,
                 streams: Any = None) -> None:
        self.client = client
        self.target = target
        self.channel = channel
        self.pending = [leftover] if leftover else []
        self.agent: Any = None
        self.closed = False
        self.input_ended = False  # the client sent EOF: the agent is told once connected
        self.to_agent = len(leftover)
        self.to_client = 0
        channel.pause_input()  # nothing piles up before the agent is connected
        log.info("relaying {user}'s stream from {address} to session {id}", user=client.user,
                 address=client.address, id=target.session_id)
        self.reactor = reactor
        if getattr(target, "node", ""):
            if streams is None:
                reactor.callLater(0, self._failed, f"the session runs on member {target.node}, and this gateway"
                                                   " is not a cluster member")
            else:
                streams.connect(target, _AgentSide(self), self._failed)
        else:
            agentsocket.connect_soon(reactor, target.path, target.uid, self._reached)

    def _reached(self, sock: socket.socket | None, error: str) -> None:
        if sock is None:
            self._failed(error)
            return
        if self.closed:  # the client left while the agent was not listening yet
            sock.close()
            return
        try:
            factory = protocol.Factory.forProtocol(lambda: _AgentSide(self))
            self.reactor.adoptStreamConnection(sock.fileno(), socket.AF_UNIX, factory)
        finally:
            sock.close()  # the reactor holds its own copy of the descriptor

    def connected(self, transport: Any) -> None:
        if self.closed:
            transport.loseConnection()
            return
        self.agent = transport
        for chunk in self.pending:
            transport.write(chunk)
        self.pending.clear()
        transport.bufferSize = self.AGENT_BUFFER
        transport.registerProducer(_ClientInput(self.channel), True)
        self.channel.resume_input()
        if self.input_ended:
            self._end_agent_input()

    def _failed(self, error: str) -> None:
        log.warn("cannot reach the agent of session {id}: {error}", id=self.target.session_id, error=error)
        self.agent_closed()

    # client side -------------------------------------------------------
    def write(self, data: bytes) -> None:
        self.to_agent += len(data)
        metrics.relayed_up(len(data))
        if self.agent is not None:
            self.agent.write(data)
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
        if self.agent is not None:
            self.agent.loseConnection()
        self._log_end("client")

    def pause_agent(self) -> None:
        if self.agent is not None:
            self.agent.pauseProducing()

    def resume_agent(self) -> None:
        if self.agent is not None:
            self.agent.resumeProducing()

    # agent side --------------------------------------------------------
    def agent_closed(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.channel.resume_input()  # the client's goodbye must still be read
        self.channel.close()
        self._log_end("agent")

    def _log_end(self, side: str) -> None:
        log.info("stream of session {id} closed by the {side} ({up} bytes up, {down} down)",
                 id=self.target.session_id, side=side, up=self.to_agent, down=self.to_client)
