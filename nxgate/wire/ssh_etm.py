"""Encrypt-then-MAC for Conch transports (``hmac-sha2-*-etm@openssh.com``).

Conch only has encrypt-and-MAC: the MAC covers the plaintext, so a receiver
decrypts before it can authenticate (the weakness behind the 2008 CBC
plaintext-recovery attack, and what ``ssh-audit`` warns about on every
``hmac-*`` MAC).  OpenSSH's ``-etm@openssh.com`` MACs (PROTOCOL, section
1.7) leave the packet length in clear and MAC the ciphertext, so a forged
packet is refused before anything is decrypted.  Both ends of the gateway use
them: :class:`EtmTransport` is mixed into the server transport and into
nxgate-client's.

Only the framing differs; ciphers, keys and the HMAC come from Conch's
:class:`~twisted.conch.ssh.transport.SSHCiphers`.

The same framing carries OpenSSH's AES-GCM ciphers (``aes256-gcm@openssh.com``,
``aes128-gcm@openssh.com``; PROTOCOL, section 1.6), which Conch lacks: the
length in clear and authenticated with the rest, no separate MAC.  With
the CPUs' AES and carry-less multiply instructions GCM seals a byte in
about a fifth of the time AES-CTR plus HMAC-SHA-256 takes, and every byte of
a bulk channel (a folder copy on nxgate-client's own channel, the NX
stream) is sealed by one end and opened by the other.
"""

from __future__ import annotations

import struct
from hashlib import sha256, sha512
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from twisted.conch.ssh import connection, transport
from twisted.python.randbytes import secureRandom

from nxgate.wire.tcp import send_now

ETM_MACS = {
    b"hmac-sha2-512-etm@openssh.com": sha512,
    b"hmac-sha2-256-etm@openssh.com": sha256,
}
#: OpenSSH's AES-GCM ciphers and their key sizes.
AEAD_CIPHERS = {
    b"aes256-gcm@openssh.com": 32,
    b"aes128-gcm@openssh.com": 16,
}
#: GCM's authentication tag, after each packet.
TAG_SIZE = 16
#: The longest packet we accept, as Conch (RFC 4253 asks for 35000 at least).
MAX_PACKET = 1048576
_CHANNEL_DATA = struct.Struct(">2L")
_CHANNEL_DATA_MESSAGE = struct.Struct(">B2L")


def is_etm(mac_name: bytes | None) -> bool:
    return mac_name in ETM_MACS


class Gcm:
    """One direction of AES-GCM: its key, and the nonce, a fixed part and a
    64-bit invocation counter, both from the derived IV, counted up by one
    per packet (RFC 5647, section 7.1)."""

    __slots__ = ("aead", "fixed", "counter")

    def __init__(self, key: bytes, iv: bytes) -> None:
        self.aead = AESGCM(key)
        self.fixed = iv[:4]
        self.counter = int.from_bytes(iv[4:12], "big")

    def next_nonce(self) -> bytes:
        nonce = self.fixed + self.counter.to_bytes(8, "big")
        self.counter = (self.counter + 1) & 0xFFFFFFFFFFFFFFFF
        return nonce


class EtmCiphers(transport.SSHCiphers):
    """Conch's cipher state, knowing the ETM MAC names (same HMACs) and the
    AES-GCM ciphers (:class:`Gcm`, one per direction that negotiated one:
    its negotiated MAC is not used, as in OpenSSH)."""

    macMap = {**transport.SSHCiphers.macMap, **ETM_MACS}
    outAEAD: Gcm | None = None
    inAEAD: Gcm | None = None

    def setKeys(self, outIV: bytes, outKey: bytes, inIV: bytes, inKey: bytes, outInteg: bytes,
                inInteg: bytes) -> None:
        out_size, in_size = AEAD_CIPHERS.get(self.outCipType), AEAD_CIPHERS.get(self.inCipType)
        if out_size is None and in_size is None:
            super().setKeys(outIV, outKey, inIV, inKey, outInteg, inInteg)
            return
        if out_size is None:
            sealing = self._getCipher(self.outCipType, outIV, outKey)
            self.encryptor = sealing.encryptor()
            self.encBlockSize = sealing.algorithm.block_size // 8
            self.outMAC = self._getMAC(self.outMACType, outInteg)
        else:
            self.outAEAD = Gcm(outKey[:out_size], outIV)
            self.encBlockSize = 16
            self.outMAC = (None, b"", b"", 0)
        if in_size is None:
            opening = self._getCipher(self.inCipType, inIV, inKey)
            self.decryptor = opening.decryptor()
            self.decBlockSize = opening.algorithm.block_size // 8
            self.inMAC = self._getMAC(self.inMACType, inInteg)
            self.verifyDigestSize = self.inMAC[3] if self.inMAC else 0
        else:
            self.inAEAD = Gcm(inKey[:in_size], inIV)
            self.decBlockSize = 16
            self.inMAC = (None, b"", b"", 0)
            self.verifyDigestSize = 0


#: What a cipher state holds for the direction it reads (a server sends with
#: new keys before it reads with them: RFC 4253, section 7.3).
INCOMING_STATE = ("inCipType", "inMACType", "decryptor", "decBlockSize", "inMAC", "verifyDigestSize", "inAEAD")


class EtmTransport:
    """Mixin before an ``SSHTransportBase`` subclass: sends and reads ETM
    packets whenever the negotiated MAC of that direction is an ETM one, and
    AES-GCM packets when its cipher is AES-GCM (preferred: a client's order
    decides)."""

    supportedCiphers = [*AEAD_CIPHERS, *transport.SSHTransportBase.supportedCiphers]
    #: Within our own packet loop: payloads may stay views of the opened packets.
    _views = False

    # Provided by SSHTransportBase.
    currentEncryptions: Any
    nextEncryptions: Any
    buf: bytes
    transport: Any
    outgoingPacketSequence: int
    incomingPacketSequence: int
    outgoingCompression: Any
    incomingCompression: Any

    def ssh_KEXINIT(self, packet: bytes) -> Any:
        result = super().ssh_KEXINIT(packet)  # type: ignore[misc]
        chosen = getattr(self, "nextEncryptions", None)
        if type(chosen) is transport.SSHCiphers:  # just negotiated: only names so far
            self.nextEncryptions = EtmCiphers(chosen.outCipType, chosen.inCipType, chosen.outMACType,
                                              chosen.inMACType)
        return result

    def sendPacket(self, messageType: int, payload: bytes) -> None:
        ciphers = self.currentEncryptions
        aead = getattr(ciphers, "outAEAD", None)
        if aead is None and not is_etm(ciphers.outMACType):
            super().sendPacket(messageType, payload)  # type: ignore[misc]
            return
        state = self._keyExchangeState  # type: ignore[attr-defined]
        if state != self._KEY_EXCHANGE_NONE and not self._allowedKeyExchangeMessageType(messageType):  # type: ignore[attr-defined]
            self._blockedByKeyExchange.append((messageType, payload))  # type: ignore[attr-defined]
            return
        data = bytes((messageType,)) + payload
        if self.outgoingCompression:
            data = self.outgoingCompression.compress(data) + self.outgoingCompression.flush(2)
        if aead is not None:
            send_now(self.transport, *seal_aead(aead, (data,)))
        else:
            send_now(self.transport, seal(ciphers, self.outgoingPacketSequence, data))
        self.outgoingPacketSequence += 1

    def send_channel_data(self, recipient: int, data: bytes | memoryview) -> None:
        """SSH_MSG_CHANNEL_DATA to the peer's channel ``recipient`` (the
        channel's window and packet size are the caller's), sealed straight
        from ``data``: Conch's way copies each byte six times before the
        cipher (slices, ``NS``, the message type, padding)."""
        aead = getattr(self.currentEncryptions, "outAEAD", None)
        if aead is None or self.outgoingCompression or self._keyExchangeState != self._KEY_EXCHANGE_NONE:  # type: ignore[attr-defined]
            self.sendPacket(connection.MSG_CHANNEL_DATA, _CHANNEL_DATA.pack(recipient, len(data)) + bytes(data))
            return
        send_now(self.transport, *seal_aead(aead, (_CHANNEL_DATA_MESSAGE.pack(connection.MSG_CHANNEL_DATA, recipient,
                                                                              len(data)), data)))
        self.outgoingPacketSequence += 1

    def dataReceived(self, data: bytes) -> None:
        """Conch's packet loop, but the data of a channel that takes views
        (``takes_views``) reaches it as a view into the packet, without
        Conch's three copies (the message type, the channel number, ``NS``)."""
        if not self.gotVersion:  # type: ignore[attr-defined]
            super().dataReceived(data)  # type: ignore[misc]
            return
        self.buf = self.buf + data if self.buf else data
        self._views = True
        try:
            packet = self.getPacket()
            while packet:
                if packet[0] != connection.MSG_CHANNEL_DATA or not self._channel_data(packet):
                    self.dispatchMessage(packet[0], bytes(packet[1:]))  # type: ignore[attr-defined]
                packet = self.getPacket()
        finally:
            self._views = False

    def _channel_data(self, packet: bytes) -> bool:
        """Hand a well-formed SSH_MSG_CHANNEL_DATA within the window to its
        channel if it takes views (as Conch's ``ssh_CHANNEL_DATA``: the
        window, its adjustment); False leaves the packet to Conch."""
        service = self.service  # type: ignore[attr-defined]
        if not isinstance(service, connection.SSHConnection) or len(packet) < 9:
            return False
        local, length = _CHANNEL_DATA.unpack_from(packet, 1)
        channel = service.channels.get(local)
        if (channel is None or not getattr(channel, "takes_views", False) or 9 + length != len(packet)
                or length > channel.localWindowLeft or length > channel.localMaxPacket):
            return False
        channel.localWindowLeft -= length
        channel.dataReceived(memoryview(packet)[9:])
        # Granted after the data went on (Conch grants first): the peer has half the window still, and the
        # adjustment is a send and a wakeup of the peer that need not delay this data's way.
        if channel.localWindowLeft < channel.localWindowSize // 2 and not channel.localClosed:
            service.adjustWindow(channel, channel.localWindowSize - channel.localWindowLeft)
        return True

    def getPacket(self) -> bytes | memoryview | None:
        """The next packet's payload: a view of the opened packet within our
        own packet loop (:meth:`dataReceived`), bytes for anyone else."""
        ciphers = self.currentEncryptions
        aead = getattr(ciphers, "inAEAD", None)
        if aead is None and not is_etm(ciphers.inMACType):
            return super().getPacket()  # type: ignore[misc]
        try:
            opened = (open_aead(aead, self.buf) if aead is not None
                      else open_packet(ciphers, self.incomingPacketSequence, self.buf))
        except EtmError as error:
            self.sendDisconnect(error.code, str(error).encode())  # type: ignore[attr-defined]
            return None
        if opened is None:
            return None
        payload, used = opened
        self.buf = self.buf[used:]
        if self.incomingCompression:
            try:
                payload = self.incomingCompression.decompress(payload)
            except Exception:  # zlib.error and friends: the peer's fault, not ours
                self.sendDisconnect(transport.DISCONNECT_COMPRESSION_ERROR, b"compression error")  # type: ignore[attr-defined]
                return None
        self.incomingPacketSequence += 1
        return payload if self._views or isinstance(payload, bytes) else bytes(payload)


class EtmError(Exception):
    """A malformed or forged ETM packet; ``code`` is the disconnect reason."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class _RandomBytes:
    """Random bytes for packet padding, drawn from the kernel 8 KiB at a
    time: one ``getrandom`` per packet cost more than the padding is worth
    (each byte is still used once)."""

    def __init__(self, chunk: int = 8192) -> None:
        self.chunk = chunk
        self.pool = b""
        self.used = 0

    def take(self, count: int) -> bytes:
        if self.used + count > len(self.pool):
            self.pool, self.used = secureRandom(self.chunk), 0
        taken = self.pool[self.used:self.used + count]
        self.used += count
        return taken


_padding = _RandomBytes()


def seal(ciphers: transport.SSHCiphers, sequence: int, payload: bytes) -> bytes:
    """One ETM packet: length in clear, the rest encrypted, then the MAC of
    the sequence number, the length and the ciphertext."""
    block = max(ciphers.encBlockSize, 8)
    body = 1 + len(payload)  # padding-length byte + payload; the length field is not encrypted
    padding = block - body % block
    if padding < 4:
        padding += block
    clear = bytes((padding,)) + payload + _padding.take(padding)
    framed = struct.pack(">L", len(clear)) + ciphers.encrypt(clear)
    return framed + ciphers.makeMAC(sequence, framed)


def open_packet(ciphers: transport.SSHCiphers, sequence: int, data: bytes) -> tuple[bytes, int] | None:
    """The payload of the ETM packet at the start of ``data`` and the bytes it
    took, or None while it is incomplete.  Raises :class:`EtmError`."""
    if len(data) < 4:
        return None
    (length,) = struct.unpack(">L", data[:4])
    if length > MAX_PACKET:
        raise EtmError(transport.DISCONNECT_PROTOCOL_ERROR, f"bad packet length {length}")
    block = max(ciphers.decBlockSize, 8)
    if length < block or length % block:
        raise EtmError(transport.DISCONNECT_PROTOCOL_ERROR, f"bad packet length {length} for the block size")
    end = 4 + length
    mac_size = ciphers.verifyDigestSize
    if len(data) < end + mac_size:
        return None
    if not ciphers.verify(sequence, data[:end], data[end:end + mac_size]):
        raise EtmError(transport.DISCONNECT_MAC_ERROR, "bad MAC")
    clear = ciphers.decrypt(data[4:end])
    padding = clear[0]
    if padding < 4 or padding >= len(clear):
        raise EtmError(transport.DISCONNECT_PROTOCOL_ERROR, "bad padding length")
    return memoryview(clear)[1:len(clear) - padding], end + mac_size


def seal_aead(gcm: Gcm, parts: tuple[bytes | memoryview, ...]) -> tuple[bytes, bytes]:
    """One AES-GCM packet of the payload ``parts`` (joined), in two pieces
    to send one after the other (not joined: another copy): the length in
    clear (authenticated), then the rest encrypted and the tag."""
    body = 1 + sum(map(len, parts))
    padding = 16 - body % 16
    if padding < 4:
        padding += 16
    length = struct.pack(">L", body + padding)
    clear = b"".join((bytes((padding,)), *parts, _padding.take(padding)))
    return length, gcm.aead.encrypt(gcm.next_nonce(), clear, length)


def open_aead(gcm: Gcm, data: bytes) -> tuple[memoryview, int] | None:
    """The payload of the AES-GCM packet at the start of ``data`` (a view
    into the decrypted packet) and the bytes it took, or None while it is
    incomplete.  Raises :class:`EtmError` (nothing of a packet whose tag is
    wrong is used)."""
    if len(data) < 4:
        return None
    (length,) = struct.unpack_from(">L", data)
    if length > MAX_PACKET or length < 16 or length % 16:
        raise EtmError(transport.DISCONNECT_PROTOCOL_ERROR, f"bad packet length {length}")
    end = 4 + length + TAG_SIZE
    if len(data) < end:
        return None
    view = memoryview(data)
    try:
        clear = gcm.aead.decrypt(gcm.next_nonce(), view[4:end], view[:4])
    except InvalidTag:
        raise EtmError(transport.DISCONNECT_MAC_ERROR, "bad MAC") from None
    padding = clear[0]
    if padding < 4 or padding >= len(clear):
        raise EtmError(transport.DISCONNECT_PROTOCOL_ERROR, "bad padding length")
    return memoryview(clear)[1:len(clear) - padding], end
