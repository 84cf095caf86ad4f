"""TCP settings shared by every connection that carries NX or cluster traffic."""

from __future__ import annotations

import socket
from typing import Any

#: Reads below this size are acknowledged at once (:func:`quick_ack`).
QUICK_ACK_BELOW = 4096


def no_delay(transport: Any) -> None:
    """Send small writes at once (TCP_NODELAY) on the TCP connection under
    ``transport`` (a TLS wrapper forwards to it); nothing on other kinds
    (Unix sockets, test transports).

    The NX stream after ``bye`` and the cluster's AMP and streams carry
    small request/answer messages: the smb channel's SMB calls went from
    0.3-0.7 MB/s with Nagle's delays to ~10 MB/s without
    (bench/sharing_copy.py), and a small write right after another may wait
    for the peer's delayed ACK, up to 40 ms on Linux.  Bulk transfers are
    unaffected: their writes fill segments anyway, and SSH sends whole
    packets."""
    set_it = getattr(transport, "setTcpNoDelay", None)
    if set_it is not None:
        set_it(True)


def quick_ack(transport: Any, read: int) -> None:
    """Acknowledge a small read at once (TCP_QUICKACK) on the TCP connection
    under ``transport``; nothing on other kinds.

    A client that leaves Nagle's algorithm on (paramiko, so python-x2go and
    pyhoca-cli) holds a small message back until the one before it is
    acknowledged, and Linux delays the acknowledgement of a read it has no
    answer for by up to 40 ms: pyhoca-cli's exec requests took 44 ms each
    instead of 0.8 ms (about nine of them, and the key exchange, in every
    operation).  The mode is not kept by the kernel, so it is set again
    after each read; bulk reads keep delayed acknowledgements."""
    if read >= QUICK_ACK_BELOW:
        return
    handle = getattr(transport, "getHandle", None)
    sock = handle() if handle is not None else None
    if isinstance(sock, socket.socket) and sock.family in (socket.AF_INET, socket.AF_INET6):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        except OSError:
            pass  # the connection is going away
