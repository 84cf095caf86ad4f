"""Repeating calls that cannot die silently.

A plain :class:`twisted.internet.task.LoopingCall` (and the
:class:`~twisted.application.internet.TimerService` built on it) stops for
good on the first exception its call raises, and the only trace is an
unhandled error in a Deferred nobody watches.  For the cluster heartbeat that
meant every other gateway listed this member's sessions as lost after one
unexpected error.  Every loop of the gateway goes through :func:`steady`: a
failed run is logged with its traceback and the next run comes at its time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet import defer, task
from twisted.logger import Logger
from twisted.python.failure import Failure

log = Logger()


def steady(call: Callable[[], Any], what: str) -> Callable[[], defer.Deferred[Any]]:
    """``call`` made safe to repeat: its errors (raised, or a failed Deferred
    or coroutine) are logged as "``what`` failed" and swallowed."""

    def once() -> defer.Deferred[Any]:
        return defer.maybeDeferred(call).addErrback(_logged, what)

    return once


def _logged(failure: Failure, what: str) -> None:
    log.failure("{what} failed; it runs again at its next time", failure, what=what)


class SteadyLoop:
    """A LoopingCall over :func:`steady` (``clock`` injected for tests)."""

    def __init__(self, call: Callable[[], Any], clock: Any, what: str) -> None:
        self.what = what
        self._loop = task.LoopingCall(steady(call, what))
        self._loop.clock = clock

    @property
    def running(self) -> bool:
        return bool(self._loop.running)

    def start(self, interval: float, now: bool = True) -> None:
        # The call never fails, so this Deferred fails only on a bug of the loop
        # itself; it is watched all the same.
        self._loop.start(interval, now=now).addErrback(
            lambda failure: log.failure("the {what} loop stopped", failure, what=self.what))

    def stop(self) -> None:
        if self._loop.running:
            self._loop.stop()
