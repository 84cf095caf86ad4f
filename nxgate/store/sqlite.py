"""SQLite as one more dialect of the SQL store: the embedded default, one
file in the state directory, with no server to run.

The queries are :mod:`nxgate.store.sql`'s, run in the same small
thread pool as for PostgreSQL and MariaDB, one connection per thread:
SQLite blocks on its file lock (``busy_timeout``), and on the reactor that
meant a second writer -- an admin's ``sqlite3`` shell, a backup tool --
froze every door for up to five seconds.  What SQLite differs in is here:

* the ``?`` parameter style (a thin cursor translates the shared ``%s``),
  ``BEGIN IMMEDIATE`` as the admission lock, ``PRAGMA user_version`` as
  the schema version (so files written by earlier releases open as before);
* the file itself: created 0600, checked at open (``quick_check``; a
  damaged file is refused with the way to recover), WAL journal, copied
  aside before a schema migration and, periodically, by the backup API;
* failures in words a client may see: a full disk is "the server's storage
  is full", not a database that cannot be reached.
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
from typing import Any

from nxgate.store.dialects import Dialect
from nxgate.store.errors import STORAGE_FULL, StoreCorrupt, StoreError, StoreUnavailable, storage_reason
from nxgate.store.location import Location

#: Schema version -> statements.  1 is the first release's; 2 added the
#: cluster columns and the members' heartbeats (no index on node: one file
#: serves one machine, and every index slows every write).
MIGRATIONS: dict[int, list[str]] = {
    1: ["""CREATE TABLE sessions (
            id TEXT PRIMARY KEY, user TEXT NOT NULL, uid INTEGER NOT NULL, gid INTEGER NOT NULL,
            type TEXT NOT NULL, name TEXT NOT NULL, display INTEGER NOT NULL, server_name TEXT NOT NULL,
            cookie TEXT NOT NULL, state TEXT NOT NULL, created REAL NOT NULL, changed REAL NOT NULL,
            client_address TEXT NOT NULL, geometry TEXT NOT NULL, depth INTEGER NOT NULL, render INTEGER NOT NULL,
            fullscreen INTEGER NOT NULL, rootless INTEGER NOT NULL, encrypted INTEGER NOT NULL,
            ever_attached INTEGER NOT NULL, agent_pid INTEGER NOT NULL, agent_started INTEGER NOT NULL,
            app_pid INTEGER NOT NULL, app_started INTEGER NOT NULL, failure TEXT NOT NULL, options TEXT NOT NULL)""",
        "CREATE INDEX sessions_user_state ON sessions (user, state)",
        "CREATE INDEX sessions_state ON sessions (state)"],
    2: ["ALTER TABLE sessions ADD COLUMN node TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE sessions ADD COLUMN revision INTEGER NOT NULL DEFAULT 0",
        """CREATE TABLE members (
            name TEXT PRIMARY KEY, address TEXT NOT NULL, roles TEXT NOT NULL, started REAL NOT NULL,
            last_heartbeat REAL NOT NULL, sessions INTEGER NOT NULL, load REAL NOT NULL, cpus INTEGER NOT NULL,
            free_memory INTEGER NOT NULL, drained INTEGER NOT NULL DEFAULT 0, weight REAL NOT NULL DEFAULT 1.0)"""],
}

_MARK = re.compile(r"%s")


class _Cursor:
    """A sqlite3 cursor that takes the shared queries' ``%s`` marks."""

    def __init__(self, cursor: sqlite3.Cursor) -> None:
        self._cursor = cursor

    def execute(self, query: str, arguments: Any = ()) -> Any:
        return self._cursor.execute(_MARK.sub("?", query), tuple(arguments))

    def executemany(self, query: str, rows: Any) -> Any:
        return self._cursor.executemany(_MARK.sub("?", query), rows)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


class _Connection:
    """A sqlite3 connection whose cursors are :class:`_Cursor`."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self.raw = connection

    def cursor(self) -> _Cursor:
        return _Cursor(self.raw.cursor())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


class SQLite(Dialect):
    name = "SQLite"
    timeout = 5  # seconds: busy_timeout, how long a call waits for another writer's lock
    migration_timeout = 30
    backs_itself_up = False

    def __init__(self) -> None:
        self.driver = sqlite3

    # ------------------------------------------------------------ the file
    def path(self, location: Location) -> str:
        return location.path

    def where(self, location: Location) -> str:
        return f"SQLite file {location.path}"

    def backup_path(self, location: Location) -> str | None:
        return location.path + ".backup"

    def prepare(self, location: Location) -> None:
        """Create the file private, and refuse one that is damaged."""
        path = location.path
        if not os.path.exists(path):
            with contextlib.suppress(FileExistsError):
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
        try:
            connection = sqlite3.connect(path, isolation_level=None)
        except sqlite3.Error as error:
            raise self._corrupt(path, str(error)) from None
        try:
            connection.execute("PRAGMA journal_mode=WAL")
            problems = [row[0] for row in connection.execute("PRAGMA quick_check")]
        except sqlite3.DatabaseError as error:
            raise self._corrupt(path, str(error)) from None
        finally:
            connection.close()
        if problems != ["ok"]:
            raise self._corrupt(path, "; ".join(problems[:3]))
        os.chmod(path, 0o600)

    @staticmethod
    def _corrupt(path: str, detail: str) -> StoreCorrupt:
        aside = f"move {path} and its -wal and -shm files aside"
        backup = path + ".backup"
        if os.path.exists(backup):
            how = f"{aside} and copy the backup {backup} to {path}"
        else:
            how = f"{aside} (there is no backup) and start with an empty store"
        return StoreCorrupt(f"the session store {path} is damaged ({detail}); to recover, {how}. Sessions "
                            f"still running that the store does not know are reported at start.")

    def connect(self, location: Location, timeout: float | None = None) -> Any:
        connection = sqlite3.connect(location.path, timeout=timeout or self.timeout, check_same_thread=False)
        connection.execute("PRAGMA synchronous=NORMAL")  # WAL: no fsync per commit
        return _Connection(connection)

    def autocommit(self, connection: Any) -> None:
        connection.raw.isolation_level = None

    # ---------------------------------------------------------- schema
    def lock_schema(self, cursor: Any) -> None:
        """Nothing: one gateway owns a state directory (its lock file), and
        each migration step is one transaction of the file's own."""

    def unlock_schema(self, cursor: Any) -> None:
        pass

    def schema_version(self, cursor: Any) -> int:
        cursor.execute("PRAGMA user_version")
        return int(cursor.fetchone()[0])

    def record_version(self, cursor: Any, version: int, previous: int) -> None:
        cursor.execute(f"PRAGMA user_version={int(version)}")

    def before_migration(self, location: Location, connection: Any, version: int) -> None:
        """A copy of a file written by an earlier release, before it changes."""
        if version > 0:
            self.copy(connection.raw, f"{location.path}.schema-{version}")

    @property
    def migrations(self) -> dict[int, list[str]]:
        return MIGRATIONS

    def admission_lock(self, cursor: Any) -> None:
        # The write lock first: even another process on the same file counts after us.
        cursor.execute("BEGIN IMMEDIATE")

    def upsert(self, table: str, columns: list[str], key: str) -> str:
        q = self.quote
        updates = ",".join(f"{q(c)}=excluded.{q(c)}" for c in columns if c != key)
        return (f"INSERT INTO {table} ({','.join(q(c) for c in columns)}) VALUES ({','.join('%s' for _ in columns)})"
                f" ON CONFLICT ({q(key)}) DO UPDATE SET {updates}")

    # --------------------------------------------------------- backups
    def backup(self, location: Location) -> str:
        """An online copy of the store (consistent while it is written),
        replacing the periodic backup atomically (blocking: run it in the
        store's pool, on a connection of its own)."""
        source = sqlite3.connect(location.path, timeout=self.timeout)
        try:
            return self.copy(source, location.path + ".backup")
        finally:
            source.close()

    def copy(self, source: sqlite3.Connection, target: str) -> str:
        temporary = f"{target}.{os.getpid()}.tmp"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
        try:
            copy = sqlite3.connect(temporary)
            try:
                source.backup(copy)
                copy.execute("PRAGMA journal_mode=DELETE")  # one self-contained file to copy back
            finally:
                copy.close()
            os.replace(temporary, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
        return target

    # ---------------------------------------------------------- errors
    def is_unavailable(self, error: BaseException) -> bool:
        # A busy file, a full disk, an I/O error may pass, but the connection
        # stays good (it is not dropped); store_error says what failed.
        return False

    def is_error(self, error: BaseException) -> bool:
        return isinstance(error, (sqlite3.Error, UnicodeEncodeError, OSError))

    def is_broken(self, error: BaseException, connection: Any) -> bool:
        return False  # a file does not go away between two calls

    def store_error(self, error: BaseException, location: Location) -> StoreError | None:
        if isinstance(error, UnicodeEncodeError):
            return StoreError(f"a value is not valid text: {error}")
        if isinstance(error, OSError):
            return StoreUnavailable(storage_reason(error), str(error))
        if isinstance(error, sqlite3.DatabaseError):
            code = getattr(error, "sqlite_errorcode", None)
            if code == sqlite3.SQLITE_FULL:
                return StoreUnavailable(STORAGE_FULL, str(error))
            if code in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
                return StoreUnavailable("the server's session store is damaged", str(error))
            return StoreUnavailable("the server's session store cannot be used", str(error))
        return None
