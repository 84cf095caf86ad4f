"""How many key exchanges may be computed at once, per address and in all.

A key exchange costs the server far more than the client (DHEat,
CVE-2002-20001: the client may send any number as its Diffie-Hellman value
and skip the exponentiation).  Each connection's key-exchange computation is
admitted here before it is queued for the worker processes:

* at most ``per_source`` pending (queued or running) per client address: a
  flood from one address refuses its own extra connections, not others';
* in all, OpenSSH's ``MaxStartups`` random early drop: from half of
  ``max_pending`` on, a new one is refused with a probability rising from
  30 % to 100 % at ``max_pending``, so that a flood from many addresses
  cannot queue up without bound and a legitimate client still gets through
  now and then.

Refusals are logged once per address per minute (:class:`OncePer`, the one
rate limiter of :mod:`nxgate.ratelimit`), with the
number left out in between, so that a flood cannot fill the log.  Admitted
jobs wait in a :class:`FairQueue`, served address by address in turn.
Pure: no clock and no randomness of its own.
"""

from __future__ import annotations

import random
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from nxgate.ratelimit import RateLimiter

T = TypeVar("T")

#: Probability of a refusal when half of max_pending is reached (OpenSSH's default rate).
EARLY_DROP_RATE = 0.3


@dataclass(frozen=True)
class Refusal:
    """Why a key exchange was refused: ``reason`` for the log, ``scope`` is
    "address" (this address has too many) or "total" (the gateway has)."""

    reason: str
    scope: str


class KexAdmission:
    def __init__(self, per_source: int, max_pending: int, rng: Callable[[], float] = random.random) -> None:
        self.per_source = per_source
        self.max_pending = max_pending
        self._rng = rng
        self._by_source: dict[str, int] = {}
        self.pending = 0

    def admit(self, source: str) -> Refusal | None:
        """Count one more pending computation for ``source``, or say why not."""
        mine = self._by_source.get(source, 0)
        if mine >= self.per_source:
            return Refusal(f"{mine} key exchanges from this address are already pending", "address")
        refusal = self._early_drop()
        if refusal is not None:
            return refusal
        self._by_source[source] = mine + 1
        self.pending += 1
        return None

    def _early_drop(self) -> Refusal | None:
        start = max(1, self.max_pending // 2)
        if self.pending >= self.max_pending:
            return Refusal(f"{self.pending} key exchanges are pending, the most allowed", "total")
        if self.pending < start:
            return None
        chance = EARLY_DROP_RATE + (1 - EARLY_DROP_RATE) * (self.pending - start) / (self.max_pending - start)
        if self._rng() < chance:
            return Refusal(f"{self.pending} key exchanges are pending (random early drop at {chance:.0%})", "total")
        return None

    def release(self, source: str) -> None:
        """One computation for ``source`` ended (done, failed or abandoned)."""
        left = self._by_source.get(source, 0) - 1
        if left < 0:
            raise ValueError(f"release without admission for {source!r}")
        if left:
            self._by_source[source] = left
        else:
            del self._by_source[source]
        self.pending -= 1


class OncePer(RateLimiter):
    """One log line per key (an address) per ``interval`` seconds, with the
    number held back since the last one (:class:`nxgate.ratelimit.RateLimiter`)."""

    def __init__(self, clock: Callable[[], float], interval: float = 60.0, capacity: int = 10000) -> None:
        super().__init__(clock, allowance=1, window=interval, capacity=capacity, reports=False)

    def allow(self, key: str) -> int | None:
        """None: stay quiet; else how many were held back since the last one."""
        return self.tell(key)


class FairQueue(Generic[T]):
    """Waiting jobs by client address, served in turn: however many one
    address has queued, another address's next job waits at most one turn
    per address ahead of it, not behind the whole backlog."""

    def __init__(self) -> None:
        self._by_key: OrderedDict[str, deque[T]] = OrderedDict()
        self._length = 0

    def __len__(self) -> int:
        return self._length

    def push(self, key: str, item: T) -> None:
        self._by_key.setdefault(key, deque()).append(item)
        self._length += 1

    def pop(self) -> T:
        """The next address's oldest job; that address goes to the back."""
        if not self._by_key:
            raise IndexError("pop from an empty FairQueue")
        key, items = next(iter(self._by_key.items()))
        item = items.popleft()
        del self._by_key[key]
        if items:
            self._by_key[key] = items
        self._length -= 1
        return item

    def remove(self, key: str, item: T) -> bool:
        items = self._by_key.get(key)
        if items is None or item not in items:
            return False
        items.remove(item)
        if not items:
            del self._by_key[key]
        self._length -= 1
        return True


def stalled(state: str, cpu_before: int | None, cpu_now: int, busy_for: float, longest: float) -> str | None:
    """Why a worker that has had a job for ``busy_for`` seconds without
    answering should be replaced, or None to wait on.  ``state`` is the
    process's (``/proc/PID/stat``: R running, S sleeping, T stopped...),
    ``cpu_before`` its CPU time at the last look (None: first look), and
    ``cpu_now`` now.  A stopped worker is stuck at once; one that sleeps and
    used no CPU since the last look is stuck too (a computing worker never
    waits for anything); one waiting for a CPU on a loaded machine (R) is
    only slow.  Whatever it does, ``longest`` seconds is the end."""
    if state in ("Z", "X"):
        return None  # it has ended: the pool hears of it in a moment
    if state in ("T", "t"):
        return "it is stopped"
    if busy_for >= longest:
        return f"no answer after {busy_for:.0f} s"
    if state != "R" and cpu_before is not None and cpu_now == cpu_before:
        return f"it sleeps and has used no CPU for {busy_for:.0f} s"
    return None
