"""Service tunnels: a session's folder and printer traffic on SSH channels
of its own, beside the NX stream instead of inside it.

Why: nxcomp's smb and cups channels ride inside the NX stream, through
nxagent's embedded proxy, whose flow control answers the client's tokens
only at its next timer in an idle session (about every 2 s): folder copies
stalled at 0.03x the same SMB copy without NX, and every IPP request of a
print job waited on the same proxy.  X2Go carries sshfs on an SSH tunnel
of its own for the same reason.

How: once its session is ready, ``nxgate-client`` asks on its NX shell
channel for a tunnel per service (:data:`REQUEST`, the service and the
session id).  The Conch door checks that the logged-in caller owns that
session and was granted the service, listens for it, and records where
here (:class:`TunnelRegistry`); the session's extras (smbnetfs for folders,
the session's cupsd for printers) connect there instead of the NX
channel's port.  Each connection the door accepts is let through only when
a process of the session's own user made it (:mod:`nxgate.local_peers`):
printers on a Unix socket (CUPS's ``ipp`` backend reaches one as
``ipp://%2Fpath...``), where the kernel says who connected
(``SO_PEERCRED``); folders on a loopback TCP port (libsmbclient knows no
other way), where the connecting socket must be a live one that a process
of the user holds.  Another local user is cut off before a byte reaches the
client, and no connection counts as the gateway's own: when the gateway
itself asks the client's print server (which printers it has), it goes
through a socket pair handed to the listener (:meth:`TunnelRegistry.connect_own`),
never through the listening socket.  The door then opens a channel of
:data:`CHANNEL` to the client, which connects it to its private Samba or its
print gate.  A client that does not ask (other NX clients, an older
nxgate-client) keeps the NX channels, as before; so does a session on
another cluster member (the registry is per process).

This module is the pure part and the registry shared by the door and the
node's extras (neither imports the other).
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

#: The channel request (on the NX shell channel) that asks for a tunnel.
REQUEST = b"service-tunnel@nxgate"
#: The channel type the server opens to the client for each connection.
CHANNEL = b"service-connection@nxgate"
#: The services that may have a tunnel (nxgate.protocols.channels.SERVICES less sound,
#: whose PulseAudio stream needs no more than the NX channel gives).
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


# ---------------------------------------------------------------- registry
class OwnConnections(Protocol):
    """The door's listener of a tunnel, as the extras see it."""

    def connect_own(self) -> socket.socket:
        """A connected socket whose other end the tunnel carries to the
        client at once, for the gateway's own requests."""


#: Where a tunnel listens: a loopback TCP port, or the path of a Unix socket.
Address = int | str


@dataclass(frozen=True)
class Tunnel:
    """Where a session's service tunnel listens, and for whom."""

    session_id: str
    user: str
    service: str
    address: Address
    owner: OwnConnections  # the door's listener that registered it (only it may remove it)


class TunnelRegistry:
    """The tunnels this process listens for, by session and service.

    The door adds one when a client asked for it and removes it when the
    client's connection goes; the extras ask for a session's tunnel.  A
    lookup names the user too: a tunnel serves only its user's session."""

    def __init__(self) -> None:
        self._tunnels: dict[tuple[str, str], Tunnel] = {}

    def add(self, tunnel: Tunnel) -> None:
        """The newest tunnel of a session's service wins (a resume from
        another connection replaces the previous client's)."""
        self._tunnels[(tunnel.session_id, tunnel.service)] = tunnel

    def remove(self, tunnel: Tunnel) -> None:
        if self._tunnels.get((tunnel.session_id, tunnel.service)) == tunnel:
            del self._tunnels[(tunnel.session_id, tunnel.service)]

    def find(self, session_id: str, user: str, service: str) -> Tunnel | None:
        tunnel = self._tunnels.get((session_id, service))
        return tunnel if tunnel is not None and tunnel.user == user else None

    def address(self, session_id: str, user: str, service: str) -> Address | None:
        tunnel = self.find(session_id, user, service)
        return tunnel.address if tunnel is not None else None

    def connect_own(self, session_id: str, user: str, service: str) -> Callable[[], socket.socket] | None:
        """How the gateway itself reaches the client's side of a session's
        tunnel (None: there is none): each call gives a connected socket
        that does not go through the listening one."""
        tunnel = self.find(session_id, user, service)
        return tunnel.owner.connect_own if tunnel is not None else None


#: The registry of this process: the Conch door adds, the node's extras read.
REGISTRY = TunnelRegistry()
