"""The relay's flow control, with a fake client channel and agent connection;
tests/test_e2e_sessions.py RelayTests floods a real one."""

from __future__ import annotations

import socket

from twisted.internet.testing import StringTransport
from twisted.internet import defer, task, threads
from twisted.trial.unittest import SynchronousTestCase, TestCase

from nxgate.wire.agentsocket import SocketStream
from nxgate.wire.relay import StreamRelay
from nxgate.vocabulary.caller import Caller
from nxgate.vocabulary.streams import AGENT
from tests.harness.clock import FakeReactor


class Opener:
    """``open_stream`` whose answer the test gives (by hand)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.answer: defer.Deferred = defer.Deferred()

    def __call__(self, caller, session_id, kind):
        self.calls.append((caller, session_id, kind))
        return self.answer


class FakeChannel:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.paused = False
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def close(self) -> None:
        self.closed = True

    def pause_input(self) -> None:
        self.paused = True

    def resume_input(self) -> None:
        self.paused = False


class AgentConnection(StringTransport):
    def setTcpNoDelay(self, enabled: bool) -> None:
        self.no_delay = enabled


class FlowControlTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.channel = FakeChannel()
        # The stream never opens: the test connects the relay by hand.
        self.opener = Opener()
        self.relay = StreamRelay(Caller("alice", address="192.0.2.1"), "S" * 32, self.channel, b"early", self.opener)
        self.agent = AgentConnection()

    def test_the_relay_asks_the_node_interface_for_the_agents_stream(self) -> None:
        self.assertEqual(self.opener.calls, [(Caller("alice", address="192.0.2.1"), "S" * 32, AGENT)])

    def test_client_input_waits_for_the_agent_connection(self) -> None:
        self.assertTrue(self.channel.paused)
        self.relay.write(b" bytes")
        self.relay.connected(self.agent)
        self.assertFalse(self.channel.paused)
        self.assertEqual(self.agent.value(), b"early bytes")

    def test_a_full_agent_connection_pauses_the_client(self) -> None:
        self.relay.connected(self.agent)
        self.assertTrue(self.agent.streaming)
        self.agent.producer.pauseProducing()  # what Twisted does when its send buffer is full
        self.assertTrue(self.channel.paused)
        self.agent.producer.resumeProducing()
        self.assertFalse(self.channel.paused)

    def test_the_client_is_never_left_paused(self) -> None:
        self.relay.connected(self.agent)
        self.agent.producer.pauseProducing()
        self.relay.agent_closed()
        self.assertFalse(self.channel.paused)
        self.assertTrue(self.channel.closed)

    def test_a_client_that_left_before_the_agent_listened_gets_no_connection(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX)
        self.addCleanup(theirs.close)
        self.relay.close()
        self.opener.answer.callback(SocketStream(FakeReactor(), ours, "S" * 32, AGENT))
        self.assertEqual(ours.fileno(), -1)  # closed, not adopted
        self.assertEqual(theirs.recv(1), b"")

    def test_a_refusal_closes_the_client(self) -> None:
        from nxgate.vocabulary.errors import Kind, SessionError

        self.opener.answer.errback(SessionError(Kind.NOT_YOURS, "Could not find session " + "S" * 32 + "."))
        self.assertTrue(self.channel.closed)
        self.assertFalse(self.channel.paused)


class EndOfInputTests(SynchronousTestCase):
    """The client's EOF reaches the agent as a half-close: nxagent waits for
    its peer to close before it says suspended or terminated (its own 10 s
    when the EOF never came).  Real sockets: RealAgentEndOfInputTests."""

    def setUp(self) -> None:
        self.channel = FakeChannel()
        self.relay = StreamRelay(Caller("alice", address="192.0.2.1"), "S" * 32, self.channel, b"", Opener())

    def test_the_agent_connection_is_half_closed(self) -> None:
        agent = AgentConnection()
        agent.loseWriteConnection = lambda: setattr(agent, "half_closed", True)
        self.relay.connected(agent)
        self.relay.end_of_input()
        self.assertTrue(getattr(agent, "half_closed", False))
        self.assertFalse(agent.disconnecting)  # what the agent still says reaches the client
        self.assertFalse(self.channel.closed)

    def test_an_eof_before_the_agent_answered_is_passed_on_once_connected(self) -> None:
        agent = AgentConnection()
        agent.loseWriteConnection = lambda: setattr(agent, "half_closed", True)
        self.relay.end_of_input()
        self.relay.connected(agent)
        self.assertTrue(getattr(agent, "half_closed", False))

    def test_a_stream_without_half_close_is_ended(self) -> None:
        class Whole(AgentConnection):
            loseWriteConnection = None

        agent = Whole()
        self.relay.connected(agent)
        self.relay.end_of_input()
        self.assertTrue(agent.disconnecting)


class RealAgentEndOfInputTests(TestCase):
    """The same over a real Unix socket and the real reactor."""

    @defer.inlineCallbacks
    def test_the_agent_reads_the_last_bytes_then_eof_and_may_still_answer(self):
        from twisted.internet import reactor

        channel = FakeChannel()
        ours, theirs = socket.socketpair(socket.AF_UNIX)
        self.addCleanup(ours.close)
        opener = Opener()
        relay = StreamRelay(Caller("alice", address="192.0.2.1"), "S" * 32, channel, b"", opener)
        opener.answer.callback(SocketStream(reactor, theirs, "S" * 32, AGENT))
        relay.write(b"last words")
        relay.end_of_input()
        received = yield threads.deferToThread(read_to_eof, ours)
        self.assertEqual(received, b"last words")  # and then EOF
        self.assertFalse(channel.closed)
        ours.sendall(b"bye")
        ours.close()  # the agent ends its side: the channel closes
        for _ in range(100):
            if channel.closed:
                break
            yield task.deferLater(reactor, 0.01, lambda: None)
        self.assertEqual((b"".join(channel.written), channel.closed), (b"bye", True))


def read_to_eof(sock: socket.socket) -> bytes:
    sock.settimeout(30)
    received = b""
    while chunk := sock.recv(100):
        received += chunk
    return received
