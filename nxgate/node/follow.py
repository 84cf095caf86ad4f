"""Following an append-only log file without polling (Linux inotify).

The agent writes its log; the kernel tells us when the file grew; we read
from where we stopped.  One inotify instance serves every session.

Neither part may hold the reactor long: :func:`replay` reads a whole log
(what happened while the gateway was away) and is meant to run in a
thread, returning the offset a :class:`LogFollower` then follows from; the
follower reads at most :data:`READ_CAP` bytes per wake-up and continues in
the next reactor turn, so an agent that writes a flood of lines cannot
starve every other session.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from twisted.internet import inotify
from twisted.logger import Logger
from twisted.python.filepath import FilePath

from nxgate.node.agents.agentlog import LineSplitter

log = Logger()

READ_CHUNK = 65536
#: At most this much of a log is read per reactor turn; the rest follows
#: in the next one (callLater(0)).
READ_CAP = 256 * 1024


def _open(path: str) -> int:
    return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)


def replay(path: str, feed: Callable[[str], Any], offset: int = 0) -> int:
    """Feed every complete line of ``path`` from ``offset`` on to ``feed``;
    the offset just after the last complete line, where following must go
    on (a line still being written is read again by the follower).

    Blocking and unbounded (a long session's log): run it in a thread, with
    a ``feed`` that touches no reactor state (``ReplayState.feed``).  Raises
    OSError if the log cannot be opened."""
    fd = _open(path)
    splitter = LineSplitter()
    try:
        while True:
            chunk = os.pread(fd, READ_CHUNK, offset)
            if not chunk:
                break
            offset += len(chunk)
            for line in splitter.feed(chunk):
                feed(line)
    finally:
        os.close(fd)
    return offset - splitter.pending


class LogFollower:
    """Calls ``on_line`` for every complete line appended to ``path``.

    What the file holds past ``offset`` when the follower starts is read at
    once, in full: give it the offset :func:`replay` returned, so that is
    only what was written meanwhile.  Later reads are capped at
    :data:`READ_CAP` per reactor turn."""

    def __init__(self, notifier: inotify.INotify, path: str, on_line: Callable[[str], None], offset: int = 0,
                 reactor: Any = None) -> None:
        self.notifier = notifier
        self.path = FilePath(path)
        self.on_line = on_line
        self.offset = offset
        self.splitter = LineSplitter()
        self.stopped = False
        self.reactor = reactor
        self._more: Any = None  # the call that reads on, in the next reactor turn
        self._warned = False
        notifier.watch(self.path, mask=inotify.IN_MODIFY, callbacks=[self._changed])
        self.read(limit=None)  # what was written before the watch began

    def _changed(self, _watch: Any, _path: FilePath, _mask: int) -> None:
        if self._more is None:  # else the next turn reads it anyway
            self.read()

    def _read_more(self) -> None:
        self._more = None
        self.read()

    def read(self, limit: int | None = READ_CAP) -> None:
        """Read what was appended, at most ``limit`` bytes (None: to the end)
        now; if more is there, go on in the next reactor turn."""
        if self.stopped:
            return
        try:
            fd = _open(self.path.path)
        except OSError as error:
            if not self._warned:
                self._warned = True
                log.warn("cannot read the agent log {path}: {error}; its session hears nothing from its agent",
                         path=self.path.path, error=str(error))
            return
        left = limit
        try:
            while left is None or left > 0:
                chunk = os.pread(fd, READ_CHUNK if left is None else min(READ_CHUNK, left), self.offset)
                if not chunk:
                    return
                self.offset += len(chunk)
                if left is not None:
                    left -= len(chunk)
                for line in self.splitter.feed(chunk):
                    self.on_line(line)
                    if self.stopped:
                        return
        finally:
            os.close(fd)
        self._schedule()  # the cap was reached: there may be more

    def _schedule(self) -> None:
        if self._more is None and not self.stopped:
            if self.reactor is None:
                from twisted.internet import reactor

                self.reactor = reactor
            self._more = self.reactor.callLater(0, self._read_more)

    def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            if self._more is not None and self._more.active():
                self._more.cancel()
            self._more = None
            self.notifier.ignore(self.path)
