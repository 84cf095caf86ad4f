"""How often something a client can repeat gets told: the one rate limiter (pure: the clock is given).

Anything a client can make the gateway say, it can make it say a million
times: a refused connection, a refused key exchange, a failed web request,
a warning, a refused reverse connection.  Each of those places tells the
first few of a kind at once and counts the rest, and tells the count later
in one line.  They differ only in their numbers (how many per window, how
long a window, how many keys are remembered) and in how they word the
count, so they all use one :class:`RateLimiter`:

* **Windows per key.**  A key (an address, a kind of line and its address,
  a peer) gets a window of ``window`` seconds at its first event; in it,
  ``allowance`` events pass and the rest are *held*: counted (by ``what``,
  a reason or a kind), the latest one kept as a sample.  The next event
  after the window is over opens a new one and passes; what the old window
  held comes with that decision (:attr:`Decision.held`), to be told with it.
* **Due reports.**  A caller that tells the counts of a flood that stopped
  asks :meth:`RateLimiter.due` now and then: the held counts of every window
  that is over, each once.  A report counts as a line told: the key's next
  window begins with it (``allowance - 1`` more pass in it).
* **Bounded.**  At most ``capacity`` keys are remembered; at capacity, the
  windows that are over are forgotten (their counts reported by
  :meth:`due` if the caller asked for due reports, else dropped), and if
  all are still open, new keys share one :data:`OVERFLOW` key.  A flood
  from many addresses grows nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

#: The key that keys share once the table is full of open windows.
OVERFLOW = "(many)"


@dataclass
class Held:
    """What one window held back: counts by ``what``, the latest sample, and since when."""

    counts: dict[Any, int] = field(default_factory=dict)
    sample: Any = None
    since: float = 0.0

    @property
    def count(self) -> int:
        return sum(self.counts.values())


@dataclass(frozen=True)
class Decision:
    """Whether an event passes now, and what the key's previous window held
    (told once, with the first event of the next window, or by :meth:`RateLimiter.due`)."""

    passed: bool
    held: Held | None = None
    key: Hashable = None


class _Window:
    __slots__ = ("start", "passed", "held")

    def __init__(self, start: float, passed: int = 0) -> None:
        self.start = start
        self.passed = passed
        self.held: Held | None = None


class RateLimiter:
    """At most ``allowance`` events per key per ``window`` seconds (see the module's docstring).

    ``reports``: whether held counts of windows forgotten at capacity are
    kept for :meth:`due` (a caller that never asks must say False)."""

    def __init__(self, clock: Callable[[], float], allowance: int = 1, window: float = 60.0,
                 capacity: int = 10_000, reports: bool = True) -> None:
        self.clock = clock
        self.allowance = allowance
        self.window = window
        self.capacity = capacity
        self.reports = reports
        self._windows: dict[Hashable, _Window] = {}
        self._holding: set[Hashable] = set()  # keys whose open or closed window holds something
        self._forgotten: list[tuple[Hashable, Held]] = []
        self._scanned_at = float("-inf")

    def __len__(self) -> int:
        return len(self._windows)

    def room(self, key: Hashable, overflow: Hashable = OVERFLOW) -> bool:
        """Whether an event of ``key`` would pass now (nothing changes)."""
        window = self._windows.get(self._key(key, overflow, adding=False))
        return window is None or self._over(window, self.clock()) or window.passed < self.allowance

    def admit(self, key: Hashable, what: Any = None, sample: Any = None, overflow: Hashable = OVERFLOW) -> Decision:
        """One event of ``key``: passed now, or held (counted under ``what``,
        ``sample`` kept).  ``overflow``: the key it shares when the table is full."""
        now = self.clock()
        key = self._key(key, overflow)
        window, previous = self._current(key, now)
        if window.passed < self.allowance:
            window.passed += 1
            return Decision(True, previous, key)
        self._hold(key, window, what, sample, now)
        return Decision(False, previous, key)

    def tell(self, key: Hashable = None) -> int | None:
        """For a line that says how many were held back: None to stay quiet,
        else how many were held back since the last one told (0 at first)."""
        decision = self.admit(key)
        if not decision.passed:
            return None
        return decision.held.count if decision.held is not None else 0

    def hold(self, key: Hashable, what: Any = None, sample: Any = None, overflow: Hashable = OVERFLOW) -> Held | None:
        """Hold an event back whatever the allowance says (another limit
        refused it); what the key's previous window held, if it closed now."""
        now = self.clock()
        key = self._key(key, overflow)
        window, previous = self._current(key, now)
        self._hold(key, window, what, sample, now)
        return previous

    def held(self, key: Hashable) -> Held | None:
        """What the key's window holds now (nothing changes)."""
        window = self._windows.get(key)
        return window.held if window is not None else None

    def due(self) -> list[tuple[Hashable, Held]]:
        """The held counts of windows that are over, each once (the windows
        are looked at once a second at most); each report begins the key's
        next window."""
        now = self.clock()
        ready, self._forgotten = self._forgotten, []
        if now - self._scanned_at < 1.0 and not ready:
            return ready
        self._scanned_at = now
        for key in list(self._holding):
            window = self._windows.get(key)
            if window is None or window.held is None:
                self._holding.discard(key)
            elif self._over(window, now):
                ready.append((key, window.held))
                self._windows[key] = _Window(now, passed=1)
                self._holding.discard(key)
        return ready

    def forget(self, key: Hashable) -> Held | None:
        """Drop ``key`` (its route ended, say); what its window held."""
        self._holding.discard(key)
        window = self._windows.pop(key, None)
        return window.held if window is not None else None

    # ------------------------------------------------------------ internal
    def _over(self, window: _Window, now: float) -> bool:
        return now - window.start >= self.window

    def _key(self, key: Hashable, overflow: Hashable, adding: bool = True) -> Hashable:
        if key in self._windows or len(self._windows) < self.capacity:
            return key
        if adding:
            self._prune(self.clock())
            if len(self._windows) < self.capacity:
                return key
        return overflow

    def _current(self, key: Hashable, now: float) -> tuple[_Window, Held | None]:
        window = self._windows.get(key)
        if window is not None and not self._over(window, now):
            return window, None
        previous = window.held if window is not None else None
        self._holding.discard(key)
        window = self._windows[key] = _Window(now)
        return window, previous

    def _hold(self, key: Hashable, window: _Window, what: Any, sample: Any, now: float) -> None:
        if window.held is None:
            window.held = Held(since=window.start)
        window.held.counts[what] = window.held.counts.get(what, 0) + 1
        window.held.sample = sample
        self._holding.add(key)

    def _prune(self, now: float) -> None:
        for key, window in list(self._windows.items()):
            if self._over(window, now):
                del self._windows[key]
                self._holding.discard(key)
                if self.reports and window.held is not None:
                    self._forgotten.append((key, window.held))
