"""Sessions and members as database rows, for every SQL store (pure).

One place says which columns a row has and how Python values map to
them, so that SQLite, PostgreSQL and MariaDB store exactly the same thing:
booleans as integers, the state as its word, options as JSON, a member's
roles as a sorted comma-separated list.
"""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any

from nxgate.vocabulary.model import Member, Session, State

#: Every column of the sessions table, in the order rows are read and written.
SESSION_COLUMNS = [f.name for f in fields(Session)]
#: The columns an update writes (not the key, and not the revision, which the store bumps).
UPDATE_COLUMNS = [c for c in SESSION_COLUMNS if c not in ("id", "revision")]
MEMBER_COLUMNS = [f.name for f in fields(Member)]
#: The columns a heartbeat writes: everything but the admin's ``drained``.
HEARTBEAT_COLUMNS = [c for c in MEMBER_COLUMNS if c != "drained"]
LIVE_STATES = tuple(state.value for state in State if state.live)
_BOOLEANS = frozenset(f.name for f in fields(Session) if f.type in ("bool", bool))


def session_row(session: Session, columns: list[str] = SESSION_COLUMNS) -> list[Any]:
    row: list[Any] = []
    for column in columns:
        value = getattr(session, column)
        if column == "options":
            value = json.dumps(value, sort_keys=True)
        elif isinstance(value, State):
            value = value.value
        elif isinstance(value, bool):
            value = int(value)
        row.append(value)
    return row


def session_from_row(row: tuple[Any, ...] | list[Any]) -> Session:
    values = dict(zip(SESSION_COLUMNS, row))
    values["state"] = State(values["state"])
    values["options"] = json.loads(values["options"])
    for name in _BOOLEANS:
        values[name] = bool(values[name])
    for name in ("created", "changed"):
        values[name] = float(values[name])
    return Session(**values)


def member_row(member: Member, columns: list[str] = MEMBER_COLUMNS) -> list[Any]:
    row: list[Any] = []
    for column in columns:
        value = getattr(member, column)
        if column == "roles":
            value = ",".join(sorted(value))
        elif isinstance(value, bool):
            value = int(value)
        row.append(value)
    return row


def member_from_row(row: tuple[Any, ...] | list[Any]) -> Member:
    values = dict(zip(MEMBER_COLUMNS, row))
    values["roles"] = frozenset(role for role in values["roles"].split(",") if role)
    values["drained"] = bool(values["drained"])
    for name in ("started", "last_heartbeat", "load", "weight"):
        values[name] = float(values[name])
    for name in ("sessions", "cpus", "free_memory"):
        values[name] = int(values[name])
    return Member(**values)


def admission_counts(per_user: int, per_node: int, total: int) -> list[tuple[str, str]]:
    """The counts an admission needs, only for the limits it has (0: none),
    each one query an index answers: (limit name, the session column live
    rows must share with the new session, or "" for all live rows)."""
    wanted = [("user", "user", per_user), ("node", "node", per_node), ("total", "", total)]
    return [(name, column) for name, column, limit in wanted if limit]


def limit_hit(counts: tuple[int, int, int], per_user: int, per_node: int, total: int) -> str | None:
    """Which limit one more session would break ("user", "node", "total"),
    or None; ``counts`` are the live sessions of the user, on the node and
    in all (0 = no limit)."""
    for name, count, limit in zip(("user", "node", "total"), counts, (per_user, per_node, total)):
        if limit and count >= limit:
            return name
    return None
