"""The framing between ``nxgate-shell`` and the gateway's local socket (pure).

In the OpenSSH deployment mode sshd runs ``nxgate-shell`` for the nx
account; it carries the NX conversation to the gateway over a Unix socket
and, after ``bye``, gets a connection to the session's agent, so that it
can hand the bulk stream to ``nxcopy`` and leave Python out of the way.
Every message is one type byte, a 4-byte big-endian length and a payload:

* ``H`` shell -> gateway, first: JSON ``{"remote": "<client address>"}``
* ``D`` both ways: conversation bytes
* ``E`` shell -> gateway: the client sent EOF
* ``S`` gateway -> shell: JSON ``{"leftover"}`` — switch to the raw stream
  on the connection to the agent that came with it (SCM_RIGHTS, sent with
  the frame or before it); ``leftover`` (base64) are stream bytes the client
  sent after ``bye`` that must reach the agent first
* ``X`` gateway -> shell: the conversation is over; payload: exit status
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

HELLO, DATA, EOF, SWITCH, EXIT = b"H", b"D", b"E", b"S", b"X"
MAX_FRAME = 1 << 20
_HEADER = struct.Struct(">cI")


class FramingError(Exception):
    pass


def frame(kind: bytes, payload: bytes = b"") -> bytes:
    return _HEADER.pack(kind, len(payload)) + payload


class Deframer:
    """Splits a byte stream into (kind, payload) frames."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> Iterator[tuple[bytes, bytes]]:
        self._buffer += data
        while len(self._buffer) >= _HEADER.size:
            kind, length = _HEADER.unpack_from(self._buffer)
            if length > MAX_FRAME or kind not in (HELLO, DATA, EOF, SWITCH, EXIT):
                raise FramingError(f"bad frame {kind!r} of {length} bytes")
            if len(self._buffer) < _HEADER.size + length:
                return
            payload = bytes(self._buffer[_HEADER.size : _HEADER.size + length])
            del self._buffer[: _HEADER.size + length]
            yield kind, payload
