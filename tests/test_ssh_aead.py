"""OpenSSH's AES-GCM packets (nxgate.wire.ssh_etm), the lean path of channel
data through a transport, and sends that go to the socket at once
(nxgate.wire.tcp.send_now).

Interoperability with OpenSSH itself, both ways, is end to end: the ssh
client with ``-c aes128-gcm@openssh.com``/``aes256-gcm@openssh.com`` and
rekeying against the gateway (tests.test_e2e_ssh_ciphers), nxgate-client
against sshd (tests.test_e2e_openssh), and nxgate-client against the
gateway with folders and printers on their own channels
(tests.test_e2e_sharing, tests.test_e2e_printing)."""

from __future__ import annotations

import os
import socket
import struct

from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from twisted.conch.ssh import channel, connection, transport
from twisted.internet import protocol, reactor
from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase, TestCase

from nxgate.streams.reverse_channel import SplicedChannel
from nxgate.wire import ssh_etm as etm
from nxgate.wire import tcp
from nxgate.wire.tcp import send_now

GCM = b"aes256-gcm@openssh.com"
ETM_MAC = b"hmac-sha2-256-etm@openssh.com"


def gcm_pair(name: bytes = GCM) -> tuple[etm.Gcm, etm.Gcm, bytes, bytes]:
    """A sealing and an opening state of one direction, and its key and IV."""
    key, iv = os.urandom(64), os.urandom(64)
    size = etm.AEAD_CIPHERS[name]
    return etm.Gcm(key[:size], iv), etm.Gcm(key[:size], iv), key[:size], iv


def sealed_packet(state: etm.Gcm, *parts: bytes) -> bytes:
    """A packet as it goes on the wire (seal_aead gives it in two pieces)."""
    return b"".join(etm.seal_aead(state, parts))


class GcmFramingTests(SynchronousTestCase):
    def test_a_packet_is_openssh_s_layout(self) -> None:
        """PROTOCOL 1.6 / RFC 5647: the length in clear and authenticated,
        padding length, payload, 4 to 19 bytes of padding to a multiple of
        16, the tag; the nonce is the IV's 12 bytes, counted up by one."""
        sealing, _, key, iv = gcm_pair()
        for count, payload in enumerate((b"", b"x", b"y" * 11, b"z" * 12, b"w" * 1000)):
            sealed = sealed_packet(sealing, payload)
            (length,) = struct.unpack(">L", sealed[:4])
            self.assertEqual(len(sealed), 4 + length + etm.TAG_SIZE)
            self.assertEqual(length % 16, 0)
            nonce = iv[:4] + (int.from_bytes(iv[4:12], "big") + count).to_bytes(8, "big")
            clear = AESGCM(key).decrypt(nonce, sealed[4:], sealed[:4])
            padding = clear[0]
            self.assertTrue(4 <= padding <= 19, padding)
            self.assertEqual(clear[1:len(clear) - padding], payload)

    def test_round_trip_one_after_another(self) -> None:
        sealing, opening, _, _ = gcm_pair(b"aes128-gcm@openssh.com")
        first, second = sealed_packet(sealing, b"first"), sealed_packet(sealing, b"sec", b"ond")
        self.assertIsNone(etm.open_aead(opening, first[:-1]))  # incomplete: nothing used, the nonce kept
        self.assertIsNone(etm.open_aead(opening, first[:3]))
        self.assertEqual(etm.open_aead(opening, first + second[:10]), (b"first", len(first)))
        self.assertEqual(etm.open_aead(opening, second), (b"second", len(second)))

    def test_a_forged_or_replayed_packet_is_refused(self) -> None:
        sealing, opening, _, _ = gcm_pair()
        sealed = sealed_packet(sealing, b"payload" * 10)
        for where in (3, 4, 20, len(sealed) - 1):  # the length, the body, the tag
            forged = bytearray(sealed)
            forged[where] ^= 1
            with self.assertRaises(etm.EtmError) as raised:
                etm.open_aead(_copy(opening), bytes(forged))
            self.assertIn(raised.exception.code, (transport.DISCONNECT_MAC_ERROR, transport.DISCONNECT_PROTOCOL_ERROR))
        self.assertEqual(etm.open_aead(_copy(opening), sealed)[0], b"payload" * 10)
        later = sealed_packet(sealing, b"later")
        with self.assertRaises(etm.EtmError) as raised:  # out of order: its nonce is the next one's
            etm.open_aead(_copy(opening), later)
        self.assertEqual(raised.exception.code, transport.DISCONNECT_MAC_ERROR)

    def test_bad_lengths_are_refused_at_the_header(self) -> None:
        _, opening, _, _ = gcm_pair()
        for length in (0, 8, 17, etm.MAX_PACKET + 16):
            with self.assertRaises(etm.EtmError) as raised:
                etm.open_aead(opening, struct.pack(">L", length))
            self.assertEqual(raised.exception.code, transport.DISCONNECT_PROTOCOL_ERROR)

    def test_padding_bytes_come_from_the_kernel_in_chunks_each_used_once(self) -> None:
        pool = etm._RandomBytes(chunk=64)
        taken = [pool.take(19) for _ in range(3)]
        self.assertEqual([len(piece) for piece in taken], [19, 19, 19])
        self.assertEqual(b"".join(taken), pool.pool[:57])  # one draw, consecutive, no byte twice
        first = pool.pool
        self.assertEqual(len(pool.take(19)), 19)  # 57 + 19 > 64: a fresh draw
        self.assertIsNot(pool.pool, first)

    def test_the_invocation_counter_wraps_in_64_bits_and_the_fixed_part_stays(self) -> None:
        state = etm.Gcm(b"k" * 32, b"FIXD" + b"\xff" * 8)
        self.assertEqual(state.next_nonce(), b"FIXD" + b"\xff" * 8)
        self.assertEqual(state.next_nonce(), b"FIXD" + b"\0" * 8)


def _copy(state: etm.Gcm) -> etm.Gcm:
    """The same direction at the same nonce (an opening may advance it)."""
    copied = etm.Gcm(b"\0" * 16, b"\0" * 12)
    copied.aead, copied.fixed, copied.counter = state.aead, state.fixed, state.counter
    return copied


class CipherStateTests(SynchronousTestCase):
    def test_each_direction_has_its_own_cipher_and_gcm_no_separate_mac(self) -> None:
        keys = [os.urandom(64) for _ in range(6)]
        mixed = etm.EtmCiphers(GCM, b"aes128-ctr", ETM_MAC, ETM_MAC)
        mixed.setKeys(*keys)
        self.assertIsNotNone(mixed.outAEAD)
        self.assertIsNone(mixed.inAEAD)
        self.assertEqual((mixed.encBlockSize, mixed.outMAC[0]), (16, None))
        self.assertEqual(mixed.verifyDigestSize, 32)  # the reading side's ETM MAC
        other = etm.EtmCiphers(b"aes128-ctr", GCM, ETM_MAC, ETM_MAC)
        other.setKeys(keys[2], keys[3], keys[0], keys[1], keys[5], keys[4])
        self.assertEqual((other.verifyDigestSize, other.decBlockSize), (0, 16))
        sealed = sealed_packet(mixed.outAEAD, b"to the other side")
        self.assertEqual(etm.open_aead(other.inAEAD, sealed)[0], b"to the other side")
        back = etm.seal(other, 3, b"and back")
        self.assertEqual(etm.open_packet(mixed, 3, back)[0], b"and back")

    def test_the_reading_state_a_server_keeps_until_the_clients_newkeys_is_all_there(self) -> None:
        ciphers = etm.EtmCiphers(GCM, GCM, ETM_MAC, ETM_MAC)
        ciphers.setKeys(*[os.urandom(64) for _ in range(6)])
        reading = {name for name in vars(ciphers) if name.startswith(("in", "dec", "verify"))}
        self.assertLessEqual(reading, set(etm.INCOMING_STATE))

    def test_offered_first_by_both_ends(self) -> None:
        self.assertEqual(etm.EtmTransport.supportedCiphers[:2], list(etm.AEAD_CIPHERS))


# ------------------------------------------------------------ channel data
class _Transport(etm.EtmTransport, transport.SSHClientTransport):
    pass


class _Recorder(channel.SSHChannel):
    """A channel that keeps what it gets; ``takes_views`` as given."""

    def __init__(self, takes_views: bool, **kwargs) -> None:
        super().__init__(**kwargs)
        self.takes_views = takes_views
        self.got: list[bytes | memoryview] = []

    def dataReceived(self, data) -> None:
        self.got.append(data)


def _end(cipher: bytes, keys: list[bytes]) -> tuple[_Transport, connection.SSHConnection]:
    end = _Transport()
    end.makeConnection(StringTransport())
    end.transport.clear()  # the version line and a KEXINIT: as if the key exchange were over
    end.outgoingPacketSequence = end.incomingPacketSequence = 0
    ciphers = etm.EtmCiphers(cipher, cipher, ETM_MAC, ETM_MAC)
    ciphers.setKeys(*keys)
    end.currentEncryptions = ciphers
    end.gotVersion = True
    end._keyExchangeState = end._KEY_EXCHANGE_NONE
    conn = connection.SSHConnection()
    conn.transport = end
    end.service = conn
    return end, conn


class ChannelDataTests(SynchronousTestCase):
    """Two transports, keys set, joined by hand: a spliced channel's bytes from one to a channel of the other."""

    def link(self, cipher: bytes = GCM, takes_views: bool = True, window: int = 1 << 20
             ) -> tuple[_Transport, _Transport, SplicedChannel, _Recorder]:
        keys = [os.urandom(64) for _ in range(6)]
        sender, sending = _end(cipher, keys)
        receiver, receiving = _end(cipher, [keys[2], keys[3], keys[0], keys[1], keys[5], keys[4]])
        out = SplicedChannel(remoteWindow=window, remoteMaxPacket=32768, conn=sending)
        into = _Recorder(takes_views, localWindow=window, localMaxPacket=32768, conn=receiving)
        out.id, into.id = 0, 7
        sending.channels[0], sending.channelsToRemoteChannel[out] = out, 7
        receiving.channels[7], receiving.channelsToRemoteChannel[into] = into, 0
        return sender, receiver, out, into

    @staticmethod
    def deliver(source: _Transport, target: _Transport, piece: int = 5000) -> None:
        wire = source.transport.value()
        source.transport.clear()
        for start in range(0, len(wire), piece):  # in pieces that cut packets anywhere
            target.dataReceived(wire[start:start + piece])

    def test_a_channel_that_takes_views_gets_its_bytes_and_the_window_is_kept(self) -> None:
        sender, receiver, out, into = self.link(window=200000)
        data = os.urandom(150000)
        out.write(data)
        self.assertEqual(out.remoteWindowLeft, 50000)
        self.deliver(sender, receiver)
        self.assertEqual(b"".join(bytes(piece) for piece in into.got), data)
        self.assertTrue(all(isinstance(piece, memoryview) and len(piece) <= 32768 for piece in into.got))
        # Past half the window (after 4 of the 5 packets) the receiver granted it again, and the sender has it.
        self.assertEqual(into.localWindowLeft, 200000 - (150000 - 4 * 32768))
        self.deliver(receiver, sender)
        self.assertEqual(out.remoteWindowLeft, into.localWindowLeft)

    def test_the_window_is_granted_after_the_data_went_on_and_not_while_paused(self) -> None:
        sender, receiver, out, into = self.link(window=65536)
        sent_before: list[int] = []

        def received(data) -> None:
            sent_before.append(len(receiver.transport.value()))  # what the receiver had sent when the data came
            into.got.append(data)

        into.dataReceived = received
        out.write(b"d" * 40000)  # past half the window: a grant is due
        self.deliver(sender, receiver, piece=1 << 20)
        self.assertEqual(sent_before, [0, 0])  # no grant was on its way yet when the data reached the channel
        self.assertNotEqual(receiver.transport.value(), b"")  # and then it was
        receiver.transport.clear()

        def paused(data) -> None:
            into.localWindowSize = 0  # the far end is full: ChannelEnd.pause_reading
            into.got.append(data)

        into.dataReceived = paused
        out.write(b"e" * 20000)
        self.deliver(sender, receiver, piece=1 << 20)
        self.assertEqual(receiver.transport.value(), b"")  # nothing granted while paused

    def test_more_than_the_window_waits_in_conchs_buffer_until_granted(self) -> None:
        sender, receiver, out, into = self.link(window=65536)
        data = os.urandom(100000)
        out.write(data)
        self.assertEqual(len(out.buf), 100000 - 65536)
        self.deliver(sender, receiver)
        self.deliver(receiver, sender)  # the window adjustment: the rest goes
        self.deliver(sender, receiver)
        self.assertEqual(b"".join(bytes(piece) for piece in into.got), data)

    def test_a_packet_taken_outside_the_transports_loop_is_bytes(self) -> None:
        sender, receiver, out, into = self.link()
        out.write(b"c" * 100)
        receiver.buf = sender.transport.value()
        packet = receiver.getPacket()
        self.assertIsInstance(packet, bytes)
        self.assertEqual(packet[9:], b"c" * 100)

    def test_other_channels_and_ciphers_keep_conchs_path(self) -> None:
        for cipher, takes_views in ((GCM, False), (b"aes128-ctr", True)):
            sender, receiver, out, into = self.link(cipher, takes_views)
            out.write(b"a" * 70000)
            self.deliver(sender, receiver)
            self.assertEqual(b"".join(bytes(piece) for piece in into.got), b"a" * 70000)
            self.assertEqual({type(piece) for piece in into.got}, {memoryview if takes_views else bytes})

    def test_too_much_data_is_left_to_conch_which_closes_the_channel(self) -> None:
        sender, receiver, out, into = self.link(window=40000)
        into.localWindowLeft = 1000  # the sender ignores what we granted
        out.write(b"b" * 5000)
        closed: list[object] = []
        receiver.service.sendClose = closed.append
        self.deliver(sender, receiver)
        self.assertEqual((into.got, closed), ([], [into]))

    def test_during_a_key_exchange_channel_data_waits_with_conchs_other_packets(self) -> None:
        sender, receiver, out, into = self.link()
        sender._keyExchangeState = sender._KEY_EXCHANGE_REQUESTED
        sender._blockedByKeyExchange = []
        out.write(b"held")
        self.assertEqual(sender.transport.value(), b"")
        self.assertEqual(sender._blockedByKeyExchange,
                         [(connection.MSG_CHANNEL_DATA, struct.pack(">2L", 7, 4) + b"held")])


# ------------------------------------------------------------- send_now
class _Keep(protocol.Protocol):
    pass


class SendNowTests(TestCase):
    """A real socket in the reactor: what send_now sends is there before the reactor turns."""

    def adopted(self) -> tuple[object, socket.socket]:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        ours.setblocking(False)
        theirs.setblocking(False)
        kept = _Keep()
        reactor.adoptStreamConnection(ours.fileno(), socket.AF_UNIX, protocol.Factory.forProtocol(lambda: kept))
        ours.close()
        self.addCleanup(theirs.close)
        self.addCleanup(kept.transport.loseConnection)
        return kept.transport, theirs

    def test_bytes_go_out_at_once_and_views_too(self) -> None:
        transport_, theirs = self.adopted()
        send_now(transport_, b"now")
        send_now(transport_, memoryview(b"-and a view-")[1:-1])
        self.assertEqual(theirs.recv(100), b"nowand a view")
        self.assertFalse(transport_._tempDataBuffer)

    def test_pieces_go_in_one_sendmsg_and_what_is_left_is_joined_in_order(self) -> None:
        transport_, theirs = self.adopted()
        send_now(transport_, b"len:", memoryview(b"-body-")[1:-1])
        self.assertEqual(theirs.recv(100), b"len:body")
        self.assertEqual(tcp._rest((b"abc", memoryview(b"def"), b"g"), 4), b"efg")
        self.assertEqual(tcp._rest((b"abc", b"def"), 3), b"def")
        one = b"whole"
        self.assertIs(tcp._rest((one,), 0), one)  # nothing copied for a plain write

    def test_what_waits_in_twisteds_buffer_keeps_the_order(self) -> None:
        transport_, theirs = self.adopted()
        transport_.write(b"first ")
        send_now(transport_, b"sec", b"ond")
        self.assertRaises(BlockingIOError, theirs.recv, 100)  # both wait for the reactor

        def arrived() -> bytes:
            return theirs.recv(100)

        from twisted.internet import task

        return task.deferLater(reactor, 0.05, arrived).addCallback(self.assertEqual, b"first second")

    def test_a_plain_wrapper_is_looked_through(self) -> None:
        from twisted.protocols.policies import ProtocolWrapper, WrappingFactory

        transport_, theirs = self.adopted()
        plain = ProtocolWrapper(WrappingFactory(protocol.Factory.forProtocol(_Keep)), _Keep())
        plain.makeConnection(transport_)
        send_now(plain, b"at once")
        self.assertEqual(theirs.recv(100), b"at once")

    def test_a_wrapper_that_transforms_its_writes_is_written_through(self) -> None:
        """TLS is a ProtocolWrapper whose attributes include the socket under
        it: its bytes must go through its own write (encrypted), never raw."""
        from twisted.protocols.policies import ProtocolWrapper, WrappingFactory

        class Sealing(ProtocolWrapper):
            def write(self, data: bytes) -> None:
                self.transport.write(b"sealed:" + data)

        transport_, theirs = self.adopted()
        wrapper = Sealing(WrappingFactory(protocol.Factory.forProtocol(_Keep)), _Keep())
        wrapper.makeConnection(transport_)
        self.assertIs(wrapper.socket, transport_.socket)  # what made it look like a socket transport
        send_now(wrapper, b"secret")
        self.assertRaises(BlockingIOError, theirs.recv, 100)  # nothing went around the wrapper

        from twisted.internet import task

        return task.deferLater(reactor, 0.05, theirs.recv, 100).addCallback(self.assertEqual, b"sealed:secret")

    def test_a_transport_without_a_socket_gets_a_plain_write(self) -> None:
        wire = StringTransport()
        send_now(wire, memoryview(b"view"))
        self.assertEqual(wire.value(), b"view")
