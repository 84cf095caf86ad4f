"""Why the session manager refused or failed: a kind and a sentence.

Doors map the kind to their own wire (``nxgate.protocols.nx.dispatch`` to NX reply
codes, the admin socket to JSON); the message is a sentence for people,
without a code and without the NX "Error: " prefix.
"""

from __future__ import annotations

import enum


class ErrorKind(str, enum.Enum):
    NOT_FOUND = "not_found"                  # no such live session (or not the caller's: see NOT_YOURS)
    NOT_YOURS = "not_yours"                  # someone else's session; doors show it as NOT_FOUND
    WRONG_STATE = "wrong_state"              # e.g. resume of a session that is starting
    LIMIT_REACHED = "limit_reached"          # server, user or group limit, or draining
    ENCRYPTION_REQUIRED = "encryption_required"
    NOT_ALLOWED = "not_allowed"              # policy: a remote host that is not a target, shadowing others
    INVALID_REQUEST = "invalid_request"      # a value the service cannot use
    UNAVAILABLE = "unavailable"              # a type or engine this server does not offer
    FAILED_TO_START = "failed_to_start"
    FAILED_TO_RESUME = "failed_to_resume"
    FAILED_TO_SUSPEND = "failed_to_suspend"
    REFUSED_BY_OWNER = "refused_by_owner"    # shadowing: the owner said no or did not answer
    REMOTE_FAILED = "remote_failed"          # an RDP/VNC host could not be reached or refused the login
    STORAGE_FULL = "storage_full"            # the session store cannot be written
    INTERNAL = "internal"                    # a bug: the log has the traceback


class SessionError(Exception):
    """A refusal or failure of the session manager."""

    #: Set on a cluster member that could not be reached at all (nothing was
    #: asked of it): a new session may then be placed on the next node.
    unreachable = False

    def __init__(self, kind: ErrorKind, message: str, *, session_id: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.session_id = session_id

    def __repr__(self) -> str:
        return f"SessionError({self.kind.value}, {self.message!r})"
