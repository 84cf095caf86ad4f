"""Following an append-only log file without polling (Linux inotify).

The agent writes its log; the kernel tells us when the file grew; we read
from where we stopped.  One inotify instance serves every session.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from twisted.internet import inotify
from twisted.python.filepath import FilePath

from nxgate.backends.agentlog import LineSplitter

READ_CHUNK = 65536


class LogFollower:
    """Calls ``on_line`` for every complete line appended to ``path``."""

    def __init__(self, notifier: inotify.INotify, path: str, on_line: Callable[[str], None], offset: int = 0) -> None:
        self.notifier = notifier
        self.path = FilePath(path)
        self.on_line = on_line
        self.offset = offset
        self.splitter = LineSplitter()
        self.stopped = False
        notifier.watch(self.path, mask=inotify.IN_MODIFY, callbacks=[self._changed])
        self.read()  # what was written before the watch began

    def _changed(self, _watch: Any, _path: FilePath, _mask: int) -> None:
        self.read()

    def read(self) -> None:
        if self.stopped:
            return
        try:
            fd = os.open(self.path.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return
        try:
            while True:
                chunk = os.pread(fd, READ_CHUNK, self.offset)
                if not chunk:
                    break
                self.offset += len(chunk)
                for line in self.splitter.feed(chunk):
                    self.on_line(line)
                    if self.stopped:
                        return
        finally:
            os.close(fd)

    def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            self.notifier.ignore(self.path)
