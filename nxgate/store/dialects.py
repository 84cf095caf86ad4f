"""What PostgreSQL, MariaDB/MySQL and SQLite differ in, for the SQL store:
drivers and their timeouts, column types, quoting, locks, upserts, where
the schema version is kept, and how a failure is put for people.

Drivers: psycopg2 and PyMySQL, imported when a store of that kind is
opened (a single box on SQLite needs neither).  Both speak the ``%s``
parameter style, so the queries in :mod:`nxgate.store.sql` are
shared (SQLite's dialect, :mod:`nxgate.store.sqlite`, translates
them to its ``?``).  Every connection gets bounded waits: connecting, each statement,
each lock, and the TCP connection itself (keepalives), so a call on a
server that went away fails instead of hanging.
"""

from __future__ import annotations

from typing import Any

from nxgate.store.errors import StoreError
from nxgate.store.location import Location
from nxgate.store.rows import MEMBER_COLUMNS, SESSION_COLUMNS

# Abstract column types; each dialect spells them.
_SESSION_TYPES = {
    "id": "key", "user": "name", "uid": "big", "gid": "big", "type": "name", "name": "text", "display": "int",
    "server_name": "text", "cookie": "text", "state": "word", "created": "real", "changed": "real",
    "client_address": "text", "geometry": "text", "depth": "int", "render": "flag", "fullscreen": "flag",
    "rootless": "flag", "encrypted": "flag", "ever_attached": "flag", "agent_pid": "big", "agent_started": "big",
    "app_pid": "big", "app_started": "big", "failure": "text", "options": "long", "node": "name", "revision": "big",
}
_MEMBER_TYPES = {
    "name": "name", "address": "text", "roles": "text", "started": "real", "last_heartbeat": "real",
    "sessions": "int", "load": "real", "cpus": "int", "free_memory": "big", "drained": "flag", "weight": "real",
}
_DEFAULTS = {"node": "''", "revision": "0", "drained": "0", "weight": "1.0"}
assert list(_SESSION_TYPES) == SESSION_COLUMNS and list(_MEMBER_TYPES) == MEMBER_COLUMNS


class Dialect:
    name = ""
    quote_char = '"'
    connect_timeout = 3  # seconds
    timeout = 5  # seconds, per statement and per lock wait
    migration_timeout = 120  # seconds: waiting for another member's migration
    types: dict[str, str] = {}
    #: The database server's own backups cover it (SQLite's file is copied by :meth:`backup`).
    backs_itself_up = True

    def path(self, location: Location) -> str:
        """The store as logs and the admin name it (never with a password)."""
        return location.safe_url

    def where(self, location: Location) -> str:
        """The store in an error's detail."""
        return f"{self.name} at {location.host}:{location.port}"

    def backup_path(self, location: Location) -> str | None:
        return None

    def prepare(self, location: Location) -> None:
        """Anything to do before the first connection (a server: nothing)."""

    def backup(self, location: Location) -> str | None:
        return None

    def schema_version(self, cursor: Any) -> int:
        """The schema version the store is at (0: empty)."""
        cursor.execute("CREATE TABLE IF NOT EXISTS nxgate_schema (version INTEGER NOT NULL)")
        cursor.execute("SELECT version FROM nxgate_schema")
        row = cursor.fetchone()
        return int(row[0]) if row else 0

    def record_version(self, cursor: Any, version: int, previous: int) -> None:
        if previous == 0:
            cursor.execute("INSERT INTO nxgate_schema (version) VALUES (%s)", (version,))
        else:
            cursor.execute("UPDATE nxgate_schema SET version=%s", (version,))

    def before_migration(self, location: Location, connection: Any, version: int) -> None:
        """Called before a store at ``version`` (> 0) is migrated."""

    def admission_lock(self, cursor: Any) -> None:
        """Serialise admissions across machines: every admit queues here
        until the one before committed."""
        cursor.execute("SELECT name FROM nxgate_locks WHERE name='admit' FOR UPDATE")

    def store_error(self, error: BaseException, location: Location) -> StoreError | None:
        """The StoreError ``error`` means, when this dialect says more than
        "cannot be reached" / "refused" (None: the SQL store's words)."""
        return None

    def quote(self, identifier: str) -> str:
        return f"{self.quote_char}{identifier}{self.quote_char}"

    def columns(self, types: dict[str, str], key: str) -> str:
        out = []
        for column, kind in types.items():
            spec = f"{self.quote(column)} {self.types[kind]} NOT NULL"
            if column in _DEFAULTS:
                spec += f" DEFAULT {_DEFAULTS[column]}"
            if column == key:
                spec += " PRIMARY KEY"
            out.append(spec)
        return ", ".join(out)

    def upsert(self, table: str, columns: list[str], key: str) -> str:
        raise NotImplementedError

    # Schema version -> statements (from nothing, the first is the whole schema).
    @property
    def migrations(self) -> dict[int, list[str]]:
        raise NotImplementedError

    def connect(self, location: Location, timeout: float | None = None) -> Any:
        raise NotImplementedError

    def autocommit(self, connection: Any) -> None:
        """Statements commit one by one (migrations say BEGIN and COMMIT themselves)."""
        connection.autocommit = True

    def lock_schema(self, cursor: Any) -> None:
        raise NotImplementedError

    def unlock_schema(self, cursor: Any) -> None:
        raise NotImplementedError

    def is_unavailable(self, error: BaseException) -> bool:
        """The server cannot be reached or did not answer in time (may pass)."""
        raise NotImplementedError

    def is_error(self, error: BaseException) -> bool:
        """Any error of this driver."""
        raise NotImplementedError

    def is_broken(self, error: BaseException, connection: Any) -> bool:
        """``error`` says ``connection`` is dead (not that a statement timed out)."""
        raise NotImplementedError


class PostgreSQL(Dialect):
    name = "PostgreSQL"
    types = {"key": "TEXT", "name": "TEXT", "word": "TEXT", "text": "TEXT", "long": "TEXT", "int": "INTEGER",
             "big": "BIGINT", "real": "DOUBLE PRECISION", "flag": "SMALLINT"}
    schema_lock = 0x6E78676174650001  # pg_advisory_lock key: "nxgate" + 1

    def __init__(self) -> None:
        import psycopg2

        self.driver = psycopg2

    def upsert(self, table: str, columns: list[str], key: str) -> str:
        q = self.quote
        updates = ",".join(f"{q(c)}=EXCLUDED.{q(c)}" for c in columns if c != key)
        return (f"INSERT INTO {table} ({','.join(q(c) for c in columns)}) VALUES ({','.join('%s' for _ in columns)})"
                f" ON CONFLICT ({q(key)}) DO UPDATE SET {updates}")

    @property
    def migrations(self) -> dict[int, list[str]]:
        q = self.quote
        return {2: [
            f"CREATE TABLE IF NOT EXISTS sessions ({self.columns(_SESSION_TYPES, 'id')})",
            f"CREATE INDEX IF NOT EXISTS sessions_user_state ON sessions ({q('user')}, {q('state')})",
            f"CREATE INDEX IF NOT EXISTS sessions_state ON sessions ({q('state')}, {q('changed')})",
            f"CREATE INDEX IF NOT EXISTS sessions_node_state ON sessions ({q('node')}, {q('state')})",
            f"CREATE TABLE IF NOT EXISTS members ({self.columns(_MEMBER_TYPES, 'name')})",
            "CREATE TABLE IF NOT EXISTS nxgate_locks (name VARCHAR(64) PRIMARY KEY)",
            "INSERT INTO nxgate_locks (name) VALUES ('admit') ON CONFLICT DO NOTHING",
        ]}

    def connect(self, location: Location, timeout: float | None = None) -> Any:
        milliseconds = int((timeout or self.timeout) * 1000)
        return self.driver.connect(
            host=location.host, port=location.port, user=location.user, password=location.password or None,
            dbname=location.database, connect_timeout=self.connect_timeout, application_name="nxgate",
            options=f"-c statement_timeout={milliseconds} -c lock_timeout={milliseconds}"
                    " -c idle_in_transaction_session_timeout=60000",
            keepalives=1, keepalives_idle=5, keepalives_interval=2, keepalives_count=3,
            tcp_user_timeout=milliseconds + 5000)

    def lock_schema(self, cursor: Any) -> None:
        cursor.execute("SELECT pg_advisory_lock(%s)", (self.schema_lock,))

    def unlock_schema(self, cursor: Any) -> None:
        cursor.execute("SELECT pg_advisory_unlock(%s)", (self.schema_lock,))

    def is_unavailable(self, error: BaseException) -> bool:
        return isinstance(error, (self.driver.OperationalError, self.driver.InterfaceError))

    def is_error(self, error: BaseException) -> bool:
        return isinstance(error, self.driver.Error)

    def is_broken(self, error: BaseException, connection: Any) -> bool:
        # psycopg2 marks a connection it found dead (closed == 2); a
        # statement timeout leaves it open.
        return isinstance(error, self.driver.InterfaceError) or (
            isinstance(error, self.driver.OperationalError) and bool(connection.closed))


class MySQL(Dialect):
    name = "MariaDB"
    quote_char = "`"
    # VARCHAR where a column is a key or indexed; utf8mb4_bin: user names compare exactly.
    types = {"key": "VARCHAR(64)", "name": "VARCHAR(255)", "word": "VARCHAR(32)", "text": "TEXT",
             "long": "MEDIUMTEXT", "int": "INTEGER", "big": "BIGINT", "real": "DOUBLE", "flag": "SMALLINT"}
    # Client errors (2000-2999: cannot connect, gone away, lost) and server
    # answers that may pass: too many connections, shutting down, access
    # denied (a password being changed), lock wait / statement time-outs.
    _PASSING = {1040, 1045, 1053, 1077, 1205, 1213, 1927, 1969, 3024, 4031}
    table_options = "ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"

    def __init__(self) -> None:
        import pymysql

        self.driver = pymysql

    def upsert(self, table: str, columns: list[str], key: str) -> str:
        q = self.quote
        updates = ",".join(f"{q(c)}=VALUES({q(c)})" for c in columns if c != key)
        return (f"INSERT INTO {table} ({','.join(q(c) for c in columns)}) VALUES ({','.join('%s' for _ in columns)})"
                f" ON DUPLICATE KEY UPDATE {updates}")

    @property
    def migrations(self) -> dict[int, list[str]]:
        q = self.quote
        return {2: [
            # Indexes inline: MySQL has no CREATE INDEX IF NOT EXISTS, and DDL is not transactional here.
            f"CREATE TABLE IF NOT EXISTS sessions ({self.columns(_SESSION_TYPES, 'id')},"
            f" KEY sessions_user_state ({q('user')}, {q('state')}),"
            f" KEY sessions_state ({q('state')}, {q('changed')}),"
            f" KEY sessions_node_state ({q('node')}, {q('state')})) {self.table_options}",
            f"CREATE TABLE IF NOT EXISTS members ({self.columns(_MEMBER_TYPES, 'name')}) {self.table_options}",
            f"CREATE TABLE IF NOT EXISTS nxgate_locks (name VARCHAR(64) PRIMARY KEY) {self.table_options}",
            "INSERT IGNORE INTO nxgate_locks (name) VALUES ('admit')",
        ]}

    def connect(self, location: Location, timeout: float | None = None) -> Any:
        seconds = timeout or self.timeout
        from pymysql.constants import CLIENT

        connection = self.driver.connect(
            host=location.host, port=location.port, user=location.user, password=location.password,
            database=location.database, charset="utf8mb4", autocommit=False, connect_timeout=self.connect_timeout,
            read_timeout=seconds + 5, write_timeout=seconds + 5,
            client_flag=CLIENT.FOUND_ROWS)  # rowcount: rows matched, as PostgreSQL and SQLite count
        try:
            with connection.cursor() as cursor:
                # Each statement sees what others committed (admit counts after the lock).
                cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                cursor.execute(f"SET SESSION innodb_lock_wait_timeout={int(seconds)}")
            connection.commit()
        except BaseException:
            connection.close()
            raise
        return connection

    def autocommit(self, connection: Any) -> None:
        connection.autocommit(True)

    def lock_schema(self, cursor: Any) -> None:
        cursor.execute("SELECT GET_LOCK('nxgate.schema', %s)", (self.migration_timeout,))
        if cursor.fetchone()[0] != 1:
            raise self.driver.OperationalError(1205, "another member held the schema lock too long")

    def unlock_schema(self, cursor: Any) -> None:
        cursor.execute("SELECT RELEASE_LOCK('nxgate.schema')")

    def is_unavailable(self, error: BaseException) -> bool:
        if isinstance(error, self.driver.InterfaceError):
            return True
        if isinstance(error, self.driver.OperationalError):
            code = error.args[0] if error.args and isinstance(error.args[0], int) else 0
            return 2000 <= code < 3000 or code in self._PASSING
        return False

    def is_error(self, error: BaseException) -> bool:
        return isinstance(error, self.driver.Error)

    def is_broken(self, error: BaseException, connection: Any) -> bool:
        # Gone away / lost, but not PyMySQL's own read timeout (also 2013).
        if isinstance(error, self.driver.InterfaceError):
            return True
        code = error.args[0] if isinstance(error, self.driver.OperationalError) and error.args else 0
        return code in (2006, 2013) and "timed out" not in str(error)


def dialect(kind: str) -> Dialect:
    if kind == "sqlite":
        from nxgate.store.sqlite import SQLite

        return SQLite()
    return {"postgresql": PostgreSQL, "mysql": MySQL}[kind]()
