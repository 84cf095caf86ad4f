"""What the session layer needs of a session store, asynchronously.

Every call returns a Deferred, which fails with
:class:`nxgate.sessions.store.errors.StoreError` (or its :class:`StoreUnavailable`)
and never raises: so a store on another machine (PostgreSQL, MariaDB
through ``twisted.enterprise.adbapi``) can follow without touching a
caller.  Callers ``await`` every call and never assume it has fired: the
SQLite store answers at once, others later.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from twisted.internet.defer import Deferred

from nxgate.sessions.model import Session


class SessionStore(Protocol):
    #: Where the store lives and where its backup goes, for people (logs).
    path: str
    backup_path: str | None

    def insert(self, session: Session) -> Deferred[None]: ...
    def update(self, session: Session) -> Deferred[None]: ...  # fails StoreError("no session …") if the row is gone
    def delete(self, session_ids: Iterable[str]) -> Deferred[None]: ...
    def get(self, session_id: str) -> Deferred[Session | None]: ...
    def live(self, user: str | None = None) -> Deferred[list[Session]]: ...
    def ended_before(self, timestamp: float, limit: int = 500) -> Deferred[list[Session]]: ...
    def count(self) -> Deferred[int]: ...
    def backup(self) -> Deferred[str | None]: ...  # None: this store backs itself up
    def close(self) -> Deferred[None]: ...
