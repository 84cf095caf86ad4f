"""The pure parts of the service tunnels (issue 25, nxgate.wire.tunnel_registry) and the
tunnel channel's flow control, with fakes; the real thing is tested end to
end in tests.test_e2e_sharing and tests.test_e2e_printing (nxgate-client)."""

from __future__ import annotations

from types import SimpleNamespace

from twisted.trial.unittest import TestCase

from nxgate.wire import tunnel_registry as tunnels
from nxgate.protocols import printgate
from nxgate.wire.service_tunnels import WINDOW, TunnelChannel

SID = "0123456789ABCDEF0123456789ABCDEF"
TABLE = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 11 1 0 100 0 0 10 0
   1: 0100007F:D431 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1042        0 12 1 0 20 4 30 10 -1
   2: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 13 1 0 20 4 30 10 -1
"""


class Codec(TestCase):
    def test_a_request_round_trips_and_the_id_is_upper_case(self) -> None:
        self.assertEqual(tunnels.decode(tunnels.encode("sharing", SID.lower())), ("sharing", SID))

    def test_bad_payloads_are_refused_with_a_reason(self) -> None:
        for bad in (b"", tunnels.encode("sound", SID), tunnels.encode("sharing", "x" * 32),
                    tunnels.encode("sharing", SID)[:-1], tunnels.encode("sharing", SID) + b"!",
                    b"\x00\x00\x10\x00" + b"a" * 4096):
            self.assertRaises(tunnels.TunnelRequestError, tunnels.decode, bad)


class PeerUid(TestCase):
    def test_the_connecting_sockets_owner_is_found(self) -> None:
        # 127.0.0.1:54321 (uid 1042) connected to our listener's accepted end at 127.0.0.1:8080.
        self.assertEqual(tunnels.peer_uid(TABLE, ("127.0.0.1", 54321), ("127.0.0.1", 8080)), 1042)

    def test_our_own_end_or_an_unknown_peer_is_not_taken_for_it(self) -> None:
        self.assertEqual(tunnels.peer_uid(TABLE, ("127.0.0.1", 8080), ("127.0.0.1", 54321)), 0)
        self.assertIsNone(tunnels.peer_uid(TABLE, ("127.0.0.1", 54322), ("127.0.0.1", 8080)))
        self.assertIsNone(tunnels.peer_uid("garbage\nmore garbage", ("127.0.0.1", 1), ("127.0.0.1", 2)))

    def test_ipv6_addresses_are_written_as_the_kernel_does(self) -> None:
        self.assertEqual(tunnels._proc_address("::1", 80), "00000000000000000000000001000000:0050")


class Registry(TestCase):
    def test_a_tunnel_serves_its_own_user_only_and_only_its_owner_removes_it(self) -> None:
        registry = tunnels.TunnelRegistry()
        first = tunnels.Tunnel(SID, "alice", "sharing", 40001, object())
        registry.add(first)
        self.assertEqual(registry.port(SID, "alice", "sharing"), 40001)
        self.assertIsNone(registry.port(SID, "bob", "sharing"))
        self.assertIsNone(registry.port(SID, "alice", "printing"))
        second = tunnels.Tunnel(SID, "alice", "sharing", 40002, object())  # a resume from another connection
        registry.add(second)
        registry.remove(first)  # the old connection goes: the new tunnel stays
        self.assertEqual(registry.port(SID, "alice", "sharing"), 40002)
        registry.remove(second)
        self.assertIsNone(registry.port(SID, "alice", "sharing"))


class FakeConnection:
    def __init__(self) -> None:
        self.adjusted: list[int] = []

    def adjustWindow(self, channel, amount: int) -> None:
        self.adjusted.append(amount)
        channel.localWindowLeft += amount


class FlowControl(TestCase):
    def test_a_full_socket_holds_the_window_until_it_drained(self) -> None:
        conn = FakeConnection()
        channel = TunnelChannel(conn=conn)
        written: list[bytes] = []
        channel.socket = SimpleNamespace(transport=SimpleNamespace(write=written.append))
        channel.pauseProducing()  # the socket's buffer is full
        channel.localWindowLeft = 100  # the peer used nearly all of it
        # Conch grants more only while localWindowLeft < localWindowSize // 2: never while paused.
        self.assertFalse(channel.localWindowLeft < channel.localWindowSize // 2)
        channel.dataReceived(b"x")
        self.assertEqual(written, [b"x"])
        channel.resumeProducing()
        self.assertEqual(conn.adjusted, [WINDOW - 100])
        self.assertEqual(channel.localWindowSize, WINDOW)


class Gate(TestCase):
    def test_the_tunnels_gate_needs_no_credential_but_still_strips_it(self) -> None:
        request = b"POST /printers/p HTTP/1.1\r\nHost: x\r\nAuthorization: Basic bm9wZQ==\r\nContent-Length: 0\r\n\r\n"
        refused = printgate.Gate("c" * 32).feed(request)
        self.assertTrue(refused.to_client.startswith(b"HTTP/1.1 401"))
        through = printgate.Gate("c" * 32, credential_required=False).feed(request)
        self.assertEqual(through.to_client, b"")
        self.assertNotIn(b"Authorization", through.to_server)
        self.assertIn(b"Host: localhost\r\n", through.to_server)
