"""Log level filtering for the gateway's log.

twistd sends every event, Conch's per-packet debug chatter included, to its
log file.  An admin wants logins, sessions and failures, so the gateway puts
a level filter in front of the observers twistd installed.  twistd offers no
hook for that, hence the small reach into the global publisher's observer
list; if that ever changes, the log is simply unfiltered.

The same wrapper keeps every event on one line: values in events come from
clients (a user name, a parameter with ``%0A`` in it, bytes that are not
UTF-8), and the classic text format writes a newline in a message as a new
line of the file.  Each message is formatted first and its control
characters and undecodable bytes escaped (:mod:`nxgate.safetext`), whatever
the format string did with the value (``{x}``, ``{x!r}``, ``str(error)``);
only a traceback (``log_failure``) spans lines, indented as usual.  And a
write that fails (a full disk) is dropped instead of raised, since Twisted
would otherwise disable the log file for the rest of the run.
"""

from __future__ import annotations

from typing import Any

from twisted.logger import (
    FilteringLogObserver,
    ILogObserver,
    LogLevel,
    LogLevelFilterPredicate,
    PredicateResult,
    formatEvent,
    globalLogPublisher,
)
from zope.interface import implementer

from nxgate.safetext import printable

LEVELS = {"debug": LogLevel.debug, "info": LogLevel.info, "warn": LogLevel.warn, "error": LogLevel.error}
# Conch's per-connection chatter; our own modules log what matters with context.
QUIET_NAMESPACES = ("twisted.conch", "nxgate.gateway.doors.conch.server.NXSessionChannel", "nxgate.gateway.doors.conch.server.NXUserAuthServer")
NORMAL_DISCONNECT = 11  # SSH_DISCONNECT_BY_APPLICATION: a client saying goodbye


def _not_a_normal_disconnect(event: dict) -> PredicateResult:
    if event.get("log_format", "").startswith("Got remote error") and event.get("code") == NORMAL_DISCONNECT:
        return PredicateResult.no
    return PredicateResult.maybe


_PREDICATE = LogLevelFilterPredicate()


def one_line(event: dict[str, Any]) -> dict[str, Any]:
    """``event``, or a copy whose message is its formatted text with
    control characters and undecodable bytes escaped."""
    if not event.get("log_format"):
        return event  # nothing is written for it
    text = formatEvent(event)
    safe = printable(text)
    if safe == text:
        return event
    copy = dict(event)
    copy["log_format"] = safe.replace("{", "{{").replace("}", "}}")
    return copy


@implementer(ILogObserver)
class OneLineObserver:
    """Passes events on as :func:`one_line`; a failed write is dropped."""

    def __init__(self, observer: ILogObserver) -> None:
        self.observer = observer

    def __call__(self, event: dict[str, Any]) -> None:
        try:
            self.observer(one_line(event))
        except OSError:
            pass  # the log's disk is full: losing lines beats losing the log


def filter_global_log(level: str) -> None:
    """Drop events below ``level`` before they reach twistd's observers
    (again: a reload changes the level of the filter in place).  Observers
    with a true ``unfiltered`` attribute (the audit log) see every event."""
    _PREDICATE.defaultLogLevel = LEVELS[level]
    _PREDICATE.clearLogLevels()
    if level != "debug":
        for namespace in QUIET_NAMESPACES:
            _PREDICATE.setLogLevelForNamespace(namespace, LogLevel.warn)
    predicates = [_not_a_normal_disconnect, _PREDICATE]
    observers = getattr(globalLogPublisher, "_observers", None)
    if observers is None:
        return
    for observer in list(observers):
        if isinstance(observer, FilteringLogObserver) or getattr(observer, "unfiltered", False):
            continue
        globalLogPublisher.removeObserver(observer)
        globalLogPublisher.addObserver(FilteringLogObserver(OneLineObserver(observer), predicates))
