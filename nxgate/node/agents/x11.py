"""What an X server on this machine looks like from outside: its lock file
and socket paths, and the X authority file format (the MIT-MAGIC-COOKIE-1
entries root writes for a session's agent and reads back for a shadowed
console).  Pure data and byte formats: no processes, no Twisted."""

from __future__ import annotations

import socket
import struct

X_LOCK = "/tmp/.X{n}-lock"
X_SOCKET_DIR = "/tmp/.X11-unix"
X_SOCKET = "/tmp/.X11-unix/X{n}"
FAMILY_WILD = 0xFFFF
FAMILY_LOCAL = 256


def xauthority(display: int, cookie_hex: str) -> bytes:
    """X authority entries holding one MIT-MAGIC-COOKIE-1 for display ``N``.

    A "local" entry for this host (what ``xauth add :N`` writes, and all
    python-xlib looks for) and a "wild" one that matches however else a
    client reaches the display (``localhost:N``, ``unix/host:N``).
    """

    def counted(data: bytes) -> bytes:
        return struct.pack(">H", len(data)) + data

    def entry(family: int, address: bytes) -> bytes:
        return (struct.pack(">H", family) + counted(address) + counted(str(display).encode())
                + counted(b"MIT-MAGIC-COOKIE-1") + counted(bytes.fromhex(cookie_hex)))

    return entry(FAMILY_LOCAL, socket.gethostname().encode()) + entry(FAMILY_WILD, b"")


def cookie_in_xauthority(data: bytes, display: int) -> str | None:
    """The hex MIT-MAGIC-COOKIE-1 for ``display`` in Xauthority data, if any."""
    pos = 0

    def counted() -> bytes:
        nonlocal pos
        (length,) = struct.unpack_from(">H", data, pos)
        if pos + 2 + length > len(data):
            raise struct.error("truncated X authority entry")
        value = data[pos + 2 : pos + 2 + length]
        pos += 2 + length
        return value

    try:
        while pos < len(data):
            pos += 2  # family: any address may do; this machine wrote the file
            counted()
            number, name, cookie = counted(), counted(), counted()
            if number == str(display).encode() and name == b"MIT-MAGIC-COOKIE-1":
                return cookie.hex()
    except struct.error:
        return None
    return None
