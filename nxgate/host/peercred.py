"""Who is at the other end of a local (Unix) socket, from the kernel
(SO_PEERCRED): the OpenSSH door and the admin socket both decide on this,
never on what the peer says about itself."""

from __future__ import annotations

import socket
import struct
from typing import Any


def peer_uid(transport: Any) -> int | None:
    try:
        raw = transport.socket.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (AttributeError, OSError):
        return None
    return struct.unpack("3i", raw)[1]
