"""Who is at the other end of a local connection, and whether one user's
back-channel may let it in.

A session's back-channels (the client's printers and folders reached from
the session) listen on this machine, where every local user can connect.
Only the session user's own processes may go through: anything else would
print on her printers or talk to her share.  The kernel is the only witness
we accept, never what the peer says:

* On a **Unix socket**, ``SO_PEERCRED`` gives the uid of the process that
  called ``connect()``, fixed at that moment: a peer that connects, sends
  and closes at once is still known (:func:`judge_unix`).
* On **loopback TCP** there is no such call.  The connecting socket's row in
  ``/proc/net/tcp`` gives its owner uid and inode, but a socket whose
  process closed it already is an orphan there: inode 0 and uid 0, which
  must never pass for root's (a connect-send-close from any user looks just
  like that).  So the row must show a live socket (inode not 0) of the
  session's uid, and a process of that uid must hold it, found in its
  ``/proc/PID/fd`` (:func:`judge_tcp`).  The data the peer sent is not read
  before the answer.

The parsers and judgements are pure; :func:`check_tcp` and :func:`holders`
read ``/proc`` (blocking: run them through the caller's ``blocking``), while
:func:`check_unix` asks the socket itself and does not block.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
from collections.abc import Iterable
from dataclasses import dataclass

_UCRED = struct.Struct("3i")


@dataclass(frozen=True)
class Verdict:
    """Whether a connection is let in, and the words for the log: ``who``
    made it (as far as the kernel says) and why it is (not) let in."""

    admitted: bool
    reason: str
    who: str = "an unknown peer"


@dataclass(frozen=True)
class TcpRow:
    """The connecting socket's row in ``/proc/net/tcp``: its owner and inode
    (0 for an orphan: a socket its process has closed already)."""

    uid: int
    inode: int


# ------------------------------------------------------------------ pure
def proc_address(host: str, port: int) -> str:
    """``127.0.0.1``, 5000 -> ``0100007F:1388`` as /proc/net/tcp writes it
    (IPv4 in host byte order, little-endian here; IPv6 as four such words)."""
    packed = ipaddress.ip_address(host).packed
    words = [packed[i:i + 4] for i in range(0, len(packed), 4)]
    return "".join(word[::-1].hex().upper() for word in words) + f":{port:04X}"


def tcp_row(table: str, peer: tuple[str, int], local: tuple[str, int]) -> TcpRow | None:
    """The row of the socket at ``peer`` connected to ``local`` (our accepted
    end), from the text of /proc/net/tcp or tcp6; None when it is not there
    (gone already, or not on this machine)."""
    wanted = (proc_address(*peer), proc_address(*local))
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 9 and (fields[1], fields[2]) == wanted:
            try:
                return TcpRow(int(fields[7]), int(fields[9]))
            except ValueError:
                return None
    return None


def judge_tcp(row: TcpRow | None, holder: int | None, uid: int) -> Verdict:
    """Whether a loopback TCP peer may use ``uid``'s back-channel: its socket
    is live (not an orphan), belongs to ``uid``, and ``holder`` (a pid of
    ``uid`` holding it, None if none was found) still holds it."""
    if row is None:
        return Verdict(False, "its socket is not in the kernel's table (gone already, or not from this machine)")
    if row.inode == 0:
        return Verdict(False, "its process had closed it already (an orphaned socket, listed as uid 0, tells "
                              "nobody's connection from another's)", "a socket closed by its process")
    if row.uid != uid:
        return Verdict(False, "another user's socket", f"uid {row.uid}")
    if holder is None:
        return Verdict(False, f"no process of the user holds its socket (inode {row.inode}) any more", f"uid {uid}")
    return Verdict(True, f"pid {holder} of the session's user holds its socket", f"uid {uid}")


def judge_unix(credentials: tuple[int, int, int] | None, uid: int) -> Verdict:
    """Whether a Unix-socket peer (``(pid, uid, gid)`` from ``SO_PEERCRED``,
    None if unknown) may use ``uid``'s back-channel."""
    if credentials is None:
        return Verdict(False, "the kernel does not say who connected")
    pid, peer_uid, _gid = credentials
    if peer_uid != uid:
        return Verdict(False, f"pid {pid} of another user connected", f"uid {peer_uid}")
    return Verdict(True, f"pid {pid} of the session's user connected", f"uid {uid}")


def socket_link(inode: int) -> str:
    """What ``/proc/PID/fd/N`` reads for a socket."""
    return f"socket:[{inode}]"


# -------------------------------------------------------------- blocking
def read_tcp_row(peer: tuple[str, int], local: tuple[str, int], proc: str = "/proc") -> TcpRow | None:
    """:func:`tcp_row` from this machine's table (blocking)."""
    table = os.path.join(proc, "net", "tcp6" if ":" in peer[0] else "tcp")
    try:
        with open(table, encoding="ascii", errors="replace") as handle:
            return tcp_row(handle.read(), peer, local)
    except OSError:
        return None


def holders(inodes: Iterable[int], uid: int | None = None, proc: str = "/proc",
            first_only: bool = False) -> dict[int, set[int]]:
    """inode -> the pids holding that socket (a scan of ``/proc/*/fd``;
    blocking).  ``uid``: only that user's processes are looked into (the
    owner of ``/proc/PID``); ``first_only``: stop at the first holder found."""
    wanted = {socket_link(inode): inode for inode in inodes if inode}
    found: dict[int, set[int]] = {}
    if not wanted:
        return found
    try:
        entries = os.listdir(proc)
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        directory = os.path.join(proc, entry)
        try:
            if uid is not None and os.stat(directory).st_uid != uid:
                continue
            descriptors = os.listdir(os.path.join(directory, "fd"))
        except OSError:
            continue  # it ended meanwhile: routine in a scan
        for fd in descriptors:
            try:
                inode = wanted.get(os.readlink(os.path.join(directory, "fd", fd)))
            except OSError:
                continue  # the descriptor closed meanwhile
            if inode is not None:
                found.setdefault(inode, set()).add(int(entry))
                if first_only:
                    return found
    return found


def check_tcp(peer: tuple[str, int], local: tuple[str, int], uid: int, proc: str = "/proc") -> Verdict:
    """The verdict on the loopback TCP connection from ``peer`` that we
    accepted at ``local``, for ``uid``'s back-channel (blocking: /proc)."""
    row = read_tcp_row(peer, local, proc)
    holder = None
    if row is not None and row.inode and row.uid == uid:
        held = holders([row.inode], uid, proc, first_only=True).get(row.inode)
        holder = min(held) if held else None
    return judge_tcp(row, holder, uid)


def peer_credentials(sock: socket.socket) -> tuple[int, int, int] | None:
    """``(pid, uid, gid)`` of a Unix socket's peer, from the kernel (fixed at
    its ``connect()``); None if the socket cannot say."""
    try:
        return _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    except (OSError, struct.error):
        return None


def check_unix(sock: socket.socket, uid: int) -> Verdict:
    """The verdict on a connection accepted on a Unix socket, for ``uid``'s
    back-channel (does not block)."""
    return judge_unix(peer_credentials(sock), uid)
