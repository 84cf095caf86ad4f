"""The session manager: the one owner of every session's state.

It allocates display numbers, ids and cookies, starts each session's nxagent
and program through the launcher, follows the agent's log to drive the state
machine of :mod:`nxgate.session.model`, writes every transition to the store,
and checks the owner of a session on every operation.  Nothing else writes
the store.

Agents are not tied to the gateway: they run in sessions of their own with
their output in files, so the gateway can stop, crash or be SIGKILLed and
they live on.  When it starts again, :meth:`SessionManager.reconcile` finds
them (by pid and process start time), replays their logs to learn their
state and follows them again; sessions whose agent died meanwhile are marked
ended and cleaned up.

Memory is authoritative for live sessions; the store follows it.  A start
is refused (nothing held) when its first record cannot be stored.  Later
writes that fail (a full disk) are kept and retried every few seconds, so
sessions carry on and end normally meanwhile and the store catches up
without a restart once space returns.  At start, session directories and
agents the store does not know (a store lost or replaced) are reported and
their displays never handed out again while their agent lives.
"""

from __future__ import annotations

import os
import pwd
import secrets
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from twisted.application import service
from twisted.internet import defer, inotify, task
from twisted.logger import Logger

from nxgate import metrics
from nxgate.auth import resolve_service
from nxgate.backends import nxagent
from nxgate.backends.agentlog import AgentEvent, LogEvent, parse_line
from nxgate.config import Config
from nxgate.node.displays import DisplayAllocator, NoFreeDisplay
from nxgate.safetext import printable
from nxgate.session import files, processes
from nxgate.session.follow import LogFollower
from nxgate.session.model import Session, State, advance
from nxgate.session.processes import ExitWatch, LaunchError, ProcessId
from nxgate.session.programs import login_environment, session_command
from nxgate.session.remote import PROTOCOLS, RemoteSessions
from nxgate.session.store import STORAGE_FULL, SessionStore, StoreError, StoreUnavailable, storage_reason
from nxgate.sessions.caller import Caller
from nxgate.sessions.errors import Kind, SessionError
from nxgate.sessions.lifecycle import Action, Background, Op, SessionEnded, WaitTimeout, action
from nxgate.sessions.limits import Limits
from nxgate.sessions.requests import DisplaySettings, RestoreRequest, ShadowRequest, StartRequest
from nxgate.sessions.results import (Listing, ProgressCallback, Ready, ServiceStatus, SessionView, ShadowTarget,
                                     StreamTarget, UnknownSession)

log = Logger(namespace="nxgate.session")

#: A suspended agent that has not started resuming this long after a SIGHUP
#: gets another one; one that started is left alone for RESUME_LISTEN_SECONDS.
SIGHUP_RETRY_SECONDS = 0.25
SIGHUP_ATTEMPTS = 40
RESUME_LISTEN_SECONDS = 10.0
#: How often writes the store refused (a full disk) are tried again.
STORE_RETRY_SECONDS = 5.0
#: How long what a session left behind has between SIGTERM and SIGKILL.
LEFTOVER_GRACE_SECONDS = 5.0


@dataclass(frozen=True)
class Orphan:
    """A live agent in a session directory the store does not know."""

    session_id: str
    user: str
    display: int
    agent: ProcessId


@dataclass
class Runtime:
    """What the manager holds for a live session besides its record."""

    files: nxagent.AgentFiles
    follower: LogFollower | None = None
    agent_watch: ExitWatch | None = None
    app_watch: ExitWatch | None = None
    waiters: list[tuple[frozenset[State], defer.Deferred[State]]] = field(default_factory=list)
    lock: defer.DeferredLock = field(default_factory=defer.DeferredLock)
    connect_timer: Any = None
    last_error: str = ""
    app_starting: bool = False
    secret: str | None = field(default=None, repr=False)  # for the program's stdin, until it has it


class SessionManager(service.Service):
    name = "sessions"

    def __init__(
        self,
        reactor: Any,
        config: Config,
        store: SessionStore,
        layout: files.StateLayout,
        notifier: inotify.INotify | None = None,
        launcher: processes.Launcher | None = None,
    ) -> None:
        self.reactor = reactor
        self.config = config
        self.settings = config.sessions
        self.store = store
        self.layout = layout
        self.notifier = notifier or inotify.INotify(reactor)
        self.launcher = launcher or processes.Launcher(reactor)
        self.pam_service = resolve_service(config.auth.pam_service)
        self.sessions: dict[str, Session] = {}
        self.runtime: dict[str, Runtime] = {}
        self.limits = Limits(lambda: self.config)
        self.background = Background()
        self.unsaved: dict[str, Session] = {}  # the latest record of each session the store refused
        self.orphans: dict[str, Orphan] = {}  # id -> a running session the store did not know at start
        self.displays = DisplayAllocator(
            lambda: (self.settings.display_base, self.settings.display_limit),
            lambda: [s.display for s in self.sessions.values()] + [o.display for o in self.orphans.values()])
        self._housekeeping = task.LoopingCall(self.housekeeping)
        self._housekeeping.clock = reactor
        self._retry = task.LoopingCall(self.flush)
        self._retry.clock = reactor
        self._backup = task.LoopingCall(self.backup)
        self._backup.clock = reactor
        self.remote = RemoteSessions(self)
        # Shadowing (nxgate.shadow.service.ShadowService), set by the gateway.
        self.shadow: Any = None

    # ------------------------------------------------------------ service
    def startService(self) -> None:
        super().startService()
        files.ensure_x_socket_dir()
        self.notifier.startReading()
        self.reconcile()
        self._housekeeping.start(60, now=False)
        if self.settings.store_backup_interval > 0:
            # Not now: a store that lost its rows must not replace a good backup at once.
            self._backup.start(self.settings.store_backup_interval, now=False)

    def stopService(self) -> None:
        """Stop watching; the sessions themselves carry on without us."""
        super().stopService()
        for loop in (self._housekeeping, self._retry, self._backup):
            if loop.running:
                loop.stop()
        self.flush()
        if self.unsaved:
            log.error("{count} session change(s) could not be written to the store before stopping; the next start "
                      "learns the state of running sessions from their agents' logs", count=len(self.unsaved))
        for runtime in self.runtime.values():
            self._stop_watching(runtime)
        self.notifier.loseConnection()

    # ----------------------------------------------------------- commands
    async def start(self, caller: Caller, request: StartRequest) -> Ready:
        """A new session for ``caller``, once its agent waits for the client
        (the remote desktop types go to :class:`RemoteSessions`)."""
        if request.ignored:
            log.info("startsession of {user} from {address}: ignored {ignored!r} (the server chooses the"
                     " session id and display)", user=caller.user, address=caller.address,
                     ignored=dict(request.ignored))
        if request.type in PROTOCOLS:
            return await self.remote.start(caller, request)
        program = session_command(request, self.config.types, self.settings)
        if not request.encrypted and not self.settings.allow_unencrypted:
            raise SessionError(Kind.ENCRYPTION_REQUIRED, "Unencrypted sessions are not allowed.")
        plan = nxagent.AgentPlan(mode="-R" if request.rootless else "-D", program=program)
        session = self.new_session(caller, request.type, request.name, request.display, request.encrypted,
                                   rootless=request.rootless)
        return await self.launch(caller, session, request.display, plan)

    def new_session(self, caller: Caller, session_type: str, name: str, settings: DisplaySettings,
                    encrypted: bool, rootless: bool = False, run_as: str = "") -> Session:
        """A session record for ``caller`` with a fresh id, cookie and display
        (not stored yet).  Its processes run as ``run_as`` (default: the caller,
        whose uid and gid were resolved at login)."""
        self.limits.check(caller, self.sessions.values())
        if run_as:
            owner = pwd.getpwnam(run_as)
            uid, gid = owner.pw_uid, owner.pw_gid
        else:
            uid, gid = caller.uid, caller.gid
        now = self.reactor.seconds()
        return Session(
            id=secrets.token_hex(16).upper(), user=caller.user, uid=uid, gid=gid,
            type=session_type, name=printable(name), display=self._allocate_display(),
            server_name=self.config.server_name, cookie=secrets.token_hex(16), created=now, changed=now,
            client_address=printable(caller.address),
            geometry=settings.geometry, depth=settings.depth, render=settings.render,
            fullscreen=settings.fullscreen, rootless=rootless, encrypted=encrypted,
        )

    async def launch(self, caller: Caller, session: Session, settings: DisplaySettings,
                     plan: nxagent.AgentPlan, secret: str | None = None,
                     judge: Callable[[str], SessionError | None] | None = None) -> Ready:
        """Start a new session's agent and answer once it listens.

        With ``plan.program_early`` the program (a viewer) starts as soon as
        the agent listens, gets ``secret`` on stdin, and its status line is
        ``judge``d before the client is answered.  The secret lives in
        memory only, until the program has it."""
        session = session.evolve(options={**session.options, "display": settings.as_dict(), "plan": plan.as_dict()})
        try:
            self.store.insert(session)
        except StoreError as error:
            # Nothing is held but the display's claim: no place in the user's limit.
            self.displays.release(session.display)
            log.error("session {id} for {user} not started: the session store refused it: {error}",
                      id=session.id, user=session.user, error=str(error))
            reason = storage_reason(error)
            raise SessionError(Kind.STORAGE_FULL if reason == STORAGE_FULL else Kind.UNAVAILABLE,
                               f"Session startup failed: {reason}.") from None
        self.sessions[session.id] = session
        runtime = self.runtime[session.id] = Runtime(self.layout.agent_files(session.id), secret=secret)
        log.info(
            "starting session {id} ({type}, display :{display}) for {user} from {address}",
            id=session.id, type=session.type, display=session.display, user=session.user,
            address=caller.address, audit="session_start",
        )
        try:
            launched = self.reactor.seconds()
            await self._start_agent(session, runtime, settings, plan)
            await self._wait_for(session.id, {State.WAITING}, self.settings.agent_start_timeout)
            metrics.agent_started(self.reactor.seconds() - launched)
            if plan.program_early:
                status = await self._start_program(session.id, report=True)
                failure = judge(status) if judge is not None else None
                if failure is not None:
                    log.warn("session {id} for {user}: {failure}", id=session.id, user=session.user,
                             failure=failure.message)
                    await self.terminate_session(session.id, failure.message)
                    raise failure
        except (LaunchError, OSError, SessionEnded, WaitTimeout) as error:
            reason = runtime.last_error or storage_reason(error)
            log.warn("session {id} for {user} failed to start: {reason}", id=session.id, user=session.user, reason=reason)
            await self._end(session.id, State.FAILED, f"start failed: {reason}")
            raise SessionError(Kind.FAILED_TO_START, f"Session startup failed: {reason}") from None
        except SessionError:
            raise
        except Exception:
            # A bug must not leave a phantom holding a display and a place
            # in the user's limit: end the session, then answer.
            log.failure("session {id} for {user} failed to start", id=session.id, user=session.user)
            await self._end(session.id, State.FAILED, "start failed: internal error")
            raise SessionError(Kind.INTERNAL,
                               "Session startup failed: internal error (see the server log).") from None
        self._expect_client(session.id)
        return self._ready(self._own_listener(session.id), resumed=False)

    async def restore(self, caller: Caller, request: RestoreRequest) -> Ready:
        session_id, settings, encrypted = request.session_id, request.display, request.encrypted
        session = self._owned(caller, session_id)
        if not encrypted and not self.settings.allow_unencrypted:
            raise SessionError(Kind.ENCRYPTION_REQUIRED, "Unencrypted sessions are not allowed.")
        runtime = self.runtime[session.id]
        await runtime.lock.acquire()
        try:
            session = self._owned(caller, session_id)
            todo = action(Op.RESTORE, session.state, session.ever_attached)
            if todo is Action.TAKE_OVER:
                log.info("session {id} is attached elsewhere: suspending it for {address}", id=session.id,
                         address=caller.address, audit="session_takeover")
                self._cancel_connect_timer(runtime)  # this suspend is wanted (see _listen_again)
                self._signal_agent(session, signal.SIGHUP)
                await self._wait_for(session.id, {State.SUSPENDED}, self.settings.suspend_timeout)
            elif todo is Action.WAIT_SUSPENDED_THEN_RESUME:
                await self._wait_for(session.id, {State.SUSPENDED}, self.settings.suspend_timeout)
            elif todo is not Action.RESUME:
                raise SessionError(Kind.WRONG_STATE,
                                   f"Session {session.id} cannot be resumed while it is {session.state.value}.",
                                   session_id=session.id)
            session = self._update(
                session.id, cookie=secrets.token_hex(16), client_address=printable(caller.address),
                encrypted=encrypted,
                geometry=settings.geometry, depth=settings.depth, render=settings.render,
                fullscreen=settings.fullscreen, options={**session.options, "display": settings.as_dict()},
            )
            self._write_agent_files(session, runtime.files, settings)
            log.info("resuming session {id} of {user} for {address}", id=session.id, user=session.user,
                     address=caller.address, audit="session_resume")
            await self._sighup_until_listening(session.id)
        except (SessionEnded, WaitTimeout) as error:
            raise SessionError(Kind.FAILED_TO_RESUME, f"Session resume failed: {error}",
                               session_id=session_id) from None
        finally:
            runtime.lock.release()
        self._expect_client(session.id)
        return self._ready(self._own_listener(session.id), resumed=True)

    async def terminate(self, caller: Caller, session_id: str, reason: str = "user request") -> SessionView:
        session = self._owned(caller, session_id)
        log.info("terminating session {id} of {user} on request from {address}", id=session.id,
                 user=session.user, address=caller.address, audit="session_terminate")
        await self.terminate_session(session.id, reason)
        return SessionView.of(self.sessions.get(session.id, session))

    async def suspend(self, caller: Caller, session_id: str) -> SessionView:
        """Suspend the caller's session (one already suspended stays so)."""
        session = self._owned(caller, session_id)
        await self.suspend_session(session.id)
        return SessionView.of(self.sessions.get(session.id, session))

    async def show(self, caller: Caller, session_id: str) -> SessionView:
        return SessionView.of(self._owned(caller, session_id))

    async def status(self, caller: Caller) -> ServiceStatus:
        self._admin_only(caller, "see the service's status")
        return ServiceStatus(
            draining=self.draining, live=sum(1 for s in self.sessions.values() if s.state.live),
            unsaved_changes=len(self.unsaved),
            unknown_sessions=tuple(UnknownSession(o.session_id, o.user, o.display, o.agent.pid)
                                   for o in self.orphans.values()))

    async def set_draining(self, caller: Caller, on: bool) -> bool:
        """Draining: no new sessions, the running ones carry on."""
        self._admin_only(caller, "drain the server")
        self.draining = bool(on)
        return self.draining

    @staticmethod
    def _admin_only(caller: Caller, what: str) -> None:
        if not caller.admin:
            raise SessionError(Kind.NOT_ALLOWED, f"Only the admin may {what}.")

    async def shadow_targets(self, caller: Caller) -> tuple[ShadowTarget, ...]:
        """The displays ``caller`` may shadow."""
        return self.shadow.targets(caller)

    async def attach_shadow(self, caller: Caller, request: ShadowRequest,
                            progress: ProgressCallback = lambda progress: None) -> Ready:
        """A shadow session of ``request.target_id`` for ``caller``; ``progress``
        hears when the owner is asked."""
        return await self.shadow.attach(caller, request, progress)

    async def suspend_session(self, session_id: str) -> None:
        """Suspend a running session wherever it is attached (SIGHUP)."""
        session = self.sessions[session_id]
        todo = action(Op.SUSPEND, session.state)
        if todo is Action.SIGHUP_AND_WAIT:
            self._signal_agent(session, signal.SIGHUP)
            try:
                await self._wait_for(session.id, {State.SUSPENDED}, self.settings.suspend_timeout)
            except (SessionEnded, WaitTimeout) as error:
                raise SessionError(Kind.FAILED_TO_SUSPEND, f"Session suspend failed: {error}",
                                   session_id=session_id) from None
        elif todo is Action.REFUSE:
            raise SessionError(Kind.WRONG_STATE, f"Session {session.id} is {session.state.value}.",
                               session_id=session_id)

    async def list(self, caller: Caller) -> Listing:
        """The caller's live sessions, oldest first (an admin's: everyone's)."""
        live = sorted((s for s in self.sessions.values() if s.state.live and caller.owns(s.user)),
                      key=lambda s: s.created)
        return Listing(tuple(SessionView.of(s) for s in live), capacity_reached=self.limits.at_capacity(caller, self.sessions.values()))

    # ------------------------------------------------------- agent control
    async def _start_agent(self, session: Session, runtime: Runtime, settings: DisplaySettings,
                           plan: nxagent.AgentPlan) -> None:
        agent_files = runtime.files
        files.make_session_dir(agent_files.directory, session.uid, session.gid)
        self._write_agent_files(session, agent_files, settings)
        for path in (agent_files.log, agent_files.app_log):
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600))
        runtime.follower = LogFollower(self.notifier, agent_files.log, lambda line: self._agent_line(session.id, line))
        user = pwd.getpwuid(session.uid)
        request = {
            "user": user.pw_name,
            "argv": nxagent.agent_argv(self.settings.nxagent, session, agent_files, plan,
                                       self.settings.agent_extra_options),
            "env": login_environment(user, self.settings),
            "env_fixed": {**nxagent.agent_environment(session, agent_files, {}),
                          processes.SESSION_MARKER: session.id},
            "cwd": agent_files.directory,
            "log": agent_files.log,
            "pam": self._pam_request(session) if plan.pam else None,
        }
        agent = await self.launcher.start(request)
        session = self._update(session.id, agent_pid=agent.pid, agent_started=agent.started)
        self._watch_agent(session.id, agent)

    def _write_agent_files(self, session: Session, agent_files: nxagent.AgentFiles, settings: DisplaySettings) -> None:
        plan = self._plan(session)
        # Encrypted sessions reach their agent through the gateway only;
        # an unencrypted one's client connects to its TCP port directly.
        listen = (nxagent.listen_unix(agent_files.socket) if session.encrypted
                  else nxagent.listen_tcp(session.client_address))
        authority = b"".join(files.xauthority(display, cookie)
                             for display, cookie in ((session.display, session.cookie), *plan.extra_cookies))
        options = nxagent.options_line(session, settings, listen, plan.extra_options)
        files.write_user_file(agent_files.authority, authority, session.uid, session.gid)
        files.write_user_file(agent_files.options, options.encode(), session.uid, session.gid)

    @staticmethod
    def _plan(session: Session) -> nxagent.AgentPlan:
        return nxagent.AgentPlan.from_dict(session.options.get("plan", {}))

    def _pam_request(self, session: Session) -> dict[str, Any]:
        return {"service": self.pam_service, "rhost": session.client_address, "tty": f":{session.display}"}

    async def _start_program(self, session_id: str, report: bool = False) -> str:
        """Start the session's program; with ``report``, return its status line
        (a viewer's ``ready ...`` or ``error ...``), waited for within the
        remote connect timeout."""
        session = self.sessions[session_id]
        runtime = self.runtime[session_id]
        plan = self._plan(session)
        if not plan.program:
            return ""
        user = pwd.getpwuid(session.uid)
        secret, runtime.secret = runtime.secret, None
        request = {
            "user": user.pw_name,
            "argv": list(plan.program),
            "env": login_environment(user, self.settings),
            "env_fixed": {**nxagent.x11_environment(session, runtime.files, dict(plan.program_env)),
                          processes.SESSION_MARKER: session.id},
            "cwd": user.pw_dir,
            "log": runtime.files.app_log,
            "stdin": secret,
            "status_fd": report,
        }
        try:
            started, status = await self.launcher.start_reporting(request)
        except (LaunchError, OSError) as error:
            log.warn("session {id}: could not start {program}: {error}", id=session_id,
                     program=plan.program[0], error=str(error))
            await self.terminate_session(session_id, "session program failed to start")
            return f"error protocol: could not start {plan.program[0]}"
        if session_id not in self.runtime:
            # The session ended while the program started; it has no display left.
            self._kill_program(session.evolve(app_pid=started.pid, app_started=started.started))
            return "error protocol: the session ended"
        log.info("session {id}: started {program} (pid {pid})", id=session_id, program=plan.program[0],
                 pid=started.pid)
        self._update(session_id, app_pid=started.pid, app_started=started.started)
        runtime.app_watch = ExitWatch(self.reactor, started, lambda: self._program_exited(session_id))
        if not report:
            return ""
        status.addTimeout(self.config.remote.connect_timeout + 10, self.reactor)
        try:
            return await status
        except defer.TimeoutError:
            return "error timeout: no answer from the viewer"
        except LaunchError as error:
            return f"error protocol: {error}"

    def _program_exited(self, session_id: str) -> None:
        session = self.sessions.get(session_id)
        if session is None or not session.state.live:
            return
        log.info("session {id}: its program ended; ending the session", id=session_id)
        self.background(self.terminate_session(session_id, "session program ended"), "ending it", session_id)

    @staticmethod
    def _signal_program(session: Session, signum: int) -> None:
        processes.send_signal(ProcessId(session.app_pid, session.app_started), signum)

    def _signal_agent(self, session: Session, signum: int) -> None:
        processes.send_signal(ProcessId(session.agent_pid, session.agent_started), signum)

    async def _sighup_until_listening(self, session_id: str) -> None:
        """SIGHUP a suspended agent until it listens again.

        nxagent ignores a SIGHUP that comes right after it suspended (it is
        still tearing down the old link), which a take-over or a quick
        reconnect always meets: the signal is repeated soon, but only until
        the agent says it is resuming, as a SIGHUP then would suspend it again.
        """
        for attempt in range(SIGHUP_ATTEMPTS):
            self._signal_agent(self.sessions[session_id], signal.SIGHUP)
            try:
                await self._wait_for(session_id, {State.RESUMING, State.WAITING}, SIGHUP_RETRY_SECONDS)
                break
            except WaitTimeout:
                log.debug("session {id}: SIGHUP {n} not taken yet", id=session_id, n=attempt + 1)
        else:
            raise WaitTimeout(f"nxagent did not resume after {SIGHUP_ATTEMPTS} SIGHUPs")
        await self._wait_for(session_id, {State.WAITING}, RESUME_LISTEN_SECONDS)

    async def terminate_session(self, session_id: str, reason: str) -> None:
        """End a session and return when its agent is gone: SIGTERM, again
        after 2 s, SIGKILL at the timeout."""
        session = self.sessions.get(session_id)
        if session is None or not session.state.live:
            return
        self._set_failure_reason(session_id, reason)
        agent = ProcessId(session.agent_pid, session.agent_started)
        await self._terminate_agent(session_id, session, agent, reason)
        if not await self._gone(agent, 5.0):
            log.warn("session {id}: nxagent still running after it ended; killing it", id=session_id)
            processes.send_signal(agent, signal.SIGKILL)  # the pidfd re-checks it is still that agent
            await self._gone(agent, 5.0)

    async def _terminate_agent(self, session_id: str, session: Session, agent: ProcessId, reason: str) -> None:
        if not agent.alive():
            await self._end(session_id, State.TERMINATED, reason)
            return
        self._signal_agent(session, signal.SIGTERM)
        try:
            await self._wait_for(session_id, {State.TERMINATED, State.FAILED}, 2.0)
            return
        except WaitTimeout:
            self._signal_agent(self.sessions[session_id], signal.SIGTERM)
        except SessionEnded:
            return
        try:
            await self._wait_for(session_id, {State.TERMINATED, State.FAILED}, self.settings.terminate_timeout)
        except WaitTimeout:
            log.warn("session {id}: nxagent ignored SIGTERM; killing it", id=session_id)
            self._signal_agent(self.sessions[session_id], signal.SIGKILL)
            await self._wait_for(session_id, {State.TERMINATED, State.FAILED}, 5.0)
        except SessionEnded:
            pass

    async def _gone(self, process: ProcessId, timeout: float) -> bool:
        """Whether ``process`` exits within ``timeout`` seconds."""
        if not process.alive():
            return True
        exited: defer.Deferred[bool] = defer.Deferred()
        watch = ExitWatch(self.reactor, process, lambda: exited.called or exited.callback(True))
        exited.addTimeout(timeout, self.reactor)
        try:
            return await exited
        except defer.TimeoutError:
            return False
        finally:
            watch.stop()

    # -------------------------------------------------------- agent events
    def _agent_line(self, session_id: str, line: str) -> None:
        event = parse_line(line)
        if event is not None:
            self._agent_event(session_id, event)

    def _agent_event(self, session_id: str, event: LogEvent) -> None:
        session = self.sessions.get(session_id)
        runtime = self.runtime.get(session_id)
        if session is None or runtime is None:
            return
        if event.event is AgentEvent.ERROR:
            runtime.last_error = event.text
            log.warn("session {id}: nxagent: {text}", id=session_id, text=event.text)
            return
        if event.event is AgentEvent.COOKIE_MISMATCH:
            log.warn("session {id}: a client offered a wrong cookie", id=session_id)
            return
        if event.event is AgentEvent.WATCHDOG_WAIT:
            self._end_watchdog(session)
            return
        if event.event is AgentEvent.SCREEN:
            self._screen_changed(session, event)
            return
        new = advance(session.state, event.event)
        if new is None:
            return
        changes: dict[str, Any] = {}
        if new is State.RUNNING:
            changes["ever_attached"] = True
        reason = session.failure or runtime.last_error or "nxagent ended"
        self._transition(session_id, new, **changes)
        if new is State.SUSPENDED and self._awaiting_client(runtime):
            log.warn("session {id}: its agent suspended itself before the client came (a failed connection, or "
                     "nxagent's own timeout); listening again", id=session_id)
            self.background(self._listen_again(session_id), "listening again", session_id)
            return
        if not new.live:
            # Waiters may have cleaned up already; _end does nothing twice.
            self.background(self._end(session_id, new, reason), "recording its end", session_id)
            return
        if new is State.RUNNING:
            self._cancel_connect_timer(runtime)
            plan = self._plan(session)
            if plan.program_early and plan.attach_signal and not session.ever_attached:
                self._signal_program(session, plan.attach_signal)  # the viewer may draw now
            elif not session.app_pid and not runtime.app_starting and not plan.program_early:
                runtime.app_starting = True
                self.background(self._start_program(session_id), "starting its program", session_id)

    def _screen_changed(self, session: Session, event: LogEvent) -> None:
        """Keep the size nxagent reports, which the list shows: it can differ
        from the request (a window manager fitting the window into the
        client's screen, a resize by the user, a resume)."""
        if (session.geometry, session.fullscreen) == (event.text, event.fullscreen):
            return
        self._update(session.id, geometry=event.text, fullscreen=event.fullscreen)
        log.info("session {id} of {user}: screen {geometry}{mode}", id=session.id, user=session.user,
                 geometry=event.text, mode=" full screen" if event.fullscreen else "")

    @staticmethod
    def _end_watchdog(session: Session) -> None:
        """nxagent waits for its watchdog, which waits for a client proxy that
        may never say goodbye (Neatx saw agents that never exit): end it.
        The watchdog is the agent's forked ``nxagent`` child, found in /proc
        rather than from its log line, which a restarted gateway never saw.
        SIGKILL, because a fresh watchdog sometimes still runs nxagent's
        SIGTERM handler and lives on (one suspend in ~10 hung for 20 s); it
        holds nothing to clean up."""
        if not session.agent_pid:
            return
        for child in processes.named_children(session.agent_pid, "nxagent"):
            log.debug("session {id}: ending nxagent's watchdog {pid}", id=session.id, pid=child.pid)
            processes.send_signal(child, signal.SIGKILL)

    def _agent_exited(self, session_id: str) -> None:
        session = self.sessions.get(session_id)
        if session is None or not session.state.live:
            return
        if session.ever_attached or session.state is State.TERMINATING:
            final, reason = State.TERMINATED, session.failure or "nxagent ended"
        else:
            final, reason = State.FAILED, self.runtime[session_id].last_error or "nxagent ended before a client connected"
        self.background(self._end(session_id, final, reason), "recording its end", session_id)

    def _watch_agent(self, session_id: str, agent: ProcessId) -> None:
        self.runtime[session_id].agent_watch = ExitWatch(self.reactor, agent, lambda: self._agent_exited(session_id))

    def _expect_client(self, session_id: str) -> None:
        """End a session whose client never connects after start or resume."""
        runtime = self.runtime[session_id]
        self._cancel_connect_timer(runtime)

        def check() -> None:
            runtime.connect_timer = None
            session = self.sessions.get(session_id)
            if session is not None and session.state is State.WAITING:
                if session.ever_attached:
                    log.info("session {id}: no client came back; suspending it again", id=session_id)
                    self._signal_agent(session, signal.SIGHUP)
                else:
                    log.info("session {id}: no client connected; ending it", id=session_id)
                    self.background(self.terminate_session(session_id, "no client connected"), "ending it",
                                    session_id)

        runtime.connect_timer = self.reactor.callLater(self.settings.connect_timeout, check)

    @staticmethod
    def _awaiting_client(runtime: Runtime) -> bool:
        return runtime.connect_timer is not None and runtime.connect_timer.active()

    async def _listen_again(self, session_id: str) -> None:
        """A resumed agent that suspended itself again before its client
        came listens again, as long as that client may still come: one bad
        connection (a wrong cookie, a connection that closed at once) must
        not cost the user his resume.  nxagent also gives up waiting by
        itself after about 20 seconds, shorter than the connect timeout."""
        runtime = self.runtime.get(session_id)
        if runtime is None:
            return
        await runtime.lock.acquire()
        try:
            session = self.sessions.get(session_id)
            if (session is None or action(Op.LISTEN_AGAIN, session.state) is not Action.RESUME
                    or not self._awaiting_client(runtime)):
                return
            await self._sighup_until_listening(session_id)
        except (SessionEnded, WaitTimeout) as error:
            log.warn("session {id}: could not make its agent listen again: {error}", id=session_id, error=str(error))
        finally:
            runtime.lock.release()

    @staticmethod
    def _cancel_connect_timer(runtime: Runtime) -> None:
        if runtime.connect_timer is not None and runtime.connect_timer.active():
            runtime.connect_timer.cancel()
        runtime.connect_timer = None

    # --------------------------------------------------------------- state
    def _update(self, session_id: str, **changes: Any) -> Session:
        session = self.sessions[session_id].evolve(**changes)
        self.sessions[session_id] = session
        self._save(session)
        return session

    def _save(self, session: Session) -> None:
        """Write ``session`` to the store, or keep it for :meth:`flush` if
        the store cannot take it now; memory goes on either way."""
        if self.unsaved:
            self.unsaved.pop(session.id, None)
            self.unsaved[session.id] = session  # keep the order of writes
            return
        try:
            self._write(session)
        except StoreUnavailable as error:
            self.unsaved[session.id] = session
            log.error("the session store cannot be written ({error}); session changes are kept in memory and "
                      "written when it can be (tried every {seconds:g} s)", error=str(error),
                      seconds=STORE_RETRY_SECONDS)
            if not self._retry.running:
                self._retry.start(STORE_RETRY_SECONDS, now=False)

    def _write(self, session: Session) -> None:
        try:
            self.store.update(session)
        except StoreUnavailable:
            raise
        except StoreError:
            self.store.insert(session)  # its row is gone: memory is authoritative

    def flush(self) -> None:
        """Write the session changes the store refused earlier, in order."""
        written = 0
        while self.unsaved:
            session_id, session = next(iter(self.unsaved.items()))
            try:
                self._write(session)
            except StoreUnavailable as error:
                log.debug("the session store still cannot be written: {error}", error=str(error))
                return
            except StoreError as error:
                log.error("session {id}: the store refused its record: {error}", id=session_id, error=str(error))
            del self.unsaved[session_id]
            written += 1
        if self._retry.running:
            self._retry.stop()
        if written:
            log.info("the session store can be written again: {count} kept session change(s) written",
                     count=written)

    def _set_failure_reason(self, session_id: str, reason: str) -> None:
        if not self.sessions[session_id].failure:
            self._update(session_id, failure=reason)

    def _transition(self, session_id: str, new: State, **changes: Any) -> None:
        old = self.sessions[session_id].state
        session = self._update(session_id, state=new, changed=self.reactor.seconds(), **changes)
        log.info("session {id} of {user}: {old} -> {new}", id=session_id, user=session.user,
                 old=old.value, new=new.value)
        if new is State.SUSPENDED:
            log.info("session {id} of {user} suspended (last client {address})", id=session_id, user=session.user,
                     address=session.client_address, type=session.type, audit="session_suspend")
        runtime = self.runtime.get(session_id)
        if runtime is None:
            return
        for waiter in list(runtime.waiters):
            wanted, deferred = waiter
            if new in wanted:
                runtime.waiters.remove(waiter)
                deferred.callback(new)
            elif not new.live:
                runtime.waiters.remove(waiter)
                deferred.errback(SessionEnded(f"the session {new.value}"))

    async def _wait_for(self, session_id: str, wanted: set[State], timeout: float) -> State:
        session = self.sessions.get(session_id)
        if session is None:
            raise SessionEnded("the session is gone")
        if session.state in wanted:
            return session.state
        if not session.state.live:
            raise SessionEnded(f"the session {session.state.value}")
        deferred: defer.Deferred[State] = defer.Deferred()
        runtime = self.runtime[session_id]
        entry = (frozenset(wanted), deferred)
        runtime.waiters.append(entry)
        deferred.addTimeout(timeout, self.reactor)
        try:
            return await deferred
        except defer.TimeoutError:
            names = " or ".join(sorted(state.value for state in wanted))
            raise WaitTimeout(f"not {names} after {timeout:g} seconds") from None
        finally:
            if entry in runtime.waiters:
                runtime.waiters.remove(entry)

    async def _end(self, session_id: str, final: State, reason: str) -> None:
        """Record the end of a session and clean up after it."""
        session = self.sessions.get(session_id)
        if session is None:
            return
        if session.state.live:
            self._set_failure_reason(session_id, reason)
            self._transition(session_id, final)
        session = self.sessions.pop(session_id)
        runtime = self.runtime.pop(session_id, None)
        self.displays.release(session.display)
        log.info("session {id} of {user} ended ({state}: {reason})", id=session_id, user=session.user,
                 state=final.value, reason=session.failure or reason, audit="session_end")
        if "shadow" in session.options:
            log.info("shadow detach: {user} no longer watches {target} of {owner} (session {id})", user=session.user,
                     target=session.options["shadow"]["target"], owner=session.options["shadow"]["owner"],
                     id=session_id, audit="shadow_detach")
        if runtime is not None:
            self._stop_watching(runtime)
            self._cancel_connect_timer(runtime)
        self._kill_program(session)
        self._end_leftovers(session)
        agent = ProcessId(session.agent_pid, session.agent_started)
        if agent.alive():
            # It said it terminated; it should be gone in a moment.
            self.reactor.callLater(5, self._kill_if_alive, agent)
        agent_files = self.layout.agent_files(session_id)
        files.remove_tree(agent_files.directory)
        if session.agent_pid and self._plan(session).pam:
            try:
                await self.launcher.close_pam({"user": session.user, "pam": self._pam_request(session)})
            except (LaunchError, OSError) as error:
                log.warn("session {id}: closing the PAM session failed: {error}", id=session_id, error=str(error))

    @staticmethod
    def _stop_watching(runtime: Runtime) -> None:
        for watcher in (runtime.follower, runtime.agent_watch, runtime.app_watch):
            if watcher is not None:
                watcher.stop()

    @staticmethod
    def _kill_if_alive(process: ProcessId) -> None:
        if process.alive():
            log.warn("nxagent pid {pid} lingered after its session ended; killing it", pid=process.pid)
            processes.send_signal(process, signal.SIGKILL)

    @staticmethod
    def _kill_program(session: Session) -> None:
        """The session program leads its own process group: end all of it."""
        processes.signal_group(ProcessId(session.app_pid, session.app_started), signal.SIGTERM)

    def _end_leftovers(self, session: Session) -> None:
        """Whatever the session started ends with it, also daemons that left
        its process group (gpg-agent, dbus-daemon): SIGTERM now, SIGKILL to
        what is still there after LEFTOVER_GRACE_SECONDS.  They are found by
        the session's marker in their environment (processes.tagged_processes)."""

        def signal_all(signum: int) -> int:
            tagged = processes.tagged_processes(session.id, session.uid)
            for process in tagged:
                processes.send_signal(process, signum)
            return len(tagged)

        left = signal_all(signal.SIGTERM)
        if left:
            log.info("session {id} of {user}: ending {count} processes it started", id=session.id,
                     user=session.user, count=left)
            self.reactor.callLater(LEFTOVER_GRACE_SECONDS, self._kill_leftovers, session, signal_all)

    @staticmethod
    def _kill_leftovers(session: Session, signal_all: Callable[[int], int]) -> None:
        left = signal_all(signal.SIGKILL)
        if left:
            log.warn("session {id} of {user}: killed {count} processes that ignored SIGTERM", id=session.id,
                     user=session.user, count=left)

    # ------------------------------------------------------------ restart
    def reconcile(self) -> None:
        """Take back the sessions of a previous gateway run."""
        for session in self.store.live():
            agent = ProcessId(session.agent_pid, session.agent_started)
            self.sessions[session.id] = session
            runtime = self.runtime[session.id] = Runtime(self.layout.agent_files(session.id))
            self.displays.claim(session.display)
            if not agent.alive():
                log.warn("session {id} of {user}: nxagent ended while the gateway was away", id=session.id,
                         user=session.user)
                final = State.TERMINATED if session.ever_attached else State.FAILED
                self.background(self._end(session.id, final, "nxagent ended while the gateway was away"),
                                "recording its end", session.id)
                continue
            # The follower first reads the whole log (the replay), then follows it live.
            replay = ReplayState()
            follower = LogFollower(self.notifier, runtime.files.log, replay.feed)
            follower.on_line = lambda line, sid=session.id: self._agent_line(sid, line)
            runtime.follower = follower
            if replay.state is not session.state:
                self._transition(session.id, replay.state, ever_attached=session.ever_attached or replay.attached)
            if replay.screen is not None:
                self._screen_changed(self.sessions[session.id], replay.screen)
            self._watch_agent(session.id, agent)
            program = ProcessId(session.app_pid, session.app_started)
            if session.app_pid and not program.alive():
                self.background(self.terminate_session(session.id, "session program ended while the gateway was away"),
                                "ending it", session.id)
            elif session.app_pid:
                runtime.app_watch = ExitWatch(self.reactor, program, lambda sid=session.id: self._program_exited(sid))
            log.info("session {id} of {user} taken back ({state})", id=session.id, user=session.user,
                     state=self.sessions[session.id].state.value, audit="session_reattach")
        self._find_orphans()

    def _find_orphans(self) -> None:
        """Report what the store should know but does not (it was lost,
        truncated or replaced): agents still running in session
        directories, whose displays are then never handed out while they
        live, and directories of sessions whose agent is gone, removed."""
        try:
            names = os.listdir(self.layout.sessions)
        except OSError:
            names = []
        agents = processes.agents_in(self.layout.sessions)
        for session_id in sorted(set(names) | set(agents)):
            if session_id in self.sessions:
                continue
            directory = os.path.join(self.layout.sessions, session_id)
            agent = agents.get(session_id)
            if agent is None:
                log.warn("session directory {path} belongs to no known session and no nxagent runs in it; "
                         "removing it", path=directory)
                files.remove_tree(directory)
                continue
            try:
                user = pwd.getpwuid(os.stat(f"/proc/{agent.pid}").st_uid).pw_name
            except (OSError, KeyError):
                user = "?"
            display = processes.display_argument(agent.pid) or 0
            self.orphans[session_id] = Orphan(session_id, user, display, agent)
            log.error(
                "session {id} of {user} (display :{display}, nxagent pid {pid}) runs but the session store does "
                "not know it (was {store} lost or replaced?); its display stays reserved while it runs. Its user "
                "cannot reach it: end it with 'kill {pid}', or stop nxgate and restore the store from {backup}",
                id=session_id, user=user, display=display, pid=agent.pid, store=self.store.path,
                backup=self.store.backup_path, audit="session_orphan",
            )

    def _forget_orphans(self) -> None:
        """Free the displays of unknown sessions whose agent has ended."""
        for session_id, orphan in list(self.orphans.items()):
            if not orphan.agent.alive():
                del self.orphans[session_id]
                log.info("unknown session {id} of {user} on display :{display} has ended", id=session_id,
                         user=orphan.user, display=orphan.display)
                files.remove_tree(os.path.join(self.layout.sessions, orphan.session_id))

    # -------------------------------------------------------- housekeeping
    def housekeeping(self) -> None:
        """Expire long-suspended sessions and forget old ended ones."""
        now = self.reactor.seconds()
        hours = self.settings.expire_suspended_after
        if hours > 0:
            for session in list(self.sessions.values()):
                if session.state is State.SUSPENDED and now - session.changed > hours * 3600:
                    log.info("session {id} of {user} was suspended too long; ending it", id=session.id,
                             user=session.user, audit="session_expire")
                    self.background(self.terminate_session(session.id, "suspended too long"), "expiring it",
                                    session.id)
        self._forget_orphans()
        try:
            old = self.store.ended_before(now - self.settings.history_days * 86400)
            for session in old:
                agent_files = self.layout.agent_files(session.id)
                for path in (agent_files.log, agent_files.app_log):
                    try:
                        os.unlink(path)
                    except FileNotFoundError:
                        pass
            self.store.delete(session.id for session in old)
        except StoreError as error:
            log.warn("housekeeping of the session store postponed: {error}", error=str(error))

    def backup(self) -> None:
        """Copy the store to its backup file (periodic; a failure waits for
        the next period).  Not while sessions run that the store lost: the
        backup may be the one copy that still knows them."""
        if self.orphans:
            log.warn("session store not backed up: it does not know {count} running session(s), and "
                     "{path} may", count=len(self.orphans), path=self.store.backup_path)
            return
        try:
            path = self.store.backup()
        except (StoreError, OSError) as error:
            log.warn("the session store could not be backed up: {error}", error=str(error))
            return
        log.debug("session store backed up to {path}", path=path)

    # ------------------------------------------------------------ helpers
    def _owned(self, caller: Caller, session_id: str) -> Session:
        """The caller's own live session; others' sessions do not exist for him
        (NOT_YOURS carries the same words as NOT_FOUND)."""
        session = self.sessions.get(session_id)
        if session is not None and session.state.live and not caller.owns(session.user):
            log.warn("{user} from {address} asked for session {id} of another user", user=caller.user,
                     address=caller.address, id=session_id, audit="session_denied")
            raise SessionError(Kind.NOT_YOURS, f"Could not find session {session_id}.", session_id=session_id)
        if session is None or not session.state.live:
            raise SessionError(Kind.NOT_FOUND, f"Could not find session {session_id}.", session_id=session_id)
        return session

    @property
    def draining(self) -> bool:
        return self.limits.draining

    @draining.setter
    def draining(self, on: bool) -> None:
        self.limits.draining = on

    def _allocate_display(self) -> int:
        try:
            return self.displays.allocate()
        except NoFreeDisplay:
            raise SessionError(Kind.FAILED_TO_START,
                               "Display limit exceeded: no free display for a new session.") from None

    def _own_listener(self, session_id: str) -> Session:
        """The session, once it is sure its port is held by its own agent."""
        session = self.sessions[session_id]
        if session.encrypted:
            return session  # its socket is in the user's private directory (nxgate.agentsocket)
        if not processes.listens(session.agent_pid, session.port):
            log.error("session {id}: port {port} is not held by its agent (pid {pid}); not relaying there",
                      id=session_id, port=session.port, pid=session.agent_pid)
            self.background(self.terminate_session(session_id, "its port was taken by another process"),
                            "ending it", session_id)
            raise SessionError(Kind.FAILED_TO_START, "Session startup failed: its port is in use by another "
                               "process.", session_id=session_id)
        return session

    def _ready(self, session: Session, resumed: bool) -> Ready:
        """What the client needs to reach ``session``: an encrypted one's
        stream goes through the gateway to the agent's socket."""
        stream = (StreamTarget(session.id, self.layout.agent_files(session.id).socket, session.uid)
                  if session.encrypted else None)
        return Ready(SessionView.of(session), session.cookie, resumed, stream)


class ReplayState:
    """Replays a whole agent log to learn where a session stands now."""

    def __init__(self) -> None:
        self.state = State.CREATED
        self.attached = False
        self.screen: LogEvent | None = None

    def feed(self, line: str) -> None:
        event = parse_line(line)
        if event is None:
            return
        if event.event is AgentEvent.SCREEN:
            self.screen = event
            return
        new = advance(self.state, event.event)
        if new is not None:
            self.state = new
            self.attached = self.attached or new is State.RUNNING
