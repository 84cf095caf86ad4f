"""nxgate-client's service tunnels: their words on the wire (nxgate.protocols.service_tunnel), the reverse
channel's flow control with fakes (nxgate.streams.reverse_channel), and the gate the client's print
tunnel passes; the listeners' admission is tested in tests.test_local_peers and tests.test_reverse_streams,
the whole thing end to end in tests.test_e2e_sharing, tests.test_e2e_printing (nxgate-client) and
tests.test_e2e_attacks_node (another user's connect-send-close flood)."""

from __future__ import annotations

from types import SimpleNamespace

from twisted.trial.unittest import TestCase

from nxgate.protocols import printgate
from nxgate.protocols import service_tunnel as tunnels
from nxgate.streams.reverse_channel import WINDOW, ChannelEnd, SplicedChannel

SID = "0123456789ABCDEF0123456789ABCDEF"
class Codec(TestCase):
    def test_a_request_round_trips_and_the_id_is_upper_case(self) -> None:
        self.assertEqual(tunnels.decode(tunnels.encode("sharing", SID.lower())), ("sharing", SID))

    def test_bad_payloads_are_refused_with_a_reason(self) -> None:
        for bad in (b"", tunnels.encode("sound", SID), tunnels.encode("sharing", "x" * 32),
                    tunnels.encode("sharing", SID)[:-1], tunnels.encode("sharing", SID) + b"!",
                    b"\x00\x00\x10\x00" + b"a" * 4096):
            self.assertRaises(tunnels.TunnelRequestError, tunnels.decode, bad)


class FakeConnection:
    def __init__(self) -> None:
        self.adjusted: list[int] = []

    def adjustWindow(self, channel, amount: int) -> None:
        self.adjusted.append(amount)
        channel.localWindowLeft += amount


class FlowControl(TestCase):
    def test_a_full_stream_holds_the_window_until_it_drained(self) -> None:
        conn = FakeConnection()
        channel = SplicedChannel(conn=conn)
        end = ChannelEnd(channel)
        end.pause_reading()  # the stream's buffer is full
        channel.localWindowLeft = 100  # the peer used nearly all of it
        # Conch grants more only while localWindowLeft < localWindowSize // 2: never while paused.
        self.assertFalse(channel.localWindowLeft < channel.localWindowSize // 2)
        end.resume_reading()
        self.assertEqual(conn.adjusted, [WINDOW - 100])
        self.assertEqual(channel.localWindowSize, WINDOW)

    def test_a_full_client_window_pauses_the_streams_reading(self) -> None:
        channel = SplicedChannel(conn=FakeConnection())
        written: list[bytes] = []
        paused: list[str] = []
        far = SimpleNamespace(write=written.append, pauseProducing=lambda: paused.append("pause"),
                              resumeProducing=lambda: paused.append("resume"), registerProducer=lambda p, s: None,
                              bufferSize=0)
        channel.far_connected(far)
        channel.stopWriting()
        channel.startWriting()
        self.assertEqual(paused, ["pause", "resume"])
        channel.dataReceived(b"x")
        self.assertEqual(written, [b"x"])


class BulkReady(TestCase):
    def test_a_channel_opening_reads_the_ssh_socket_in_whole_packets_and_keeps_freed_memory(self) -> None:
        """The SSH connection's TCP transport (under the gateway's plain
        wrapper) reads up to SSH_READ at a time once a reverse channel opens,
        and malloc keeps the memory of its reads (glibc: Debian's)."""
        import socket

        from twisted.internet import protocol, reactor
        from twisted.protocols.policies import ProtocolWrapper, WrappingFactory

        from nxgate.streams.reverse_channel import SSH_READ
        from nxgate.wire import heap

        ours, theirs = socket.socketpair()
        self.addCleanup(theirs.close)
        kept = protocol.Protocol()
        reactor.adoptStreamConnection(ours.fileno(), socket.AF_UNIX, protocol.Factory.forProtocol(lambda: kept))
        ours.close()
        self.addCleanup(kept.transport.loseConnection)
        wrapper = ProtocolWrapper(WrappingFactory(protocol.Factory.forProtocol(protocol.Protocol)), protocol.Protocol())
        wrapper.makeConnection(kept.transport)
        channel = SplicedChannel(conn=SimpleNamespace(transport=SimpleNamespace(transport=wrapper)))
        self.assertLess(kept.transport.bufferSize, SSH_READ)
        channel._ready_for_bulk()
        self.assertEqual(kept.transport.bufferSize, SSH_READ)
        self.assertEqual(heap._applied, [True])
        self.assertTrue(heap.keep_freed_memory())  # once


class Gate(TestCase):
    def test_the_tunnels_gate_needs_no_credential_but_still_strips_it(self) -> None:
        request = b"POST /printers/p HTTP/1.1\r\nHost: x\r\nAuthorization: Basic bm9wZQ==\r\nContent-Length: 0\r\n\r\n"
        refused = printgate.Gate("c" * 32).feed(request)
        self.assertTrue(refused.to_client.startswith(b"HTTP/1.1 401"))
        through = printgate.Gate("c" * 32, credential_required=False).feed(request)
        self.assertEqual(through.to_client, b"")
        self.assertNotIn(b"Authorization", through.to_server)
        self.assertIn(b"Host: localhost\r\n", through.to_server)
