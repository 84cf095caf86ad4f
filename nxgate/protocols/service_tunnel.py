"""nxgate-client's words for taking a session's printers and folders back over its own SSH connection.

After the session is ready (before ``addmount``), ``nxgate-client`` sends
:data:`REQUEST` on its NX shell channel with the service and the session
id; the server grants it when that login owns the session and was granted
the service, and then opens a channel of :data:`CHANNEL` (the same two
fields) to the client for each connection the session makes to the
service: the session's end of nxgate's reverse streams
(:mod:`nxgate.streams.reverse`), the client's end its private Samba or its
print gate.  These names are on the wire between two versions of nxgate:
they stay.  Pure.
"""

from __future__ import annotations

import struct

#: The channel request (on the NX shell channel) that asks for a tunnel.
REQUEST = b"service-tunnel@nxgate"
#: The channel type the server opens to the client for each connection.
CHANNEL = b"service-connection@nxgate"
#: The services nxgate-client may take back this way (its sound stays on the NX media channel).
SERVICES = ("printing", "sharing")
MAX_FIELD = 64


class TunnelRequestError(ValueError):
    """A tunnel request or channel payload that cannot be read."""


def _string(value: bytes) -> bytes:
    return struct.pack(">L", len(value)) + value


def _strings(data: bytes, count: int) -> list[str]:
    found, rest = [], data
    for _ in range(count):
        if len(rest) < 4:
            raise TunnelRequestError("truncated")
        (length,) = struct.unpack(">L", rest[:4])
        if length > MAX_FIELD or len(rest) < 4 + length:
            raise TunnelRequestError("a field is too long or truncated")
        try:
            found.append(rest[4:4 + length].decode("ascii"))
        except UnicodeDecodeError:
            raise TunnelRequestError("not ASCII") from None
        rest = rest[4 + length:]
    if rest:
        raise TunnelRequestError("trailing bytes")
    return found


def encode(service: str, session_id: str) -> bytes:
    """The payload of a :data:`REQUEST` and of a :data:`CHANNEL` open."""
    return _string(service.encode("ascii")) + _string(session_id.encode("ascii"))


def decode(data: bytes) -> tuple[str, str]:
    """(service, session id) of a payload; TunnelRequestError for anything
    but a known service and a 32-hex-digit id."""
    service, session_id = _strings(data, 2)
    if service not in SERVICES:
        raise TunnelRequestError(f"unknown service {service[:32]!r}")
    if len(session_id) != 32 or any(c not in "0123456789ABCDEFabcdef" for c in session_id):
        raise TunnelRequestError("not a session id")
    return service, session_id.upper()
