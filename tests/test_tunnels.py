"""The pure parts of the service tunnels (nxgate.wire.tunnel_registry), the
tunnel channel's flow control with fakes, and the listeners' admission on
real sockets of this machine; the whole thing is tested end to end in
tests.test_e2e_sharing, tests.test_e2e_printing (nxgate-client) and
tests.test_e2e_attacks_node (another user's connect-send-close flood)."""

from __future__ import annotations

from types import SimpleNamespace

from twisted.trial.unittest import TestCase

from nxgate.wire import tunnel_registry as tunnels
from nxgate.protocols import printgate
from nxgate.wire.service_tunnels import WINDOW, TunnelChannel

SID = "0123456789ABCDEF0123456789ABCDEF"
class Codec(TestCase):
    def test_a_request_round_trips_and_the_id_is_upper_case(self) -> None:
        self.assertEqual(tunnels.decode(tunnels.encode("sharing", SID.lower())), ("sharing", SID))

    def test_bad_payloads_are_refused_with_a_reason(self) -> None:
        for bad in (b"", tunnels.encode("sound", SID), tunnels.encode("sharing", "x" * 32),
                    tunnels.encode("sharing", SID)[:-1], tunnels.encode("sharing", SID) + b"!",
                    b"\x00\x00\x10\x00" + b"a" * 4096):
            self.assertRaises(tunnels.TunnelRequestError, tunnels.decode, bad)


class Registry(TestCase):
    def test_a_tunnel_serves_its_own_user_only_and_only_its_owner_removes_it(self) -> None:
        registry = tunnels.TunnelRegistry()
        first = tunnels.Tunnel(SID, "alice", "sharing", 40001, Own())
        registry.add(first)
        self.assertEqual(registry.address(SID, "alice", "sharing"), 40001)
        self.assertIsNone(registry.address(SID, "bob", "sharing"))
        self.assertIsNone(registry.address(SID, "alice", "printing"))
        second = tunnels.Tunnel(SID, "alice", "sharing", 40002, Own())  # a resume from another connection
        registry.add(second)
        registry.remove(first)  # the old connection goes: the new tunnel stays
        self.assertEqual(registry.address(SID, "alice", "sharing"), 40002)
        registry.remove(second)
        self.assertIsNone(registry.address(SID, "alice", "sharing"))

    def test_the_gateways_own_way_in_is_the_tunnels_and_its_users_only(self) -> None:
        registry = tunnels.TunnelRegistry()
        own = Own()
        registry.add(tunnels.Tunnel(SID, "alice", "printing", "/run/t/printing-1", own))
        self.assertIsNone(registry.connect_own(SID, "bob", "printing"))
        self.assertIsNone(registry.connect_own(SID, "alice", "sharing"))
        connect = registry.connect_own(SID, "alice", "printing")
        self.assertIsNotNone(connect)
        self.assertEqual(connect(), "a socket")
        self.assertEqual(own.calls, 1)


class Own:
    def __init__(self) -> None:
        self.calls = 0

    def connect_own(self):
        self.calls += 1
        return "a socket"


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
