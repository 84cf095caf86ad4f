"""Login throttling per source address and per account (pure, with a clock).

Only failed authentications count — a wrong password, an unknown user, an
empty password — never disconnects or sessions that an admin killed (xrdp
once locked users out for those).  An address or an account that failed
``limit`` times within ``window`` seconds is refused for ``block``
seconds without PAM being asked.

An attempt counts from the moment it *starts*: :meth:`Throttle.begin`
registers it as pending and :meth:`Throttle.end` settles it when PAM has
answered.  A pending attempt counts as a failure until it succeeds, so
``failures + pending`` can never pass the limit: a burst of guesses sent at
once from one address reaches PAM at most ``limit`` times (the rest are
refused at once), and the same bound caps how many PAM conversations one
address or one account may hold open at a time.  Checking only finished
attempts let every request already in flight through (issue 22).

One wrong secret is one failure, whatever SSH methods a client tries it
with: x2goclient answers keyboard-interactive's "Password:" and then tries
the password method with the same typo, on the same connection.  A failure
may carry a digest of its secret (a keyed hash, its key one connection's
own: :class:`~nxgate.gateway.doors.conch.checkers.RepeatedSecrets`); a
failure whose digest an earlier failure of the same address or account
within the window carried is not counted again.  Every attempt still counts
as pending while it runs, so bursts are held as before, and a repeated
secret tells a guesser nothing new.

A success that ends while its address or account is blocked (the guesses
that ran beside it used up the budget) is refused too.  A successful login
clears the failures of its account and address (not what is still
pending).  The tables are bounded, so a flood of made-up names cannot
exhaust memory.
"""

from __future__ import annotations

import enum
from collections import OrderedDict, deque
from dataclasses import dataclass, field

MAX_KEYS = 100_000
#: Digests of failed secrets kept per address or account (the newest).
MAX_SECRETS = 16


class Outcome(enum.Enum):
    """How a started attempt ended."""

    GRANTED = "granted"
    FAILED = "failed"
    #: Neither: PAM broke (an error, not a guess), or the attempt was abandoned.
    VOID = "void"


@dataclass(frozen=True)
class Refusal:
    """Why an attempt may not start (or a success may not stand).

    ``seconds_left`` > 0: the address or account is blocked; 0: too many
    attempts are pending for it (``pending`` of them)."""

    kind: str  # "address" or "account"
    seconds_left: float
    pending: int = 0

    def describe(self) -> str:
        if self.seconds_left > 0:
            return f"throttled: too many failed logins for this {self.kind} ({self.seconds_left:.0f} s left)"
        return f"throttled: too many logins in progress for this {self.kind} ({self.pending} pending)"


@dataclass
class _Record:
    failures: deque[float] = field(default_factory=deque)
    blocked_until: float = 0.0
    pending: int = 0
    #: (when, digest) of the failed secrets counted within the window.
    secrets: deque[tuple[float, bytes]] = field(default_factory=lambda: deque(maxlen=MAX_SECRETS))


class _Table:
    def __init__(self, limit: int, window: float, block: float) -> None:
        self.limit, self.window, self.block = limit, window, block
        self.records: OrderedDict[str, _Record] = OrderedDict()

    def blocked(self, key: str, now: float) -> float:
        record = self.records.get(key)
        return max(0.0, record.blocked_until - now) if record else 0.0

    def _record(self, key: str, now: float) -> _Record:
        """The key's record (made if new, moved to the most recent end),
        its failures older than the window dropped."""
        record = self.records.pop(key, None) or _Record()
        self.records[key] = record
        while record.failures and record.failures[0] <= now - self.window:
            record.failures.popleft()
        while record.secrets and record.secrets[0][0] <= now - self.window:
            record.secrets.popleft()
        while len(self.records) > MAX_KEYS:
            self.records.popitem(last=False)
        return record

    def refusal(self, key: str, now: float) -> tuple[float, int] | None:
        """``(seconds blocked, pending)`` if an attempt may not start now."""
        if self.limit <= 0:
            return None
        left = self.blocked(key, now)
        if left > 0:
            return left, 0
        record = self.records.get(key)
        if record is None:
            return None
        record = self._record(key, now)
        if len(record.failures) + record.pending >= self.limit:
            return 0.0, record.pending
        return None

    def begin(self, key: str, now: float) -> None:
        if self.limit > 0:
            self._record(key, now).pending += 1

    def settle(self, key: str) -> None:
        """One pending attempt is over (a record evicted or a limit switched
        on meanwhile has nothing to settle)."""
        record = self.records.get(key)
        if record is not None and record.pending > 0:
            record.pending -= 1
            self._forget_if_empty(key, record)

    def repeated(self, key: str, secret: bytes | None, now: float) -> bool:
        """Whether a failure with ``secret``'s digest was counted already."""
        if secret is None or self.limit <= 0 or key not in self.records:
            return False
        return any(seen == secret for _, seen in self._record(key, now).secrets)

    def failed(self, key: str, now: float, secret: bytes | None = None) -> bool:
        """Count a failure; True if it starts a block."""
        if self.limit <= 0:
            return False
        record = self._record(key, now)
        record.failures.append(now)
        if secret is not None:
            record.secrets.append((now, secret))
        if len(record.failures) >= self.limit and record.blocked_until <= now:
            record.blocked_until = now + self.block
            record.failures.clear()
            return True
        return False

    def clear(self, key: str) -> None:
        """Forget the failures (a success); what is pending still counts."""
        record = self.records.get(key)
        if record is None:
            return
        record.failures.clear()
        record.secrets.clear()
        record.blocked_until = 0.0
        self._forget_if_empty(key, record)

    def _forget_if_empty(self, key: str, record: _Record) -> None:
        if not record.pending and not record.failures and not record.blocked_until and not record.secrets:
            del self.records[key]


class Throttle:
    def __init__(self, clock, per_address: int, per_account: int, window: float, block: float) -> None:  # type: ignore[no-untyped-def]
        self.clock = clock
        self.addresses = _Table(per_address, window, block)
        self.accounts = _Table(per_account, window, block)

    def configure(self, per_address: int, per_account: int, window: float, block: float) -> None:
        """New limits (a reload); what was counted so far stays."""
        for table, limit in ((self.addresses, per_address), (self.accounts, per_account)):
            table.limit, table.window, table.block = limit, window, block

    def _keys(self, address: str | None, user: str | None) -> list[tuple[str, _Table, str]]:
        return [(kind, table, key) for kind, table, key in (("address", self.addresses, address),
                                                            ("account", self.accounts, user)) if key]

    def blocked(self, address: str | None, user: str) -> tuple[str, float] | None:
        """``("address"|"account", seconds left)`` if a login must be refused now."""
        now = self.clock.seconds()
        for kind, table, key in self._keys(address, user):
            left = table.blocked(key, now)
            if left > 0:
                return kind, left
        return None

    def begin(self, address: str | None, user: str | None) -> Refusal | None:
        """Start an attempt, or say why it may not start.

        On None the attempt is pending on both its address and its account
        (``user`` None: on the address only, for a name too long to be a
        key) until :meth:`end` settles it; a refused attempt is not pending
        and must not be ended."""
        now = self.clock.seconds()
        keys = self._keys(address, user)
        for kind, table, key in keys:
            found = table.refusal(key, now)
            if found is not None:
                return Refusal(kind, *found)
        for _kind, table, key in keys:
            table.begin(key, now)
        return None

    def end(self, address: str | None, user: str | None, outcome: Outcome,
            secret: bytes | None = None) -> tuple[Refusal | None, list[str]]:
        """Settle an attempt :meth:`begin` let through.

        Returns a refusal when a success may not stand (its address or
        account was blocked while it ran), and the kinds of blocks a failure
        started.  ``secret``: the digest of a failed attempt's secret; a
        failure with a digest counted before is not counted again."""
        now = self.clock.seconds()
        keys = self._keys(address, user)
        for _kind, table, key in keys:
            table.settle(key)
        if outcome is Outcome.FAILED:
            return None, [kind for kind, table, key in keys
                          if not table.repeated(key, secret, now) and table.failed(key, now, secret)]
        if outcome is Outcome.GRANTED:
            for kind, table, key in keys:
                left = table.blocked(key, now) if table.limit > 0 else 0.0
                if left > 0:
                    return Refusal(kind, left), []
            for _kind, table, key in keys:
                table.clear(key)
        return None, []

    def repeats(self, address: str | None, user: str | None, secret: bytes) -> bool:
        """Whether a failure with ``secret``'s digest was counted already (for the log)."""
        now = self.clock.seconds()
        return any(table.repeated(key, secret, now) for _kind, table, key in self._keys(address, user))

    def failed(self, address: str | None, user: str) -> list[str]:
        """Count a failed login that was never begun; the kinds of blocks it started."""
        now = self.clock.seconds()
        return [kind for kind, table, key in self._keys(address, user) if table.failed(key, now)]

    def succeeded(self, address: str | None, user: str) -> None:
        for _kind, table, key in self._keys(address, user):
            table.clear(key)
