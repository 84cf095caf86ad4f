"""The session record and its state machine (pure).

States follow Neatx's model (reference §4.1) plus ``resuming`` (nxagent's
own word) and ``failed``.  The agent's log drives the transitions; the
table below says which event moves which state where, and anything not in
the table is ignored (nxagent repeats itself, e.g. "Waiting for
connection" after both a start and a resume).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Any



class AgentEvent(enum.Enum):
    """What an agent's log line says happened (read by nxgate.node.agents.agentlog)."""
    STARTING = "starting"
    WAITING = "waiting"  # listening for the client's proxy
    RUNNING = "running"  # started or resumed: a client is attached
    DISPLAY_FAILURE = "display-failure"  # the client went away
    SUSPENDING = "suspending"
    SUSPENDED = "suspended"
    RESUMING = "resuming"
    TERMINATING = "terminating"
    TERMINATED = "terminated"
    ABORTING = "aborting"
    ABORTED = "aborted"
    ERROR = "error"  # an "Error: ..." line; the text is kept
    COOKIE_MISMATCH = "cookie-mismatch"
    WATCHDOG_WAIT = "watchdog-wait"  # the agent waits for its watchdog to end
    SCREEN = "screen"  # the desktop's size changed; text is WxH


class State(str, enum.Enum):
    CREATED = "created"
    STARTING = "starting"
    WAITING = "waiting"  # the agent listens for the client's proxy
    RUNNING = "running"  # a client is attached
    SUSPENDING = "suspending"
    SUSPENDED = "suspended"
    RESUMING = "resuming"
    TERMINATING = "terminating"
    TERMINATED = "terminated"
    FAILED = "failed"

    @property
    def live(self) -> bool:
        return self not in (State.TERMINATED, State.FAILED)


S = State
_LIVE = [s for s in State if s.live]

# event -> {from state: to state}
TRANSITIONS: dict[AgentEvent, dict[State, State]] = {
    AgentEvent.STARTING: {S.CREATED: S.STARTING},
    AgentEvent.WAITING: {S.CREATED: S.WAITING, S.STARTING: S.WAITING, S.RESUMING: S.WAITING, S.SUSPENDED: S.WAITING},
    AgentEvent.RUNNING: {S.STARTING: S.RUNNING, S.WAITING: S.RUNNING, S.RESUMING: S.RUNNING},
    AgentEvent.DISPLAY_FAILURE: {S.RUNNING: S.SUSPENDING},
    AgentEvent.SUSPENDING: {S.RUNNING: S.SUSPENDING, S.WAITING: S.SUSPENDING},
    AgentEvent.SUSPENDED: {S.RUNNING: S.SUSPENDED, S.SUSPENDING: S.SUSPENDED, S.WAITING: S.SUSPENDED, S.RESUMING: S.SUSPENDED},
    AgentEvent.RESUMING: {S.SUSPENDED: S.RESUMING},
    AgentEvent.TERMINATING: {s: S.TERMINATING for s in _LIVE},
    AgentEvent.ABORTING: {s: S.TERMINATING for s in _LIVE},
    AgentEvent.TERMINATED: {s: S.TERMINATED for s in _LIVE},
    AgentEvent.ABORTED: {s: S.TERMINATED for s in _LIVE},
}


def advance(state: State, event: AgentEvent) -> State | None:
    """The state after ``event``, or None if the event changes nothing."""
    new = TRANSITIONS.get(event, {}).get(state)
    return new if new is not state else None


#: The option a session started for a later client carries (StartSession
#: over D-Bus): its agent waits for a first client no one has been told of yet.
FOR_LATER = "for_later"


def listed_status(state: State, for_later: bool = False) -> str | None:
    """The one-word status clients see in ``listsession`` (None: not listed).

    A session started for a later client and never attached is Suspended
    while it waits: that is the word NX clients offer to resume."""
    if state in (S.SUSPENDED, S.SUSPENDING) or (state is S.WAITING and for_later):
        return "Suspended"
    if state in (S.RUNNING, S.WAITING, S.RESUMING, S.STARTING):
        return "Running"
    return None


@dataclass(frozen=True)
class Session:
    """Everything the gateway knows about one session; stored as one row."""

    id: str  # 32 upper-case hex digits
    user: str
    uid: int
    gid: int
    type: str
    name: str
    display: int
    server_name: str
    cookie: str
    state: State = State.CREATED
    created: float = 0.0
    changed: float = 0.0
    client_address: str = ""
    geometry: str = "800x600"
    depth: int = 24
    render: bool = True
    fullscreen: bool = False
    rootless: bool = False
    encrypted: bool = True
    ever_attached: bool = False
    agent_pid: int = 0
    agent_started: int = 0  # /proc starttime, to tell a reused pid apart
    app_pid: int = 0
    app_started: int = 0
    failure: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    node: str = ""  # the cluster member running it ("": this box, single-box mode)
    revision: int = 0  # maintained by the store: bumped on every write (compare-and-set in swap)

    @property
    def full_id(self) -> str:
        """What clients get in ``NX> 700`` and use as nxproxy's ``id=``."""
        return f"{self.server_name}-{self.display}-{self.id}"

    @property
    def port(self) -> int:
        return 4000 + self.display

    @property
    def for_later(self) -> bool:
        """Started with no client (see :data:`FOR_LATER`) and none attached yet."""
        return bool(self.options.get(FOR_LATER)) and not self.ever_attached

    def evolve(self, **changes: Any) -> Session:
        return replace(self, **changes)


def member_name(config: Any) -> str:
    """The cluster member ``config`` makes this box ("" without ``[cluster]``):
    the ``node`` its sessions carry, and the only ones it takes back after a
    restart or prunes from a store shared with other members."""
    cluster = getattr(config, "cluster", None)
    return str(getattr(cluster, "name", "") or "") if cluster else ""


#: A member's state as a gateway sees it (``nxgate-admin nodes``, placement): down by its heartbeat, or up
#: (its link works, or the gateway keeps none to it), or connecting (a first link attempt).  Any other state
#: is a failed link's, in words: "refused: ..." (the certificate), "unreachable: ...".
MEMBER_UP, MEMBER_DOWN, MEMBER_CONNECTING = "up", "down", "connecting"


@dataclass(frozen=True)
class Member:
    """One cluster member as its own heartbeat last described it (one row in
    the store).  Times are the writer's wall clock; ``drained`` and nothing
    else belongs to the admin (a heartbeat never overwrites it)."""

    name: str
    address: str
    roles: frozenset[str]
    started: float
    last_heartbeat: float
    sessions: int
    load: float
    cpus: int
    free_memory: int  # bytes
    drained: bool = False
    weight: float = 1.0
