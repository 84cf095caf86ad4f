"""Who asks the session manager for something."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Caller:
    """An authenticated caller, resolved once per login.

    ``groups`` are the user's group names (for limits and shadow policy), so
    the service never walks the group database on the reactor thread.
    ``address`` is printable (escaped) and may carry a note such as
    "(claimed by uid N)"; it goes to logs, the audit log and listings.
    ``local_address`` is where the caller reached us: an unencrypted session
    tells the client to connect there.  ``admin`` callers (the admin socket)
    act on every user's sessions.
    """

    user: str
    uid: int = -1
    gid: int = -1
    groups: frozenset[str] = frozenset()
    address: str = ""
    local_address: str = "127.0.0.1"
    door: str = "nx"
    admin: bool = False

    def owns(self, session_user: str) -> bool:
        """Whether this caller may act on a session of ``session_user``."""
        return self.admin or session_user == self.user
