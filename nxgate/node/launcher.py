"""Starting programs as a user: :class:`Launcher` runs :mod:`nxgate.node.runas`
(as root, with PAM) for each start, feeds it the request as JSON on stdin and
reads back "ok" (then the program's pid) or the error, and optionally the
program's own first status line (fd 3), or all of its output, with a bound
(:meth:`Launcher.output`).  It is the one way nxgate starts a program as a
user: sessions, their programs and services, browser viewers, thumbnails."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from typing import Any

from twisted.internet import defer, protocol

from nxgate.node.processes import LaunchError, ProcessId


class OutputTooLarge(LaunchError):
    """The program wrote more than the caller would read; reading stopped there (``read`` bytes)."""

    def __init__(self, read: int) -> None:
        super().__init__(f"output too large: more than {read - 1} bytes")
        self.read = read


class _Launch(protocol.ProcessProtocol):
    def __init__(self, request: dict[str, Any], limit: int | None = None) -> None:
        self.request = json.dumps(request).encode()
        #: With a limit, everything the program writes after "ok" is kept (up to the limit).
        self.limit = limit
        self.kept: list[bytes] = []
        self.kept_bytes = 0
        self.too_much: int | None = None
        self.ready: defer.Deferred[int] = defer.Deferred()
        self.status: defer.Deferred[str] = defer.Deferred() if request.get("status_fd") else defer.succeed("")
        self.ended: defer.Deferred[int | None] = defer.Deferred()
        self.output = b""
        self.errors = b""

    def connectionMade(self) -> None:
        self.transport.write(self.request)
        self.transport.closeStdin()

    def outReceived(self, data: bytes) -> None:
        if self.limit is not None and self.ready.called:
            self._keep(data)
            return
        self.output += data
        while b"\n" in self.output:
            raw, self.output = self.output.split(b"\n", 1)
            line = raw.decode("utf-8", "replace")
            if not self.ready.called:
                if line == "ok":
                    self.ready.callback(self.transport.pid)
                elif line.startswith("ok ") and line[3:].isdigit():
                    self.ready.callback(int(line[3:]))  # a child it forked (into a jail)
                else:
                    self.ready.errback(LaunchError(line.removeprefix("error: ")))
                    continue
                if self.limit is not None:  # the rest is the program's output
                    output, self.output = self.output, b""
                    self._keep(output)
                    return
            elif not self.status.called:
                self.status.callback(line)  # the program's own first line (fd 3)

    def _keep(self, data: bytes) -> None:
        if self.too_much is not None or not data:
            return
        self.kept.append(data)
        self.kept_bytes += len(data)
        if self.limit is not None and self.kept_bytes > self.limit:
            self.too_much = self.kept_bytes
            self.kept.clear()
            self.transport.closeChildFD(1)  # a writer past the limit gets SIGPIPE

    def outConnectionLost(self) -> None:
        if self.ready.called and not self.status.called:
            self.status.addErrback(lambda _failure: None)  # in case nobody waits any more
            self.status.errback(LaunchError("the program closed its status pipe without a word"))

    def errReceived(self, data: bytes) -> None:
        self.errors = (self.errors + data)[-4096:]

    def processEnded(self, reason: Any) -> None:
        code = getattr(reason.value, "exitCode", None)
        if not self.ready.called:
            detail = self.errors.decode("utf-8", "replace").strip().splitlines()[-1:] or [f"exit code {code}"]
            self.ready.errback(LaunchError(f"launcher failed: {detail[0]}"))
        if not self.status.called:
            self.status.addErrback(lambda _failure: None)  # nobody waits for a status now
            self.status.errback(LaunchError(f"the program ended (exit code {code})"))
        self.ended.callback(code)


class Launcher:
    """Runs :mod:`nxgate.node.runas` for the session manager."""

    #: PAM closes run in the background, and after a restart or a mass
    #: logout there can be a hundred at once; each is a Python process, so
    #: a handful at a time finishes them sooner than all together.
    CONCURRENT_PAM_CLOSES = 4

    def __init__(self, reactor: Any) -> None:
        self.reactor = reactor
        self._pam_closes = defer.DeferredSemaphore(self.CONCURRENT_PAM_CLOSES)

    def _run(self, request: dict[str, Any], limit: int | None = None) -> _Launch:
        launch = _Launch(request, limit)
        env = {"PATH": os.defpath, "LANG": "C.UTF-8", "PYTHONPATH": os.pathsep.join(sys.path)}
        self.reactor.spawnProcess(
            launch, sys.executable, [sys.executable, "-m", "nxgate.node.runas"],
            env=env, path="/", childFDs={0: "w", 1: "r", 2: "r"},
        )
        return launch

    async def start(self, request: dict[str, Any]) -> ProcessId:
        """Start a program as a user; its identity once it runs."""
        process, _status = await self.start_reporting(request)
        return process

    async def start_reporting(self, request: dict[str, Any]) -> tuple[ProcessId, defer.Deferred[str]]:
        """Start a program that writes a status line on fd 3 (if the request
        says ``status_fd``); also returns the Deferred of that line."""
        launch = self._run(request)
        pid = await launch.ready
        identity = ProcessId.of(pid)
        if identity is None:
            raise LaunchError("the program exited at once")
        return identity, launch.status

    async def run(self, request: dict[str, Any], timeout: float) -> int | None:
        """Run a program as a user to its end; its exit code, or None if it
        had to be stopped after ``timeout`` seconds."""
        launch = self._run(request)
        pid = await launch.ready
        ended = launch.ended
        ended.addTimeout(timeout, self.reactor)
        try:
            return await ended
        except defer.TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            return None

    async def output(self, request: dict[str, Any], limit: int, timeout: float) -> bytes:
        """Run a program as a user (``pipe_stdout`` in the request) to its end
        and return what it wrote on stdout: at most ``limit`` bytes are kept,
        whatever it writes (:class:`OutputTooLarge` past them), and a program
        still running after ``timeout`` seconds is killed (LaunchError)."""
        launch = self._run(dict(request, pipe_stdout=True), limit)
        pid = await launch.ready
        ended = launch.ended
        ended.addTimeout(timeout, self.reactor)
        try:
            await ended
        except defer.TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)  # our own child, not reaped yet: its pid is nobody else's
            raise LaunchError(f"no complete output within {timeout:g} seconds") from None
        if launch.too_much is not None:
            raise OutputTooLarge(launch.too_much)
        return b"".join(launch.kept)

    async def close_pam(self, request: dict[str, Any]) -> None:
        await self._pam_closes.acquire()
        try:
            started = self._run(dict(request, mode="close-pam"))
            await started.ready
            await started.ended
        finally:
            self._pam_closes.release()
