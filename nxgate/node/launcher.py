"""Starting programs as a user: :class:`Launcher` runs :mod:`nxgate.node.runas`
(as root, with PAM) for each start, feeds it the request as JSON on stdin and
reads back "ok" (then the program's pid) or the error, and optionally the
program's own first status line (fd 3), or all of its output, with a bound
(:meth:`Launcher.output`).  It is the one way nxgate starts a program as a
user: sessions, their programs and services, browser viewers, thumbnails.

A launcher is a Python process, whose start-up (interpreter, imports, libpam)
took ~0.1 s of every session start, twice: the agent's launcher and then the
program's.  So two are started ahead (*spares*, one for each): a spare gets
ready and waits for its request on stdin, and a start hands it the request
instead of waiting for a fresh one; a new spare is started right after, at
the lowest CPU priority, so that its start-up takes only idle time and never
competes with the session that is starting (it gets the gateway's priority
back when it is given a request, before it reads it).  It holds no request, no user
and no secret until it is given one, and ends by itself when the gateway
goes (its stdin closes)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
from typing import Any

from twisted.internet import defer, protocol

from nxgate.node.processes import LaunchError, ProcessId

#: A spare's niceness while it starts and waits (the least CPU priority).
SPARE_NICENESS = 19


def _running(pid: int) -> bool:
    """Whether our child ``pid`` has not exited, its end not reaped yet
    (a peek: the reactor still reaps it and sees it end)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    except ChildProcessError:
        return False


class OutputTooLarge(LaunchError):
    """The program wrote more than the caller would read; reading stopped there (``read`` bytes)."""

    def __init__(self, read: int) -> None:
        super().__init__(f"output too large: more than {read - 1} bytes")
        self.read = read


class _Launch(protocol.ProcessProtocol):
    """One launcher process; a spare is made with no request and is given
    one later (:meth:`send`)."""

    def __init__(self, request: dict[str, Any] | None = None, limit: int | None = None) -> None:
        self.request: bytes | None = None
        #: With a limit, everything the program writes after "ok" is kept (up to the limit).
        self.limit: int | None = None
        self.kept: list[bytes] = []
        self.kept_bytes = 0
        self.too_much: int | None = None
        self.ready: defer.Deferred[int] = defer.Deferred()
        self.status: defer.Deferred[str] = defer.succeed("")
        self.ended: defer.Deferred[int | None] = defer.Deferred()
        self.output = b""
        self.errors = b""
        self.gone = False  # the process has ended
        self.holder: int | None = None  # an fd the program gets (see send)
        self.handover: socket.socket | None = None  # our end of the launcher's fd 3
        if request is not None:
            self.send(request, limit)

    def send(self, request: dict[str, Any], limit: int | None = None) -> None:
        """``request["abstract_holder"]``: an fd of ours (a display's abstract
        X name, see :func:`nxgate.node.displays.name_holder`) that the program
        keeps as fd 3: it goes over the hand-over socket, not into the JSON."""
        request = dict(request)
        self.holder = request.pop("abstract_holder", None)
        if self.holder is not None:
            request["abstract_holder"] = "handed over"
        self.request = json.dumps(request).encode()
        self.limit = limit
        if request.get("status_fd"):
            self.status = defer.Deferred()
        if self.transport is not None:
            self._deliver()

    def connectionMade(self) -> None:
        if self.request is not None:
            self._deliver()

    def _deliver(self) -> None:
        assert self.request is not None
        if self.holder is not None and self.handover is not None:
            socket.send_fds(self.handover, [b"x"], [self.holder])  # one byte: it fits, it does not block
        self.close_handover()
        self.transport.write(self.request)
        self.transport.closeStdin()

    def close_handover(self) -> None:
        if self.handover is not None:
            self.handover.close()
            self.handover = None

    def quit(self) -> None:
        """A spare that is not needed: its stdin closes, and it ends."""
        if self.transport is not None and not self.gone:
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
        self.gone = True
        self.close_handover()
        code = getattr(reason.value, "exitCode", None)
        if self.request is None:  # a spare that was never used
            self.ended.callback(code)
            return
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

    #: Launchers kept started ahead: a session start takes two (its agent's, its program's).
    SPARES = 2

    def __init__(self, reactor: Any, spares: int = SPARES) -> None:
        """``spares``: launchers kept started ahead from :meth:`prepare` on
        until :meth:`stop` (0, or never prepared: every start spawns its own)."""
        self.reactor = reactor
        self._pam_closes = defer.DeferredSemaphore(self.CONCURRENT_PAM_CLOSES)
        self.spares_wanted = spares
        self._spares: list[_Launch] = []
        self._refill_call: Any = None
        self._keeping = False  # prepared and not stopped

    def _spawn(self, launch: _Launch) -> _Launch:
        env = {"PATH": os.defpath, "LANG": "C.UTF-8", "PYTHONPATH": os.pathsep.join(sys.path)}
        argv = [sys.executable, "-m", "nxgate.node.runas"]
        if launch.request is None:
            argv.append("--spare")  # get ready (libpam too) before the request comes
        # fd 3: how a descriptor of ours reaches the launcher (SCM_RIGHTS), a spare's too.
        launch.handover, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            process = self.reactor.spawnProcess(launch, sys.executable, argv, env=env, path="/",
                                                childFDs={0: "w", 1: "r", 2: "r", 3: theirs.fileno()})
        except BaseException:
            launch.close_handover()
            raise
        finally:
            theirs.close()
        if launch.request is None:
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, process.pid, SPARE_NICENESS)
        return launch

    def _run(self, request: dict[str, Any], limit: int | None = None, spare: bool = True) -> _Launch:
        """A launcher carrying ``request``: a spare if one is ready (and
        ``spare``), else a fresh one."""
        launch = self._take_spare() if spare else None
        if launch is None:
            launch = self._spawn(_Launch(request, limit))
        else:
            launch.send(request, limit)
        if spare:
            self._refill_soon()
        return launch

    def _take_spare(self) -> _Launch | None:
        """A waiting spare, back at the gateway's own CPU priority (which the
        program it starts inherits); one that has died meanwhile is skipped."""
        while self._spares:
            launch = self._spares.pop(0)
            if launch.gone or launch.transport is None or not _running(launch.transport.pid):
                launch.quit()
                continue
            try:
                os.setpriority(os.PRIO_PROCESS, launch.transport.pid, os.getpriority(os.PRIO_PROCESS, 0))
            except OSError:
                continue  # gone meanwhile
            return launch
        return None

    def prepare(self) -> None:
        """Start the spares, and keep them until :meth:`stop` (the node's start)."""
        self._keeping = True
        self._refill()

    def _refill_soon(self) -> None:
        """A new spare after this reactor turn: the start that used one goes first."""
        if self._refill_call is None and self._keeping and self.spares_wanted:
            self._refill_call = self.reactor.callLater(0, self._refill)

    def _refill(self) -> None:
        self._refill_call = None
        if not self._keeping:
            return
        self._spares = [launch for launch in self._spares if not launch.gone]
        while len(self._spares) < self.spares_wanted:
            self._spares.append(self._spawn(_Launch()))

    def stop(self) -> None:
        """No more spares; those waiting end (their stdin closes)."""
        self._keeping = False
        if self._refill_call is not None and self._refill_call.active():
            self._refill_call.cancel()
        self._refill_call = None
        spares, self._spares = self._spares, []
        for launch in spares:
            launch.quit()

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
            # Background work: never the spare a session start is waiting for.
            started = self._run(dict(request, mode="close-pam"), spare=False)
            await started.ready
            await started.ended
        finally:
            self._pam_closes.release()
