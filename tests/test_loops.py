"""Loops that cannot die silently (issue 23): an error in one run is logged
and the next run comes at its time, for plain calls, Deferreds and coroutines."""

from __future__ import annotations

from twisted.application.internet import TimerService
from twisted.internet import defer
from twisted.logger import globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase

from nxgate.loops import SteadyLoop, steady
from tests.harness.clock import FakeReactor


class Boom(Exception):
    pass


class Runs:
    """A call that fails on the runs listed in ``failing``, in the given style."""

    def __init__(self, style: str, failing: set[int]) -> None:
        self.style, self.failing, self.count = style, failing, 0

    def __call__(self):
        self.count += 1
        fails = self.count in self.failing
        if self.style == "raise":
            if fails:
                raise Boom(self.count)
            return None
        if self.style == "deferred":
            return defer.fail(Boom(self.count)) if fails else defer.succeed(None)

        async def run():
            if fails:
                raise Boom(self.count)

        return run()


class EveryLoopIsSteadyTests(SynchronousTestCase):
    """No bare LoopingCall or TimerService call in the package: each goes through steady()."""

    def test_every_timer_service_call_is_steady(self):
        import os
        import re

        package = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "nxgate")
        found = []
        for directory, _dirs, names in os.walk(package):
            for name in names:
                if name.endswith(".py") and name != "loops.py":
                    with open(os.path.join(directory, name), encoding="utf-8") as handle:
                        for number, line in enumerate(handle, 1):
                            if re.search(r"TimerService\(|task\.LoopingCall\(", line):
                                found.append((name, number, "steady(" in line))
        self.assertTrue(found, "no timer found: the test reads the wrong place")
        self.assertEqual([f for f in found if not f[2]], [])


class SteadyLoopTests(SynchronousTestCase):
    def setUp(self):
        self.events = []
        globalLogPublisher.addObserver(self.events.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.events.append)

    def failures_logged(self):
        return [e for e in self.events if e.get("log_namespace") == "nxgate.loops" and "log_failure" in e]

    def check_goes_on(self, style):
        clock, runs = FakeReactor(), Runs(style, {2, 3})
        loop = SteadyLoop(runs, clock, "the test loop")
        loop.start(5, now=True)
        for _ in range(4):
            clock.advance(5)
        self.assertEqual(runs.count, 5)
        self.assertTrue(loop.running)
        self.assertEqual(len(self.flushLoggedErrors(Boom)), 2)
        self.assertEqual([e["what"] for e in self.failures_logged()], ["the test loop"] * 2)
        loop.stop()
        self.assertFalse(loop.running)

    def test_an_exception_does_not_end_the_loop(self):
        self.check_goes_on("raise")

    def test_a_failed_deferred_does_not_end_the_loop(self):
        self.check_goes_on("deferred")

    def test_a_failed_coroutine_does_not_end_the_loop(self):
        self.check_goes_on("coroutine")

    def test_a_timer_service_with_a_steady_call_goes_on(self):
        """What a bare TimerService does with the same call: it stops for good."""
        clock = FakeReactor()
        bare, safe = Runs("raise", {1}), Runs("raise", {1})
        services = [TimerService(1, bare), TimerService(1, steady(safe, "the safe timer"))]
        for timer in services:
            timer.clock = clock
            timer.startService()
        clock.advance(1)
        clock.advance(1)
        self.assertEqual((bare.count, safe.count), (1, 3))
        self.assertEqual(len(self.flushLoggedErrors(Boom)), 2)
        services[1].stopService()
