"""What the session layer needs of a session store, asynchronously.

Every call returns a Deferred, which fails with
:class:`nxgate.store.errors.StoreError` (or its :class:`StoreUnavailable`)
and never raises: so a store on another machine (PostgreSQL, MariaDB
through ``twisted.enterprise.adbapi``) can follow without touching a
caller.  Callers ``await`` every call and never assume it has fired: the
SQLite store answers at once, others later.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from twisted.internet.defer import Deferred

from nxgate.vocabulary.model import Member, Session


class SessionStore(Protocol):
    #: Where the store lives and where its backup goes, for people (logs).
    path: str
    backup_path: str | None

    def insert(self, session: Session) -> Deferred[None]: ...
    # Writes every field but ``revision``, which the store bumps; fails
    # StoreError("no session …") if the row is gone.  Last writer wins.
    def update(self, session: Session) -> Deferred[None]: ...
    # Compare-and-set: writes (and bumps the revision) only if the stored
    # revision is ``session.revision``; False if someone wrote in between
    # (or deleted the row).  For two machines that could race on one session.
    def swap(self, session: Session) -> Deferred[bool]: ...
    # Counts live sessions (of ``session.user``, on ``session.node``, in
    # all) and inserts ``session`` in one step serialised across machines;
    # None when inserted, else the limit it would break: "user", "node" or
    # "total" (a limit of 0 is none).
    def admit(self, session: Session, per_user: int = 0, per_node: int = 0, total: int = 0) -> Deferred[str | None]: ...
    def delete(self, session_ids: Iterable[str]) -> Deferred[None]: ...
    def get(self, session_id: str) -> Deferred[Session | None]: ...
    # Live sessions, oldest first; of one user and/or on one member (node).
    def live(self, user: str | None = None, node: str | None = None) -> Deferred[list[Session]]: ...
    # A member's row, inserted or refreshed; never touches ``drained``.
    def heartbeat(self, member: Member) -> Deferred[None]: ...
    def members(self) -> Deferred[list[Member]]: ...  # by name
    # The admin's switch; False: no member of that name is known.
    def set_drained(self, name: str, on: bool) -> Deferred[bool]: ...
    # Ended sessions changed before ``timestamp``, oldest first; only ``node``'s
    # if given (on a shared store each member prunes its own rows and files).
    def ended_before(self, timestamp: float, limit: int = 500, node: str | None = None) -> Deferred[list[Session]]: ...
    def count(self) -> Deferred[int]: ...
    def backup(self) -> Deferred[str | None]: ...  # None: this store backs itself up
    def close(self) -> Deferred[None]: ...
