"""The one test reactor of the unit tests.

Code under test takes its reactor, clock or ``now`` function as an
argument; its unit tests hand it a :class:`FakeReactor`: Twisted's
``MemoryReactorClock`` (timers run only when the test advances the time;
listens and connections are recorded, not made), which is also a ``now()``
function, so one object serves wherever the product wants any of the three.
Building the clock in one place keeps every test's time the same kind of
thing: starting at a chosen second, advanced by hand, never the wall clock.
"""

from __future__ import annotations

from twisted.internet.testing import MemoryReactorClock


class FakeReactor(MemoryReactorClock):
    """A memory reactor whose clock starts at ``now`` and moves only by
    :meth:`advance` (or :meth:`pump`); calling it gives the time."""

    def __init__(self, now: float = 0.0) -> None:
        super().__init__()
        self.rightNow = now

    def __call__(self) -> float:
        return self.seconds()
