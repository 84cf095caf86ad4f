"""Connecting to a session's agent: the Unix socket in its session directory.

An agent that listened on TCP ``4000+N`` could be reached by every local
user, and one connection with a wrong cookie makes a new nxagent abort (it
never gets a second chance to open its display).  So the agent listens on
``<session dir>/agent.sock`` instead: the directory is the user's, 0700,
and nxagent runs with umask 077, so only that user and root (the gateway)
can connect.

The gateway connects as root into a directory the user controls, so it
must not follow a link the user put there (a link to another user's
agent would hand this client's stream, and its failed handshake, to that
agent): the socket file is opened with ``O_PATH | O_NOFOLLOW``, checked to
be a socket of the session's user (or root's), and connected to through
``/proc/self/fd``.  The peer's credentials are checked once more after the
connect.  The connect itself never blocks: a Unix connect either succeeds
at once or fails (``EAGAIN`` when the listener's backlog is full).
"""

from __future__ import annotations

import os
import socket
import stat
import struct
from collections.abc import Callable
from typing import Any


_UCRED = struct.Struct("3i")
#: A resumed agent that the gateway makes listen again (it suspended itself
#: after a failed connection) has no socket for a moment: a client that
#: comes just then waits this long for it.
WAIT_SECONDS = 3.0
_RETRY_INTERVAL = 0.1


class AgentSocketError(OSError):
    """The path is not the session's agent socket; the text says why."""


def connect(path: str, owner: int) -> socket.socket:
    """A connected, non-blocking socket to the agent listening at ``path``,
    which must belong to uid ``owner`` (or root)."""
    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISSOCK(st.st_mode):
            raise AgentSocketError(f"{path} is not a socket")
        if st.st_uid not in (owner, 0):
            raise AgentSocketError(f"{path} belongs to uid {st.st_uid}, not to the session's user {owner}")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.setblocking(False)
            sock.connect(f"/proc/self/fd/{fd}")
            _pid, uid, _gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
            if uid not in (owner, 0):
                raise AgentSocketError(f"the listener at {path} runs as uid {uid}, not as {owner}")
        except BaseException:
            sock.close()
            raise
        return sock
    finally:
        os.close(fd)


def connect_soon(reactor: Any, path: str, owner: int, done: Callable[[socket.socket | None, str], None],
                 wait: float = WAIT_SECONDS) -> None:
    """:func:`connect`, retried for ``wait`` seconds while nothing listens at
    ``path`` yet; then ``done(sock, "")`` or ``done(None, why)``, always from
    the reactor, never from inside this call."""
    deadline = reactor.seconds() + wait

    def attempt() -> None:
        try:
            sock = connect(path, owner)
        except (FileNotFoundError, ConnectionRefusedError) as error:
            if reactor.seconds() < deadline:
                reactor.callLater(_RETRY_INTERVAL, attempt)
            else:
                done(None, str(error))
        except OSError as error:
            done(None, str(error))
        else:
            done(sock, "")

    reactor.callLater(0, attempt)
