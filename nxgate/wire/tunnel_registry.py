"""Service tunnels: a session's folder and printer traffic on SSH channels
of its own, beside the NX stream instead of inside it (issue 25).

Why: nxcomp's smb and cups channels ride inside the NX stream, through
nxagent's embedded proxy, whose flow control answers the client's tokens
only at its next timer in an idle session (about every 2 s): folder copies
stalled at 0.03x the same SMB copy without NX, and every IPP request of a
print job waited on the same proxy.  X2Go carries sshfs on an SSH tunnel
of its own for the same reason.

How: once its session is ready, ``nxgate-client`` asks on its NX shell
channel for a tunnel per service (:data:`REQUEST`, the service and the
session id).  The Conch door checks that the logged-in caller owns that
session and was granted the service, listens on a fresh loopback port for
it, and records the port here (:class:`TunnelRegistry`); the session's
extras (smbnetfs for folders, the session's cupsd for printers) connect to
that port instead of the NX channel's.  Each connection the door accepts
there is let through only when it comes from a process of the session's
own user (:func:`peer_uid`, the kernel's socket table): another local user
is cut off before a byte reaches the client, where before, the NX
channel's port was open to everyone and only the client's SMB password or
print credential stood in the way (they still do).  The door then opens a
channel of :data:`CHANNEL` to the client, which connects it to its private
Samba or its print gate.  A client that does not ask (other NX clients, an
older nxgate-client) keeps the NX channels, as before; so does a session
on another cluster member (the registry is per process).

This module is the pure part and the registry shared by the door and the
node's extras (neither imports the other).
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

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


# ------------------------------------------------------- who is connecting
def _proc_address(host: str, port: int) -> str:
    """``127.0.0.1``, 5000 -> ``0100007F:1388`` as /proc/net/tcp writes it
    (IPv4 in host byte order, little-endian here; IPv6 as four such words)."""
    packed = ipaddress.ip_address(host).packed
    words = [packed[i:i + 4] for i in range(0, len(packed), 4)]
    return "".join(word[::-1].hex().upper() for word in words) + f":{port:04X}"


def peer_uid(table: str, peer: tuple[str, int], local: tuple[str, int]) -> int | None:
    """The uid owning the socket at ``peer`` that is connected to ``local``
    (our accepted end), from the text of /proc/net/tcp or tcp6; None when
    it is not there (gone already, or not on this machine)."""
    wanted = (_proc_address(*peer), _proc_address(*local))
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 7 and (fields[1], fields[2]) == wanted:
            try:
                return int(fields[7])
            except ValueError:
                return None
    return None


def read_peer_uid(peer: tuple[str, int], local: tuple[str, int]) -> int | None:
    """:func:`peer_uid` from this machine's table (blocking: run it in a thread)."""
    table = "/proc/net/tcp6" if ":" in peer[0] else "/proc/net/tcp"
    with open(table, encoding="ascii", errors="replace") as handle:
        return peer_uid(handle.read(), peer, local)


# ---------------------------------------------------------------- registry
@dataclass(frozen=True)
class Tunnel:
    """Where a session's service tunnel listens, and for whom."""

    session_id: str
    user: str
    service: str
    port: int
    owner: object  # the door's listener that registered it (only it may remove it)


class TunnelRegistry:
    """The tunnels this process listens for, by session and service.

    The door adds one when a client asked for it and removes it when the
    client's connection goes; the extras ask for a session's port.  A
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

    def port(self, session_id: str, user: str, service: str) -> int | None:
        tunnel = self._tunnels.get((session_id, service))
        return tunnel.port if tunnel is not None and tunnel.user == user else None


#: The registry of this process: the Conch door adds, the node's extras read.
REGISTRY = TunnelRegistry()
