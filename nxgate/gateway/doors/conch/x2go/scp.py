"""The sink side of the SCP protocol, for x2goclient's pushes (pure, sans-IO).

x2goclient (libssh) copies its sshfs key and PulseAudio cookie with
``scp -t -r '<dir>'`` and shows a critical "Connection failed" dialog when
that fails.  This reads the few messages a sink gets -- ``C<mode> <size>
<name>`` with the data, ``D``/``E`` for directories, ``T`` times -- and
answers them; what to write where is handed out as :class:`File` records
(paths below the target directory, plain names only, at most
:data:`MAX_FILE_BYTES` each, and at most so many files and bytes in one
copy: :class:`~nxgate.gateway.doors.conch.x2go.allowance.PushCount`),
written by the caller (confined to ``~/.x2go``, as the user:
:mod:`nxgate.gateway.doors.conch.x2go.pushes`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nxgate.gateway.doors.conch.x2go.allowance import PushCount

OK = b"\0"
MAX_FILE_BYTES = 64 * 1024
MAX_LINE = 1024
MAX_DEPTH = 4
_COPY = re.compile(rb"C([0-7]{4}) (\d{1,12}) ([A-Za-z0-9._@+-]{1,128})")
_DIRECTORY = re.compile(rb"D([0-7]{4}) 0 ([A-Za-z0-9._@+-]{1,128})")
_TIMES = re.compile(rb"T\d{1,20} \d{1,9} \d{1,20} \d{1,9}")


@dataclass(frozen=True)
class File:
    path: str  # the target directory's path joined with the names pushed
    data: bytes


class Failed(ValueError):
    """Something a sink does not take; the client gets ``\\x01`` and the reason."""


class Sink:
    """Feed it the client's bytes; it answers with what to send and the files received."""

    def __init__(self, directory: str) -> None:
        self.directory = directory.rstrip("/")
        self.stack: list[str] = []
        self.buffer = b""
        self.pending: tuple[str, int] | None = None  # (path, size) of the file being received
        self.done = False
        self.count = PushCount()

    def start(self) -> bytes:
        return OK

    def feed(self, data: bytes) -> tuple[bytes, list[File]]:
        """(what to send back, complete files); raises Failed."""
        self.buffer += data
        out, files = b"", []
        while not self.done:
            if self.pending is not None:
                path, size = self.pending
                if len(self.buffer) < size + 1:
                    if len(self.buffer) > MAX_FILE_BYTES + 1:
                        raise Failed("file too large")
                    break
                if self.buffer[size:size + 1] != b"\0":
                    raise Failed("no end of file")
                files.append(File(path, self.buffer[:size]))
                self.buffer = self.buffer[size + 1:]
                self.pending = None
                out += OK
                continue
            end = self.buffer.find(b"\n")
            if end < 0:
                if len(self.buffer) > MAX_LINE:
                    raise Failed("line too long")
                break
            line, self.buffer = self.buffer[:end], self.buffer[end + 1:]
            out += self._line(line)
        return out, files

    def _line(self, line: bytes) -> bytes:
        copy = _COPY.fullmatch(line)
        if copy is not None:
            size = int(copy.group(2))
            if size > MAX_FILE_BYTES:
                raise Failed("file too large")
            refusal = self.count.refusal(size)
            if refusal is not None:
                raise Failed(refusal)
            self.pending = (self._join(copy.group(3).decode()), size)
            return OK
        directory = _DIRECTORY.fullmatch(line)
        if directory is not None:
            if len(self.stack) >= MAX_DEPTH:
                raise Failed("too deep")
            name = directory.group(2).decode()
            if name in (".", ".."):
                raise Failed("bad directory name")
            self.stack.append(name)
            return OK
        if line == b"E":
            if not self.stack:
                self.done = True  # the end of the top directory: nothing more comes
                return OK
            self.stack.pop()
            return OK
        if _TIMES.fullmatch(line):
            return OK
        raise Failed("unexpected message")

    def _join(self, name: str) -> str:
        if name in (".", ".."):
            raise Failed("bad file name")
        return "/".join([self.directory, *self.stack, name])


def failure(reason: str) -> bytes:
    return b"\x01nxgate: " + reason.encode()[:200] + b"\n"
