"""Cluster membership: each member's heartbeat in the shared store, and
whether a member is up (issue 13, contract "Membership").

Every ``[cluster] heartbeat`` seconds a member writes its row: address,
roles, how many live sessions it runs, its load average, CPUs and free
memory (for placement), and its admin weight.  A member is "down" once its
last heartbeat is more than :data:`DOWN_AFTER` heartbeats old, by the
reader's clock: members' clocks must agree to within a heartbeat or so
(NTP).  A heartbeat is not enough to be "up" though: a member writes it
into the shared database, which a member whose certificate comes from
another CA reaches as well as any.  A gateway keeps a TLS link to every
node (:mod:`nxgate.wire.remote_node`), and a node it links to is up only
while that link works; otherwise its state is the link's ("refused:
certificate not from the cluster's CA", "unreachable: ..."), or
"connecting" for the first attempt.  ``drained`` belongs to the admin
(``nxgate-admin drain --node``); a heartbeat never writes it.  The
decisions are pure functions; the service is a thin LoopingCall around
them.  A single box has no heartbeat: its one node is this machine
(:meth:`Membership.views`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

from twisted.application import service
from twisted.logger import Logger

from nxgate.loops import SteadyLoop
from nxgate.vocabulary.errors import Kind, SessionError
from nxgate.vocabulary.model import MEMBER_CONNECTING, MEMBER_DOWN, MEMBER_UP, Member
from nxgate.vocabulary.results import MemberView
from nxgate.store.errors import StoreError, storage_reason

log = Logger()

DEFAULT_HEARTBEAT = 2.0
#: Heartbeats a member may miss before it is down.
DOWN_AFTER = 3
DEFAULT_ROLES = frozenset({"gateway", "node"})


UP, DOWN, CONNECTING = MEMBER_UP, MEMBER_DOWN, MEMBER_CONNECTING

#: What tells the state of this member's link to another (:meth:`nxgate.wire.remote_node.RemoteNodes.link_state`);
#: None: it keeps none (a member that serves no doors).
Links = Callable[[str], "str | None"]


def no_links(name: str) -> str | None:
    return None


def state(member: Member, now: float, heartbeat: float = DEFAULT_HEARTBEAT, link: str | None = None) -> str:
    """"down" if ``member`` wrote no heartbeat within the last ``DOWN_AFTER``
    periods; else, for a node, the state of this member's link to it
    (``link``: "up", "connecting", "refused: ...", "unreachable: ..."); "up"
    without one (this member itself, a member that links to none) and for a
    member that runs no sessions (gateways link to nodes only)."""
    if now - member.last_heartbeat > DOWN_AFTER * heartbeat:
        return DOWN
    return link if link is not None and "node" in member.roles else UP


def reachable(member_state: str) -> bool:
    """May calls go to a member in this state (new sessions among them)?"""
    return member_state in (UP, CONNECTING)


def view(member: Member, now: float, heartbeat: float = DEFAULT_HEARTBEAT, link: str | None = None) -> MemberView:
    return MemberView(name=member.name, address=member.address, roles=tuple(sorted(member.roles)),
                      state=state(member, now, heartbeat, link), sessions=member.sessions, load=member.load,
                      cpus=member.cpus, free_memory=member.free_memory, started=member.started,
                      last_heartbeat=member.last_heartbeat, drained=member.drained, weight=member.weight)


def load_average(loadavg: str) -> float:
    """The 1-minute load average from the text of /proc/loadavg."""
    return float(loadavg.split()[0])


def available_memory(meminfo: str) -> int:
    """MemAvailable in bytes from the text of /proc/meminfo (0 if absent)."""
    for line in meminfo.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def _read(path: str) -> str:
    with open(path, encoding="ascii") as handle:
        return handle.read()


def cluster_settings(config: Any) -> Any:
    """``config.cluster`` (None: a single box)."""
    return getattr(config, "cluster", None)


class Membership(service.Service):
    """Writes this member's row every heartbeat; answers ``nodes`` and ``drain --node``."""

    def __init__(self, config: Any, store: Any, reactor: Any, sessions_count: Callable[[], int],
                 read: Callable[[str], str] = _read, draining: Callable[[], bool] = lambda: False) -> None:
        """``draining``: this machine's own switch (``nxgate-admin drain on``), shown for a single box."""
        cluster = cluster_settings(config)
        self.clustered = cluster is not None
        self.member_name: str = getattr(cluster, "name", "") or config.server_name
        self.address: str = getattr(cluster, "address", "")
        self.roles: frozenset[str] = frozenset(getattr(cluster, "roles", DEFAULT_ROLES))
        self.heartbeat: float = float(getattr(cluster, "heartbeat", DEFAULT_HEARTBEAT))
        self.weight: float = float(getattr(cluster, "weight", 1.0))
        self.store = store
        self.reactor = reactor
        self.sessions_count = sessions_count
        self.read = read
        self.draining = draining
        self.started = reactor.seconds()  # again when the heartbeats start (a single box writes none)
        self.failing = False
        self._loop = SteadyLoop(self.beat, reactor, "the cluster heartbeat")

    def member(self) -> Member:
        """This member now, as its heartbeat describes it."""
        try:
            load = load_average(self.read("/proc/loadavg"))
            memory = available_memory(self.read("/proc/meminfo"))
        except (OSError, ValueError, IndexError):
            load, memory = 0.0, 0
        return Member(name=self.member_name, address=self.address, roles=self.roles, started=self.started,
                      last_heartbeat=self.reactor.seconds(), sessions=self.sessions_count(), load=load,
                      cpus=os.cpu_count() or 1, free_memory=memory, weight=self.weight)

    async def beat(self) -> None:
        """One heartbeat; a store that fails is logged once, and again when it takes them."""
        try:
            await self.store.heartbeat(self.member())
        except StoreError as error:
            if not self.failing:
                self.failing = True
                log.error("cluster member {name}: heartbeat not written ({error}); other members will see this one "
                          "as down after {after:g}s", name=self.member_name, error=str(error),
                          after=DOWN_AFTER * self.heartbeat)
            return
        if self.failing:
            self.failing = False
            log.info("cluster member {name}: heartbeats are written again", name=self.member_name)

    def startService(self) -> None:
        super().startService()
        self.started = self.reactor.seconds()
        log.info("cluster member {name} ({roles}): heartbeat every {every:g}s", name=self.member_name,
                 roles=", ".join(sorted(self.roles)), every=self.heartbeat)
        self._loop.start(self.heartbeat, now=True)

    def stopService(self) -> Any:
        super().stopService()
        self._loop.stop()

    async def views(self, links: Links = no_links) -> tuple[MemberView, ...]:
        """Every member the store knows, with its state by this member's
        clock and links; a single box: this machine, its one node."""
        now = self.reactor.seconds()
        if not self.clustered:
            return (view(dataclasses.replace(self.member(), drained=self.draining()), now, self.heartbeat),)
        try:
            members = await self.store.members()
        except StoreError as error:
            raise _unavailable(error) from None
        return tuple(view(member, now, self.heartbeat, self._link(links, member.name))
                     for member in members)

    def _link(self, links: Links, name: str) -> str | None:
        return None if name == self.member_name else links(name)  # this member's own node is in process

    async def drain(self, name: str, on: bool) -> bool:
        """The admin's switch for member ``name``; False: no such member."""
        if not self.clustered:
            raise ValueError("this gateway is a single box (no [cluster] section): nxgate-admin drain on|off "
                             "drains its one node")
        try:
            return bool(await self.store.set_drained(name, on))
        except StoreError as error:
            raise _unavailable(error) from None


def _unavailable(error: StoreError) -> SessionError:
    return SessionError(Kind.UNAVAILABLE, f"The cluster's session store cannot be used: {storage_reason(error)}.")
