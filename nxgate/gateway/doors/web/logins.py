"""Browser logins: the cookie table, CSRF tokens and opaque session handles.

Pure (no Twisted, no I/O): the clock and the random source are passed in, so
the idle timeout and the token checks are unit-tested without a reactor.
A login is found only by its cookie value; the page then names sessions by
*handles*, random per login, so nothing in a URL or page says which session
id, display or port is behind them, and a handle of one login means nothing
in another.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

COOKIE_NAME = "nxgate_login"
TOKEN_BYTES = 32
HANDLE_BYTES = 12


def new_token(nbytes: int = TOKEN_BYTES) -> str:
    return secrets.token_urlsafe(nbytes)


def same_secret(given: str | bytes | None, expected: str) -> bool:
    """Constant-time comparison that tolerates a missing or non-ASCII value."""
    if given is None:
        return False
    if isinstance(given, str):
        given = given.encode("utf-8", "replace")
    return hmac.compare_digest(given, expected.encode("ascii"))


@dataclass
class Login:
    """One browser login: who (``caller``, a :class:`~nxgate.vocabulary.caller.Caller`)
    and its secrets.  ``cookie`` is the HttpOnly cookie value, ``csrf`` the
    token every state-changing request must carry."""

    cookie: str = field(repr=False)
    csrf: str = field(repr=False)
    caller: Any
    started: float
    seen: float
    admin: bool = False
    handles: dict[str, str] = field(default_factory=dict, repr=False)  # handle -> session id
    _by_session: dict[str, str] = field(default_factory=dict, repr=False)  # session id -> handle
    #: The handle of a session just started with "Start and open": the next portal page opens it.
    opening: str = field(default="", repr=False)

    def handle(self, session_id: str, token: Callable[[int], str] = new_token) -> str:
        """The opaque handle of ``session_id`` for this login (the same one each time)."""
        known = self._by_session.get(session_id)
        if known is None:
            known = token(HANDLE_BYTES)
            self._by_session[session_id] = known
            self.handles[known] = session_id
        return known

    def session_id(self, handle: str | None) -> str | None:
        """The session id behind ``handle``, None for a handle this login never gave out."""
        if not handle:
            return None
        return self.handles.get(handle)

    def csrf_ok(self, given: str | bytes | None) -> bool:
        return same_secret(given, self.csrf)


class LoginTable:
    """The live browser logins, by cookie value.

    ``idle_timeout`` seconds without a request end a login; ``now`` is a
    monotonic clock.  Expired logins are dropped when looked up and by
    :meth:`expire` (called from a timer by the site).
    """

    def __init__(self, idle_timeout: float, now: Callable[[], float],
                 token: Callable[[int], str] = new_token) -> None:
        self.idle_timeout = idle_timeout
        self.now = now
        self.token = token
        self._logins: dict[str, Login] = {}

    def __len__(self) -> int:
        return len(self._logins)

    def create(self, caller: Any, admin: bool = False) -> Login:
        now = self.now()
        login = Login(cookie=self.token(TOKEN_BYTES), csrf=self.token(TOKEN_BYTES), caller=caller,
                      started=now, seen=now, admin=admin)
        self._logins[login.cookie] = login
        return login

    def find(self, cookie: str | bytes | None, touch: bool = True) -> Login | None:
        """The live login of a cookie value (its idle clock restarted), or None."""
        if not cookie:
            return None
        if isinstance(cookie, bytes):
            try:
                cookie = cookie.decode("ascii")
            except UnicodeDecodeError:
                return None
        login = self._logins.get(cookie)
        if login is None:
            return None
        now = self.now()
        if now - login.seen > self.idle_timeout:
            del self._logins[cookie]
            return None
        if touch:
            login.seen = now
        return login

    def remove(self, cookie: str | bytes | None) -> Login | None:
        if isinstance(cookie, bytes):
            cookie = cookie.decode("ascii", "replace")
        return self._logins.pop(cookie, None) if cookie else None

    def expire(self) -> list[Login]:
        """Drop and return the logins idle for longer than the timeout."""
        now = self.now()
        gone = [login for login in self._logins.values() if now - login.seen > self.idle_timeout]
        for login in gone:
            del self._logins[login.cookie]
        return gone

    def of_user(self, user: str) -> list[Login]:
        return [login for login in self._logins.values() if login.caller.user == user]
