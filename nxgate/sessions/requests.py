"""What callers ask the session service for (typed, already validated)."""

from __future__ import annotations

from dataclasses import dataclass, field

from nxgate.session.request import DisplaySettings, StartRequest  # moved here by the layout change

__all__ = ["DisplaySettings", "StartRequest", "RemoteRequest", "RestoreRequest", "ShadowRequest"]


@dataclass(frozen=True)
class RemoteRequest:
    """An RDP or VNC desktop asked for by a client (its agent_* values, raw)."""

    server: str
    user: str = ""
    domain: str = ""
    password: str = field(default="", repr=False)


@dataclass(frozen=True)
class RestoreRequest:
    session_id: str
    display: DisplaySettings
    encrypted: bool


@dataclass(frozen=True)
class ShadowRequest:
    target_id: str
    display: DisplaySettings
    view_only: bool
