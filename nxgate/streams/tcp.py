"""TCP settings shared by every connection that carries NX or cluster traffic."""

from __future__ import annotations

from typing import Any


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
