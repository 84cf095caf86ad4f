"""nxagent's log lines, read as session events (pure; reference §4.1 and the
measurements in nxagent-recipe.md).

nxagent announces every state change on stderr with a fixed line, e.g.
``Session: Session suspended at '...'.``; the gateway sends stderr to a
log file and feeds each new line through :func:`parse_line`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nxgate.vocabulary.model import AgentEvent  # the events are the session model's vocabulary




@dataclass(frozen=True)
class LogEvent:
    event: AgentEvent
    text: str = ""
    fullscreen: bool = False  # for SCREEN: whether the client shows it full screen


_PATTERNS: list[tuple[re.Pattern[str], AgentEvent]] = [
    (re.compile(r"^Session: Starting session at"), AgentEvent.STARTING),
    (re.compile(r"^Info: Waiting for connection from (?:'[^']*'|this host) on (?:port|socket) '"), AgentEvent.WAITING),
    (re.compile(r"^Session: Session (?:started|resumed) at"), AgentEvent.RUNNING),
    (re.compile(r"^Session: Display failure detected at"), AgentEvent.DISPLAY_FAILURE),
    (re.compile(r"^Session: Suspending session at"), AgentEvent.SUSPENDING),
    (re.compile(r"^Session: Session suspended at"), AgentEvent.SUSPENDED),
    (re.compile(r"^Session: Resuming session at"), AgentEvent.RESUMING),
    (re.compile(r"^Session: Terminating session at"), AgentEvent.TERMINATING),
    (re.compile(r"^Session: Session terminated at"), AgentEvent.TERMINATED),
    (re.compile(r"^Session: Aborting session at"), AgentEvent.ABORTING),
    (re.compile(r"^Session: Session aborted at"), AgentEvent.ABORTED),
    (re.compile(r"^Error: Authentication cookie '.*' doesn't match"), AgentEvent.COOKIE_MISMATCH),
    (re.compile(r"^Info: Waiting the watchdog process to complete"), AgentEvent.WATCHDOG_WAIT),
    (re.compile(r"^Error: (.*)"), AgentEvent.ERROR),
]


# nxcomp's Error lines when the link to the client breaks: the client went
# (or its network did), which for NX is a normal disconnect; the agent then
# suspends (a shadow ends), and that is what the gateway's log says.
_CLIENT_GONE = re.compile(r"peer proxy|remote peer broken|state of your network")
#: The reason a session ended when its agent lost its client, in the gateway's words.
CLIENT_GONE = "its client went away"


def client_gone(text: str) -> bool:
    """Whether an ``Error:`` line's text is the agent losing its client."""
    return _CLIENT_GONE.search(text) is not None


# The real size of the session's screen, printed at start, at every resume
# and whenever the desktop follows the client's window (resize=1).
_SCREEN = re.compile(r"^Info: Screen \[0\] resized to geometry \[(\d{1,5}x\d{1,5})\] fullscreen \[([01])\]")


def parse_line(line: str) -> LogEvent | None:
    """The event a log line announces, or None for the many other lines."""
    screen = _SCREEN.search(line)
    if screen:
        return LogEvent(AgentEvent.SCREEN, screen.group(1), screen.group(2) == "1")
    for pattern, event in _PATTERNS:
        match = pattern.search(line)
        if match:
            if event is AgentEvent.COOKIE_MISMATCH:
                return LogEvent(event)  # never keep cookies in our logs
            return LogEvent(event, match.group(1) if match.groups() else "")
    return None


class LineSplitter:
    """Turns appended chunks of a log file into complete lines."""

    def __init__(self, max_line: int = 8192) -> None:
        self._partial = b""
        self.max_line = max_line

    def feed(self, data: bytes) -> list[str]:
        data = self._partial + data
        *lines, self._partial = data.split(b"\n")
        if len(self._partial) > self.max_line:
            lines.append(self._partial[: self.max_line])
            self._partial = b""
        return [line.decode("utf-8", "replace").rstrip("\r") for line in lines]

    @property
    def pending(self) -> int:
        """How many bytes fed so far belong to a line not complete yet."""
        return len(self._partial)
