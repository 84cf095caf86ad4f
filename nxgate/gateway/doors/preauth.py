"""Who may hold a connection that has not authenticated yet (pure, with a clock).

Before authentication a connection costs the gateway a file descriptor and
some memory and proves nothing about who holds it.  Issue 26 showed one
address holding 1,100 silent SSH connections until the process ran out of
file descriptors, after which PAM, NSS and the store failed for everybody.
This table is what every listening door asks before it serves a new
connection, and what it tells when the connection authenticates or ends:

* **Per source** (``max_startups_per_address``): at most this many
  unauthenticated connections from one address (IPv6: one /64, as a host
  usually owns a whole /64) across all doors.
* **Per door** (``max_startups`` = ``start:rate:full``, OpenSSH's
  MaxStartups, counted for each door on its own: idle TLS connections to the
  portal take nothing from the SSH port): from ``start`` unauthenticated
  connections on, a new one is refused with probability ``rate`` percent,
  rising linearly to 100 % at ``full``.  Random early drop keeps some room
  for real clients while a flood lasts instead of a hard wall that the flood
  alone fills.
* **Displacement**: where a new connection would be refused by that total,
  it takes the place of the most idle connection of the address that holds
  the most on that door, if that address holds more than the newcomer's
  would (or, for a newcomer with no other connection waiting on the door,
  of any connection silent for :data:`DISPLACE_IDLE` seconds); the displaced
  one is closed and costs its address ``penalty_noauth``.  Twenty addresses
  holding ten silent connections each cannot keep a user from logging in,
  and a connection that is busy logging in is never the one displaced.
* **File descriptors** (``fd_reserve``): when the process is within this
  many descriptors of its limit, doors take no one, so that running
  sessions, the admin socket, PAM/NSS and the store keep the reserve.
* **Penalties** (issue 27, OpenSSH's PerSourcePenalties): a connection that
  ends without authenticating adds ``penalty_noauth`` seconds to its
  source's debt, one closed at the deadline ``penalty_grace``.  Debt drains
  at one second per second; when it reaches ``penalty_min`` the source is
  refused for that long (at most ``penalty_max``), and each further block
  within ``penalty_max`` seconds of the last lasts twice as long.
* **Logs**: refusals of one source are logged once a minute with a count,
  never per connection (a flood must not become a log flood; the one
  :class:`nxgate.ratelimit.RateLimiter`).

Exempt networks (``preauth_exempt``: a load balancer, a NAT of a whole
office) skip the per-source cap and the penalties; they still count in the
total, the deadline and the descriptor reserve.  So does, for an hour, an
address a cluster member's certificate was verified from (:meth:`PreauthTable.trust`).
"""

from __future__ import annotations

import enum
import ipaddress
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from nxgate.config import Config, parse_max_startups, parse_networks
from nxgate.ratelimit import RateLimiter

#: Sources remembered for penalties (each a few hundred bytes).
MAX_SOURCES = 100_000
#: Seconds a verified cluster member's address stays exempt, and how many such addresses.
TRUST_SECONDS = 3600.0
MAX_TRUSTED = 1024
#: Seconds between two log lines about one source.
LOG_INTERVAL = 60.0
#: Seconds without a byte after which any newcomer may displace a connection.
DISPLACE_IDLE = 10.0
#: The door of callers that name none.
ANY_DOOR = "any"


@dataclass(frozen=True)
class Limits:
    """The settings, from ``[server]`` (see nxgate.config)."""

    grace: float = 30.0
    per_address: int = 10
    start: int = 100
    rate: int = 30
    full: int = 200
    fd_reserve: int = 128
    penalty_noauth: float = 1.0
    penalty_grace: float = 10.0
    penalty_min: float = 15.0
    penalty_max: float = 600.0
    exempt: tuple[Any, ...] = ()
    #: Authenticated connections per user (not this table's: nxgate.gateway.doors.user_connections).
    per_user: int = 32

    @classmethod
    def from_config(cls, config: Config) -> Limits:
        server = config.server
        start, rate, full = parse_max_startups(server.max_startups)
        return cls(grace=server.login_grace_time, per_address=server.max_startups_per_address, start=start,
                   rate=rate, full=full, fd_reserve=server.fd_reserve, penalty_noauth=server.penalty_noauth,
                   penalty_grace=server.penalty_grace, penalty_min=server.penalty_min,
                   penalty_max=server.penalty_max, exempt=parse_networks(server.preauth_exempt),
                   per_user=server.max_connections_per_user)


class Refusal(enum.Enum):
    """Why a new connection was not taken, as an admin reads it in the log."""

    FILES = "the gateway is near its open file limit, keeping the rest for running sessions"
    PER_ADDRESS = "too many unauthenticated connections from this address"
    FULL = "too many unauthenticated connections in total"
    EARLY_DROP = "many unauthenticated connections in total (random early drop)"
    PENALTY = "this address's earlier connections kept ending before authentication"


class Ending(enum.Enum):
    AUTHENTICATED = "authenticated"
    NOAUTH = "closed before authenticating"
    DEADLINE = "not authenticated within the deadline"
    UNPENALIZED = "ended before authenticating, on a door without penalties"
    DISPLACED = "closed to make room for a newcomer"


@dataclass
class _Door:
    """One door's unauthenticated connections: by source, each source's
    connections from the most idle to the latest active."""

    total: int = 0
    by_source: dict[str, OrderedDict[Hashable, float]] = field(default_factory=dict)
    #: Whether its connections earn penalties (the portal's do not).
    penalizes: bool = True


@dataclass
class _Source:
    pending: int = 0          # unauthenticated connections now
    by_door: dict[str, int] = field(default_factory=dict)  # ... on each door
    debt: float = 0.0         # penalty seconds owed, as of debt_at
    debt_at: float = 0.0
    blocked_until: float = 0.0
    strikes: int = 0          # blocks in a row, each twice the last
    last_block: float = float("-inf")

    def idle(self, now: float) -> bool:
        return self.pending == 0 and self.blocked_until <= now and self.debt <= now - self.debt_at


@dataclass(frozen=True)
class Block:
    """A source just refused for ``seconds`` by a penalty."""

    source: str
    seconds: float
    strikes: int


class PreauthTable:
    """The unauthenticated connections of every door, by source.

    ``clock`` gives seconds (the reactor's), ``random`` a float in [0, 1)
    for the early drop; both are injected so that tests decide."""

    def __init__(self, limits: Limits, clock: Callable[[], float], random: Callable[[], float],
                 displace: Callable[[Hashable, str, Block | None], None] = lambda *displaced: None) -> None:
        """``displace(connection, source, block)`` closes a connection the
        table displaced (see :meth:`admit`; ``block``: a penalty that began
        with it, or None): it no longer counts, its end is not told again."""
        self.limits = limits
        self.clock = clock
        self.random = random
        self.displace = displace
        self.sources: OrderedDict[str, _Source] = OrderedDict()
        self.total = 0
        self.doors: dict[str, _Door] = {}
        self._placed: dict[Hashable, tuple[str, str]] = {}  # connection -> (door, source)
        self.refused: dict[str, int] = {reason.name.lower(): 0 for reason in Refusal}
        self.closed_at_deadline = 0
        self.displaced = 0
        # Sources a cluster member's certificate was verified from, until when (see trust()).
        self.trusted: dict[str, float] = {}
        #: The log lines about each source: one a minute (see note()).
        self.lines = RateLimiter(clock, allowance=1, window=LOG_INTERVAL, capacity=MAX_SOURCES)

    # ----------------------------------------------------------- queries
    @staticmethod
    def source_of(address: str) -> str:
        """The key a connection counts under: the address, an IPv6 one's /64."""
        try:
            ip = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            return address
        if isinstance(ip, ipaddress.IPv6Address):
            if ip.ipv4_mapped is not None:
                return str(ip.ipv4_mapped)
            return str(ipaddress.ip_network(f"{ip}/64", strict=False))
        return str(ip)

    def trust(self, source: str, seconds: float = TRUST_SECONDS) -> None:
        """A connection from ``source`` proved to be a cluster member (TLS
        with a member's certificate): its further connections are exempt
        for ``seconds``.  A gateway opens a stream per session to a node,
        many at once in a morning rush; their handshakes must not meet the
        per-address cap meant for strangers.  Only a member can earn this."""
        if len(self.trusted) >= MAX_TRUSTED:
            now = self.clock()
            self.trusted = {s: until for s, until in self.trusted.items() if until > now}
        if len(self.trusted) < MAX_TRUSTED:
            self.trusted[source] = self.clock() + seconds

    def exempt(self, source: str) -> bool:
        if self.trusted.get(source, float("-inf")) > self.clock():
            return True
        try:
            network = ipaddress.ip_network(source, strict=False)
        except ValueError:
            return False
        return any(network.version == allowed.version and network.subnet_of(allowed)
                   for allowed in self.limits.exempt)

    def penalized(self) -> int:
        now = self.clock()
        return sum(1 for record in self.sources.values() if record.blocked_until > now)

    # ----------------------------------------------------------- changes
    def admit(self, source: str, open_files: int = 0, file_limit: int = 0, penalties: bool = True,
              door: str = ANY_DOOR, connection: Hashable | None = None) -> Refusal | None:
        """A new connection from ``source`` to ``door``: None if it may go on
        (it then counts until :meth:`ended`), else why not.  ``open_files``
        of ``file_limit`` are the process's descriptors (0: not checked).
        ``penalties``: whether this door refuses a penalized source (the
        portal neither earns nor checks them: it has its own login throttle,
        and one scanner behind an office NAT must not take it from all).
        ``connection``: a key for this connection, so that it may be
        displaced by a later one and tell its activity (:meth:`active`);
        admitting it may displace another (see the module's docstring)."""
        limits, now = self.limits, self.clock()
        refusal = None
        record = self.sources.get(source)
        exempt = self.exempt(source)
        at_door = self.doors.setdefault(door, _Door())
        at_door.penalizes = penalties
        if file_limit and open_files >= file_limit - limits.fd_reserve:
            refusal = Refusal.FILES
        elif penalties and not exempt and record is not None and record.blocked_until > now:
            refusal = Refusal.PENALTY
        elif not exempt and record is not None and record.pending >= limits.per_address:
            refusal = Refusal.PER_ADDRESS
        elif at_door.total >= limits.full:
            refusal = Refusal.FULL
        elif at_door.total >= limits.start:
            chance = (limits.rate + (100 - limits.rate) * (at_door.total - limits.start)
                      / max(1, limits.full - limits.start)) / 100
            if self.random() < chance:
                refusal = Refusal.EARLY_DROP
        if refusal in (Refusal.FULL, Refusal.EARLY_DROP) and self._make_room(at_door, source, now):
            refusal = None
        if refusal is not None:
            self.refused[refusal.name.lower()] += 1
            return refusal
        record = self._record(source)
        record.pending += 1
        record.by_door[door] = record.by_door.get(door, 0) + 1
        self.total += 1
        at_door.total += 1
        if connection is not None:
            at_door.by_source.setdefault(source, OrderedDict())[connection] = now
            self._placed[connection] = (door, source)
        return None

    def active(self, connection: Hashable) -> None:
        """``connection`` received something: it is the least idle of its source's."""
        placed = self._placed.get(connection)
        if placed is not None:
            door, source = placed
            waiting = self.doors[door].by_source[source]
            waiting[connection] = self.clock()
            waiting.move_to_end(connection)

    def _make_room(self, at_door: _Door, source: str, now: float) -> bool:
        """Displace a connection for a newcomer from ``source``, if one may be."""
        mine = len(at_door.by_source.get(source, ())) + 1
        best: tuple[int, float, str, Hashable] | None = None
        for holder, waiting in at_door.by_source.items():
            if not waiting or holder == source or self.exempt(holder):
                continue
            connection, last = next(iter(waiting.items()))
            count, idle = len(waiting), now - last
            if count > mine or (mine == 1 and idle >= DISPLACE_IDLE):
                if best is None or (count, idle) > best[:2]:
                    best = (count, idle, holder, connection)
        if best is None:
            return False
        _, _, holder, connection = best
        block = self.ended(holder, Ending.DISPLACED if at_door.penalizes else Ending.UNPENALIZED, connection)
        self.displaced += 1
        self.displace(connection, holder, block)
        return True

    def ended(self, source: str, ending: Ending, connection: Hashable | None = None,
              door: str = ANY_DOOR) -> Block | None:
        """An admitted connection authenticated or ended before that: it no
        longer counts; one that never authenticated adds to its source's
        debt, which may start a block (returned, for the log).  A
        ``connection`` that was displaced has ended already: nothing happens."""
        if connection is not None:
            placed = self._placed.pop(connection, None)
            if placed is None:
                return None
            door, source = placed
            waiting = self.doors[door].by_source[source]
            del waiting[connection]
            if not waiting:
                del self.doors[door].by_source[source]
        record = self.sources.get(source)
        if record is None or record.pending <= 0:
            return None
        record.pending -= 1
        self.total -= 1
        if record.by_door.get(door, 0) > 0:
            record.by_door[door] -= 1
            self.doors[door].total -= 1
        if ending is Ending.DEADLINE:
            self.closed_at_deadline += 1
        if ending in (Ending.AUTHENTICATED, Ending.UNPENALIZED) or self.exempt(source):
            return None
        amount = self.limits.penalty_grace if ending is Ending.DEADLINE else self.limits.penalty_noauth
        return self._penalize(source, record, amount)

    def _penalize(self, source: str, record: _Source, amount: float) -> Block | None:
        if amount <= 0:
            return None
        now = self.clock()
        if record.blocked_until > now:
            return None  # already refused; what it still holds ends at the deadline
        record.debt = max(0.0, record.debt - (now - record.debt_at)) + amount
        record.debt_at = now
        if record.debt < self.limits.penalty_min:
            return None
        record.strikes = record.strikes + 1 if now - record.last_block <= self.limits.penalty_max else 1
        seconds = min(self.limits.penalty_max, record.debt * 2 ** (record.strikes - 1))
        record.blocked_until = now + seconds
        record.last_block = now + seconds
        record.debt = 0.0
        return Block(source, seconds, record.strikes)

    def note(self, source: str, what: str) -> dict[str, int] | None:
        """Count a refusal (a :class:`Refusal`'s lower-case name) or a
        connection closed at the deadline (``"deadline"``) for the log: the
        counts by kind to log now, this one's included (the first of a
        source, then at most once a minute), else None."""
        decision = self.lines.admit(source, what)
        if not decision.passed:
            return None
        counts = dict(decision.held.counts) if decision.held is not None else {}
        counts[what] = counts.get(what, 0) + 1
        return counts

    def flush_log(self) -> list[tuple[str, dict[str, int]]]:
        """Refusals not logged yet whose minute is over (call now and then),
        so that the last burst of a flood is logged too; each begins its
        source's next minute."""
        return [(str(source), dict(held.counts)) for source, held in self.lines.due()]

    def _record(self, source: str) -> _Source:
        record = self.sources.pop(source, None)
        if record is None:
            record = _Source(debt_at=self.clock())
            self._prune()
        self.sources[source] = record  # most recently used last
        return record

    def _prune(self) -> None:
        """At MAX_SOURCES: forget the sources that owe nothing and hold
        nothing, then the least recently seen down to 90 % (amortized: a
        flood from many addresses must not make each new one scan them all)."""
        if len(self.sources) < MAX_SOURCES:
            return
        now = self.clock()
        for source in [s for s, record in self.sources.items() if record.idle(now)]:
            del self.sources[source]
        while len(self.sources) > MAX_SOURCES * 9 // 10:
            source, record = self.sources.popitem(last=False)
            self.total -= record.pending  # what it still holds no longer counts
            for name, count in record.by_door.items():
                self.doors[name].total -= count
                for connection in self.doors[name].by_source.pop(source, {}):
                    self._placed.pop(connection, None)

    def status(self) -> dict[str, Any]:
        """For ``nxgate-admin status`` and the metrics."""
        return {"unauthenticated": self.total, "penalized_sources": self.penalized(),
                "refused": dict(self.refused), "closed_at_deadline": self.closed_at_deadline,
                "displaced": self.displaced,
                "unauthenticated_by_door": {name: door.total for name, door in self.doors.items() if door.total}}
