"""The relay's flow control, with a fake client channel and agent connection;
tests/test_e2e_sessions.py RelayTests floods a real one."""

from __future__ import annotations

import socket

from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.trial.unittest import SynchronousTestCase

from nxgate.wire.relay import StreamRelay
from nxgate.vocabulary.caller import Caller
from nxgate.vocabulary.results import StreamTarget


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
        # Nothing listens there: the test connects the relay by hand.
        self.relay = StreamRelay(MemoryReactorClock(), Caller("alice", address="192.0.2.1"),
                                StreamTarget("S" * 32, "/nonexistent/agent.sock", 1000), self.channel, b"early")
        self.agent = AgentConnection()

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
        self.relay._reached(ours, "")
        self.assertEqual(ours.fileno(), -1)  # closed, not adopted
        self.assertEqual(theirs.recv(1), b"")
