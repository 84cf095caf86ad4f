"""The session store: one implementation for SQLite (the embedded
default), and PostgreSQL and MariaDB/MySQL, shared by every member of a
cluster.

The drivers block (SQLite on its file lock too), so every call runs in a
small thread pool of the store's own, one connection per thread, and comes
back as a Deferred (the interface in
:mod:`nxgate.store.interface`); the reactor never waits for the
database.  What a dialect differs in (types, quoting, locks, upsert, the
schema version, the driver's errors) lives in
:mod:`nxgate.store.dialects` and :mod:`nxgate.store.sqlite`;
the queries are here, once.  Unit tests run a store ``inline`` (in the
calling thread, every Deferred fired at once) to stay deterministic.

Failure: a server that cannot be reached, a connection that broke, or a
statement that timed out is :class:`StoreUnavailable` with plain words
(the connection is dropped and made again on the next call, so the store
recovers by itself when the server comes back); nothing waits forever
(connect, statement and lock timeouts in the dialect, plus an overall
deadline per call here).  Concurrency between machines: every call is one
transaction; ``swap`` is compare-and-set on the revision; ``admit`` holds
a row lock (``nxgate_locks``) while it counts and inserts; schema
migrations at start hold a server-wide lock, so several members starting
at once migrate once.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from twisted.internet import defer, threads
from twisted.logger import Logger
from twisted.python.threadpool import ThreadPool

from nxgate.vocabulary.model import Member, Session
from nxgate.store.dialects import Dialect
from nxgate.store.errors import StoreError, StoreUnavailable
from nxgate.store.location import Location
from nxgate.store.rows import (HEARTBEAT_COLUMNS, LIVE_STATES, MEMBER_COLUMNS, SESSION_COLUMNS,
                                        UPDATE_COLUMNS, admission_counts, limit_hit, member_from_row, member_row,
                                        session_from_row, session_row)

log = Logger()
T = TypeVar("T")

SCHEMA_VERSION = 2
UNREACHABLE = "the session database cannot be reached"


class Connections:
    """One blocking connection per worker thread of a private pool.

    A connection whose call failed for a reason that may pass
    (``unavailable``) is closed, and the next call on that thread connects
    again.  A connection that died while it sat idle (the server restarted:
    every pooled connection is dead, and nobody knows yet) fails its next
    call at the first statement, before anything was committed: that call
    runs once more on a new connection (``broken`` says which errors mean
    that), so a restart costs no caller an error.  A failed commit is never
    run again: it may have been committed."""

    def __init__(self, reactor: Any, connect: Callable[[], Any], size: int = 4,
                 unavailable: Callable[[BaseException], bool] = lambda error: False,
                 broken: Callable[[BaseException, Any], bool] = lambda error, connection: False,
                 inline: bool = False) -> None:
        self.reactor = reactor
        self.connect = connect
        self.unavailable = unavailable
        self.broken = broken
        self.inline = inline
        self.pool = ThreadPool(minthreads=1, maxthreads=size, name="nxgate-store")
        self.local = threading.local()
        self.lock = threading.Lock()
        self.connections: set[Any] = set()
        self.shutdown: Any = None
        if inline:
            return
        # Threads start with the reactor, not now: twistd may still fork
        # (daemonize) after the store is opened, and threads do not survive
        # a fork.  Calls made before are queued until then.
        self.shutdown = reactor.addSystemEventTrigger("during", "shutdown", self.close)
        reactor.callWhenRunning(self._start)  # at once if it runs already

    def _start(self) -> None:
        if self.shutdown is not None:
            self.pool.start()

    def run(self, work: Callable[[Any], T]) -> defer.Deferred[T]:
        """``work(cursor)`` in one transaction, in a worker thread."""
        return self.call(self._run, work)

    def call(self, function: Callable[..., T], *arguments: Any) -> defer.Deferred[T]:
        """``function(*arguments)`` in a worker thread (inline: now)."""
        if self.inline:
            return defer.maybeDeferred(function, *arguments)
        return threads.deferToThreadPool(self.reactor, self.pool, function, *arguments)

    def _connection(self) -> tuple[Any, bool]:
        """This thread's connection, and whether it was made just now."""
        connection = getattr(self.local, "connection", None)
        if connection is not None:
            return connection, False
        connection = self.connect()
        self.local.connection = connection
        with self.lock:
            self.connections.add(connection)
        return connection, True

    def _run(self, work: Callable[[Any], T]) -> T:
        connection, fresh = self._connection()
        again: list[bool] = []
        try:
            return self._transaction(connection, work, again)
        except BaseException:
            if fresh or not again:
                raise
        self.drop()
        connection, _ = self._connection()
        return self._transaction(connection, work, [])

    def _transaction(self, connection: Any, work: Callable[[Any], T], again: list[bool]) -> T:
        """``work`` in one transaction; ``again`` gets True if it failed
        on a dead connection before its commit (so it may run again)."""
        try:
            cursor = connection.cursor()
            try:
                result = work(cursor)
            finally:
                with contextlib.suppress(Exception):
                    cursor.close()
        except BaseException as error:
            if self.broken(error, connection):
                again.append(True)
            self._failed(connection, error)
            raise
        try:
            connection.commit()
        except BaseException as error:
            self._failed(connection, error)
            raise
        return result

    def _failed(self, connection: Any, error: BaseException) -> None:
        if self.unavailable(error):
            self.drop()
            return
        try:
            connection.rollback()
        except Exception:
            self.drop()

    def drop(self) -> None:
        """Forget this thread's connection (it failed; the next call connects again)."""
        connection = getattr(self.local, "connection", None)
        self.local.connection = None
        if connection is not None:
            with self.lock:
                self.connections.discard(connection)
            try:
                connection.close()
            except Exception:
                pass

    def close(self) -> None:
        if self.shutdown is not None or self.inline:
            if self.shutdown is not None:
                self.reactor.removeSystemEventTrigger(self.shutdown)
                self.shutdown = None
                self.pool.stop()
            with self.lock:
                connections, self.connections = self.connections, set()
            for connection in connections:
                try:
                    connection.close()
                except Exception:
                    pass


class SQLStore:
    """:class:`nxgate.store.interface.SessionStore` on SQLite or a database server."""

    def __init__(self, dialect: Dialect, location: Location, reactor: Any, *, size: int = 4,
                 timeout: float | None = None, migrate: bool = True, inline: bool = False) -> None:
        self.dialect = dialect
        self.location = location
        self.reactor = reactor
        self.inline = inline
        self.path = dialect.path(location)
        self.backup_path: str | None = dialect.backup_path(location)
        self.timeout = timeout if timeout is not None else dialect.timeout * 2 + dialect.connect_timeout + 1
        self.reachable = True
        q = dialect.quote
        self._columns = ",".join(q(c) for c in SESSION_COLUMNS)
        self._live_marks = ",".join("%s" for _ in LIVE_STATES)
        self._insert = f"INSERT INTO sessions ({self._columns}) VALUES ({','.join('%s' for _ in SESSION_COLUMNS)})"
        self._update = (f"UPDATE sessions SET {','.join(f'{q(c)}=%s' for c in UPDATE_COLUMNS)},"
                        f" {q('revision')}={q('revision')}+1 WHERE {q('id')}=%s")
        self._members = f"SELECT {','.join(q(c) for c in MEMBER_COLUMNS)} FROM members ORDER BY {q('name')}"
        self._heartbeat = dialect.upsert("members", HEARTBEAT_COLUMNS, "name")
        if migrate:
            self.migrate()
        self.connections = Connections(reactor, self._connect, size, dialect.is_unavailable, dialect.is_broken,
                                       inline=inline)

    # ------------------------------------------------------- plumbing
    def _connect(self) -> Any:
        return self.dialect.connect(self.location)

    def _unavailable(self, error: BaseException) -> StoreError:
        translated = self.dialect.store_error(error, self.location)
        if translated is not None:
            return translated
        detail = " ".join(str(error).split()) or type(error).__name__
        return StoreUnavailable(UNREACHABLE, f"{self.dialect.where(self.location)}: {detail}")

    def _call(self, function: Callable[[Any], T]) -> defer.Deferred[T]:
        def run() -> defer.Deferred[T]:
            d = self.connections.run(function)
            if not self.inline:
                d.addTimeout(self.timeout, self.reactor)
            return d

        d = defer.maybeDeferred(run)
        d.addCallbacks(self._up, self._down)
        return d

    def _up(self, result: T) -> T:
        if not self.reachable:
            self.reachable = True
            log.info("the session store {url} answers again", url=self.path)
        return result

    def _down(self, failure: Any) -> Any:
        if failure.check(defer.TimeoutError, defer.CancelledError):
            failure = type(failure)(StoreUnavailable(
                "the session database does not answer",
                f"{self.dialect.where(self.location)}: no answer within {self.timeout:g}s"))
        elif not failure.check(StoreError) and self.dialect.store_error(failure.value, self.location) is not None:
            failure = type(failure)(self.dialect.store_error(failure.value, self.location))
        elif not failure.check(StoreError) and self.dialect.is_unavailable(failure.value):
            failure = type(failure)(self._unavailable(failure.value))  # raised while connecting
        elif not failure.check(StoreError) and self.dialect.is_error(failure.value):
            failure = type(failure)(StoreError(f"the session database refused: {failure.value}"))
        if failure.check(StoreUnavailable) and self.reachable:
            self.reachable = False
            log.error("the session store {url} is unavailable: {why}", url=self.path, why=str(failure.value))
        return failure

    # ------------------------------------------------------- schema
    def migrate(self) -> None:
        """Bring the schema to :data:`SCHEMA_VERSION`, blocking (at start,
        before the reactor runs), under the server-wide schema lock: members
        starting together migrate once, the others wait and find it done."""
        self.dialect.prepare(self.location)
        try:
            connection = self.dialect.connect(self.location, timeout=self.dialect.migration_timeout)
        except Exception as error:
            if self.dialect.is_unavailable(error):
                raise self._unavailable(error) from None
            if self.dialect.is_error(error):
                raise StoreError(f"the session store {self.path} cannot be used: {error}") from None
            raise
        try:
            self.dialect.autocommit(connection)
            cursor = connection.cursor()
            self.dialect.lock_schema(cursor)
            try:
                self._migrate(connection, cursor)
            finally:
                self.dialect.unlock_schema(cursor)
        except StoreError:
            raise
        except Exception as error:
            if self.dialect.is_unavailable(error):
                raise self._unavailable(error) from None
            if self.dialect.is_error(error):
                raise StoreError(f"the session store {self.path} cannot be prepared: {error}") from None
            raise
        finally:
            connection.close()

    def _migrate(self, connection: Any, cursor: Any) -> None:
        version = self.dialect.schema_version(cursor)
        if version > SCHEMA_VERSION:
            raise StoreError(f"the session store {self.path} has schema {version}; this nxgate knows up to "
                             f"{SCHEMA_VERSION}")
        if 0 < version < SCHEMA_VERSION:
            self.dialect.before_migration(self.location, connection, version)
        for target, statements in sorted(self.dialect.migrations.items()):
            if target <= version or target > SCHEMA_VERSION:
                continue
            cursor.execute("BEGIN")  # PostgreSQL, SQLite: all or nothing; MariaDB commits each DDL (idempotent)
            try:
                for statement in statements:
                    cursor.execute(statement)
                self.dialect.record_version(cursor, target, version)
                version = target
                cursor.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(Exception):
                    cursor.execute("ROLLBACK")
                raise
            log.info("the session store {url} is now at schema {version}", url=self.path, version=target)

    # ------------------------------------------------------- writes
    def insert(self, session: Session) -> defer.Deferred[None]:
        def work(cursor: Any) -> None:
            cursor.execute(self._insert, session_row(session))
        return self._call(work)

    def update(self, session: Session) -> defer.Deferred[None]:
        def work(cursor: Any) -> None:
            cursor.execute(self._update, session_row(session, UPDATE_COLUMNS) + [session.id])
            if cursor.rowcount != 1:
                raise StoreError(f"no session {session.id} to update")
        return self._call(work)

    def swap(self, session: Session) -> defer.Deferred[bool]:
        def work(cursor: Any) -> bool:
            cursor.execute(self._update + f" AND {self.dialect.quote('revision')}=%s",
                           session_row(session, UPDATE_COLUMNS) + [session.id, session.revision])
            return bool(cursor.rowcount == 1)
        return self._call(work)

    def admit(self, session: Session, per_user: int = 0, per_node: int = 0, total: int = 0) -> defer.Deferred[str | None]:
        q = self.dialect.quote

        def work(cursor: Any) -> str | None:
            # Every admit on every machine queues here until the one before committed.
            self.dialect.admission_lock(cursor)
            counted = {"user": 0, "node": 0, "total": 0}
            for name, column in admission_counts(per_user, per_node, total):
                where = f" AND {q(column)}=%s" if column else ""
                cursor.execute(f"SELECT COUNT(*) FROM sessions WHERE {q('state')} IN ({self._live_marks}){where}",
                               [*LIVE_STATES, *([getattr(session, column)] if column else [])])
                counted[name] = int(cursor.fetchone()[0])
            counts = (counted["user"], counted["node"], counted["total"])
            hit = limit_hit(counts, per_user, per_node, total)  # type: ignore[arg-type]
            if hit is None:
                cursor.execute(self._insert, session_row(session))
            return hit
        return self._call(work)

    def delete(self, session_ids: Iterable[str]) -> defer.Deferred[None]:
        ids = [(sid,) for sid in session_ids]

        def work(cursor: Any) -> None:
            if ids:
                cursor.executemany(f"DELETE FROM sessions WHERE {self.dialect.quote('id')}=%s", ids)
        return self._call(work)

    def heartbeat(self, member: Member) -> defer.Deferred[None]:
        def work(cursor: Any) -> None:
            cursor.execute(self._heartbeat, member_row(member, HEARTBEAT_COLUMNS))
        return self._call(work)

    def set_drained(self, name: str, on: bool) -> defer.Deferred[bool]:
        q = self.dialect.quote

        def work(cursor: Any) -> bool:
            cursor.execute(f"UPDATE members SET {q('drained')}=%s WHERE {q('name')}=%s", (int(on), name))
            return bool(cursor.rowcount == 1)
        return self._call(work)

    # -------------------------------------------------------- reads
    def get(self, session_id: str) -> defer.Deferred[Session | None]:
        def work(cursor: Any) -> Session | None:
            cursor.execute(f"SELECT {self._columns} FROM sessions WHERE {self.dialect.quote('id')}=%s", (session_id,))
            row = cursor.fetchone()
            return None if row is None else session_from_row(row)
        return self._call(work)

    def live(self, user: str | None = None, node: str | None = None) -> defer.Deferred[list[Session]]:
        q = self.dialect.quote
        query = f"SELECT {self._columns} FROM sessions WHERE {q('state')} IN ({self._live_marks})"
        args: list[Any] = list(LIVE_STATES)
        if user is not None:
            query += f" AND {q('user')}=%s"
            args.append(user)
        if node is not None:
            query += f" AND {q('node')}=%s"
            args.append(node)
        query += f" ORDER BY {q('created')}, {q('id')}"

        def work(cursor: Any) -> list[Session]:
            cursor.execute(query, args)
            return [session_from_row(row) for row in cursor.fetchall()]
        return self._call(work)

    def ended_before(self, timestamp: float, limit: int = 500,
                     node: str | None = None) -> defer.Deferred[list[Session]]:
        q = self.dialect.quote
        where = "" if node is None else f" AND {q('node')}=%s"

        def work(cursor: Any) -> list[Session]:
            cursor.execute(f"SELECT {self._columns} FROM sessions WHERE {q('state')} NOT IN ({self._live_marks})"
                           f" AND {q('changed')} < %s{where} ORDER BY {q('changed')} LIMIT %s",
                           [*LIVE_STATES, timestamp, *([] if node is None else [node]), limit])
            return [session_from_row(row) for row in cursor.fetchall()]
        return self._call(work)

    def count(self) -> defer.Deferred[int]:
        def work(cursor: Any) -> int:
            cursor.execute("SELECT COUNT(*) FROM sessions")
            return int(cursor.fetchone()[0])
        return self._call(work)

    def members(self) -> defer.Deferred[list[Member]]:
        def work(cursor: Any) -> list[Member]:
            cursor.execute(self._members)
            return [member_from_row(row) for row in cursor.fetchall()]
        return self._call(work)

    def backup(self) -> defer.Deferred[str | None]:
        """A copy of the store beside it (None: a database server's own backups cover it)."""
        if self.dialect.backs_itself_up:
            return defer.succeed(None)
        return self.connections.call(self.dialect.backup, self.location).addErrback(self._down)

    def close(self) -> defer.Deferred[None]:
        # Joins the workers: a call stuck on a dead server holds this up to its timeouts.
        return defer.maybeDeferred(self.connections.close)
