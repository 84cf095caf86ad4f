"""A bounded pool of key-exchange worker processes (:mod:`.kexworker`).

The SSH transport hands each Diffie-Hellman or ML-KEM computation to
:meth:`KexPool.submit` and gets a Deferred; jobs wait for an idle worker,
served client address by client address in turn (:class:`~.kexlimit.FairQueue`).
How many may wait is :mod:`.kexlimit`'s business, not the pool's.  A cancelled job that is still queued is dropped (the client left);
one already running finishes and its answer is thrown away.  ``done`` is
called when a job has left the pool either way: a client that hangs up right
after its request (as DHEat tools do) still holds its admission for as long
as a worker computes for it.  A worker that dies fails its job and is
started again a second later (later and later if it keeps dying at once;
while none runs, jobs fail at once instead of waiting).

A worker that holds a job for :data:`STALL_CHECK` seconds is looked at
(``/proc/PID/stat``, read only then): one that is stopped (SIGSTOP), or that
sleeps without using CPU, or that has not answered in
:data:`LONGEST_JOB` seconds, is killed and replaced at once, and its job is
kept for the fresh worker that replaces it (once: a job that stalls two
workers fails).  The idle workers are looked at then too, and the stopped
ones among them replaced, so that the next jobs do not wait for them.  A
worker merely slowed by a busy machine is left alone
(:func:`~.kexlimit.stalled`).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from twisted.internet import defer, protocol
from twisted.internet.error import ProcessExitedAlready
from twisted.logger import Logger
from twisted.python.failure import Failure

import nxgate
from nxgate.gateway.doors.conch.kexlimit import FairQueue, stalled

log = Logger()

WORKER_MODULE = "nxgate.gateway.doors.conch.kexworker"
RESPAWN_DELAY = 1.0
MAX_RESPAWN_DELAY = 60.0
#: A worker that ends sooner than this after its start did not really start.
QUICK_DEATH = 5.0
#: The longest answer line we accept from a worker (an 8192-bit f and K are 4 KB).
MAX_LINE = 65536
#: Seconds a job may go unanswered before its worker is looked at, and between looks.
STALL_CHECK = 2.0
#: Seconds after which a job's worker is replaced whatever it does (an 8192-bit exchange takes 0.3 s).
LONGEST_JOB = 60.0
#: Times a job is tried again on another worker after its worker stalled.
RETRIES = 1
#: Seconds stop() waits for workers to end before it kills them.
STOP_GRACE = 5.0


def process_state(pid: int) -> tuple[str, int] | None:
    """A process's state letter and CPU time (clock ticks) from ``/proc/PID/stat``; None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2:].split()  # the name in parentheses may hold spaces
    return fields[0].decode("ascii", "replace"), int(fields[11]) + int(fields[12])


class KexJobError(Exception):
    """The job failed: the client's value was unusable, or the worker died."""


@dataclass(eq=False)
class _Job:
    work: dict[str, Any]
    waiting: defer.Deferred[dict[str, Any]]
    done: Callable[[], None]
    source: str
    #: Workers that stalled on it so far.
    stalls: int = 0


class _Worker(protocol.ProcessProtocol):
    def __init__(self, pool: KexPool, number: int) -> None:
        self.pool = pool
        self.number = number
        self.job: _Job | None = None
        self._buffer = b""
        self.running = False
        self.ended: defer.Deferred[None] | None = None
        self.started = 0.0
        self.job_since = 0.0
        self.cpu_seen: int | None = None
        self.watch: Any = None  # the next look at a worker that holds a job
        self.replaced = False
        #: The job of the stuck worker this one replaces: its first.
        self.reserved: _Job | None = None

    def connectionMade(self) -> None:
        self.running = True
        self.pool._dispatch()

    def outReceived(self, data: bytes) -> None:
        self._buffer += data
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            self.pool._answered(self, line)
        if len(self._buffer) > MAX_LINE:
            log.error("key-exchange worker {n} sent an overlong line; stopping it", n=self.number)
            self.transport.signalProcess("KILL")

    def errReceived(self, data: bytes) -> None:
        log.warn("key-exchange worker {n}: {text}", n=self.number, text=data[:2000].decode("utf-8", "replace"))

    def processEnded(self, reason: Failure) -> None:
        self.running = False
        self.pool._ended(self, reason)
        if self.ended is not None:
            self.ended.callback(None)


class KexPool:
    """``size`` worker processes, started by :meth:`start`."""

    def __init__(self, reactor: Any, size: int, argv: list[str] | None = None,
                 inspect: Callable[[int], tuple[str, int] | None] = process_state) -> None:
        self.reactor = reactor
        self.size = size
        self.argv = argv or [sys.executable, "-m", WORKER_MODULE]
        self.inspect = inspect
        self._queue: FairQueue[_Job] = FairQueue()
        self._workers: list[_Worker] = []
        self._next_id = 0
        self._stopping = False
        self._delay = RESPAWN_DELAY
        self._respawns: list[Any] = []

    @property
    def queued(self) -> int:
        return len(self._queue)

    def start(self) -> None:
        self._stopping = False
        for number in range(self.size):
            self._spawn(number)

    def stop(self) -> defer.Deferred[None]:
        """Close the workers' input: each ends after its job, if it has one.
        The Deferred fires when all have ended."""
        self._stopping = True
        for call in self._respawns:
            if call.active():
                call.cancel()
        ended = []
        for worker in self._workers:
            self._unwatch(worker)
            if worker.running:
                worker.ended = defer.Deferred()
                ended.append(worker.ended)
                worker.transport.closeStdin()
        waiting = [worker.reserved for worker in self._workers if worker.reserved is not None]
        while self._queue:
            waiting.append(self._queue.pop())
        for job in waiting:
            job.done()
            if not job.waiting.called:
                job.waiting.errback(KexJobError("the gateway is stopping"))
        all_ended = defer.gatherResults(ended).addCallback(lambda _: None)
        if ended:  # a stopped or stuck worker would never end by itself
            kill = self.reactor.callLater(STOP_GRACE, self._kill_all)
            all_ended.addBoth(lambda result: (kill.cancel() if kill.active() else None, result)[1])
        return all_ended

    def _kill_all(self) -> None:
        for worker in list(self._workers):
            if worker.running:
                self._kill(worker)

    def submit(self, work: dict[str, Any], done: Callable[[], None] = lambda: None,
               source: str = "") -> defer.Deferred[dict[str, Any]]:
        """The worker's answer to ``work`` (see :mod:`.kexworker`), or a
        :class:`KexJobError` with the reason; ``done()`` once the job has
        left the pool (answered, failed, or cancelled before it ran).
        ``source``, the client's address, is what the queue takes turns by."""
        self._next_id += 1

        def cancel(waiting: defer.Deferred[dict[str, Any]]) -> None:
            if self._queue.remove(job.source, job):
                job.done()
            # else running already: done() when the worker answers; the answer is ignored

        job = _Job({**work, "id": self._next_id}, defer.Deferred(cancel), done, source)
        if self._stopping or not any(worker.running for worker in self._workers):
            done()
            job.waiting.errback(KexJobError("the gateway is stopping" if self._stopping
                                            else "no key-exchange worker is running"))
            return job.waiting
        self._queue.push(source, job)
        self._dispatch()
        return job.waiting

    def _spawn(self, number: int) -> _Worker:
        worker = _Worker(self, number)
        worker.started = self.reactor.seconds()
        source_root = os.path.dirname(os.path.dirname(os.path.abspath(nxgate.__file__)))
        path = os.pathsep.join(filter(None, [source_root, os.environ.get("PYTHONPATH", "")]))
        self.reactor.spawnProcess(worker, self.argv[0], self.argv, env={**os.environ, "PYTHONPATH": path})
        self._workers.append(worker)
        return worker

    def _dispatch(self) -> None:
        for worker in self._workers:
            if not worker.running or worker.job is not None:
                continue
            if worker.reserved is not None:
                worker.job, worker.reserved = worker.reserved, None
            elif self._queue:
                worker.job = self._queue.pop()
            else:
                continue
            worker.job_since, worker.cpu_seen = self.reactor.seconds(), None
            worker.watch = self.reactor.callLater(STALL_CHECK, self._look_at, worker)
            worker.transport.write(json.dumps(worker.job.work).encode() + b"\n")

    # ------------------------------------------------------- stuck workers
    def _look_at(self, worker: _Worker) -> None:
        """A job has gone unanswered for a while: is its worker working?"""
        worker.watch = None
        if worker.job is None or worker.replaced or not worker.running:
            return
        seen = self.inspect(worker.transport.pid)
        if seen is None:
            return  # it has ended: processEnded follows
        state, cpu = seen
        why = stalled(state, worker.cpu_seen, cpu, self.reactor.seconds() - worker.job_since, LONGEST_JOB)
        if why is None:
            worker.cpu_seen = cpu
            worker.watch = self.reactor.callLater(STALL_CHECK, self._look_at, worker)
            return
        self._replace(worker, why)

    def _replace(self, worker: _Worker, why: str) -> None:
        """Kill a stuck worker and start another in its place now, which
        tries its job again (or fail the job, if it stalled one already);
        then replace the idle workers that are stopped too."""
        job, worker.job = worker.job, None
        assert job is not None
        job.stalls += 1
        retry = job.stalls <= RETRIES and not job.waiting.called
        log.warn("key-exchange worker {n} (pid {pid}) did not answer a job from {address}: {why}; it is replaced"
                 " and the job {fate}", n=worker.number, pid=worker.transport.pid, address=job.source or "?",
                 why=why, fate="tried again" if retry else "fails", event="kex_worker_replaced")
        fresh = self._renew(worker)
        if retry:
            fresh.reserved = job
        else:
            job.done()
            if not job.waiting.called:
                job.waiting.errback(KexJobError("the key-exchange workers did not answer"))
        for idle in [other for other in self._workers if other.running and other.job is None and other is not fresh]:
            seen = self.inspect(idle.transport.pid)
            if seen is not None and seen[0] in ("T", "t"):
                log.warn("key-exchange worker {n} (pid {pid}) is stopped; it is replaced", n=idle.number,
                         pid=idle.transport.pid, event="kex_worker_replaced")
                self._renew(idle)
        self._dispatch()

    def _renew(self, worker: _Worker) -> _Worker:
        """Kill ``worker`` and start its successor (which is returned)."""
        worker.replaced = True
        self._unwatch(worker)
        self._workers.remove(worker)
        self._kill(worker)
        return self._spawn(worker.number)

    def _kill(self, worker: _Worker) -> None:
        try:
            worker.transport.signalProcess("KILL")
        except (ProcessExitedAlready, OSError):
            pass

    def _unwatch(self, worker: _Worker) -> None:
        if worker.watch is not None and worker.watch.active():
            worker.watch.cancel()
        worker.watch = None

    def _answered(self, worker: _Worker, line: bytes) -> None:
        if worker.replaced:  # its last words, after its job went elsewhere
            return
        self._unwatch(worker)
        job, worker.job = worker.job, None
        if job is None:
            log.error("key-exchange worker {n} answered without a job", n=worker.number)
            return
        try:
            answer = json.loads(line)
        except ValueError:
            answer = {"error": "unreadable answer from the key-exchange worker"}
        self._dispatch()
        job.done()
        waiting = job.waiting
        if waiting.called:  # cancelled while it ran
            return
        if not isinstance(answer, dict) or answer.get("id") != job.work["id"]:
            waiting.errback(KexJobError("the key-exchange worker answered another job"))
        elif "error" in answer:
            waiting.errback(KexJobError(str(answer["error"])))
        else:
            waiting.callback(answer)

    def _ended(self, worker: _Worker, reason: Failure) -> None:
        self._unwatch(worker)
        if worker.replaced:  # killed by _replace, which started another and took its job
            return
        self._workers.remove(worker)
        job, worker.job = worker.job, None
        if not self._stopping:
            # A worker that cannot even start (its stderr is logged) is tried
            # again less and less often, and no client waits for it meanwhile.
            quick = self.reactor.seconds() - worker.started < QUICK_DEATH
            self._delay = min(self._delay * 2, MAX_RESPAWN_DELAY) if quick else RESPAWN_DELAY
            log.error("key-exchange worker {n} ended ({why}); starting another in {delay:.0f} s",
                      n=worker.number, why=reason.getErrorMessage(), delay=self._delay)
            self._respawns.append(self.reactor.callLater(self._delay, self._respawn, worker.number))
        failed = [each for each in (job, worker.reserved) if each is not None]
        worker.reserved = None
        if not self._stopping and not any(other.running for other in self._workers):
            while self._queue:
                failed.append(self._queue.pop())
        for each in failed:
            each.done()
            if not each.waiting.called:
                each.waiting.errback(KexJobError("the key-exchange worker ended during the job" if each is job
                                                 else "no key-exchange worker is running"))

    def _respawn(self, number: int) -> None:
        self._respawns = [call for call in self._respawns if call.active()]
        if not self._stopping:
            self._spawn(number)
            self._dispatch()


class InlineKexPool:
    """Computes each job at once on the calling thread: for unit tests with
    in-memory transports, where no worker process can run."""

    def start(self) -> None:
        pass

    def stop(self) -> defer.Deferred[None]:
        return defer.succeed(None)

    def submit(self, job: dict[str, Any], done: Callable[[], None] = lambda: None,
               source: str = "") -> defer.Deferred[dict[str, Any]]:
        from nxgate.gateway.doors.conch.kexworker import run_job

        answer = run_job(job)
        done()
        if "error" in answer:
            return defer.fail(KexJobError(answer["error"]))
        return defer.succeed(answer)
