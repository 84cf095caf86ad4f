"""The old name of the session service, kept only until the mechanical move
(issue 12): :mod:`nxgate.sessions.shadow_sessions` and :mod:`nxgate.sessions.remote_sessions`
still name it for their type hints.  Use :class:`nxgate.sessions.service.SessionService`."""

from __future__ import annotations

from nxgate.sessions.service import SessionService

SessionManager = SessionService

__all__ = ["SessionManager"]
