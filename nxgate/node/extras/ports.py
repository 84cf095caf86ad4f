"""Where the session side of each granted service channel listens."""

from __future__ import annotations

from typing import Any

from nxgate import channels


def granted(session: Any) -> list[str]:
    """The services the session was granted (``session.options["services"]``)."""
    return [name for name in session.options.get("services", ()) if name in channels.CHANNELS]


def endpoints(session: Any) -> dict[str, str]:
    """service -> ``host:port`` of its channel on the session's side, for the
    granted services that have one (a display above 65535 - offset has none)."""
    found = {}
    for service in granted(session):
        port = channels.channel_port(service, session.display)
        if port is not None:
            found[service] = f"127.0.0.1:{port}"
    return found
