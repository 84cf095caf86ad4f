"""The session store: one SQLite file in the state directory.

Only the session manager writes it.  The schema carries a version
(``PRAGMA user_version``) and is migrated forward on open; a database from
a newer nxgate is refused rather than misread.  Writes are small and run on
the reactor thread (WAL journal, no fsync per commit), which keeps "one
owner of state" literal: there is no second writer to race with.

Failures are typed for the caller: :class:`StoreUnavailable` is a write or
read that failed but may work later (a full disk, an I/O error) and
carries the words a client may see; :class:`StoreCorrupt` is a file that is
not a usable database, refused at open with the way to recover.  Backups
are online copies (SQLite's backup API) taken before a schema migration
and, by the session manager, periodically: ``nxgate.sqlite.backup`` beside
the store.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterable, Iterator
from typing import Any

from nxgate.sessions.model import Member, Session
from nxgate.sessions.store.errors import STORAGE_FULL, StoreCorrupt, StoreError, StoreUnavailable, storage_reason
from nxgate.sessions.store.rows import (HEARTBEAT_COLUMNS, LIVE_STATES, MEMBER_COLUMNS, SESSION_COLUMNS,
                                        UPDATE_COLUMNS, admission_counts, limit_hit, member_from_row, member_row,
                                        session_from_row, session_row)

SCHEMA_VERSION = 2

_COLUMNS = SESSION_COLUMNS
_MIGRATIONS: dict[int, str] = {
    1: """
        CREATE TABLE sessions (
            id TEXT PRIMARY KEY,
            user TEXT NOT NULL,
            uid INTEGER NOT NULL,
            gid INTEGER NOT NULL,
            type TEXT NOT NULL,
            name TEXT NOT NULL,
            display INTEGER NOT NULL,
            server_name TEXT NOT NULL,
            cookie TEXT NOT NULL,
            state TEXT NOT NULL,
            created REAL NOT NULL,
            changed REAL NOT NULL,
            client_address TEXT NOT NULL,
            geometry TEXT NOT NULL,
            depth INTEGER NOT NULL,
            render INTEGER NOT NULL,
            fullscreen INTEGER NOT NULL,
            rootless INTEGER NOT NULL,
            encrypted INTEGER NOT NULL,
            ever_attached INTEGER NOT NULL,
            agent_pid INTEGER NOT NULL,
            agent_started INTEGER NOT NULL,
            app_pid INTEGER NOT NULL,
            app_started INTEGER NOT NULL,
            failure TEXT NOT NULL,
            options TEXT NOT NULL
        );
        CREATE INDEX sessions_user_state ON sessions (user, state);
        CREATE INDEX sessions_state ON sessions (state);
    """,
    # Several machines (issue 13): which member runs a session, a revision
    # for compare-and-set, and the members' heartbeats.  No index on node:
    # one file serves one machine, and every index slows every write.
    2: """
        ALTER TABLE sessions ADD COLUMN node TEXT NOT NULL DEFAULT '';
        ALTER TABLE sessions ADD COLUMN revision INTEGER NOT NULL DEFAULT 0;
        CREATE TABLE members (
            name TEXT PRIMARY KEY,
            address TEXT NOT NULL,
            roles TEXT NOT NULL,
            started REAL NOT NULL,
            last_heartbeat REAL NOT NULL,
            sessions INTEGER NOT NULL,
            load REAL NOT NULL,
            cpus INTEGER NOT NULL,
            free_memory INTEGER NOT NULL,
            drained INTEGER NOT NULL DEFAULT 0,
            weight REAL NOT NULL DEFAULT 1.0
        );
    """,
}


class SessionStore:
    def __init__(self, path: str) -> None:
        self.path = path
        self.backup_path = path + ".backup"
        new = not os.path.exists(path)
        if new:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        try:
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.execute("PRAGMA busy_timeout=5000")
            problems = [row[0] for row in self.db.execute("PRAGMA quick_check")]
        except sqlite3.DatabaseError as error:
            self.db.close()
            raise self._corrupt(str(error)) from None
        if problems != ["ok"]:
            self.db.close()
            raise self._corrupt("; ".join(problems[:3]))
        os.chmod(path, 0o600)
        self._migrate()

    def _corrupt(self, detail: str) -> StoreCorrupt:
        aside = f"move {self.path} and its -wal and -shm files aside"
        if os.path.exists(self.backup_path):
            how = f"{aside} and copy the backup {self.backup_path} to {self.path}"
        else:
            how = f"{aside} (there is no backup) and start with an empty store"
        return StoreCorrupt(f"the session store {self.path} is damaged ({detail}); to recover, {how}. Sessions "
                            f"still running that the store does not know are reported at start.")

    def _migrate(self) -> None:
        (version,) = self.db.execute("PRAGMA user_version").fetchone()
        if version > SCHEMA_VERSION:
            raise StoreError(f"the session store has schema {version}; this nxgate knows up to {SCHEMA_VERSION}")
        if 0 < version < SCHEMA_VERSION:
            self.backup(f"{self.path}.schema-{version}")
        for target in range(version + 1, SCHEMA_VERSION + 1):
            self.db.executescript(f"BEGIN; {_MIGRATIONS[target]}; PRAGMA user_version={target}; COMMIT;")

    def close(self) -> None:
        self.db.close()

    def backup(self, target: str | None = None, source: sqlite3.Connection | None = None) -> str:
        """An online copy of the store (consistent while it is written),
        replacing ``target`` (default: the periodic backup) atomically.
        ``source``: a connection of its own to copy from, for a copy made in
        another thread (a connection belongs to the thread that opened it)."""
        target = target or self.backup_path
        temporary = f"{target}.{os.getpid()}.tmp"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
        try:
            with self._guard():
                copy = sqlite3.connect(temporary)
                try:
                    (source or self.db).backup(copy)
                    copy.execute("PRAGMA journal_mode=DELETE")  # one self-contained file to copy back
                finally:
                    copy.close()
            os.replace(temporary, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
        return target

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        """SQLite's and Python's failures as :class:`StoreError` kinds."""
        try:
            yield
        except sqlite3.DatabaseError as error:
            code = getattr(error, "sqlite_errorcode", None)
            if code == sqlite3.SQLITE_FULL:
                raise StoreUnavailable(STORAGE_FULL, str(error)) from None
            if code in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
                raise StoreUnavailable("the server's session store is damaged", str(error)) from None
            raise StoreUnavailable("the server's session store cannot be used", str(error)) from None
        except OSError as error:
            raise StoreUnavailable(storage_reason(error), str(error)) from None
        except UnicodeEncodeError as error:
            raise StoreError(f"a value is not valid text: {error}") from None

    # ------------------------------------------------------------- writes
    def insert(self, session: Session) -> None:
        with self._guard():
            self.db.execute(_INSERT, session_row(session))

    def update(self, session: Session) -> None:
        """Write every field of ``session`` but its revision, which goes up by one."""
        with self._guard():
            cursor = self.db.execute(_UPDATE + " WHERE id=?", session_row(session, UPDATE_COLUMNS) + [session.id])
        if cursor.rowcount != 1:
            raise StoreError(f"no session {session.id} to update")

    def swap(self, session: Session) -> bool:
        """Compare-and-set: write ``session`` only if the stored revision is
        still ``session.revision`` (False: someone wrote it in between, or it is gone)."""
        with self._guard():
            cursor = self.db.execute(_UPDATE + " WHERE id=? AND revision=?",
                                     session_row(session, UPDATE_COLUMNS) + [session.id, session.revision])
        return cursor.rowcount == 1

    def admit(self, session: Session, per_user: int = 0, per_node: int = 0, total: int = 0) -> str | None:
        """Insert ``session`` unless it would break a limit (0: none); which
        one it would break otherwise.  ``BEGIN IMMEDIATE`` takes the write
        lock first, so even another process on the same file counts after us."""
        marks = ",".join("?" for _ in LIVE_STATES)
        with self._guard():
            self.db.execute("BEGIN IMMEDIATE")
            try:
                counted = {"user": 0, "node": 0, "total": 0}
                for name, column in admission_counts(per_user, per_node, total):
                    where = f" AND {column}=?" if column else ""
                    (counted[name],) = self.db.execute(f"SELECT COUNT(*) FROM sessions WHERE state IN ({marks}){where}",
                                                       [*LIVE_STATES, *([getattr(session, column)] if column else [])]
                                                       ).fetchone()
                counts = (counted["user"], counted["node"], counted["total"])
                hit = limit_hit(counts, per_user, per_node, total)
                if hit is None:
                    self.db.execute(_INSERT, session_row(session))
                self.db.execute("COMMIT")
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
        return hit

    def heartbeat(self, member: Member) -> None:
        """Insert or refresh ``member``'s row, keeping the admin's ``drained``."""
        with self._guard():
            self.db.execute(_HEARTBEAT, member_row(member, HEARTBEAT_COLUMNS))

    def members(self) -> list[Member]:
        with self._guard():
            rows = self.db.execute(f"SELECT {','.join(MEMBER_COLUMNS)} FROM members ORDER BY name").fetchall()
        return [member_from_row(row) for row in rows]

    def set_drained(self, name: str, on: bool) -> bool:
        """False: no member of that name has ever sent a heartbeat."""
        with self._guard():
            cursor = self.db.execute("UPDATE members SET drained=? WHERE name=?", (int(on), name))
        return cursor.rowcount == 1

    def delete(self, session_ids: Iterable[str]) -> None:
        with self._guard():
            self.db.executemany("DELETE FROM sessions WHERE id=?", [(sid,) for sid in session_ids])

    # -------------------------------------------------------------- reads
    def get(self, session_id: str) -> Session | None:
        with self._guard():
            row = self.db.execute(f"SELECT {','.join(_COLUMNS)} FROM sessions WHERE id=?", (session_id,)).fetchone()
        return None if row is None else session_from_row(row)

    def live(self, user: str | None = None, node: str | None = None) -> list[Session]:
        marks = ",".join("?" for _ in LIVE_STATES)
        query = f"SELECT {','.join(_COLUMNS)} FROM sessions WHERE state IN ({marks})"
        args: list[Any] = list(LIVE_STATES)
        if user is not None:
            query += " AND user=?"
            args.append(user)
        if node is not None:
            query += " AND node=?"
            args.append(node)
        with self._guard():
            return [session_from_row(row) for row in self.db.execute(query + " ORDER BY created", args)]

    def ended_before(self, timestamp: float, limit: int = 500, node: str | None = None) -> list[Session]:
        """Ended sessions last changed before ``timestamp``, oldest first, at
        most ``limit`` of them (housekeeping prunes in bounded steps); only
        those of ``node`` if given (each member prunes its own, with their files)."""
        marks = ",".join("?" for _ in LIVE_STATES)
        where = "" if node is None else " AND node=?"
        with self._guard():
            rows = self.db.execute(
                f"SELECT {','.join(_COLUMNS)} FROM sessions WHERE state NOT IN ({marks}) AND changed < ?{where}"
                " ORDER BY changed LIMIT ?",
                [*LIVE_STATES, timestamp, *([] if node is None else [node]), limit],
            ).fetchall()
        return [session_from_row(row) for row in rows]

    def count(self) -> int:
        with self._guard():
            (total,) = self.db.execute("SELECT COUNT(*) FROM sessions").fetchone()
        return total


_INSERT = f"INSERT INTO sessions ({','.join(SESSION_COLUMNS)}) VALUES ({','.join('?' for _ in SESSION_COLUMNS)})"
_UPDATE = f"UPDATE sessions SET {','.join(f'{c}=?' for c in UPDATE_COLUMNS)}, revision=revision+1"
_HEARTBEAT = (f"INSERT INTO members ({','.join(HEARTBEAT_COLUMNS)}) VALUES ({','.join('?' for _ in HEARTBEAT_COLUMNS)})"
              f" ON CONFLICT(name) DO UPDATE SET {','.join(f'{c}=excluded.{c}' for c in HEARTBEAT_COLUMNS[1:])}")
