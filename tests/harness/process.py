"""Small blocking helpers for driving child processes from tests."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import time


class Timeout(AssertionError):
    pass


def wait_for(predicate, timeout: float, what: str, interval: float = 0.05):
    """Poll ``predicate`` until it returns something true, or fail."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise Timeout(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


def stop(process: subprocess.Popen, grace: float = 5.0) -> int | None:
    """SIGTERM, then SIGKILL after ``grace`` seconds; returns the exit code."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
    return process.returncode


def release(holder: subprocess.Popen, grace: float = 60.0) -> None:
    """End an attacker that holds what it took until its stdin closes (an
    attack test's holder): close its stdin, wait ``grace`` seconds for it to
    let go, then kill it; close its pipes.  Safe to call twice."""
    if holder.poll() is None:
        holder.stdin.close()
        try:
            holder.wait(grace)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait()
    holder.stdout.close()
    holder.stderr.close()


def stop_groups(processes: list[subprocess.Popen], grace: float = 10.0) -> None:
    """End children that lead process groups of their own
    (``start_new_session``) with all they started: SIGTERM to every group
    (the last started first), then SIGKILL to those still there after
    ``grace`` seconds."""
    for process in reversed(processes):
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
    for process in processes:
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(5)


def descendants(pid: int) -> set[int]:
    """The processes below ``pid`` (children, theirs, ...), read from /proc:
    a test that looks for "the" smbd of its client must not find another
    test's, which runs beside it (make test runs modules in parallel)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as handle:
                    # The parent is the second field after the command, which may hold spaces and parentheses.
                    parents[int(entry)] = int(handle.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


class Pipe:
    """Reads a child's output without blocking forever."""

    def __init__(self, fileobj) -> None:
        self.fd = fileobj.fileno()
        os.set_blocking(self.fd, False)
        self.buffer = b""
        self.eof = False

    def fill(self, timeout: float) -> bool:
        """Read what arrives within ``timeout``; False when nothing did."""
        if self.eof:
            return False
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return False
        try:
            chunk = os.read(self.fd, 65536)
        except BlockingIOError:
            return False
        if not chunk:
            self.eof = True
            return False
        self.buffer += chunk
        return True

    def read_until(self, pattern: bytes | re.Pattern[bytes], timeout: float = 15.0) -> bytes:
        """Consume and return output up to and including ``pattern``."""
        regex = pattern if isinstance(pattern, re.Pattern) else re.compile(re.escape(pattern))
        deadline = time.monotonic() + timeout
        while True:
            match = regex.search(self.buffer)
            if match:
                out, self.buffer = self.buffer[: match.end()], self.buffer[match.end() :]
                return out
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (self.eof and not self.fill(0)):
                raise Timeout(f"no {regex.pattern!r} in output; got {self.buffer[-2000:]!r}")
            self.fill(min(remaining, 0.5))

    def read_to_eof(self, timeout: float = 15.0) -> bytes:
        deadline = time.monotonic() + timeout
        while not self.eof:
            if time.monotonic() > deadline:
                raise Timeout(f"no EOF; got {self.buffer[-2000:]!r}")
            self.fill(0.5)
        out, self.buffer = self.buffer, b""
        return out
