"""The cluster's TLS contexts (Twisted's CertificateOptions, nxgate.wire.tls)
and the peer-name gates of nxgate.wire.connection, over an in-memory
connection (twisted.test.iosim): a member's certificate is accepted both
ways, a certificate of another CA or naming no member is refused and the
refusal says why.  tests/test_cluster_wire.py does the same over real TCP."""

from __future__ import annotations

import os

from twisted.internet import defer, protocol
from twisted.internet.address import IPv4Address
from twisted.internet.ssl import CertificateOptions
from twisted.logger import globalLogPublisher
from twisted.test import iosim
from twisted.trial.unittest import SynchronousTestCase

from nxgate.wire import tls
from nxgate.wire.connection import GateFactory, _ClientGate, _TLSFactory

ADDRESS = IPv4Address("TCP", "127.0.0.1", 7022)


class Heard(protocol.Protocol):
    """The node's inner protocol: answers, as a stream's OK does."""

    def __init__(self) -> None:
        self.data = b""

    def dataReceived(self, data: bytes) -> None:
        if not self.data:
            self.transport.write(b"OK\n")
        self.data += data


def resumed(connection) -> bool:
    from OpenSSL._util import lib  # pyOpenSSL has no public SSL_session_reused

    return bool(lib.SSL_session_reused(connection._ssl))


def member(directory: str, name: str, ca_dir: str | None = None) -> tls.ClusterTLS:
    ca_dir = ca_dir or os.path.join(directory, "ca")
    if not os.path.exists(os.path.join(ca_dir, tls.CA_CERT)):
        tls.make_ca(ca_dir)
    certificate, key = tls.make_cert(name, ca_dir, os.path.join(directory, "members"))
    return tls.ClusterTLS.load(name, os.path.join(directory, "ca", tls.CA_CERT), certificate, key)


class ContextTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.base = os.path.abspath(self.mktemp())
        self.node = member(self.base, "node-b")
        self.events: list[dict] = []
        self.names: list[frozenset[str]] = []
        self.members = {"gw-a"}
        globalLogPublisher.addObserver(self.events.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.events.append)

    def connect(self, gateway: tls.ClusterTLS, dialled: str = "node-b"):
        """The gateway dials ``dialled`` at this node; the node serves members named gw-a."""
        heard = Heard()

        def authorize(names):
            self.names.append(names)
            return "gw-a" if "gw-a" in names & self.members else None

        server = GateFactory(authorize, lambda head, member_name: heard).tls_factory(self.node).buildProtocol(ADDRESS)
        self.server = server
        ready: defer.Deferred = defer.Deferred()
        sender = protocol.Protocol()
        client = _TLSFactory(gateway.client(dialled), True, protocol.Factory.forProtocol(
            lambda: _ClientGate(sender, dialled, ready, gateway))).buildProtocol(ADDRESS)
        pump = iosim.connect(server, iosim.makeFakeServer(server), client, iosim.makeFakeClient(client))
        results: list = []
        ready.addBoth(results.append)
        if ready.called and not isinstance(results[0], Exception) and not hasattr(results[0], "value"):
            sender.transport.write(b"\x00\x04ping")
            pump.flush()
            self.client = sender.transport.getHandle()
        return results, heard

    def refusals(self) -> str:
        return " | ".join(str(e.get("reason", "")) for e in self.events if e.get("event") == "cluster_peer_refused")

    def test_the_contexts_are_twisteds_and_tls_1_3_only(self) -> None:
        self.assertIsInstance(self.node.server_options, CertificateOptions)
        self.assertIsInstance(self.node.client_options, CertificateOptions)
        from OpenSSL import SSL

        connection = SSL.Connection(self.node.server_options.getContext(), None)
        self.assertEqual(connection.get_context().get_verify_mode() & SSL.VERIFY_FAIL_IF_NO_PEER_CERT,
                         SSL.VERIFY_FAIL_IF_NO_PEER_CERT)

    def test_a_members_certificate_is_accepted(self) -> None:
        results, heard = self.connect(member(self.base, "gw-a"))
        self.assertNotIsInstance(results[0], Exception)
        self.assertEqual(heard.data, b"\x00\x04ping")
        self.assertEqual(self.refusals(), "")

    def test_a_certificate_of_another_ca_is_refused(self) -> None:
        other = os.path.join(self.base, "other")
        results, heard = self.connect(member(other, "gw-a"))
        self.assertTrue(hasattr(results[0], "value"), results)  # a Failure
        self.assertEqual(heard.data, b"")
        self.assertIn("not the cluster CA", self.refusals())

    def test_a_certificate_of_the_ca_that_names_no_member_is_refused(self) -> None:
        results, heard = self.connect(member(self.base, "intruder"))
        self.assertEqual(heard.data, b"")
        self.assertIn("names intruder, not a member with role gateway", self.refusals())

    def test_a_node_whose_certificate_names_another_member_is_refused_by_the_gateway(self) -> None:
        results, heard = self.connect(member(self.base, "gw-a"), dialled="node-c")
        self.assertTrue(hasattr(results[0], "value"), results)
        self.assertIn("names node-b, not node-c", str(results[0].value))
        self.assertEqual(heard.data, b"")

    def test_a_second_connection_resumes_and_is_still_checked(self) -> None:
        """TLS 1.3 tickets (issue 25: a stream opening re-did both certificate
        signatures): the next connection to the member resumes, and the node
        still gets the peer's names and checks them against its members."""
        gateway = member(self.base, "gw-a")
        self.connect(gateway)
        self.assertFalse(resumed(self.client))
        self.assertIn("node-b", gateway.sessions)
        results, heard = self.connect(gateway)
        self.assertEqual(heard.data, b"\x00\x04ping")
        self.assertTrue(resumed(self.client))
        self.assertEqual(self.names, [frozenset({"gw-a"})] * 2)

    def test_a_member_removed_since_is_refused_on_a_resumed_session(self) -> None:
        gateway = member(self.base, "gw-a")
        self.connect(gateway)
        self.members.clear()  # an admin removed gw-a from the cluster
        results, heard = self.connect(gateway)
        self.assertEqual(heard.data, b"")
        self.assertIn("names gw-a, not a member with role gateway", self.refusals())

    def test_member_connections_write_whole_records_in_one_call(self) -> None:
        """Canary for nxgate.wire.records (pyOpenSSL's private _lib, _ffi,
        _ssl and _raise_ssl_error): one send() takes a write of many records."""
        from nxgate.wire import records

        self.assertTrue(records.AVAILABLE, "pyOpenSSL's private names changed: member streams lose throughput")
        self.connect(member(self.base, "gw-a"))
        self.assertEqual(self.client.send(b"y" * 100000), 100000)  # pyOpenSSL's default: 16384
