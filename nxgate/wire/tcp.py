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


_WRAPPER_TYPES: tuple[type, type] | None = None


def _wrapper_types() -> tuple[type, type]:
    """Twisted's FileDescriptor and ProtocolWrapper, imported at the first
    use (the client's start-up needs neither module)."""
    global _WRAPPER_TYPES
    if _WRAPPER_TYPES is None:
        from twisted.internet.abstract import FileDescriptor
        from twisted.protocols.policies import ProtocolWrapper

        _WRAPPER_TYPES = (FileDescriptor, ProtocolWrapper)
    return _WRAPPER_TYPES


def socket_transport(transport: Any) -> Any:
    """The TCP or Unix socket transport that ``transport`` writes through
    unchanged (through Twisted's plain protocol wrappers, whose ``write``
    only forwards), or None: TLS and other wrappers that transform what
    they write, test transports.  (A wrapper answers any attribute of the
    transport under it, ``socket`` too: only the type tells.)"""
    descriptor, wrapper = _WRAPPER_TYPES or _wrapper_types()
    while isinstance(transport, wrapper) and type(transport).write is wrapper.write:
        transport = transport.transport
    return transport if isinstance(transport, descriptor) and hasattr(transport, "socket") else None


def send_now(transport: Any, *pieces: bytes | memoryview) -> None:
    """``transport.write`` of ``pieces`` (joined), but the bytes go to the
    socket at once when nothing waits before them, instead of at the
    reactor's next turn, and several pieces in one ``sendmsg`` (no join).

    Twisted buffers every write until the socket is next reported writable:
    a request passing through one of our processes cost a round of the
    reactor (``epoll_ctl`` to watch for writing, ``epoll_wait``, the send,
    ``epoll_ctl`` again) at each hop, and what one read brought went out
    only once all of it was handled, so the next process in a chain (the
    client's SSH end, the gateway's, the session's program) started only
    then.  What the socket does not take now is buffered as before, with
    Twisted's flow control; an error is left for Twisted to find.  A piece
    may be a view (of a packet just opened): it is copied only into what
    waits."""
    target = socket_transport(transport)
    if target is None or not target.connected or target.disconnecting or target._writeDisconnected \
            or target._tempDataBuffer or target.offset < len(target.dataBuffer):
        transport.write(_rest(pieces, 0))
        return
    try:  # all of it: Twisted's writeSomeData sends 128 KiB at most
        sent = target.socket.send(pieces[0]) if len(pieces) == 1 else target.socket.sendmsg(pieces)
    except OSError:  # would block, or an error Twisted's next attempt meets and closes the connection on
        sent = 0
    if sent < sum(map(len, pieces)):
        transport.write(_rest(pieces, sent))


def _rest(pieces: tuple[bytes | memoryview, ...], skip: int) -> bytes:
    """The bytes of ``pieces`` after the first ``skip``, as one ``bytes``."""
    if len(pieces) == 1 and not skip and isinstance(pieces[0], bytes):
        return pieces[0]
    rest = []
    for piece in pieces:
        if skip >= len(piece):
            skip -= len(piece)
            continue
        rest.append(memoryview(piece)[skip:] if skip else piece)
        skip = 0
    return b"".join(rest)


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
