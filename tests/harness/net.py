"""Loopback ports and Unix sockets for test servers."""

from __future__ import annotations

import os
import socket

from nxgate.host.processes import listening_inodes
from tests.harness.process import wait_for


def free_port() -> int:
    """A loopback port nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def listen_when_free(port: int, timeout: float = 10.0) -> socket.socket:
    """A loopback listener on ``port``, once whoever held it has let go (an
    agent the test killed, so that the test plays the agent's end)."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

    def bound() -> bool:
        try:
            listener.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True

    try:
        wait_for(bound, timeout, f"port {port} to be free", interval=0.02)
    except BaseException:
        listener.close()
        raise
    listener.listen(1)
    return listener


def listen_unix_when_free(path: str, timeout: float = 10.0) -> socket.socket:
    """A listener at ``path``, an agent's socket in its session directory,
    once the gateway has cleaned up after the agent the test killed (it
    removes the directory), so that the test plays the agent's end.  The
    directory is made again, root's: the gateway relays to a socket of the
    session's user or of root."""
    directory = os.path.dirname(path)
    wait_for(lambda: not os.path.exists(directory), timeout, f"{directory} to be removed", interval=0.02)
    os.mkdir(directory, 0o700)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
        listener.listen(1)
    except BaseException:
        listener.close()
        raise
    return listener


def listening(port: int) -> bool:
    """Whether something listens on ``port``, read from /proc: connecting to
    probe would be one more client in the server's log (xrdp, VNC servers)."""
    return bool(listening_inodes(port))
