"""Where the session side of each granted service channel listens."""

from __future__ import annotations

import socket
from typing import Any

from nxgate.protocols import service_channels


def granted(session: Any) -> list[str]:
    """The services the session was granted (``session.options["services"]``)."""
    return [name for name in session.options.get("services", ()) if name in service_channels.CHANNELS]


def port_free(port: int) -> bool:
    """Whether nothing listens on 127.0.0.1:``port`` (nxcomp aborts the whole
    session when it cannot bind a channel's port, so a taken one is left out)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def openable(services: list[str], display: int) -> tuple[list[str], list[str]]:
    """(services whose channel port is free for ``display``, those whose is not)."""
    kept, dropped = [], []
    for service in services:
        port = service_channels.channel_port(service, display)
        (kept if port is not None and port_free(port) else dropped).append(service)
    return kept, dropped


def endpoints(session: Any) -> dict[str, str]:
    """service -> ``host:port`` of its channel on the session's side, for the
    granted services that have one (a display above 65535 - offset has none)."""
    found = {}
    for service in granted(session):
        port = service_channels.channel_port(service, session.display)
        if port is not None:
            found[service] = f"127.0.0.1:{port}"
    return found
