"""Login throttling per source address and per account (pure, with a clock).

Only failed authentications count — a wrong password, an unknown user, an
empty password — never disconnects or sessions that an admin killed (xrdp
once locked users out for those).  An address or an account that failed
``limit`` times within ``window`` seconds is refused for ``block``
seconds without PAM being asked.  A successful login clears the account's
and the address's record.  The tables are bounded, so a flood of made-up
names cannot exhaust memory.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

MAX_KEYS = 100_000


@dataclass
class _Record:
    failures: deque[float] = field(default_factory=deque)
    blocked_until: float = 0.0


class _Table:
    def __init__(self, limit: int, window: float, block: float) -> None:
        self.limit, self.window, self.block = limit, window, block
        self.records: OrderedDict[str, _Record] = OrderedDict()

    def blocked(self, key: str, now: float) -> float:
        record = self.records.get(key)
        return max(0.0, record.blocked_until - now) if record else 0.0

    def failed(self, key: str, now: float) -> bool:
        """Count a failure; True if it starts a block."""
        if self.limit <= 0:
            return False
        record = self.records.pop(key, None) or _Record()
        self.records[key] = record  # most recent last
        while record.failures and record.failures[0] <= now - self.window:
            record.failures.popleft()
        record.failures.append(now)
        while len(self.records) > MAX_KEYS:
            self.records.popitem(last=False)
        if len(record.failures) >= self.limit and record.blocked_until <= now:
            record.blocked_until = now + self.block
            record.failures.clear()
            return True
        return False

    def clear(self, key: str) -> None:
        self.records.pop(key, None)


class Throttle:
    def __init__(self, clock, per_address: int, per_account: int, window: float, block: float) -> None:  # type: ignore[no-untyped-def]
        self.clock = clock
        self.addresses = _Table(per_address, window, block)
        self.accounts = _Table(per_account, window, block)

    def configure(self, per_address: int, per_account: int, window: float, block: float) -> None:
        """New limits (a reload); what was counted so far stays."""
        for table, limit in ((self.addresses, per_address), (self.accounts, per_account)):
            table.limit, table.window, table.block = limit, window, block

    def blocked(self, address: str | None, user: str) -> tuple[str, float] | None:
        """``("address"|"account", seconds left)`` if a login must be refused now."""
        now = self.clock.seconds()
        for kind, table, key in (("address", self.addresses, address), ("account", self.accounts, user)):
            if key:
                left = table.blocked(key, now)
                if left > 0:
                    return kind, left
        return None

    def failed(self, address: str | None, user: str) -> list[str]:
        """Count a failed login; the kinds of blocks it started."""
        now = self.clock.seconds()
        started = []
        if address and self.addresses.failed(address, now):
            started.append("address")
        if user and self.accounts.failed(user, now):
            started.append("account")
        return started

    def succeeded(self, address: str | None, user: str) -> None:
        if address:
            self.addresses.clear(address)
        self.accounts.clear(user)
