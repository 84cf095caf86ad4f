"""The node's session manager (:class:`nxgate.vocabulary.api.SessionAPI`): what this machine runs.

Doors never call it directly: the router reaches it through this machine's
:class:`nxgate.node.local.LocalNode`, as other members' gateways do over the wire.

It composes the parts and adds what is about callers: who may see and act
on a session (the owner check, the admin), admission (limits, then a
display, searched off the reactor, then the limits again and registration
in one reactor turn), and the domain results
doors render (Ready, SessionView, Listing, ServiceStatus).  What a session
does over its life is the :class:`Lifecycle`'s; its processes are the
:class:`AgentSupervisor`'s; the clock's work is :class:`Housekeeping`'s;
the store is written through the :class:`StoreWriter`.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

from twisted.application import service
from twisted.internet import defer, inotify
from twisted.logger import Logger, LogLevel

from nxgate.host.pamlib import resolve_service
from nxgate.node.agents import nxagent
from nxgate.config import Config
from nxgate.node.displays import DisplayAllocator, NoFreeDisplay
from nxgate.node.supervisor import AgentSupervisor, Orphan, SendSignal
from nxgate.safetext import printable
from nxgate.node import applications, displays, services
from nxgate.host import files, processes
from nxgate.host.launcher import Launcher
from nxgate.node.reverse import ReverseListeners
from nxgate.streams.reverse import SERVICES as REVERSE_SERVICES
from nxgate.vocabulary.model import FOR_LATER, Session, State, member_name
from nxgate.node.kinds import DesktopKind, RemoteDesktopKind, SessionKind, kind_for
from nxgate.vocabulary.caller import Caller
from nxgate.vocabulary.errors import ErrorKind, SessionError
from nxgate.node.housekeeping import Housekeeping
from nxgate.node.lifecycle import Background, Lifecycle
from nxgate.session_limits import SessionLimits
from nxgate.vocabulary.requests import (PUBLISHED_TYPE, DisplaySettings, FolderShares, RestoreRequest, ShadowRequest, ShareMount,
                                        StartRequest)
from nxgate.vocabulary.results import (DesktopEntry, FolderMount, Listing, ProgressCallback, Ready, ServiceStatus, SessionObserver, SessionView,
                                     ShadowTarget, StreamTarget, UnknownSession, HeldDisplay)
from nxgate.store.interface import SessionStore
from nxgate.node.writer import StoreWriter
from nxgate.threads import Blocking, inline

log = Logger()

#: The longest session name :meth:`SessionManager.rename` accepts.
MAX_NAME = 64
#: The longest name looked at, before blanks and unprintable characters go:
#: anything longer is refused on its length alone.
MAX_RAW_NAME = 4 * MAX_NAME


class SessionManager(service.Service):
    name = "sessions"

    def __init__(
        self,
        reactor: Any,
        config: Config,
        store: SessionStore,
        layout: files.StateLayout,
        notifier: inotify.INotify | None = None,
        launcher: Launcher | None = None,
        *,
        blocking: Blocking = inline,
        send_signal: SendSignal = processes.send_signal,
        listens: Callable[[int, int], bool] | None = None,
        room: Callable[[int], bool] = lambda count: True,
    ) -> None:
        """``blocking`` runs the work that must not hold the reactor (the
        gateway passes a thread pool); ``send_signal`` and ``listens`` go to
        the AgentSupervisor (tests record signals and fake the port check).
        ``store``: the one ``[store] url`` names (SQLite by default).
        ``room(n)``: whether users' work may take ``n`` more of this
        process's descriptors (the doors' guard's reserve): the reverse
        listeners ask before they accept."""
        self.reactor = reactor
        self.config = config
        self.settings = config.sessions
        self._blocking = blocking
        self.store: SessionStore = store
        self.writer = StoreWriter(self.store, reactor)
        self.layout = layout
        self.notifier = notifier or inotify.INotify(reactor)
        self.launcher = launcher or Launcher(reactor)
        self.pam_service = resolve_service(config.auth.pam_service)
        self.limits = SessionLimits(lambda: self.config)
        self.background = Background()
        self.supervisor = AgentSupervisor(reactor, lambda: self.config, layout, self.launcher, self.notifier,
                                          self.pam_service, blocking=blocking, send_signal=send_signal,
                                          listens=listens)
        self.displays = DisplayAllocator(
            lambda: (self.settings.display_base, self.settings.display_limit),
            lambda: [s.display for s in self.sessions.values()] + [o.display for o in self.orphans.values()],
            blocking)
        #: The reverse listeners of this machine's sessions (nxgate.node.reverse).
        self.reverse = ReverseListeners(reactor, layout.reverse, blocking, lambda sid: self.sessions.get(sid),
                                        lambda word: bool(getattr(self.config.services, REVERSE_SERVICES[word].switch,
                                                                  False)),
                                        lambda: self.node_name or "this machine", room)
        self.services = services.Services.load(services.Context(reactor, lambda: self.config, layout, self.launcher,
                                                        blocking, self.reverse))
        folders, printer = self.services.by_name.get("x2go-folders"), self.services.by_name.get("printing")
        if folders is not None and printer is not None:  # X2Go's printer serves the print spool the client shares
            folders.spool_mounted.append(printer.serve_x2go)
            folders.spool_gone.append(printer.stop)
        self.lifecycle = Lifecycle(reactor, lambda: self.config, lambda: self.settings, layout, self.supervisor,
                                   self.writer, self.store, self.displays, self.background, self.services)
        self.sessions = self.lifecycle.sessions  # the same dicts: the life cycle owns them
        self.runtime = self.lifecycle.runtime
        self.lifecycle.observers.append(self.reverse.session_changed)
        self.housekeeper = Housekeeping(reactor, lambda: self.settings, self.store, layout, self.supervisor,
                                        lambda: self.sessions.values(), self.lifecycle.terminate_session,
                                        self.background, lambda: self.node_name)
        # Admission always goes through the store's ``admit`` (counted and
        # inserted in one step): on one box as on a cluster, where limits hold
        # over every member.
        self.lifecycle.admission = self.limits.admission
        #: What a new session of each type starts (remote desktops before the desktops' catch-all).
        self.kinds: tuple[SessionKind, ...] = (RemoteDesktopKind(reactor, lambda: self.config),
                                               DesktopKind(lambda: self.config, lambda: self.settings))
        # Shadowing (nxgate.node.shadow_sessions.ShadowSessions), set by the gateway.
        self.shadow: Any = None

    def startService(self) -> None:
        super().startService()
        displays.ensure_x_socket_dir()
        self.notifier.startReading()
        self.launcher.prepare()  # a launcher started ahead: no Python start-up on a session's start
        self.background(self.lifecycle._reconcile(), "taking back the sessions of the previous run")
        self.housekeeper.startService()

    def stopService(self) -> None:
        """Stop watching; the sessions themselves carry on without us."""
        super().stopService()
        self.housekeeper.stopService()
        self.launcher.stop()
        self.writer.stop()
        self.writer.flush()
        if self.unsaved:
            log.error("{count} session change(s) could not be written to the store before stopping; the next start "
                      "learns the state of running sessions from their agents' logs", count=len(self.unsaved))
        for runtime in self.runtime.values():
            self.lifecycle._stop_watching(runtime)
        self.reverse.close()
        self.notifier.loseConnection()

    async def start(self, caller: Caller, request: StartRequest) -> Ready:
        """A new session for ``caller``, once its agent waits for the client;
        what runs in it is its kind's plan (:mod:`nxgate.node.kinds`)."""
        if request.ignored:
            log.info("startsession of {user} from {address}: ignored {ignored!r} (the server chooses the"
                     " session id and display)", user=caller.user, address=caller.address,
                     ignored=dict(request.ignored))
        launch = await kind_for(self.kinds, request.type).prepare(caller, request)
        session = await self.new_session(caller, request.type, request.name, request.display, request.encrypted,
                                         rootless=request.rootless and launch.plan.mode == "-R")
        options = {**session.options, **launch.options}
        if launch.services:
            options["services"] = self.granted_services(caller, request.services, session)
        return await self.launch(caller, session.evolve(options=options), request.display, launch.plan,
                                 secret=launch.secret, judge=launch.judge)

    def granted_services(self, caller: Caller, wanted: frozenset[str], session: Session) -> list[str]:
        """What the client asked for beside the screen, less what the admin
        switched off (logged, not refused: the session simply goes without)
        and what has no free channel port."""
        granted = services.grant_for(wanted, self.config.services, session.display, session.id, session.user)
        refused = sorted(set(wanted) - set(services.grant(wanted, self.config.services)))
        if refused:
            log.info("{user} from {address} asked for {refused}, switched off in [services]", user=caller.user,
                     address=caller.address, refused=", ".join(refused))
        return granted

    async def start_for_later(self, caller: Caller, session_type: str, name: str) -> SessionView:
        """A session of an allowed type that waits for a client to attach later
        (listed as Suspended until one does); same checks and limits as an NX
        start, default display settings, encrypted.  Only types that need no
        more than their name: not unix-application, not the remote desktops."""
        if len(session_type) > MAX_NAME:
            raise SessionError(ErrorKind.INVALID_REQUEST, "No such session type.")
        if not session_type:
            raise SessionError(ErrorKind.INVALID_REQUEST, "No session type given.")
        desktop = any(isinstance(kind, DesktopKind) and kind.handles(session_type) for kind in self.kinds)
        if not desktop or session_type == "unix-application":
            raise SessionError(ErrorKind.INVALID_REQUEST,
                               f"Session type '{session_type}' needs more than a name; start it from an NX client.")
        if len(name) > MAX_RAW_NAME:  # before any per-character work: a huge name must cost nothing
            raise SessionError(ErrorKind.INVALID_REQUEST, f"A session name has 1 to {MAX_NAME} printable characters.")
        clean = printable(name).strip() or session_type
        if len(clean) > MAX_NAME:
            raise SessionError(ErrorKind.INVALID_REQUEST, f"A session name has 1 to {MAX_NAME} printable characters.")
        request = StartRequest(type=session_type, name=clean, display=DisplaySettings(), encrypted=True,
                               rootless=False)
        launch = await kind_for(self.kinds, session_type).prepare(caller, request)
        session = await self.new_session(caller, request.type, request.name, request.display, request.encrypted)
        session = session.evolve(options={**session.options, **launch.options, FOR_LATER: True}, client_address="")
        ready = await self.launch(caller, session, request.display, launch.plan)
        log.debug("session {id} of {user} started for a later client", id=ready.view.id, user=caller.user,
                 audit="session_start_for_later")
        return ready.view

    async def new_session(self, caller: Caller, session_type: str, name: str, settings: DisplaySettings,
                          encrypted: bool, rootless: bool = False, run_as: tuple[int, int] | None = None) -> Session:
        """A session record for ``caller`` with a fresh id, cookie and display
        (not stored yet).  Its processes run as ``run_as`` (uid, gid; default:
        the caller, whose uid and gid were resolved at login).  The display
        search runs off the reactor: the limits are checked before it and
        again after, and the caller registers the session in that same turn."""
        self.limits.check(caller, self.sessions.values())
        uid, gid = run_as if run_as is not None else (caller.uid, caller.gid)
        display = await self._allocate_display(uid, gid)
        try:
            self.limits.check(caller, self.sessions.values())  # other starts came in while we searched
        except SessionError:
            self.displays.release(display)
            raise
        now = self.reactor.seconds()
        return Session(
            id=secrets.token_hex(16).upper(), user=caller.user, uid=uid, gid=gid,
            type=session_type, name=printable(name), display=display,
            server_name=self.config.server_name, cookie=secrets.token_hex(16), created=now, changed=now,
            client_address=printable(caller.address),
            geometry=settings.geometry, depth=settings.depth, render=settings.render,
            fullscreen=settings.fullscreen, rootless=rootless, encrypted=encrypted, node=self.node_name,
        )

    @property
    def node_name(self) -> str:
        """This member's name in a cluster (its sessions' ``node`` in the shared
        store; what it reconciles after a restart), "" on a single box."""
        return member_name(self.config)

    async def launch(self, caller: Caller, session: Session, settings: DisplaySettings,
                     plan: nxagent.AgentPlan, secret: str | None = None,
                     judge: Callable[[str], SessionError | None] | None = None) -> Ready:
        """Start a new session (see :meth:`Lifecycle.launch`); Ready once its agent listens."""
        return self._ready(await self.lifecycle.launch(caller, session, settings, plan, secret, judge), resumed=False)

    async def restore(self, caller: Caller, request: RestoreRequest) -> Ready:
        session = self._owned(caller, request.session_id)
        if not request.encrypted and not self.settings.allow_unencrypted:
            raise SessionError(ErrorKind.ENCRYPTION_REQUIRED, "Unencrypted sessions are not allowed.")
        session = await self.lifecycle.resume(caller, request, lambda: self._owned(caller, request.session_id))
        return self._ready(session, resumed=True)

    async def terminate(self, caller: Caller, session_id: str, reason: str = "user request") -> SessionView:
        session = self._owned(caller, session_id)
        # The session's end is its owner's line; another user ending it is worth one of its own.
        log.emit(LogLevel.debug if caller.user == session.user else LogLevel.info,
                 "terminating session {id} of {user} on request of {requester} from {address}", id=session.id,
                 user=session.user, requester=caller.user, address=caller.address, audit="session_terminate")
        await self.lifecycle.terminate_session(session.id, reason)
        return SessionView.of(self.sessions.get(session.id, session))

    async def suspend(self, caller: Caller, session_id: str) -> SessionView:
        """Suspend the caller's session (one already suspended stays so)."""
        session = self._owned(caller, session_id)
        await self.lifecycle.suspend_session(session.id)
        return SessionView.of(self.sessions.get(session.id, session))

    async def rename(self, caller: Caller, session_id: str, name: str) -> SessionView:
        """Give the caller's session a new name: printable, 1 to 64 characters."""
        session = self._owned(caller, session_id)
        clean = printable(name).strip() if len(name) <= MAX_RAW_NAME else ""  # length before per-character work
        if not clean or len(clean) > MAX_NAME:
            raise SessionError(ErrorKind.INVALID_REQUEST, f"A session name has 1 to {MAX_NAME} printable characters.",
                               session_id=session_id)
        log.info("session {id} of {user} renamed to {name!r} by {address}", id=session.id, user=session.user,
                 name=clean, address=caller.address, audit="session_rename")
        return SessionView.of(self.lifecycle.rename(session.id, clean))

    async def add_mount(self, caller: Caller, session_id: str, mount: ShareMount) -> bool:
        """Mount a folder the client shares in the caller's session (``addmount``).

        False when folder sharing is off for the session (the admin's
        ``[services]``, or a client that did not ask with ``--samba``): off,
        not an error.  The mount is made in the background once the client's
        proxy is attached, since the smb channel exists only then; clients
        send ``addmount`` before ``bye``."""
        session = self._owned(caller, session_id)
        if session.user != caller.user:  # an admin too: a folder goes only into its owner's own session
            raise SessionError(ErrorKind.NOT_YOURS, f"Could not find session {session_id}.", session_id=session_id)
        if "sharing" not in services.granted(session) or "sharing" not in self.services.by_name:
            log.info("{user} from {address} shared {share!r} with session {id}, which has no folder sharing",
                     user=caller.user, address=caller.address, share=mount.share, id=session.id)
            return False
        log.info("{user} from {address} shares {share!r} (as ~/MyShares/{name}) with session {id}", user=caller.user,
                 address=caller.address, share=mount.share, name=mount.name, id=session.id, audit="share_mount")
        self.background(self.lifecycle.mount_share(session.id, mount), "mounting a shared folder", session.id)
        return True

    def _folders_of(self, caller: Caller, session_id: str) -> tuple[Session, Any]:
        """The caller's own session (an admin's too: a client's folders go into its owner's session only) and
        this machine's X2Go folders."""
        session = self._owned(caller, session_id)
        if session.user != caller.user:
            raise SessionError(ErrorKind.NOT_YOURS, f"Could not find session {session_id}.", session_id=session_id)
        folders = self.services.by_name.get("x2go-folders")
        if folders is None or not self.config.services.sharing:
            raise SessionError(ErrorKind.NOT_ALLOWED, f"Folder sharing is switched off on machine "
                               f"{self.node_name or 'this machine'}.", session_id=session_id)
        return session, folders

    async def mount_folders(self, caller: Caller, session_id: str, shares: FolderShares) -> tuple[FolderMount, ...]:
        """Mount folders an X2Go client shares in the caller's running session
        (:mod:`nxgate.node.services.x2go_folders`): one result a folder, with the
        words of a refusal."""
        session, folders = self._folders_of(caller, session_id)
        # X2Go's clients share their folders before their graphics link is up, at a start and at a resume.
        if session.state not in (State.STARTING, State.WAITING, State.RESUMING, State.RUNNING):
            raise SessionError(ErrorKind.WRONG_STATE, f"Session {session_id} is suspended.", session_id=session_id)
        log.info("{user} from {address} shares {count} folder(s) of their X2Go client with session {id}",
                 user=caller.user, address=caller.address, count=len(shares.folders), id=session.id,
                 audit="x2go_folders")
        return await folders.mount(session, shares)

    async def unmount_folders(self, caller: Caller, session_id: str, path: str = "") -> tuple[FolderMount, ...]:
        session, folders = self._folders_of(caller, session_id)
        return await folders.unmount(session, path)

    async def folders(self, caller: Caller, session_id: str) -> tuple[FolderMount, ...]:
        session, folders = self._folders_of(caller, session_id)
        return await folders.listing(session)

    async def applications(self, caller: Caller, session_id: str) -> tuple[DesktopEntry, ...]:
        """This machine's published applications (``[sessions] published_applications``), for the owner of a
        session here: X2Go's published-applications mode lists them."""
        self._owned(caller, session_id)
        return await self._blocking(applications.read_applications, self.settings.published_applications)

    async def run_application(self, caller: Caller, session_id: str, argv: tuple[str, ...]) -> bool:
        """Start a published application in the caller's own published-applications session: only the
        ``Exec`` line of one this machine lists, nothing else."""
        session = self._owned(caller, session_id)
        if session.user != caller.user or session.type != PUBLISHED_TYPE:
            raise SessionError(ErrorKind.NOT_ALLOWED, "Applications start only in a published-applications session of"
                               " one's own.", session_id=session_id)
        listed = await self._blocking(applications.read_applications, self.settings.published_applications)
        if tuple(argv) not in applications.launchable(listed):
            log.warn("{user} from {address} asked to start {argv!r} in session {id}: not a published application;"
                     " refused", user=caller.user, address=caller.address, argv=list(argv)[:8], id=session_id,
                     audit="launch_refused")
            raise SessionError(ErrorKind.NOT_ALLOWED, f"{argv[0][:64] if argv else 'Nothing'} is not a published"
                               " application of this server.", session_id=session_id)
        log.info("{user} from {address} starts the published application {argv!r} in session {id}",
                 user=caller.user, address=caller.address, argv=list(argv)[:8], id=session_id, audit="launch")
        await self.lifecycle.start_application(session_id, tuple(argv))
        return True

    @property
    def observers(self) -> list[SessionObserver]:
        """Callbacks for every session creation and state change (see :class:`SessionEvent`)."""
        return self.lifecycle.observers

    def live_count(self) -> int:
        """How many of this node's sessions are live (its heartbeat says so)."""
        return sum(1 for s in self.sessions.values() if s.state.live)

    async def show(self, caller: Caller, session_id: str) -> SessionView:
        return SessionView.of(self._owned(caller, session_id))

    async def status(self, caller: Caller) -> ServiceStatus:
        self._admin_only(caller, "see the service's status")
        held = await self._blocking(displays.foreign_displays, self.settings.display_base,
                                    self.settings.display_limit, list(self.displays.in_use()))
        return ServiceStatus(
            draining=self.draining, live=sum(1 for s in self.sessions.values() if s.state.live),
            unsaved_changes=len(self.unsaved),
            unknown_sessions=tuple(UnknownSession(o.session_id, o.user, o.display, o.agent.pid)
                                   for o in self.orphans.values()),
            held_displays=tuple(HeldDisplay(h.display, h.users, h.holds) for h in held))

    async def set_draining(self, caller: Caller, on: bool) -> bool:
        """Draining: no new sessions, the running ones carry on."""
        self._admin_only(caller, "drain the server")
        self.draining = bool(on)
        return self.draining

    @staticmethod
    def _admin_only(caller: Caller, what: str) -> None:
        if not caller.admin:
            raise SessionError(ErrorKind.NOT_ALLOWED, f"Only the admin may {what}.")

    async def shadow_targets(self, caller: Caller) -> tuple[ShadowTarget, ...]:
        """The displays ``caller`` may shadow."""
        return await self.shadow.targets(caller)

    async def attach_shadow(self, caller: Caller, request: ShadowRequest,
                            progress: ProgressCallback = lambda progress: None) -> Ready:
        """A shadow session of ``request.target_id`` for ``caller``; ``progress``
        hears when the owner is asked."""
        return await self.shadow.attach(caller, request, progress)

    async def list(self, caller: Caller) -> Listing:
        """The caller's live sessions, oldest first (an admin's: everyone's)."""
        live = sorted((s for s in self.sessions.values() if s.state.live and caller.owns(s.user)),
                      key=lambda s: s.created)
        return Listing(tuple(SessionView.of(s) for s in live), capacity_reached=self.limits.at_capacity(caller, self.sessions.values()))

    def housekeeping(self) -> defer.Deferred[None]:
        """Expire long-suspended sessions and forget old ended ones."""
        return self.housekeeper.run()

    def backup(self) -> defer.Deferred[None]:
        return self.housekeeper.backup()

    def _owned(self, caller: Caller, session_id: str) -> Session:
        """The caller's own live session; others' sessions do not exist for him
        (NOT_YOURS carries the same words as NOT_FOUND)."""
        session = self.sessions.get(session_id)
        if session is not None and session.state.live and not caller.owns(session.user):
            log.warn("{user} from {address} asked for session {id} of another user", user=caller.user,
                     address=caller.address, id=session_id, audit="session_denied")
            raise SessionError(ErrorKind.NOT_YOURS, f"Could not find session {session_id}.", session_id=session_id)
        if session is None or not session.state.live:
            raise SessionError(ErrorKind.NOT_FOUND, f"Could not find session {session_id}.", session_id=session_id)
        return session

    @property
    def orphans(self) -> dict[str, Orphan]:
        """Running sessions the store did not know at start (the supervisor's)."""
        return self.supervisor.orphans

    @property
    def draining(self) -> bool:
        return self.limits.draining

    @draining.setter
    def draining(self, on: bool) -> None:
        self.limits.draining = on

    async def _allocate_display(self, uid: int, gid: int) -> int:
        try:
            return await self.displays.allocate(uid, gid)
        except NoFreeDisplay:
            raise SessionError(ErrorKind.FAILED_TO_START,
                               "Display limit exceeded: no free display for a new session.") from None

    def _ready(self, session: Session, resumed: bool) -> Ready:
        """What the client needs to reach ``session``: an encrypted one's
        stream goes through the gateway to the agent's socket."""
        return Ready(SessionView.of(session), session.cookie, resumed, self.stream_target(session))

    def stream_target(self, session: Session) -> StreamTarget | None:
        """Where an encrypted session's stream goes on this box (None: an
        unencrypted one, whose client connects to the agent itself).  Also
        what a cluster node relays a gateway's stream to."""
        if not session.encrypted:
            return None
        return StreamTarget(session.id, self.layout.agent_files(session.id).socket, session.uid)

    # ------------------------------------------------ the life cycle's, for the NX door's helpers and tests
    async def terminate_session(self, session_id: str, reason: str) -> None:
        await self.lifecycle.terminate_session(session_id, reason)

    async def suspend_session(self, session_id: str) -> None:
        await self.lifecycle.suspend_session(session_id)

    def _agent_line(self, session_id: str, line: str) -> None:
        self.lifecycle._agent_line(session_id, line)

    def reconcile(self) -> defer.Deferred[None]:
        return self.lifecycle.reconcile()

    @property
    def unsaved(self) -> dict[str, Session]:
        return self.writer.unsaved

    def flush(self) -> defer.Deferred[int]:
        return self.writer.flush()
