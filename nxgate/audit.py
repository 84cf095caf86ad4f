"""The audit log: one JSON line per login, session event, shadow attach or
admin action.

Code that does something an admin must be able to reconstruct logs it as
usual, with an ``audit`` key naming the event; :class:`AuditLog` (an
observer of the global log) writes those events, and only those, to the
audit file with a fixed shape that tools can parse (the fail2ban filter in
``conf/fail2ban`` matches ``login_failed`` lines)::

    {"time": "2026-12-03T10:00:00Z", "event": "login_failed", "address": "192.0.2.7", "user": "bob", ...}
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

FIELDS = ("address", "user", "session", "method", "reason", "type", "display", "state", "owner", "mode",
          "target", "command", "admin", "attempt", "engine", "protocol")
ALIASES = {"id": "session"}


def audit_record(event: dict[str, Any]) -> dict[str, Any] | None:
    """The audit line for a log event, or None if it is not an audit event."""
    kind = event.get("audit")
    if not kind:
        return None
    record: dict[str, Any] = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(event.get("log_time", time.time()))),
        "event": kind,
    }
    fields = {ALIASES.get(key, key): value for key, value in event.items() if ALIASES.get(key, key) in FIELDS}
    for key in FIELDS:
        if key in fields and fields[key] not in (None, ""):
            value = fields[key]
            record[key] = value if isinstance(value, (int, float, bool)) else str(value)
    return record


class AuditLog:
    """A log observer appending audit events to a file (0600)."""

    def __init__(self, path: str) -> None:
        self.path = path
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        self.file = os.fdopen(fd, "a", encoding="utf-8", buffering=1)

    def __call__(self, event: dict[str, Any]) -> None:
        record = audit_record(event)
        if record is not None:
            self.file.write(json.dumps(record, ensure_ascii=False) + "\n")

    def close(self) -> None:
        self.file.close()
