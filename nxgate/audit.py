"""The audit log: one JSON line per login, session event, shadow attach or
admin action.

Code that does something an admin must be able to reconstruct logs it as
usual, with an ``audit`` key naming the event; :class:`AuditLog` (an
observer of the global log) writes those events, and only those, to the
audit file with a fixed shape that tools can parse (the fail2ban filter in
``conf/fail2ban`` matches ``login_failed`` lines)::

    {"time": "2026-12-03T10:00:00Z", "event": "login_failed", "address": "192.0.2.7", "user": "bob", ...}

Values come from clients: bytes that are not UTF-8 and control characters
are escaped (:func:`nxgate.safetext.printable`), so every event is one
line that a UTF-8 file takes.  A write that fails (a full disk) must not
make Twisted drop the observer for good, which would silently end the
audit trail and fail2ban's input: the observer never raises, counts what it
could not write and says so in the next line it can write.
"""

from __future__ import annotations

import errno
import json
import os
import time
from typing import Any

from nxgate.safetext import printable

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
            record[key] = value if isinstance(value, (int, float, bool)) else printable(str(value))
    return record


class AuditLog:
    """A log observer appending audit events to a file (0600)."""

    unfiltered = True  # audit events are kept whatever the log level

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        self.lost = 0  # events that could not be written since the last success

    def __call__(self, event: dict[str, Any]) -> None:
        record = audit_record(event)
        if record is None:
            return
        lines = []
        if self.lost:
            lines.append({"time": record["time"], "event": "audit_lost", "count": self.lost,
                          "reason": "the audit file could not be written"})
        lines.append(record)
        data = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines).encode("utf-8")
        try:
            written = os.write(self.fd, data)
        except OSError as error:
            if error.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG):
                raise
            self.lost += 1
            return
        if written != len(data):
            # A short append (the disk filled up in the middle): end the
            # partial line so the next event starts a line of its own.
            try:
                os.write(self.fd, b"\n")
            except OSError:
                pass
            self.lost += 1
            return
        self.lost = 0

    def close(self) -> None:
        os.close(self.fd)
