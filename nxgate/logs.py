"""Log level filtering for the gateway's log.

twistd sends every event, Conch's per-packet debug chatter included, to its
log file.  An admin wants logins, sessions and failures, so the gateway puts
a level filter in front of the observers twistd installed.  twistd offers no
hook for that, hence the small reach into the global publisher's observer
list; if that ever changes, the log is simply unfiltered.
"""

from __future__ import annotations

from twisted.logger import (
    FilteringLogObserver,
    LogLevel,
    LogLevelFilterPredicate,
    PredicateResult,
    globalLogPublisher,
)

LEVELS = {"debug": LogLevel.debug, "info": LogLevel.info, "warn": LogLevel.warn, "error": LogLevel.error}
# Conch's per-connection chatter; our own modules log what matters with context.
QUIET_NAMESPACES = ("twisted.conch", "nxgate.ssh.server.NXSessionChannel", "nxgate.ssh.server.NXUserAuthServer")
NORMAL_DISCONNECT = 11  # SSH_DISCONNECT_BY_APPLICATION: a client saying goodbye


def _not_a_normal_disconnect(event: dict) -> PredicateResult:
    if event.get("log_format", "").startswith("Got remote error") and event.get("code") == NORMAL_DISCONNECT:
        return PredicateResult.no
    return PredicateResult.maybe


_PREDICATE = LogLevelFilterPredicate()


def filter_global_log(level: str) -> None:
    """Drop events below ``level`` before they reach twistd's observers
    (again: a reload changes the level of the filter in place)."""
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
        if isinstance(observer, FilteringLogObserver):
            continue
        globalLogPublisher.removeObserver(observer)
        globalLogPublisher.addObserver(FilteringLogObserver(observer, predicates))
