"""How blocking work runs: injected, so the reactor never waits on a disk,
a user database or /proc, and tests stay synchronous.

A part that has blocking work to do (``rmtree`` of a directory a user can
fill, a read of a user's file, a /proc scan, an NSS look-up) takes a
:data:`Blocking` and calls ``blocking(function, *args)``, getting a
Deferred.  Production passes :func:`in_thread` (the reactor's own thread
pool); unit tests pass :func:`inline`, which runs the function at once and
returns a fired Deferred, so ``successResultOf`` works without a reactor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet import defer, threads

#: Runs ``function(*args, **kwargs)`` somewhere and returns a Deferred of
#: its result (or of its exception).
Blocking = Callable[..., defer.Deferred[Any]]


def in_thread(reactor: Any) -> Blocking:
    """Run blocking work in ``reactor``'s thread pool (``reactor.getThreadPool()``,
    the pool ``deferToThread`` uses, sized by ``suggestThreadPoolSize``)."""

    def blocking(function: Callable[..., Any], *args: Any, **kwargs: Any) -> defer.Deferred[Any]:
        return threads.deferToThreadPool(reactor, reactor.getThreadPool(), function, *args, **kwargs)

    return blocking


def inline(function: Callable[..., Any], *args: Any, **kwargs: Any) -> defer.Deferred[Any]:
    """Run blocking work now, on the calling thread: for tests (and for
    work known to be cheap).  The Deferred has fired when this returns."""
    return defer.maybeDeferred(function, *args, **kwargs)
