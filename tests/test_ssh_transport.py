"""Unit tests of the gateway's SSH transport around key exchange.

A Conch client and our server transport talk over in-memory transports.
What matters to libssh 0.10 clients (Remmina): when they have our NEWKEYS
they must already have ``server-sig-algs`` (RFC 8308 EXT_INFO), because
they choose the RSA signature algorithm right then and would otherwise
fall back to SHA-1 ``ssh-rsa`` and refuse it.
"""

from __future__ import annotations

import os
import socket
import struct
import zlib
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ed25519
from twisted.conch.ssh import keys, service, transport
from twisted.internet import defer
from twisted.internet.testing import StringTransport
from twisted.internet.error import ConnectionDone
from twisted.logger import LogLevel, capturedLogs, formatEvent, globalLogPublisher
from twisted.python.failure import Failure
from twisted.trial.unittest import TestCase

from nxgate.gateway.doors.conch import server
from nxgate.wire.ssh_compression import BoundedInflater, CompressionError
from nxgate.wire.ssh_etm import ETM_MACS, MAX_PACKET, EtmTransport
from tests.harness.sshattack import DelayedZlib, bomb_packet
from nxgate.gateway.doors.conch.server import NXSSHFactory
from nxgate.wire.tcp import QUICK_ACK_BELOW, no_delay, quick_ack

def pump(server: Any, server_wire: StringTransport, client: Any, client_wire: StringTransport) -> None:
    """Deliver until both sides are quiet; everything the server has sent
    reaches the client before anything more of the client's reaches the
    server, as when the server's packets arrive together."""
    while True:
        moved = False
        for wire, receiver in ((server_wire, client), (client_wire, server)):
            data = wire.value()
            wire.clear()
            if data:
                receiver.dataReceived(data)
                moved = True
        if not moved:
            return


ECHO = 192  # a message number for the test services (local extensions)
USERAUTH_SUCCESS = 52


class _Ready:
    """The client's compressor for one packet already compressed (the bomb)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def compress(self, data: bytes) -> bytes:
        return self.data

    def flush(self, mode: int = 0) -> bytes:
        return b""


class _EchoService(service.SSHService):
    """The server side: sends back what it gets."""

    name = b"ssh-userauth"

    def packetReceived(self, messageNum: int, packet: bytes) -> None:
        self.transport.sendPacket(messageNum, packet)


class _RecordingService(service.SSHService):
    """The client side: keeps what it gets."""

    name = b"ssh-userauth"

    def __init__(self) -> None:
        self.received: list[bytes] = []

    def packetReceived(self, messageNum: int, packet: bytes) -> None:
        self.received.append(packet)


class _Client(EtmTransport, DelayedZlib, transport.SSHClientTransport):
    supportedMACs = [*ETM_MACS, *transport.SSHClientTransport.supportedMACs]
    service_requested: _RecordingService | None = None

    def verifyHostKey(self, hostKey: bytes, fingerprint: bytes) -> defer.Deferred[bool]:
        return defer.succeed(True)

    def connectionSecure(self) -> None:  # Conch calls it after every key exchange
        if self.service_requested is None:
            self.service_requested = _RecordingService()
            self.requestService(self.service_requested)


class ExtInfoOrderTests(TestCase):
    def setUp(self) -> None:
        host_key = keys.Key(ed25519.Ed25519PrivateKey.generate())
        factory = NXSSHFactory(None, {b"ssh-ed25519": host_key}, 120, 6)
        factory.services = {b"ssh-userauth": _EchoService}
        factory.primes = None
        self.server = factory.buildProtocol(None)
        self.server_wire = StringTransport()
        self.client = _Client()
        self.client_wire = StringTransport()
        # What the client knew of server-sig-algs each time the server got its NEWKEYS.
        self.known_at_client_newkeys: list[dict[bytes, bytes]] = []
        received_newkeys = self.server.ssh_NEWKEYS

        def ssh_NEWKEYS(packet: bytes) -> None:
            self.known_at_client_newkeys.append(dict(self.client.peerExtensions))
            received_newkeys(packet)

        self.server.ssh_NEWKEYS = ssh_NEWKEYS

    def connect(self, compression: bytes = b"none") -> None:
        self.client.supportedCompressions = [compression]
        self.server.makeConnection(self.server_wire)
        self.client.makeConnection(self.client_wire)
        self.pump()
        self.assertIsNotNone(self.client.service_requested)
        self.assertIsInstance(self.server.service, _EchoService)

    def pump(self) -> None:
        pump(self.server, self.server_wire, self.client, self.client_wire)

    def echo(self, size: int = 20000) -> None:
        """A round trip through the encrypted (and maybe compressed) link."""
        payload = os.urandom(size // 2) + b"x" * (size // 2)
        self.client.sendPacket(ECHO, payload)
        self.pump()
        assert self.client.service_requested is not None
        self.assertEqual(self.client.service_requested.received[-1:], [payload])
        self.assertFalse(self.client_wire.disconnecting or self.server_wire.disconnecting)

    def test_ext_info_reaches_the_client_before_its_newkeys_does_the_server(self) -> None:
        self.connect()
        [known] = self.known_at_client_newkeys
        self.assertIn(b"server-sig-algs", known)
        self.assertIn(b"rsa-sha2-256", known[b"server-sig-algs"].split(b","))
        self.assertTrue(self.server.isEncrypted("both"))
        self.echo()

    def test_server_sig_algs_lists_the_user_key_algorithms(self) -> None:
        """Not our host key algorithms (only ed25519 here): what user
        authentication verifies, the NoMachine DSA key included."""
        self.connect()
        advertised = self.client.peerExtensions[b"server-sig-algs"].split(b",")
        for name in (b"rsa-sha2-512", b"rsa-sha2-256", b"ssh-ed25519", b"ecdsa-sha2-nistp256", b"ssh-dss"):
            self.assertIn(name, advertised)

    def test_no_ext_info_for_a_client_without_extension_negotiation(self) -> None:
        self.client.supportedKeyExchanges = [
            name for name in self.client.supportedKeyExchanges if name != b"ext-info-c"
        ]
        self.client._EXT_INFO_C = b"no-ext-info"  # Conch adds it to its KEXINIT otherwise
        self.connect()
        self.assertEqual(self.client.peerExtensions, {})
        self.echo()

    def authenticate(self) -> None:
        """What the user authentication service sends when it succeeds."""
        self.server.sendPacket(USERAUTH_SUCCESS, b"")
        self.pump()

    def test_plain_zlib_is_not_offered(self) -> None:
        """Plain zlib compresses from the first NEWKEYS, before the client
        has authenticated: anyone could send a zlib bomb."""
        self.client.supportedCompressions = [b"zlib"]
        self.server.makeConnection(self.server_wire)
        self.client.makeConnection(self.client_wire)
        with capturedLogs() as events:
            self.pump()
        self.assertIsNone(self.client.service_requested)
        self.assertTrue(self.server_wire.disconnecting or self.client_wire.disconnecting)
        self.assertIn(b"none,zlib@openssh.com", self.server.ourKexInitPayload)
        self.assertNotIn(b",zlib,", self.server.ourKexInitPayload)
        lines = [formatEvent(event) for event in events]
        self.assertTrue(any("no compression in common (the client offers zlib)" in line
                            and "never plain zlib" in line for line in lines), lines)

    def test_delayed_zlib_starts_after_authentication_and_goes_on_across_rekeying(self) -> None:
        """zlib@openssh.com: nothing is compressed (or inflated) before
        USERAUTH_SUCCESS; both directions from the packet after it; a fresh
        stream at each later key exchange, as OpenSSH does."""
        self.connect(b"zlib@openssh.com")
        self.assertEqual(self.server.incomingCompressionType, b"zlib@openssh.com")
        self.assertIsNone(self.server.outgoingCompression)
        self.assertIsNone(self.server.incomingCompression)
        self.echo()
        self.authenticate()
        self.assertIsInstance(self.server.incomingCompression, BoundedInflater)
        self.assertIsNotNone(self.server.outgoingCompression)
        self.echo()
        # A rekeying, with a reply queued by the server while it runs.
        self.client.sendKexInit()
        self.server.dataReceived(self.client_wire.value())
        self.client_wire.clear()
        queued = b"queued during the key exchange" * 100
        self.server.sendPacket(ECHO, queued)
        self.pump()
        self.assertEqual(self.server._keyExchangeState, self.server._KEY_EXCHANGE_NONE)
        assert self.client.service_requested is not None
        self.assertIn(queued, self.client.service_requested.received)
        self.echo()
        self.echo(1000)
        self.assertIsInstance(self.server.incomingCompression, BoundedInflater)

    def test_a_zlib_bomb_after_authentication_closes_the_connection_at_the_packet_limit(self) -> None:
        self.connect(b"zlib@openssh.com")
        self.authenticate()
        self.echo()
        bomb = bomb_packet(self.client.outgoingCompression, 40 * MAX_PACKET)
        self.assertLess(len(bomb), MAX_PACKET // 10)
        self.client.outgoingCompression = _Ready(bomb)
        self.client.sendPacket(2, b"")  # SSH_MSG_IGNORE
        with capturedLogs() as events:
            self.server.dataReceived(self.client_wire.value())
        self.assertTrue(self.server_wire.disconnecting)
        told: list[tuple[int, bytes]] = []
        self.client.receiveError = lambda code, why: told.append((code, why))
        self.client.dataReceived(self.server_wire.value())
        self.assertEqual(told, [(transport.DISCONNECT_COMPRESSION_ERROR,
                                 b"a compressed packet of %d bytes inflates to more than 1048576 bytes, the packet limit"
                                 % len(bomb))])
        lines = [formatEvent(event) for event in events]
        self.assertTrue(any("closed: a compressed packet of" in line for line in lines), lines)
        self.assertFalse(any(event.get("log_failure") for event in events))  # a line, not a traceback

    def test_rekeying_without_compression(self) -> None:
        self.connect()
        self.echo()
        for _ in range(2):
            self.client.sendKexInit()
            self.pump()
            self.echo()
        self.assertEqual(len(self.known_at_client_newkeys), 3)


class DisconnectLogTests(ExtInfoOrderTests):
    """A client's goodbye is one line, the connection's closing one; an abnormal reason is told in it."""

    def closing_lines(self, code: int, why: bytes) -> list[Any]:
        self.connect()
        with capturedLogs() as events:
            self.client.sendDisconnect(code, why)
            self.pump()
            self.server.connectionLost(Failure(ConnectionDone()))
        return events

    def test_a_normal_goodbye_is_no_error(self) -> None:
        for code, why in ((transport.DISCONNECT_CONNECTION_LOST, b"user closed connection"),
                          (transport.DISCONNECT_BY_APPLICATION, b"disconnected by user")):
            self.setUp()
            events = self.closing_lines(code, why)
            alarms = [e for e in events if e["log_level"] in (LogLevel.warn, LogLevel.error, LogLevel.critical)]
            self.assertEqual(alarms, [])  # Conch's "Got remote error" was an error line
            (line,) = [formatEvent(e) for e in events if e["log_namespace"] == server.__name__]
            self.assertRegex(line, r"^SSH connection from \S+ closed$")

    def test_another_reason_is_told_in_the_closing_line(self) -> None:
        events = self.closing_lines(transport.DISCONNECT_PROTOCOL_ERROR, b"bad packet length")
        self.assertEqual([e for e in events if e["log_level"] in (LogLevel.warn, LogLevel.error, LogLevel.critical)],
                         [])
        (line,) = [formatEvent(e) for e in events if e["log_namespace"] == server.__name__]
        self.assertRegex(line, r"^SSH connection from \S+ closed by the client: bad packet length \(code 2\)$")


class ModuliTests(TestCase):
    """Without OpenSSH's moduli file old clients lose group exchange: say so."""

    def test_a_missing_moduli_file_is_logged(self) -> None:
        events: list = []
        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        self.patch(server, "MODULI_FILE", "/nonexistent/nxgate-moduli")
        self.assertIsNone(NXSSHFactory(None, {}, 120, 6).getPrimes())
        self.assertTrue(any("/nonexistent/nxgate-moduli" in formatEvent(e) for e in events))


class _TCPWire(StringTransport):
    """A StringTransport that remembers TCP_NODELAY, as a TCP transport has it."""

    no_delay = False

    def setTcpNoDelay(self, enabled: bool) -> None:
        self.no_delay = enabled


class NoDelayTests(TestCase):
    """The NX stream after ``bye`` carries the smb channel's small SMB calls:
    Nagle's delays cut folder copies to a fraction (nxgate.wire.tcp)."""

    def test_the_gateways_ssh_connections_send_small_writes_at_once(self) -> None:
        factory = NXSSHFactory(None, {b"ssh-ed25519": keys.Key(ed25519.Ed25519PrivateKey.generate())}, 120, 6)
        factory.primes = None
        wire = _TCPWire()
        factory.buildProtocol(None).makeConnection(wire)
        self.assertTrue(wire.no_delay)

    def test_transports_without_tcp_are_left_alone(self) -> None:
        no_delay(StringTransport())  # no setTcpNoDelay: nothing to set, no error


class _RecordingSocket(socket.socket):
    """A real TCP socket object that remembers the options set on it."""

    def __init__(self, family: int = socket.AF_INET) -> None:
        super().__init__(family, socket.SOCK_STREAM)
        self.options: list[tuple[int, int, int]] = []

    def setsockopt(self, level: int, name: int, value: Any, *rest: Any) -> None:  # type: ignore[override]
        self.options.append((level, name, value))


class _SocketWire(StringTransport):
    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self.sock = sock

    def getHandle(self) -> socket.socket:
        return self.sock


class QuickAckTests(TestCase):
    """paramiko (python-x2go, pyhoca-cli) keeps Nagle's algorithm on: each of
    its small messages waited for our delayed acknowledgement of the one
    before, 44 ms per X2Go command (nxgate.wire.tcp.quick_ack)."""

    def wire(self, family: int = socket.AF_INET) -> tuple[_SocketWire, _RecordingSocket]:
        sock = _RecordingSocket(family)
        self.addCleanup(sock.close)
        return _SocketWire(sock), sock

    def test_the_gateway_acknowledges_each_small_read_at_once(self) -> None:
        factory = NXSSHFactory(None, {b"ssh-ed25519": keys.Key(ed25519.Ed25519PrivateKey.generate())}, 120, 6)
        factory.primes = None
        wire, sock = self.wire()
        protocol = factory.buildProtocol(None)
        protocol.makeConnection(wire)
        protocol.dataReceived(b"SSH-2.0-paramiko_2.12.0\r\n")
        protocol.dataReceived(b"\0" * 8)
        self.assertEqual(sock.options.count((socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)), 2)

    def test_bulk_reads_keep_delayed_acknowledgements(self) -> None:
        wire, sock = self.wire()
        quick_ack(wire, QUICK_ACK_BELOW)
        self.assertEqual(sock.options, [])

    def test_other_sockets_and_transports_are_left_alone(self) -> None:
        wire, sock = self.wire(socket.AF_UNIX)
        quick_ack(wire, 10)
        self.assertEqual(sock.options, [])
        quick_ack(StringTransport(), 10)  # no socket under it: nothing to set, no error


class BoundedInflaterTests(TestCase):
    def test_packets_up_to_the_limit_inflate_one_after_another(self) -> None:
        deflate = zlib.compressobj(6)
        inflater = BoundedInflater(1000)
        for payload in (b"a" * 1000, os.urandom(500), b""):
            packet = deflate.compress(payload) + deflate.flush(zlib.Z_SYNC_FLUSH)
            self.assertEqual(inflater.decompress(packet), payload)

    def test_one_byte_over_the_limit_is_refused_without_inflating_it_all(self) -> None:
        deflate = zlib.compressobj(6)
        inflater = BoundedInflater(1000)
        error = self.assertRaises(CompressionError, inflater.decompress,
                                  deflate.compress(b"a" * 1001) + deflate.flush(zlib.Z_SYNC_FLUSH))
        self.assertIn("more than 1000 bytes", str(error))
        bomb = bomb_packet(zlib.compressobj(6), 100 << 20)[5:]  # 100 MB of zeros, without the header
        self.assertRaises(CompressionError, BoundedInflater(1000).decompress, bomb)

    def test_corrupt_data_is_a_compression_error(self) -> None:
        error = self.assertRaises(CompressionError, BoundedInflater(1000).decompress, b"not zlib at all")
        self.assertIn("corrupt", str(error))
