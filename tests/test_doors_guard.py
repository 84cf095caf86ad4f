"""The guard in front of the doors (nxgate.gateway.doors.guard) with Twisted's
fakes: the deadline, the authenticated hook through a wrapper in between,
refusals and their log lines.  The real gateway is tests.test_e2e_preauth."""

from __future__ import annotations

from twisted.internet import protocol
from twisted.internet.address import IPv4Address, UNIXAddress
from twisted.internet.testing import StringTransport
from twisted.logger import capturedLogs
from twisted.protocols.policies import ProtocolWrapper, WrappingFactory
from twisted.trial.unittest import TestCase

from nxgate.gateway.doors.guard import DoorGuard
from nxgate.wire.guarded import authenticated
from nxgate.gateway.doors.preauth import Limits
from tests.harness.clock import FakeReactor


class Door(protocol.Factory):
    """A door that records what it got."""

    def __init__(self) -> None:
        self.built: list[Inner] = []

    def buildProtocol(self, addr: object) -> Inner:
        inner = Inner()
        self.built.append(inner)
        return inner


class Inner(protocol.Protocol):
    def __init__(self) -> None:
        self.received = b""
        self.lost = False

    def dataReceived(self, data: bytes) -> None:
        self.received += data

    def connectionLost(self, reason: object = None) -> None:
        self.lost = True


def peer(host: str = "192.0.2.1") -> IPv4Address:
    return IPv4Address("TCP", host, 40000)


class GuardTests(TestCase):
    def setUp(self) -> None:
        self.reactor = FakeReactor()
        self.files = 20
        self.guard = DoorGuard(self.reactor, Limits(grace=30, per_address=2, penalty_grace=0, penalty_noauth=0),
                               count_files=lambda: self.files, file_limit=1024, chance=lambda: 0.99)
        self.door = Door()
        self.factory = self.guard.wrap(self.door, "SSH")

    def connect(self, host: str = "192.0.2.1", factory: object = None) -> tuple[object, StringTransport]:
        wrapper = (factory or self.factory).buildProtocol(peer(host))
        transport = StringTransport(peerAddress=peer(host))
        if wrapper is not None:
            wrapper.makeConnection(transport)
        return wrapper, transport

    def test_the_log_prefix_is_the_doors_own(self) -> None:
        # "NXSSHFactory starting on PORT" is what admins and the test harness read.
        self.assertEqual(self.factory.logPrefix(), "Door")

    def test_a_silent_connection_is_closed_at_the_deadline(self) -> None:
        _, transport = self.connect()
        self.reactor.advance(29.9)
        self.assertFalse(transport.disconnecting)
        with capturedLogs() as events:
            self.reactor.advance(0.2)
        self.assertTrue(transport.disconnecting)
        self.assertIn("closed 1 connection(s) from 192.0.2.1 (latest on the SSH door): not authenticated within 30 s"
                      " ([server] login_grace_time", " ".join(_text(event) for event in events))

    def test_an_authenticated_connection_has_no_deadline_and_stops_counting(self) -> None:
        wrapper, transport = self.connect()
        middle = ProtocolWrapper(WrappingFactory(protocol.Factory()), self.door.built[0])  # as TLS sits between
        middle.transport = wrapper
        authenticated(middle)
        self.assertEqual(self.guard.table.total, 0)
        self.reactor.advance(3600)
        self.assertFalse(transport.disconnecting)
        authenticated(StringTransport())  # no guard under it: nothing happens

    def test_the_caps_refuse_at_once_and_log_once_a_minute(self) -> None:
        self.connect()
        self.connect()
        with capturedLogs() as events:
            refused = [self.factory.buildProtocol(peer()) for _ in range(50)]
        self.assertEqual(refused, [None] * 50)  # the port closes the socket; the door never sees it
        self.assertEqual(len(self.door.built), 2)
        lines = [_text(event) for event in events if event.get("event") == "preauth_refused"]
        self.assertEqual(len(lines), 1)
        self.assertIn("refused 1 connection(s) from 192.0.2.1 (latest on the SSH door): 1 x too many "
                      "unauthenticated connections from this address ([server] max_startups_per_address", lines[0])
        self.assertIsNotNone(self.factory.buildProtocol(peer("192.0.2.2")))
        self.reactor.advance(31)  # the two taken time out: counted for the next line, not logged yet
        self.reactor.advance(30)
        with capturedLogs() as events:
            self.factory.buildProtocol(peer())  # (StringTransport does not report the aborts: still 2 held)
        text = " ".join(_text(e) for e in events)
        self.assertIn("refused 50 connection(s) from 192.0.2.1", text)
        self.assertIn("closed 2 connection(s) from 192.0.2.1 (latest on the SSH door): not authenticated", text)

    def test_inside_tls_a_refused_connection_is_a_protocol_that_closes(self) -> None:
        inside = self.guard.wrap(self.door, "HTTPS", http=True, inside_tls=True)
        self.connect(factory=inside)
        self.connect(factory=inside)
        closed, transport = self.connect(factory=inside)
        self.assertTrue(transport.disconnecting)
        self.assertEqual(len(self.door.built), 2)

    def test_http_counts_until_a_whole_request_head_even_split_across_reads(self) -> None:
        web = self.guard.wrap(self.door, "HTTPS", http=True)
        wrapper, _ = self.connect(factory=web)
        wrapper.dataReceived(b"GET / HTTP/1.1\r\nHost: x\r\n")
        self.assertEqual(self.guard.table.total, 1)
        wrapper.dataReceived(b"\r\n")
        self.assertEqual(self.guard.table.total, 0)
        self.assertEqual(self.door.built[0].received, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")

    def test_https_counts_until_the_tls_handshake_and_earns_no_penalty(self) -> None:
        from twisted.internet.interfaces import IProtocolNegotiationFactory
        from twisted.web.server import Site
        from twisted.web.resource import Resource

        site = Site(Resource(), reactor=self.reactor)
        web = self.guard.wrap(site, "HTTPS", http=True, inside_tls=True)
        # TLS offers ALPN (h2) from the factory it wraps: ours must say what the site says.
        self.assertEqual(IProtocolNegotiationFactory.providedBy(web), IProtocolNegotiationFactory.providedBy(site))
        self.guard.table.limits = Limits(grace=30, per_address=2, penalty_noauth=100, penalty_min=1)
        wrapper, _ = self.connect(factory=web)
        wrapper.handshakeCompleted()
        self.assertEqual(self.guard.table.total, 0)
        silent, _ = self.connect(factory=web)
        silent.connectionLost(None)  # a browser's preconnect given up: no penalty
        self.assertIsNotNone(web.buildProtocol(peer()))

    def test_near_the_file_limit_every_door_refuses_and_the_count_is_sampled(self) -> None:
        calls = []

        def count() -> int:
            calls.append(1)
            return self.files

        self.guard.count_files = count
        self.files = 1024 - 128
        self.reactor.advance(1)
        self.assertIsNone(self.factory.buildProtocol(peer("192.0.2.7")))
        shell = self.guard.wrap(self.door, "shell socket", counted=False)
        self.assertIsNone(shell.buildProtocol(UNIXAddress(None)))
        self.assertEqual(len(calls), 1)  # the second asked within 50 ms: the same sample
        self.files = 100
        self.reactor.advance(0.1)
        self.assertIsNotNone(shell.buildProtocol(UNIXAddress(None)))
        self.assertEqual(self.guard.table.total, 0)  # the shell socket has a deadline but no place in the table

    def test_a_member_verified_on_the_cluster_port_may_open_many_at_once(self) -> None:
        cluster = self.guard.wrap(self.door, "cluster", trusts=True)
        first, _ = self.connect("192.0.2.9", cluster)
        authenticated(first)
        opened = [cluster.buildProtocol(peer("192.0.2.9")) for _ in range(5)]  # the per-address cap is 2
        self.assertNotIn(None, opened)
        ssh_door, _ = self.connect("192.0.2.8")
        authenticated(ssh_door)  # an SSH login earns no such trust
        self.connect("192.0.2.8")
        self.connect("192.0.2.8")
        self.assertIsNone(self.factory.buildProtocol(peer("192.0.2.8")))

    def test_a_newcomer_at_a_full_door_displaces_a_silent_connection_of_the_heaviest_address(self) -> None:
        self.guard.table.limits = Limits(grace=30, per_address=3, start=4, rate=30, full=4, penalty_noauth=0)
        held = [self.connect("192.0.2.1") for _ in range(3)] + [self.connect("192.0.2.2")]
        held[1][0].dataReceived(b"SSH-2.0-")  # spoke last: not the most idle
        portal = self.guard.wrap(self.door, "HTTPS", http=True)
        self.assertIsNotNone(self.connect("192.0.2.3", portal)[0])  # another door: its own total
        with capturedLogs() as events:
            newcomer, transport = self.connect("198.51.100.7")
        self.assertIsNotNone(newcomer)
        self.assertEqual([wire.disconnecting for _, wire in held], [True, False, False, False])
        self.assertIn("closed 1 silent connection(s) from 192.0.2.1 (latest on the SSH door) to make room for"
                      " newcomers", " ".join(_text(event) for event in events))
        held[0][0].connectionLost(None)  # the abort noticed: it is not counted twice
        self.assertEqual(self.guard.table.doors["SSH"].total, 4)
        self.assertEqual(self.guard.status()["displaced"], 1)

    def test_the_door_saying_no_costs_no_place(self) -> None:
        class Closed(protocol.Factory):
            def buildProtocol(self, addr: object) -> None:
                return None

        self.assertIsNone(self.guard.wrap(Closed(), "SSH").buildProtocol(peer()))
        self.assertEqual(self.guard.table.total, 0)


def _text(event: dict) -> str:
    from twisted.logger import formatEvent

    return formatEvent(event)


class UserConnectionTests(TestCase):
    """After authentication a connection counts for its user (nxgate.gateway.doors.user_connections)."""

    def setUp(self) -> None:
        self.reactor = FakeReactor()
        self.limit = [1024]
        self.guard = DoorGuard(self.reactor, Limits(per_user=2), count_files=lambda: 20,
                               file_limit=lambda: self.limit[0])
        self.factory = self.guard.wrap(Door(), "SSH")

    def connect(self, host: str = "192.0.2.1") -> object:
        wrapper = self.factory.buildProtocol(peer(host))
        wrapper.makeConnection(StringTransport(peerAddress=peer(host)))
        return wrapper

    def test_a_user_holds_at_most_the_cap_and_a_connection_that_ends_frees_its_place(self) -> None:
        from nxgate.wire.guarded import user_logged_in

        first, second, third = self.connect(), self.connect("192.0.2.2"), self.connect("192.0.2.3")
        middle = ProtocolWrapper(WrappingFactory(protocol.Factory()), Inner())  # as TLS sits between
        middle.transport = first
        self.assertIsNone(user_logged_in(middle, "alice"))
        self.assertIsNone(user_logged_in(first, "alice"))  # the same connection: no second place
        self.assertIsNone(user_logged_in(second, "alice"))
        refusal = user_logged_in(third, "alice")
        self.assertIn("user alice has 2 connections to this server open already", refusal)
        self.assertIsNone(user_logged_in(third, "bob"))  # another user's login on it counts for him
        self.assertEqual(self.guard.status()["refused_user_connections"], 1)
        second.connectionLost(None)
        self.assertIsNone(user_logged_in(third, "alice"))
        self.assertEqual(self.guard.status()["most_connections_of_one_user"], 2)
        self.assertIsNone(user_logged_in(StringTransport(), "alice"))  # no guard under it: nothing to count

    def test_a_reload_changes_the_cap_and_zero_is_none(self) -> None:
        from nxgate.wire.guarded import user_logged_in

        self.guard.configure(Limits(per_user=0))
        self.assertEqual([user_logged_in(self.connect(f"192.0.2.{n}"), "alice") for n in range(50)], [None] * 50)

    def test_the_file_limit_is_read_at_each_use(self) -> None:
        self.assertEqual(self.guard.status()["file_limit"], 1024)
        self.limit[0] = 300  # an admin's prlimit under the running gateway
        self.assertEqual(self.guard.status()["file_limit"], 300)
        self.assertFalse(self.guard.users_may_open(100))  # 20 + 100 > 300 - 2 x 128

    def test_the_admin_status_shows_the_limit_of_now_and_the_users_connections(self) -> None:
        from types import SimpleNamespace

        from nxgate.gateway.doors.admin.server import _preauth_status
        from nxgate.wire.guarded import user_logged_in

        for n in range(3):
            user_logged_in(self.connect(f"192.0.2.{n}"), "alice")  # two held, the third refused
        user_logged_in(self.connect("192.0.2.9"), "bob")
        self.limit[0] = 600  # prlimit under the running gateway
        shown = _preauth_status(SimpleNamespace(guard=self.guard))
        self.assertTrue(shown["open_files"].startswith("20 of 600 "), shown["open_files"])
        self.assertEqual(shown["user_connections"], "3 connections of 2 users (the most of one user: 2; at most 2"
                                                    " each, 0: no cap)")
        self.assertEqual(shown["refused_user_connections"], 1)
        self.limit[0] = 200  # below twice the reserve (128): users' work gets nothing, not a negative number
        self.assertTrue(_preauth_status(SimpleNamespace(guard=self.guard))["open_files"].endswith(" stop at 0)"))
