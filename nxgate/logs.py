"""Log level filtering for the gateway's log.

twistd sends every event, Conch's per-packet debug chatter included, to its
log file.  An admin wants logins, sessions and failures, so the gateway puts
a level filter in front of the observers twistd installed.  twistd offers no
hook for that, hence the small reach into the global publisher's observer
list; if that ever changes, the log is simply unfiltered.

Twisted's classes log through a ``Logger`` attribute of theirs, namespaced
by the object's class: a Conch connection's "connection lost" and "sending
close 3", a factory's "Starting factory <...>", for every connection and
channel.  That chatter (:func:`logged_by_its_class`) is debug; its warnings
and errors pass.  The gateway's own modules log through a module-level
``Logger()`` (namespaced by the module), never through such an attribute,
so what they say at info stays at info.

The same wrapper keeps every event on one line: values in events come from
clients (a user name, a parameter with ``%0A`` in it, bytes that are not
UTF-8), and the classic text format writes a newline in a message as a new
line of the file.  Each message is formatted first and its control
characters and undecodable bytes escaped (:mod:`nxgate.safetext`), whatever
the format string did with the value (``{x}``, ``{x!r}``, ``str(error)``);
only a traceback (``log_failure``) spans lines, indented as usual.  And a
write that fails (a full disk) is dropped instead of raised, since Twisted
would otherwise disable the log file for the rest of the run.

Anything a client can repeat, it can repeat a million times: a global
request refused, a malformed packet's traceback.  Every warning, error and
traceback passes :class:`RepeatLimiter` (:mod:`nxgate.ratelimit`): at most
:data:`PER_SOURCE` lines of one kind (its namespace and format) per client
address per minute, and :data:`PER_KIND` of that kind from all addresses;
what is held back is counted and told in one line when its minute is over
("... and 12345 more like it").  Every door, and Twisted's own tracebacks,
get it this way, however they log.

twistd's ``--logfile`` rotates at 1 MB, keeps every rotated file and, when a
new file cannot be opened at a rotation (EMFILE), loses the log for good:
:class:`SturdyLogFile` keeps ``[server] log_rotated_files`` of them and
writes on into the renamed file until a new one opens.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

from twisted.logger import (
    FilteringLogObserver,
    ILogObserver,
    LogLevel,
    LogLevelFilterPredicate,
    PredicateResult,
    formatEvent,
    formatEventAsClassicLogText,
    globalLogPublisher,
)
from twisted.python import logfile, threadable
from zope.interface import implementer

from nxgate import ratelimit
from nxgate.safetext import printable

LEVELS = {"debug": LogLevel.debug, "info": LogLevel.info, "warn": LogLevel.warn, "error": LogLevel.error}
# Module-level chatter of Twisted's (Conch's, AMP's "connection established/lost" for every member
# link); our own modules log what matters with context (nxgate.wire.remote_node: "connected to ...").
QUIET_NAMESPACES = ("twisted.conch", "twisted.protocols.amp")


def logged_by_its_class(event: dict[str, Any]) -> bool:
    """Whether ``event`` came from a ``Logger`` that is a class attribute
    (Twisted's way: its namespace is the class of the object that logs)."""
    source = event.get("log_source")
    if source is None:
        return False
    cls = source if isinstance(source, type) else type(source)
    return event.get("log_namespace") == f"{cls.__module__}.{cls.__name__}"


def _class_chatter_is_debug(event: dict[str, Any]) -> PredicateResult:
    """Twisted's per-object info lines count as debug (see the module's docstring)."""
    if (event.get("log_level") is LogLevel.info and _PREDICATE.defaultLogLevel is not LogLevel.debug
            and logged_by_its_class(event)):
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


# ------------------------------------------------------------ repeated lines
#: Lines of one kind about one client address per window, and of one kind in all.
PER_SOURCE = 10
PER_KIND = 60
WINDOW = 60.0
#: Kinds and (kind, address) pairs remembered at once: a flood from many
#: addresses must not grow the table (beyond it, addresses share one count).
MAX_KEYS = 10_000
#: Event fields that name the client a line is about, in order of preference.
SOURCE_FIELDS = ("address", "source", "peer", "client", "remote")
_LIMITED_LEVELS = frozenset((LogLevel.warn, LogLevel.error, LogLevel.critical))


#: What one kind of line held back in one window: ``sample`` (the last of them), ``count``, ``since``.
Held = ratelimit.Held


class RepeatLimiter:
    """How many lines of a kind the log takes per window (pure: the clock is given).

    A kind is whatever :func:`kind_of` makes of an event (its namespace and
    format, not its values); a source the client address it names (or None).
    Each (kind, source) may pass ``per_source`` lines per ``window`` seconds
    and each kind ``per_kind`` in all; the rest are counted, and
    :meth:`due` gives each count once its window is over.  Both limits are
    the one :class:`nxgate.ratelimit.RateLimiter`."""

    def __init__(self, clock: Callable[[], float], per_source: int = PER_SOURCE, per_kind: int = PER_KIND,
                 window: float = WINDOW, capacity: int = MAX_KEYS) -> None:
        self.clock = clock
        self.per_source, self.per_kind, self.window, self.capacity = per_source, per_kind, window, capacity
        self._sources = ratelimit.RateLimiter(clock, per_source, window, capacity)
        self._kinds = ratelimit.RateLimiter(clock, per_kind, window, capacity, reports=False)
        self._ready: list[Held] = []

    def admit(self, kind: Hashable, source: str | None, event: dict[str, Any]) -> bool:
        """Whether ``event`` (of ``kind``, about ``source``) is written now.
        Too many addresses at once share their kind's count (``source`` None)."""
        key, overflow = (kind, source), (kind, None)
        if self._sources.room(key, overflow) and self._kinds.room(kind):
            self._kinds.admit(kind)
            self._keep(self._sources.admit(key, overflow=overflow).held)
            return True
        self._keep(self._sources.hold(key, sample=event, overflow=overflow))
        return False

    def due(self) -> list[Held]:
        """The counts of held lines whose window is over, each once."""
        for _key, held in self._sources.due():
            self._keep(held)
        ready, self._ready = self._ready, []
        return ready

    def _keep(self, held: Held | None) -> None:
        if held is not None and held.count:
            self._ready.append(held)


def is_limited(event: dict[str, Any]) -> bool:
    """Warnings, errors and every traceback; info and debug lines are each door's own business."""
    return event.get("log_failure") is not None or event.get("log_level") in _LIMITED_LEVELS


def kind_of(event: dict[str, Any]) -> Hashable:
    """What makes two lines "the same": namespace and format (and a traceback's exception type)."""
    failure = event.get("log_failure")
    return (event.get("log_namespace"), event.get("log_format"),
            getattr(getattr(failure, "type", None), "__name__", None))


def source_of(event: dict[str, Any]) -> str | None:
    """The client address an event is about (an address object's host; a
    ``host:port`` without its port), or None."""
    for name in SOURCE_FIELDS:
        value = event.get(name)
        if value is None:
            continue
        host = getattr(value, "host", None)
        text = str(host if host is not None else value)
        if text.count(":") == 1:  # IPv4 host:port (an IPv6 address keeps its colons)
            text = text.split(":", 1)[0]
        return text[:100]
    return None


def summary_event(held: Held, now: float) -> dict[str, Any]:
    """The line that tells of held-back lines: the last one's text and the count."""
    sample = held.sample
    summary = {
        "log_level": sample.get("log_level", LogLevel.warn), "log_namespace": sample.get("log_namespace", "nxgate"),
        "log_time": time.time(),
        "log_format": "{repeated} ... and {count} more like it in {seconds:.0f} s (not logged one by one:"
                      " at most {per_source} such lines a minute per address)",
        "repeated": formatEvent({**sample, "log_failure": None}), "count": held.count,
        "seconds": max(0.0, now - held.since), "per_source": PER_SOURCE, "event": "log_repeats",
    }
    if "log_system" in sample:  # else the line names the namespace and level, as the sample's did
        summary["log_system"] = sample["log_system"]
    return summary


@implementer(ILogObserver)
class RepeatObserver:
    """Passes events on, but warnings and tracebacks through a :class:`RepeatLimiter`."""

    def __init__(self, observer: ILogObserver, limiter: RepeatLimiter) -> None:
        self.observer = observer
        self.limiter = limiter
        self._lock = threading.Lock()  # threads log too (PAM, the store): one judge at a time

    def __call__(self, event: dict[str, Any]) -> None:
        self.flush()
        if is_limited(event):
            with self._lock:
                admitted = self.limiter.admit(kind_of(event), source_of(event), event)
            if not admitted:
                return
        self.observer(event)

    def flush(self) -> None:
        with self._lock:
            due = self.limiter.due()
        for held in due:
            self.observer(summary_event(held, self.limiter.clock()))


_REPEAT_OBSERVERS: list[RepeatObserver] = []
#: The limiters' clock (tests put a fake one here).
CLOCK: Callable[[], float] = time.monotonic


def flush_repeats() -> None:
    """For a timer: tell held-back lines whose minute is over, even when nothing else is logged."""
    for observer in _REPEAT_OBSERVERS:
        observer.flush()


# ------------------------------------------------------------- the log file
class SturdyLogFile(logfile.LogFile):
    """twistd's ``LogFile``, with a rotation that cannot lose the log.

    Twisted's rotation closes the file before it renames it and opens a new
    one: if the open fails (no file descriptors left, EMFILE) every later
    write fails and the log is gone until a restart.  Here the file is
    renamed while it stays open, and only a new file that did open replaces
    it; until then lines go on into the renamed file (``name.1``) and a new
    one is tried at the next write, once a second at most.  Files beyond
    ``maxRotatedFiles`` are removed, as Twisted does.  (twistd creates a
    plain ``LogFile``: :func:`filter_global_log` turns it into this one.)"""

    synchronized = ["rotate"]
    #: The file being written was renamed away; a new one is still to open.
    orphaned = False
    retry_at = 0.0
    failure = ""

    def shouldRotate(self) -> bool:
        if time.monotonic() < self.retry_at:  # the last try failed a moment ago
            return False
        return self.orphaned or bool(super().shouldRotate())

    def rotate(self) -> None:
        if not self.orphaned:
            try:
                for number in reversed(self.listLogs()):
                    if self.maxRotatedFiles is not None and number >= self.maxRotatedFiles:
                        os.remove(f"{self.path}.{number}")
                    else:
                        os.rename(f"{self.path}.{number}", f"{self.path}.{number + 1}")
                os.rename(self.path, f"{self.path}.1")
            except OSError:
                self.retry_at = time.monotonic() + 1.0
                return  # the current file was not moved: it goes on
            self.orphaned = True
        self._open_new()

    def _open_new(self) -> None:
        current = self._file
        try:
            self._openFile()  # sets self._file only once the open succeeded
        except OSError as error:
            self._file = current
            self.retry_at = time.monotonic() + 1.0
            if not self.failure:
                self.failure = error.strerror or str(error)
            return
        self.orphaned = False
        try:
            current.close()
        except OSError:
            pass
        if self.failure:
            note = {"log_level": LogLevel.warn, "log_namespace": "nxgate.logs", "log_system": "-",
                    "log_time": time.time(), "log_format": "the log could not be reopened at its rotation ({why});"
                    " the lines in between went to {path}.1", "why": self.failure, "path": self.path}
            self.failure = ""
            line = formatEventAsClassicLogText(note)
            if line:
                self._file.write(line.encode("utf-8"))
                self.size += len(line)


threadable.synchronize(SturdyLogFile)
_LOG_FILES: list[logfile.LogFile] = []


def _sturdy(observer: Any) -> None:
    """twistd's ``--logfile`` observer writes to a ``LogFile``: make it sturdy."""
    log_file = getattr(observer, "_outFile", None)
    if isinstance(log_file, logfile.LogFile) and log_file not in _LOG_FILES:
        if type(log_file) is logfile.LogFile:
            log_file.__class__ = SturdyLogFile
        _LOG_FILES.append(log_file)


def filter_global_log(level: str, rotated_files: int | None = None) -> None:
    """Drop events below ``level`` before they reach twistd's observers
    (again: a reload changes the level of the filter in place), and hold back
    repeated warnings (:class:`RepeatObserver`).  Observers with a true
    ``unfiltered`` attribute (the audit log) see every event.
    ``rotated_files``: how many rotated files twistd's log file keeps."""
    _PREDICATE.defaultLogLevel = LEVELS[level]
    _PREDICATE.clearLogLevels()
    if level != "debug":
        for namespace in QUIET_NAMESPACES:
            _PREDICATE.setLogLevelForNamespace(namespace, LogLevel.warn)
    predicates = [_class_chatter_is_debug, _PREDICATE]
    observers = getattr(globalLogPublisher, "_observers", None)
    if observers is not None:
        for observer in list(observers):
            if isinstance(observer, FilteringLogObserver) or getattr(observer, "unfiltered", False):
                continue
            _sturdy(observer)
            limited = RepeatObserver(OneLineObserver(observer), RepeatLimiter(CLOCK))
            _REPEAT_OBSERVERS.append(limited)
            globalLogPublisher.removeObserver(observer)
            globalLogPublisher.addObserver(FilteringLogObserver(limited, predicates))
    if rotated_files is not None:
        for log_file in _LOG_FILES:
            log_file.maxRotatedFiles = rotated_files
