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
"""

from __future__ import annotations

import struct
from hashlib import sha256, sha512
from typing import Any

from twisted.conch.ssh import transport
from twisted.python.randbytes import secureRandom

ETM_MACS = {
    b"hmac-sha2-512-etm@openssh.com": sha512,
    b"hmac-sha2-256-etm@openssh.com": sha256,
}
#: The longest packet we accept, as Conch (RFC 4253 asks for 35000 at least).
MAX_PACKET = 1048576


def is_etm(mac_name: bytes | None) -> bool:
    return mac_name in ETM_MACS


class EtmCiphers(transport.SSHCiphers):
    """Conch's cipher state, knowing the ETM MAC names (same HMACs)."""

    macMap = {**transport.SSHCiphers.macMap, **ETM_MACS}


class EtmTransport:
    """Mixin before an ``SSHTransportBase`` subclass: sends and reads ETM
    packets whenever the negotiated MAC of that direction is an ETM one."""

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
        if not is_etm(ciphers.outMACType):
            super().sendPacket(messageType, payload)  # type: ignore[misc]
            return
        state = self._keyExchangeState  # type: ignore[attr-defined]
        if state != self._KEY_EXCHANGE_NONE and not self._allowedKeyExchangeMessageType(messageType):  # type: ignore[attr-defined]
            self._blockedByKeyExchange.append((messageType, payload))  # type: ignore[attr-defined]
            return
        data = bytes((messageType,)) + payload
        if self.outgoingCompression:
            data = self.outgoingCompression.compress(data) + self.outgoingCompression.flush(2)
        self.transport.write(seal(ciphers, self.outgoingPacketSequence, data))
        self.outgoingPacketSequence += 1

    def getPacket(self) -> bytes | None:
        ciphers = self.currentEncryptions
        if not is_etm(ciphers.inMACType):
            return super().getPacket()  # type: ignore[misc]
        try:
            opened = open_packet(ciphers, self.incomingPacketSequence, self.buf)
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
        return payload


class EtmError(Exception):
    """A malformed or forged ETM packet; ``code`` is the disconnect reason."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def seal(ciphers: transport.SSHCiphers, sequence: int, payload: bytes) -> bytes:
    """One ETM packet: length in clear, the rest encrypted, then the MAC of
    the sequence number, the length and the ciphertext."""
    block = max(ciphers.encBlockSize, 8)
    body = 1 + len(payload)  # padding-length byte + payload; the length field is not encrypted
    padding = block - body % block
    if padding < 4:
        padding += block
    clear = bytes((padding,)) + payload + secureRandom(padding)
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
    return clear[1:len(clear) - padding], end + mac_size
