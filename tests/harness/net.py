"""Loopback ports for test servers."""

from __future__ import annotations

import socket

from nxgate.session.processes import listening_inodes


def free_port() -> int:
    """A loopback port nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def listening(port: int) -> bool:
    """Whether something listens on ``port``, read from /proc: connecting to
    probe would be one more client in the server's log (xrdp, VNC servers)."""
    return bool(listening_inodes(port))
