"""The synchronous SQLite store behind the asynchronous interface.

Row reads and writes run at once and come back as fired Deferreds: a
commit costs microseconds (WAL, no fsync per commit), one connection keeps
writes in order for free, and tests on a MemoryReactorClock stay
deterministic.  The backup copies the whole database, so it goes through
``blocking`` (a thread in production); it uses its own connection, as
SQLite's backup API allows.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from twisted.internet import defer

from nxgate.sessions.model import Member, Session
from nxgate.sessions.store.sqlite import SessionStore as SQLiteDatabase
from nxgate.node.threads import Blocking, inline


class SyncStoreAdapter:
    """:class:`nxgate.sessions.store.interface.SessionStore` over the SQLite store."""

    def __init__(self, db: SQLiteDatabase, blocking: Blocking = inline) -> None:
        self.db = db
        self.blocking = blocking

    @property
    def path(self) -> str:
        return self.db.path

    @property
    def backup_path(self) -> str | None:
        return self.db.backup_path

    @staticmethod
    def _now(function: Any, *args: Any) -> defer.Deferred[Any]:
        return defer.maybeDeferred(function, *args)

    def insert(self, session: Session) -> defer.Deferred[None]:
        return self._now(self.db.insert, session)

    def update(self, session: Session) -> defer.Deferred[None]:
        return self._now(self.db.update, session)

    def delete(self, session_ids: Iterable[str]) -> defer.Deferred[None]:
        return self._now(self.db.delete, list(session_ids))

    def get(self, session_id: str) -> defer.Deferred[Session | None]:
        return self._now(self.db.get, session_id)

    def swap(self, session: Session) -> defer.Deferred[bool]:
        return self._now(self.db.swap, session)

    def admit(self, session: Session, per_user: int = 0, per_node: int = 0, total: int = 0) -> defer.Deferred[str | None]:
        return self._now(self.db.admit, session, per_user, per_node, total)

    def live(self, user: str | None = None, node: str | None = None) -> defer.Deferred[list[Session]]:
        return self._now(self.db.live, user, node)

    def heartbeat(self, member: Member) -> defer.Deferred[None]:
        return self._now(self.db.heartbeat, member)

    def members(self) -> defer.Deferred[list[Member]]:
        return self._now(self.db.members)

    def set_drained(self, name: str, on: bool) -> defer.Deferred[bool]:
        return self._now(self.db.set_drained, name, on)

    def ended_before(self, timestamp: float, limit: int = 500,
                     node: str | None = None) -> defer.Deferred[list[Session]]:
        return self._now(self.db.ended_before, timestamp, limit, node)

    def count(self) -> defer.Deferred[int]:
        return self._now(self.db.count)

    def backup(self) -> defer.Deferred[str | None]:
        return self.blocking(self._backup)

    def _backup(self) -> str:
        # sqlite3 connections are bound to their thread by default: the copy
        # opens its own, in the thread that runs it.
        import sqlite3

        source = sqlite3.connect(self.db.path)
        try:
            return self.db.backup(source=source)
        finally:
            source.close()

    def close(self) -> defer.Deferred[None]:
        return self._now(self.db.close)
