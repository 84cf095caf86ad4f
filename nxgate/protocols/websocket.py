"""WebSocket (RFC 6455) for the browser viewer: a pure framing core, one-time
tickets, and the thin twisted.web wrapper that takes over the connection.

Why our own and not autobahn: the viewer needs binary messages, ping/pong
and a clean close, nothing else (no extensions, no text, no client side);
that is a page of code we can test exhaustively, and the upgrade then runs
inside twisted.web's own ``render`` where the login cookie, the Origin and
the ticket are checked with the request object the portal already knows.

The core (:func:`accept_key`, :class:`FrameParser`, :func:`encode_frame`,
:class:`Tickets`) does no I/O.  :func:`upgrade` answers ``101`` and hands the
TCP/TLS transport from twisted.web's HTTP channel to a
:class:`WebSocketConnection`.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from twisted.internet import protocol
from twisted.logger import Logger
from twisted.protocols.policies import ProtocolWrapper

log = Logger()

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

CONTINUATION, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
CONTROL = frozenset({CLOSE, PING, PONG})

# Close codes (RFC 6455 §7.4.1) and ours (4000-4999: private use).
NORMAL, GOING_AWAY, PROTOCOL_ERROR, UNSUPPORTED, INVALID_DATA, TOO_BIG, INTERNAL = 1000, 1001, 1002, 1003, 1007, 1009, 1011
REFUSED = 4001      # the session cannot be shown (taken, gone, not yours, limits): the reason says which
VIEWER_ENDED = 4002  # the viewer's programs or the session ended

#: What one message from the browser may weigh: RFB client messages are
#: small; a clipboard paste is the largest.
MAX_MESSAGE = 4 * 1024 * 1024


class WebSocketError(Exception):
    """The peer broke the protocol: close with ``code``."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def accept_key(key: str) -> str | None:
    """The ``Sec-WebSocket-Accept`` for a client's ``Sec-WebSocket-Key`` (None: not a valid key)."""
    try:
        raw = base64.b64decode(key.strip().encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        return None
    if len(raw) != 16:
        return None
    return base64.b64encode(hashlib.sha1(key.strip().encode("ascii") + GUID).digest()).decode("ascii")


def unmask(mask: bytes, payload: bytes) -> bytes:
    """XOR ``payload`` with the repeated 4-byte ``mask`` (big integers: fast in CPython)."""
    if not payload:
        return b""
    n = len(payload)
    key = (mask * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(key, "big")).to_bytes(n, "big")


def encode_frame(opcode: int, payload: bytes = b"", mask: bytes | None = None) -> bytes:
    """One final frame (servers send unmasked; ``mask`` is for tests playing the browser)."""
    n = len(payload)
    head = bytes([0x80 | opcode])
    bit = 0x80 if mask is not None else 0
    if n < 126:
        head += bytes([bit | n])
    elif n < 65536:
        head += bytes([bit | 126]) + struct.pack(">H", n)
    else:
        head += bytes([bit | 127]) + struct.pack(">Q", n)
    if mask is not None:
        return head + mask + unmask(mask, payload)
    return head + payload


def close_payload(code: int, reason: str = "") -> bytes:
    return struct.pack(">H", code) + reason.encode("utf-8")[:120]


@dataclass(frozen=True)
class Message:
    opcode: int  # TEXT, BINARY, CLOSE, PING or PONG
    payload: bytes

    @property
    def close_code(self) -> int | None:
        return struct.unpack(">H", self.payload[:2])[0] if self.opcode == CLOSE and len(self.payload) >= 2 else None


class FrameParser:
    """Bytes from a browser in, whole messages out (fragments joined)."""

    def __init__(self, max_message: int = MAX_MESSAGE) -> None:
        self.max_message = max_message
        self.buffer = b""
        self.fragments: list[bytes] = []
        self.fragment_opcode: int | None = None
        self.size = 0

    def feed(self, data: bytes) -> list[Message]:
        self.buffer += data
        out: list[Message] = []
        while True:
            message = self._one()
            if message is None:
                return out
            if message is not _NOTHING:
                out.append(message)

    def _one(self) -> Any:
        buf = self.buffer
        if len(buf) < 2:
            return None
        first, second = buf[0], buf[1]
        fin, opcode = bool(first & 0x80), first & 0x0F
        if first & 0x70:
            raise WebSocketError(PROTOCOL_ERROR, "reserved bits set (no extension was agreed)")
        if not second & 0x80:
            raise WebSocketError(PROTOCOL_ERROR, "a browser's frames must be masked")
        length, offset = second & 0x7F, 2
        if length == 126:
            if len(buf) < 4:
                return None
            length, offset = struct.unpack(">H", buf[2:4])[0], 4
        elif length == 127:
            if len(buf) < 10:
                return None
            length, offset = struct.unpack(">Q", buf[2:10])[0], 10
            if length >> 63:
                raise WebSocketError(PROTOCOL_ERROR, "frame length out of range")
        if opcode in CONTROL:
            if not fin or length > 125:
                raise WebSocketError(PROTOCOL_ERROR, "control frames are single and short")
        elif opcode not in (CONTINUATION, TEXT, BINARY):
            raise WebSocketError(PROTOCOL_ERROR, f"unknown opcode {opcode}")
        if self.size + length > self.max_message:
            raise WebSocketError(TOO_BIG, "message too big")
        if len(buf) < offset + 4 + length:
            return None
        mask = buf[offset:offset + 4]
        payload = unmask(mask, buf[offset + 4:offset + 4 + length])
        self.buffer = buf[offset + 4 + length:]
        if opcode in CONTROL:
            if opcode == CLOSE and len(payload) == 1:
                raise WebSocketError(PROTOCOL_ERROR, "a close frame's code has two bytes")
            return Message(opcode, payload)
        if opcode == CONTINUATION:
            if self.fragment_opcode is None:
                raise WebSocketError(PROTOCOL_ERROR, "continuation without a start")
        elif self.fragment_opcode is not None:
            raise WebSocketError(PROTOCOL_ERROR, "a new message inside a fragmented one")
        else:
            self.fragment_opcode = opcode
        self.fragments.append(payload)
        self.size += length
        if not fin:
            return _NOTHING
        whole = Message(self.fragment_opcode, b"".join(self.fragments))
        self.fragments, self.fragment_opcode, self.size = [], None, 0
        if whole.opcode == TEXT:
            try:
                whole.payload.decode("utf-8")
            except UnicodeDecodeError:
                raise WebSocketError(INVALID_DATA, "text message is not UTF-8") from None
        return whole


_NOTHING = Message(-1, b"")


# ----------------------------------------------------------------------------------------------------------
# One-time tickets


@dataclass(frozen=True)
class Ticket:
    """What a browser may open with one WebSocket: issued by a POST of the
    logged-in page (CSRF-checked), taken once at the upgrade."""

    user: str
    login: str       # which login (browser) asked: the upgrade must come from the same one
    session_id: str
    purpose: str     # "open" (take over) or "shadow"
    width: int
    height: int
    expires: float


class Tickets:
    """Outstanding tickets, kept by the SHA-256 of their secret (a dict
    lookup by the secret itself would compare it byte by byte)."""

    TTL = 30.0
    PER_USER = 8

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.pending: dict[bytes, Ticket] = {}

    @staticmethod
    def _key(secret: str) -> bytes:
        return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).digest()

    def _expire(self) -> None:
        now = self.clock()
        for key in [key for key, ticket in self.pending.items() if ticket.expires <= now]:
            del self.pending[key]

    def issue(self, user: str, login: str, session_id: str, purpose: str, width: int, height: int) -> str:
        self._expire()
        mine = [key for key, ticket in self.pending.items() if ticket.user == user]
        for key in mine[: max(0, len(mine) - self.PER_USER + 1)]:  # the oldest go first
            del self.pending[key]
        secret = secrets.token_urlsafe(32)
        self.pending[self._key(secret)] = Ticket(user, login, session_id, purpose, width, height,
                                                 self.clock() + self.TTL)
        return secret

    def take(self, secret: str) -> Ticket | None:
        """The ticket (now used up), or None: unknown, used or expired."""
        self._expire()
        if not secret or len(secret) > 100:
            return None
        return self.pending.pop(self._key(secret), None)


# ----------------------------------------------------------------------------------------------------------
# Twisted


class MessageHandler(Protocol):
    def ws_message(self, payload: bytes) -> None: ...

    def ws_closed(self, code: int | None, reason: str) -> None: ...


class WebSocketConnection(protocol.Protocol):
    """The connection after the upgrade: binary messages to ``handler``,
    :meth:`send` back; pings answered; closes handshaked."""

    def __init__(self, reactor: Any, handler: MessageHandler | None = None, max_message: int = MAX_MESSAGE) -> None:
        self.reactor = reactor
        self.handler = handler
        self._abort_call: Any = None
        self.parser = FrameParser(max_message)
        self.closing = False
        self.gone = False

    def dataReceived(self, data: bytes) -> None:
        if self.gone:
            return
        try:
            messages = self.parser.feed(data)
        except WebSocketError as error:
            log.info("WebSocket protocol error from the browser: {reason}", reason=error.reason)
            self.close(error.code, error.reason)
            return
        for message in messages:
            if message.opcode == PING:
                self.transport.write(encode_frame(PONG, message.payload))
            elif message.opcode == CLOSE:
                if not self.closing:
                    self.closing = True
                    self.transport.write(encode_frame(CLOSE, message.payload[:2]))
                self.transport.loseConnection()
                self._finish(message.close_code, message.payload[2:].decode("utf-8", "replace"))
                return
            elif message.opcode in (BINARY, TEXT) and self.handler is not None:
                self.handler.ws_message(message.payload)

    def send(self, payload: bytes) -> None:
        if not self.closing and not self.gone:
            self.transport.write(encode_frame(BINARY, payload))

    def close(self, code: int = NORMAL, reason: str = "") -> None:
        """Start the closing handshake; the TCP connection goes after a short wait at most."""
        if self.closing or self.gone:
            return
        self.closing = True
        self.transport.write(encode_frame(CLOSE, close_payload(code, reason)))
        self._abort_call = self.reactor.callLater(2.0, self.transport.abortConnection)
        self._finish(code, reason)

    def connectionLost(self, reason: Any = protocol.connectionDone) -> None:
        if self._abort_call is not None and self._abort_call.active():
            self._abort_call.cancel()
        self._finish(None, "connection lost")
        self.gone = True

    def _finish(self, code: int | None, reason: str) -> None:
        handler, self.handler = self.handler, None
        if handler is not None:
            handler.ws_closed(code, reason)


def handshake_problem(request: Any) -> str | None:
    """Why ``request`` is not a WebSocket upgrade we take (None: it is)."""
    header = request.getHeader
    if request.method != b"GET":
        return "not a GET"
    if "websocket" not in (header(b"upgrade") or b"").decode("latin-1").lower():
        return "no Upgrade: websocket"
    if "upgrade" not in (header(b"connection") or b"").decode("latin-1").lower():
        return "no Connection: upgrade"
    if (header(b"sec-websocket-version") or b"").strip() != b"13":
        return "not WebSocket version 13"
    if accept_key((header(b"sec-websocket-key") or b"").decode("latin-1")) is None:
        return "bad Sec-WebSocket-Key"
    return None


def upgrade(request: Any, connection: WebSocketConnection) -> None:
    """Answer ``101 Switching Protocols`` to a checked ``request`` and give
    its transport to ``connection``.  The caller returns
    ``server.NOT_DONE_YET`` from ``render``: twisted.web never hears of this
    request again."""
    key = (request.getHeader(b"sec-websocket-key") or b"").decode("latin-1")
    offered = [p.strip() for p in (request.getHeader(b"sec-websocket-protocol") or b"").decode("latin-1").split(",")]
    lines = [b"HTTP/1.1 101 Switching Protocols", b"Upgrade: websocket", b"Connection: Upgrade",
             b"Sec-WebSocket-Accept: " + (accept_key(key) or "").encode("ascii")]
    if "binary" in offered:  # noVNC asks for it; a browser fails a connection whose protocol is not echoed
        lines.append(b"Sec-WebSocket-Protocol: binary")
    channel = request.channel
    transport = channel.transport
    channel.setTimeout(None)
    # twisted.web's channel registered itself as the connection's producer (Twisted >= 22); it goes,
    # so that the WebSocket's handler can register its own (flow control with the VNC side).
    transport.unregisterProducer()
    channel.transport = None  # twisted.web lets go of the connection
    if isinstance(transport, ProtocolWrapper):  # TLS
        transport.wrappedProtocol = connection
    else:
        transport.protocol = connection
    connection.makeConnection(transport)
    transport.write(b"\r\n".join(lines) + b"\r\n\r\n")
    # twisted.web pauses the connection while it serves a request; no request follows this one.
    resume = getattr(transport, "resumeProducing", None)
    if resume is not None:
        resume()


#: What an RFB 3.8 server says first.
RFB_VERSION = b"RFB 003.008\n"


def rfb_refusal(reason: str) -> bytes:
    """An RFB 3.8 server's "no security types" answer with ``reason`` (UTF-8,
    at most 1000 bytes): how a viewer that cannot start says why, in the
    protocol noVNC already speaks (its ``securityfailure`` event carries the
    text to the page), after the client's version line."""
    text = reason.encode("utf-8")[:1000]
    return b"\x00" + struct.pack(">I", len(text)) + text
