"""The one rate limiter of what clients can repeat (nxgate.ratelimit), pure, with a fake clock."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from nxgate.ratelimit import OVERFLOW, RateLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class WindowTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()

    def test_the_allowance_passes_then_the_rest_are_held_by_what(self) -> None:
        limiter = RateLimiter(self.clock, allowance=2, window=60)
        self.assertEqual([limiter.admit("a", "x").passed for _ in range(2)], [True, True])
        self.assertFalse(limiter.admit("a", "x", sample=1).passed)
        self.assertFalse(limiter.admit("a", "y", sample=2).passed)
        held = limiter.held("a")
        self.assertEqual((held.counts, held.count, held.sample, held.since), ({"x": 1, "y": 1}, 2, 2, 1000.0))
        self.assertTrue(limiter.admit("b").passed)  # another key has its own window

    def test_the_next_window_passes_and_brings_what_the_last_held(self) -> None:
        limiter = RateLimiter(self.clock, window=60)
        self.assertEqual(limiter.tell("a"), 0)
        self.assertIsNone(limiter.tell("a"))
        self.assertIsNone(limiter.tell("a"))
        self.clock.now += 59.9
        self.assertIsNone(limiter.tell("a"))
        self.clock.now += 0.1
        self.assertEqual(limiter.tell("a"), 3)
        self.assertEqual(limiter.due(), [])  # told with that line: not again

    def test_due_reports_each_held_count_once_and_the_report_opens_the_next_window(self) -> None:
        limiter = RateLimiter(self.clock, window=60)
        limiter.admit("a")
        for _ in range(5):
            limiter.admit("a", "refused")
        self.assertEqual(limiter.due(), [])
        self.clock.now += 60
        [(key, held)] = limiter.due()
        self.assertEqual((key, held.counts), ("a", {"refused": 5}))
        self.clock.now += 2
        self.assertEqual(limiter.due(), [])
        self.assertFalse(limiter.admit("a").passed)  # the report was this minute's line
        self.clock.now += 60
        self.assertTrue(limiter.admit("a").passed)

    def test_room_changes_nothing_and_hold_ignores_the_allowance(self) -> None:
        limiter = RateLimiter(self.clock, allowance=1)
        self.assertTrue(limiter.room("a"))
        self.assertTrue(limiter.room("a"))
        limiter.hold("a", sample="s")
        self.assertTrue(limiter.room("a"))
        self.assertEqual(limiter.held("a").count, 1)
        self.assertTrue(limiter.admit("a").passed)
        self.assertFalse(limiter.room("a"))

    def test_forget_drops_a_key_and_says_what_it_held(self) -> None:
        limiter = RateLimiter(self.clock)
        limiter.admit("a")
        limiter.admit("a")
        self.assertEqual(limiter.forget("a").count, 1)
        self.assertIsNone(limiter.forget("a"))
        self.assertTrue(limiter.admit("a").passed)


class BoundTests(SynchronousTestCase):
    def test_a_full_table_of_open_windows_makes_new_keys_share_one(self) -> None:
        clock = Clock()
        limiter = RateLimiter(clock, capacity=100)
        passed = sum(limiter.admit(f"10.0.{n // 256}.{n % 256}").passed for n in range(5000))
        self.assertEqual(len(limiter), 101)
        self.assertEqual(passed, 101)  # each of the first 100, and the shared key once
        self.assertEqual(limiter.held(OVERFLOW).count, 4899)

    def test_at_capacity_windows_that_are_over_are_forgotten_and_their_counts_reported(self) -> None:
        clock = Clock()
        limiter = RateLimiter(clock, capacity=10)
        for n in range(10):
            limiter.admit(n)
            limiter.admit(n)
        clock.now += 61
        self.assertTrue(limiter.admit("new").passed)
        self.assertEqual(len(limiter), 1)
        self.assertEqual(sorted(key for key, held in limiter.due()), list(range(10)))

    def test_without_reports_forgotten_counts_are_dropped(self) -> None:
        clock = Clock()
        limiter = RateLimiter(clock, capacity=10, reports=False)
        for n in range(10):
            limiter.admit(n)
            limiter.admit(n)
        clock.now += 61
        limiter.admit("new")
        self.assertEqual(limiter.due(), [])

    def test_a_caller_names_its_own_overflow_key(self) -> None:
        clock = Clock()
        limiter = RateLimiter(clock, capacity=1)
        limiter.admit(("kind", "a"))
        self.assertEqual(limiter.admit(("kind", "b"), overflow=("kind", None)).key, ("kind", None))
