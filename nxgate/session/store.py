"""The session store: one SQLite file in the state directory.

Only the session manager writes it.  The schema carries a version
(``PRAGMA user_version``) and is migrated forward on open; a database from
a newer nxgate is refused rather than misread.  Writes are small and run on
the reactor thread (WAL journal, no fsync per commit), which keeps "one
owner of state" literal: there is no second writer to race with.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterable
from dataclasses import fields
from typing import Any

from nxgate.session.model import Session, State

SCHEMA_VERSION = 1

_COLUMNS = [f.name for f in fields(Session)]
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
}
LIVE_STATES = tuple(state.value for state in State if state.live)


class StoreError(Exception):
    pass


class SessionStore:
    def __init__(self, path: str) -> None:
        new = not os.path.exists(path)
        if new:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("PRAGMA busy_timeout=5000")
        os.chmod(path, 0o600)
        self._migrate()

    def _migrate(self) -> None:
        (version,) = self.db.execute("PRAGMA user_version").fetchone()
        if version > SCHEMA_VERSION:
            raise StoreError(f"the session store has schema {version}; this nxgate knows up to {SCHEMA_VERSION}")
        for target in range(version + 1, SCHEMA_VERSION + 1):
            self.db.executescript(f"BEGIN; {_MIGRATIONS[target]}; PRAGMA user_version={target}; COMMIT;")

    def close(self) -> None:
        self.db.close()

    # ------------------------------------------------------------- writes
    def insert(self, session: Session) -> None:
        values = _to_row(session)
        marks = ",".join("?" for _ in _COLUMNS)
        self.db.execute(f"INSERT INTO sessions ({','.join(_COLUMNS)}) VALUES ({marks})", values)

    def update(self, session: Session) -> None:
        values = _to_row(session)
        assignments = ",".join(f"{column}=?" for column in _COLUMNS[1:])
        cursor = self.db.execute(f"UPDATE sessions SET {assignments} WHERE id=?", values[1:] + [values[0]])
        if cursor.rowcount != 1:
            raise StoreError(f"no session {session.id} to update")

    def delete(self, session_ids: Iterable[str]) -> None:
        self.db.executemany("DELETE FROM sessions WHERE id=?", [(sid,) for sid in session_ids])

    # -------------------------------------------------------------- reads
    def get(self, session_id: str) -> Session | None:
        row = self.db.execute(f"SELECT {','.join(_COLUMNS)} FROM sessions WHERE id=?", (session_id,)).fetchone()
        return None if row is None else _from_row(row)

    def live(self, user: str | None = None) -> list[Session]:
        marks = ",".join("?" for _ in LIVE_STATES)
        query = f"SELECT {','.join(_COLUMNS)} FROM sessions WHERE state IN ({marks})"
        args: list[Any] = list(LIVE_STATES)
        if user is not None:
            query += " AND user=?"
            args.append(user)
        return [_from_row(row) for row in self.db.execute(query + " ORDER BY created", args)]

    def ended_before(self, timestamp: float) -> list[Session]:
        marks = ",".join("?" for _ in LIVE_STATES)
        rows = self.db.execute(
            f"SELECT {','.join(_COLUMNS)} FROM sessions WHERE state NOT IN ({marks}) AND changed < ?",
            [*LIVE_STATES, timestamp],
        )
        return [_from_row(row) for row in rows]

    def count(self) -> int:
        (total,) = self.db.execute("SELECT COUNT(*) FROM sessions").fetchone()
        return total


def _to_row(session: Session) -> list[Any]:
    row: list[Any] = []
    for column in _COLUMNS:
        value = getattr(session, column)
        if column == "options":
            value = json.dumps(value, sort_keys=True)
        elif isinstance(value, State):
            value = value.value
        elif isinstance(value, bool):
            value = int(value)
        row.append(value)
    return row


def _from_row(row: tuple[Any, ...]) -> Session:
    values = dict(zip(_COLUMNS, row))
    values["state"] = State(values["state"])
    values["options"] = json.loads(values["options"])
    for f in fields(Session):
        if f.type in ("bool", bool):
            values[f.name] = bool(values[f.name])
    return Session(**values)
