"""The router: the session API every door uses, on one box and on a
cluster alike.  A single box is a cluster of one, whose
only node is this machine's :class:`~nxgate.node.local.LocalNode`.

* A new session goes where :mod:`nxgate.gateway.placement` says, after the
  user's limit is checked against his live sessions on every node (counted
  in the shared store: a clear refusal early).  The node then registers it
  through the store's ``admit``, which counts and inserts in one step, so
  two gateways racing cannot push a user past his limit.  On one box the
  only place is this machine's node.
* Every other call about a session goes to the node its store row names
  (resume affinity: never a guess, never another node); this machine's own
  sessions are known from its node's memory first (no store round trip).
* ``list``: this machine's sessions from its node, every other member's
  from the store.  A session whose node is down stays listed as lost
  (``SessionView.lost``), until that node comes back and reconciles it;
  acting on it is refused with a sentence that says why (``NX> 596``); only
  the admin may end it (its machine may never return).
* A node is down three heartbeats after its last one, and up only while
  this gateway's TLS link to it works: every gateway keeps one to every
  node that heartbeats (:meth:`keep_in_touch`), so a node process that dies
  is seen within a fraction of a second, and a member whose certificate the
  cluster does not trust (it reaches the shared database all the same) is
  never placed on (:mod:`nxgate.gateway.membership`).  The same connection
  carries the node's session events to this gateway (:attr:`observers`:
  the D-Bus door hears every member's sessions).
* The store unreachable: new requests get a clear ``NX> 596``; the relays
  of running sessions do not depend on it and carry on.
* Thumbnails are drawn by the session's node (:meth:`thumbnail`), and a
  session's bytes (the agent's stream, a browser's view) come from its node
  too (:meth:`open_stream`): the one way a door reaches them.

``status`` and ``set_draining`` are this member's own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.logger import Logger

from nxgate.gateway.membership import DEFAULT_HEARTBEAT, UP, Links, no_links, reachable, state
from nxgate.gateway.placement import NO_NODE, ranked
from nxgate.vocabulary.caller import Caller
from nxgate.vocabulary.errors import ErrorKind, SessionError
from nxgate.session_limits import SessionLimits, limit_reached
from nxgate.vocabulary.model import Member, Session, State
from nxgate.vocabulary.requests import FolderShares, RestoreRequest, ShadowRequest, ShareMount, StartRequest
from nxgate.vocabulary.results import (DesktopEntry, FolderMount, Listing, ProgressCallback, Ready, ServiceStatus, SessionEvent,
                                     SessionView, ShadowTarget)
from nxgate.vocabulary.streams import Stream, StreamKind
from nxgate.store.errors import StoreError, storage_reason

log = Logger()
#: Descriptors a stream from another member holds here: its connection, and a socket pair when it is handed on.
STREAM_FILES = 2


def lost(view: SessionView) -> SessionView:
    """``view`` of a session whose member is down."""
    return dataclasses.replace(view, lost=True)


def store_unavailable(error: StoreError) -> SessionError:
    log.error("the cluster's session store cannot be used: {error}", error=str(error),
              event="cluster_store_unavailable")
    return SessionError(ErrorKind.UNAVAILABLE, f"The cluster's session store cannot be reached ({storage_reason(error)}); "
                        "no session can be started or resumed now. Running sessions carry on; try again later.")


def node_down(session_id: str, node: str) -> SessionError:
    return SessionError(ErrorKind.UNAVAILABLE, f"Session {session_id} runs on machine {node}, which is down; it is "
                        "listed as lost until that machine is back.", session_id=session_id)


class Router:
    """:class:`nxgate.vocabulary.api.SessionAPI` over the nodes of a cluster,
    or of the cluster of one that a single box is.

    ``local``: this machine's node (:class:`nxgate.node.local.LocalNode`),
    None on a member that only routes; ``store``: the (shared) store;
    ``remote(name, address)``: another member's node over the wire
    (:meth:`nxgate.wire.remote_node.RemoteNodes.get`)."""

    def __init__(self, reactor: Any, config: Callable[[], Any], local: Any, store: Any,
                 remote: Callable[[str, str], Any] | None = None, links: Links = no_links,
                 room: Callable[[int], bool] = lambda count: True) -> None:
        """``links(name)``: the state of this gateway's link to that member
        (:meth:`nxgate.wire.remote_node.RemoteNodes.link_state`); ``room(n)``:
        whether users' work may take ``n`` more descriptors (the doors'
        guard's reserve)."""
        self.reactor = reactor
        self.room = room
        self.links = links
        self.config = config
        self.local = local
        self.store = store
        self.remote = remote
        self.limits = SessionLimits(config)
        #: Sessions placed on a member since its last heartbeat: {name: (that heartbeat, count)}.
        self.placed: dict[str, tuple[float, int]] = {}
        #: Who hears every session change on every node (the D-Bus door):
        #: this machine's node's and, through their connections, the others'.
        self.observers: list[Callable[[SessionEvent], None]] = []
        if local is not None:
            local.subscribe(self.heard)

    # ---------------------------------------------------------- who is who
    @property
    def clustered(self) -> bool:
        return self.config().cluster is not None

    @property
    def name(self) -> str:
        """This member's name ("" on a single box: its sessions' node)."""
        cluster = self.config().cluster
        return str(cluster.name) if cluster is not None else ""

    @property
    def heartbeat(self) -> float:
        return float(getattr(self.config().cluster, "heartbeat", DEFAULT_HEARTBEAT))

    @property
    def runs_sessions(self) -> bool:
        return self.local is not None

    def heard(self, event: SessionEvent) -> None:
        """A node's session changed: tell the observers (one that fails is logged, the rest still hear)."""
        for observer in list(self.observers):
            try:
                observer(event)
            except Exception:
                log.failure("an observer of session {id} failed", id=event.view.id)

    async def _members(self) -> dict[str, Member]:
        try:
            return {member.name: member for member in await self.store.members()}
        except StoreError as error:
            raise store_unavailable(error) from None

    def _up(self, member: Member | None) -> bool:
        """Up by its heartbeat and by this gateway's link to it (or its first attempt under way)."""
        return member is not None and reachable(state(member, self.reactor.seconds(), self.heartbeat,
                                                      self._link(member.name)))

    def _link(self, name: str) -> str | None:
        """This gateway's link to member ``name`` (None: this member itself, whose node is in process)."""
        return None if name == self.name else self.links(name)

    def _api(self, member: Member) -> Any:
        """This machine's node, or the other member's over the wire."""
        if member.name == self.name and self.runs_sessions:
            return self.local
        if self.remote is None:
            raise node_down("", member.name)
        return self.remote(member.name, member.address)

    async def keep_in_touch(self) -> None:
        """Hold a connection to every node that heartbeats (called every
        heartbeat): a node whose process dies closes it, and this gateway
        lists its sessions as lost at once instead of three heartbeats later;
        a link that broke or was refused is dialled again, and the node is up
        once it works.  A machine that vanishes without closing it still
        goes by heartbeats."""
        if not self.clustered:
            return
        try:
            members = await self.store.members()
        except StoreError:
            return  # the heartbeat already says so in the log
        now = self.reactor.seconds()
        for member in members:
            heartbeats = state(member, now, self.heartbeat) == UP
            if "node" in member.roles and heartbeats and self._api(member) is not self.local:
                connect = getattr(self._api(member), "connect", None)
                if connect is not None:
                    defer.ensureDeferred(connect()).addErrback(
                        lambda failure, name=member.name: log.failure("keeping in touch with {name} failed", failure,
                                                                      name=name))

    # ----------------------------------------------------------- new ones
    async def _check_user_limit(self, caller: Caller) -> None:
        """The user's limit over every node (each node checks its own again)."""
        limit = self.limits.user_limit(caller.user, caller.groups)
        if not limit:
            return
        try:
            live = await self.store.live(user=caller.user)
        except StoreError as error:
            raise store_unavailable(error) from None
        if len(live) >= limit:
            raise limit_reached("user", caller.user)

    def _pending(self, members: dict[str, Member]) -> dict[str, int]:
        """Placed since each member's last heartbeat (older counts are in its row by now)."""
        return {name: count for name, (beat, count) in self.placed.items()
                if name in members and members[name].last_heartbeat <= beat}

    def _placed(self, member: Member) -> None:
        beat, count = self.placed.get(member.name, (member.last_heartbeat, 0))
        self.placed[member.name] = (member.last_heartbeat, count + 1 if beat == member.last_heartbeat else 1)

    async def _place(self, caller: Caller, method: str, *arguments: Any) -> Any:
        """Run ``method`` on the best node; one that cannot be reached is
        skipped for the next (its heartbeat may not have gone stale yet).
        A cluster of one has one place: this machine's node."""
        if not self.clustered:
            return await getattr(self._only_node(), method)(caller, *arguments)
        await self._check_user_limit(caller)
        members = await self._members()
        candidates = ranked(members.values(), self.reactor.seconds(), self.heartbeat, self._pending(members),
                            self._link)
        if not candidates:
            raise SessionError(ErrorKind.LIMIT_REACHED, NO_NODE)
        last: SessionError | None = None
        for member in candidates:
            self._placed(member)
            try:
                return await getattr(self._api(member), method)(caller, *arguments)
            except SessionError as error:
                if not getattr(error, "unreachable", False):
                    raise
                log.warn("member {name} cannot be reached; placing {user}'s session elsewhere", name=member.name,
                         user=caller.user)
                last = error
        assert last is not None
        raise last

    async def start(self, caller: Caller, request: StartRequest) -> Ready:
        return await self._place(caller, "start", request)

    async def start_for_later(self, caller: Caller, session_type: str, name: str) -> SessionView:
        return await self._place(caller, "start_for_later", session_type, name)

    # ------------------------------------------------------ existing ones
    def _only_node(self) -> Any:
        if self.local is None:
            raise SessionError(ErrorKind.UNAVAILABLE, NO_NODE)
        return self.local

    async def _row(self, caller: Caller, session_id: str) -> Session:
        """The caller's live session as its node (this machine's: from memory)
        or the store has it (others' are NOT_YOURS, with NOT_FOUND's words)."""
        row = self.local.session(session_id) if self.local is not None else None
        if row is None:
            try:
                row = await self.store.get(session_id)
            except StoreError as error:
                raise store_unavailable(error) from None
        if row is None or not row.state.live:
            raise SessionError(ErrorKind.NOT_FOUND, f"Could not find session {session_id}.", session_id=session_id)
        if not caller.owns(row.user):
            log.warn("{user} from {address} asked for session {id} of another user", user=caller.user,
                     address=caller.address, id=session_id, audit="session_denied")
            raise SessionError(ErrorKind.NOT_YOURS, f"Could not find session {session_id}.", session_id=session_id)
        return row

    async def _node_of(self, row: Session) -> Any:
        """The node running ``row`` (a row without a node: this box's, from before the cluster)."""
        if (not row.node or row.node == self.name) and self.runs_sessions:
            return self.local
        if not row.node or not self.clustered:
            raise node_down(row.id, row.node or "this machine")
        member = (await self._members()).get(row.node)
        if member is None or not self._up(member):
            raise node_down(row.id, row.node)
        return self._api(member)

    async def _on_node_of(self, method: str, caller: Caller, session_id: str, *arguments: Any, **options: Any) -> Any:
        """``method(caller, session_id, ...)`` on the node that runs the session."""
        node = await self._node_of(await self._row(caller, session_id))
        return await getattr(node, method)(caller, session_id, *arguments, **options)

    async def open_stream(self, caller: Caller, session_id: str, kind: StreamKind) -> Stream:
        """One end of the caller's session, opened by the node that runs it
        (which checks the owner again and picks the end from its own record).
        A stream from another member holds this gateway's descriptors too:
        it is refused when users' work may take no more (``room``; this
        machine's node asks for its own)."""
        node = await self._node_of(await self._row(caller, session_id))
        if node is not self.local and not self.room(STREAM_FILES):
            log.warn("{user} from {address}: no {kind} stream of session {id}: this gateway is short of open files"
                     " ([server] fd_reserve)", user=caller.user, address=caller.address, kind=kind.word,
                     id=session_id)
            raise SessionError(ErrorKind.LIMIT_REACHED, "The server is short of open files; please try again in a"
                               " minute.", session_id=session_id)
        return await node.open_stream(caller, session_id, kind)

    async def restore(self, caller: Caller, request: RestoreRequest) -> Ready:
        node = await self._node_of(await self._row(caller, request.session_id))
        return await node.restore(caller, request)

    async def suspend(self, caller: Caller, session_id: str) -> SessionView:
        return await self._on_node_of("suspend", caller, session_id)

    async def terminate(self, caller: Caller, session_id: str, reason: str = "user request") -> SessionView:
        """On its node; the admin may also end a session of a machine that is
        down (gone for good): the store then records it ended, and if that
        machine comes back, its agent is one the node does not know (listed
        by ``nxgate-admin status`` as unknown), never a session again."""
        row = await self._row(caller, session_id)
        try:
            node = await self._node_of(row)
        except SessionError as error:
            if not (caller.admin and error.kind is ErrorKind.UNAVAILABLE):
                raise
            return await self._forget(row, error)
        return await node.terminate(caller, session_id, reason)

    async def _forget(self, row: Session, why: SessionError) -> SessionView:
        ended = row.evolve(state=State.TERMINATED, changed=self.reactor.seconds(),
                           failure=f"machine {row.node} was down; ended by the admin")
        try:
            written = await self.store.swap(ended)
        except StoreError as error:
            raise store_unavailable(error) from None
        if not written:  # its node wrote it meanwhile: it is back
            raise why
        log.info("session {id} of {user} on machine {node}, which is down, ended by the admin", id=row.id,
                 user=row.user, node=row.node, audit="session_forget")
        return SessionView.of(ended)

    async def rename(self, caller: Caller, session_id: str, name: str) -> SessionView:
        return await self._on_node_of("rename", caller, session_id, name)

    async def add_mount(self, caller: Caller, session_id: str, mount: ShareMount) -> bool:
        """On the session's node, which mounts the share (its password then
        crosses the members' TLS wire, never the store)."""
        return await self._on_node_of("add_mount", caller, session_id, mount)

    async def mount_folders(self, caller: Caller, session_id: str, shares: FolderShares) -> tuple[FolderMount, ...]:
        """On the session's node, which mounts them (the client's key then
        crosses the members' TLS wire, never the store)."""
        return await self._on_node_of("mount_folders", caller, session_id, shares)

    async def unmount_folders(self, caller: Caller, session_id: str, path: str = "") -> tuple[FolderMount, ...]:
        return await self._on_node_of("unmount_folders", caller, session_id, path)

    async def folders(self, caller: Caller, session_id: str) -> tuple[FolderMount, ...]:
        return await self._on_node_of("folders", caller, session_id)

    async def applications(self, caller: Caller, session_id: str) -> tuple[DesktopEntry, ...]:
        """The applications of the session's node (its machine's .desktop files)."""
        return await self._on_node_of("applications", caller, session_id)

    async def run_application(self, caller: Caller, session_id: str, argv: tuple[str, ...]) -> bool:
        return await self._on_node_of("run_application", caller, session_id, argv)

    async def show(self, caller: Caller, session_id: str) -> SessionView:
        """The node's own view; a session on a down node as the store last had it, marked lost."""
        row = await self._row(caller, session_id)
        try:
            node = await self._node_of(row)
        except SessionError as error:
            if error.kind is not ErrorKind.UNAVAILABLE:
                raise
            return lost(SessionView.of(row))
        return await node.show(caller, session_id)

    async def thumbnail(self, caller: Caller, session_id: str) -> bytes:
        """A PNG of the session's screen, drawn by the node that runs it."""
        return await self._on_node_of("thumbnail", caller, session_id)

    async def list(self, caller: Caller) -> Listing:
        """The caller's live sessions on every member (an admin's: everyone's),
        oldest first: this machine's from its node, the others' from the store."""
        if not self.clustered:
            return await self._only_node().list(caller)
        try:
            rows = await self.store.live(user=None if caller.admin else caller.user)
        except StoreError as error:
            raise store_unavailable(error) from None
        members = await self._members()
        here = await self.local.list(caller) if self.local is not None else None
        views = list(here.sessions) if here is not None else []
        for row in rows:
            if not caller.owns(row.user) or ((not row.node or row.node == self.name) and here is not None):
                continue
            view = SessionView.of(row)
            if row.node and not self._up(members.get(row.node)):
                view = lost(view)
            views.append(view)
        limit = self.limits.user_limit(caller.user, caller.groups)
        mine = sum(1 for view in views if view.user == caller.user)
        return Listing(tuple(sorted(views, key=lambda v: v.created)),
                       capacity_reached=bool(limit and mine >= limit))

    # ------------------------------------------------------------- shadow
    async def _up_nodes(self) -> list[tuple[str, Any]]:
        """(name, node) of every node that is up: on one box, this machine's."""
        if not self.clustered:
            return [(self.name, self.local)] if self.local is not None else []
        members = await self._members()
        return [(m.name, self._api(m)) for m in members.values() if "node" in m.roles and self._up(m)]

    async def shadow_targets(self, caller: Caller) -> tuple[ShadowTarget, ...]:
        """Every up node's targets (one that fails is left out, and logged)."""
        targets: list[ShadowTarget] = []
        for name, node in await self._up_nodes():
            try:
                targets.extend(await node.shadow_targets(caller))
            except SessionError as error:
                log.warn("shadow targets of member {name} left out: {error}", name=name, error=error.message)
        return tuple(targets)

    async def attach_shadow(self, caller: Caller, request: ShadowRequest,
                            progress: ProgressCallback = lambda progress: None) -> Ready:
        """On the node of the shadowed session (a display that is no session: the node that offers it)."""
        if not self.clustered:
            return await self._only_node().attach_shadow(caller, request, progress)
        try:
            row = await self.store.get(request.target_id)
        except StoreError as error:
            raise store_unavailable(error) from None
        if row is not None and row.state.live:
            node = await self._node_of(row)
            return await node.attach_shadow(caller, request, progress)
        for _, node in await self._up_nodes():
            try:
                offered = await node.shadow_targets(caller)
            except SessionError:
                continue
            if any(target.id == request.target_id for target in offered):
                return await node.attach_shadow(caller, request, progress)
        return await self._only_node().attach_shadow(caller, request, progress)  # its words for "no such target"

    # ----------------------------------------------------- this member's
    async def status(self, caller: Caller) -> ServiceStatus:
        """This machine's node's; a member that only routes runs no session."""
        if self.local is None:
            if not caller.admin:
                raise SessionError(ErrorKind.NOT_ALLOWED, "Only the admin may see the service's status.")
            return ServiceStatus(draining=False, live=0, unsaved_changes=0, unknown_sessions=())
        return await self.local.status(caller)

    async def set_draining(self, caller: Caller, on: bool) -> bool:
        if self.local is None:
            raise SessionError(ErrorKind.INVALID_REQUEST, f"Member {self.name} runs no sessions (role gateway only): "
                                                     "drain a node by name instead (nxgate-admin drain --node NAME).")
        return await self.local.set_draining(caller, on)
