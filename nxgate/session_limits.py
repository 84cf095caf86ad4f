"""Admission policy: how many sessions, for whom, and on which node.

Pure decisions over the live sessions the caller passes in; the life cycle
asks :meth:`SessionLimits.check` in the same reactor turn as it registers the new
session, so two starts cannot both take the last place.  ``config`` is a
callable because a reload replaces the configuration.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from nxgate.config import Config
from nxgate.vocabulary.model import Session
from nxgate.vocabulary.caller import Caller
from nxgate.vocabulary.errors import ErrorKind, SessionError


def limit_reached(which: str, user: str) -> SessionError:
    """The refusal for a reached limit: ``which`` is "user", "node" (this
    server's ``max_sessions``) or "total" (as the store's ``admit`` says)."""
    if which == "user":
        return SessionError(ErrorKind.LIMIT_REACHED, f"Server capacity: reached for user: {user}")
    return SessionError(ErrorKind.LIMIT_REACHED, "Reached the maximum number of concurrent sessions on this server.")


class SessionLimits:
    def __init__(self, config: Callable[[], Config]) -> None:
        self.config = config
        self.draining = False  # set by the admin: no new sessions, existing ones carry on

    def user_limit(self, user: str, groups: frozenset[str] = frozenset()) -> int:
        """How many live sessions ``user`` may have (0: no limit): his own
        ``[limits] user.NAME``, else the largest ``group.NAME`` of his
        ``groups`` (resolved at login), else ``max_sessions_per_user``."""
        config = self.config()
        limits = config.limits
        if f"user.{user}" in limits:
            return limits[f"user.{user}"]
        by_group = [limits[f"group.{group}"] for group in sorted(groups) if f"group.{group}" in limits]
        if by_group:
            return 0 if 0 in by_group else max(by_group)
        return config.sessions.max_sessions_per_user

    def check(self, caller: Caller, sessions: Iterable[Session]) -> None:
        """Raise LIMIT_REACHED if ``caller`` may not start one more session."""
        live = [s for s in sessions if s.state.live]
        settings = self.config().sessions
        if self.draining:
            raise SessionError(ErrorKind.LIMIT_REACHED, "This server takes no new sessions at the moment (maintenance).")
        if settings.max_sessions and len(live) >= settings.max_sessions:
            raise limit_reached("node", caller.user)
        per_user = self.user_limit(caller.user, caller.groups)
        if per_user and sum(1 for s in live if s.user == caller.user) >= per_user:
            raise limit_reached("user", caller.user)

    def at_capacity(self, caller: Caller, sessions: Iterable[Session]) -> bool:
        try:
            self.check(caller, sessions)
        except SessionError:
            return True
        return False

    def admission(self, caller: Caller) -> tuple[int, int, int]:
        """(per user, per node, total) for the store's ``admit`` (0: none)."""
        return self.user_limit(caller.user, caller.groups), self.config().sessions.max_sessions, 0

    def node_for(self, caller: Caller) -> str:
        """Where ``caller``'s next session runs on a single box: this one (a
        cluster gateway places sessions with nxgate.gateway.placement)."""
        return self.config().server_name
