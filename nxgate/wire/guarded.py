"""How a door tells the connection guard under its transport that the peer
authenticated (nxgate.gateway.doors.guard installs the hook): here, on the
wire, so that every layer that wraps a transport (the cluster's TLS, the
doors) can pass the word down without importing a door."""

from __future__ import annotations

from typing import Any

def authenticated(transport: Any) -> None:
    """Tell the guard of the connection under ``transport`` that it
    authenticated: it stops counting against the caps and its deadline is
    off.  A door calls this with its own transport; wrappers in between
    (TLS) pass the call down to ours.  Without a guard (tests), nothing."""
    hook = getattr(transport, "nxgate_authenticated", None)
    if callable(hook):
        hook()


def user_logged_in(transport: Any, user: str) -> str | None:
    """Tell the guard of the connection under ``transport`` that it carries
    ``user``'s login from now on: None when it may, else the words of the
    refusal (the user holds as many connections as one may; the door
    refuses the login with them).  Without a guard (tests), None."""
    hook = getattr(transport, "nxgate_user", None)
    return hook(user) if callable(hook) else None
