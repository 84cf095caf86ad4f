"""The session life cycle: what each operation may do in each state, and
how background work is watched.

Two written tables drive a session.  :data:`nxgate.vocabulary.model.TRANSITIONS`
says where the agent's own events (its log lines) take it.
:data:`OPERATIONS` says what a request from outside (restore, suspend,
terminate, and the gateway's own "listen again") does in each live state,
with every refusal written out, so no (operation, state) pair is decided by
an ``if`` chain nobody reads as a whole; a test checks the table is full.

Serialisation.  Restore, suspend, start (from registration until ready)
and listen-again hold the session's ``DeferredLock`` and look the state up
again once they hold it.  Terminate never queues behind them: it pre-empts
(the session may hang, which is why it is being ended), and the waiting
operation's waiters fail with :class:`SessionEnded`, which each turns into
its own clean failure.  The internal end paths (agent exit, expiry, the
connect timeout, a stolen port) use the same unlocked terminate.

Fire-and-forget work (an end triggered by an agent event, a program start
after the first attach, ...) goes through :func:`background`, so a failure
is logged with the session it belongs to instead of vanishing in an
unreferenced Deferred.
"""

from __future__ import annotations

import enum

import secrets
import signal
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from twisted.internet import defer
from twisted.logger import Logger, LogLevel

from nxgate import metrics
from nxgate.node.agents import nxagent
from nxgate.node.agents.agentlog import CLIENT_GONE, AgentEvent, LogEvent, client_gone, parse_line
from nxgate.config import Config, SessionsSection
from nxgate.node.displays import DisplayAllocator
from nxgate.node.extras import Extras, grant_for
from nxgate.node.supervisor import AgentSupervisor
from nxgate.safetext import printable
from nxgate.node.files import StateLayout
from nxgate.node.follow import LogFollower
from nxgate.vocabulary.model import Session, State, advance, member_name
from nxgate.node.processes import ExitWatch, LaunchError, ProcessId
from nxgate.store.errors import STORAGE_FULL, StoreError, storage_reason
from nxgate.vocabulary.caller import Caller
from nxgate.vocabulary.errors import Kind, SessionError
from nxgate.limits import limit_reached
from nxgate.vocabulary.requests import DisplaySettings, RestoreRequest
from nxgate.vocabulary.results import SessionEvent, SessionObserver, SessionView
from nxgate.store.interface import SessionStore
from nxgate.node.writer import StoreWriter

log = Logger()


class SessionEnded(Exception):
    """The session ended while an operation waited for it."""


class WaitTimeout(Exception):
    """The session did not reach a state in time; the text says which."""


class Op(str, enum.Enum):
    RESTORE = "restore"
    SUSPEND = "suspend"
    TERMINATE = "terminate"
    LISTEN_AGAIN = "listen_again"  # a resumed agent that suspended itself before its client came


class Action(str, enum.Enum):
    RESUME = "resume"                                  # SIGHUP until it listens, with a fresh cookie
    WAIT_SUSPENDED_THEN_RESUME = "wait_then_resume"    # a suspend is under way: let it finish first
    TAKE_OVER = "take_over"                            # attached elsewhere: suspend it there, then resume
    TAKE_OVER_IF_ATTACHED = "take_over_if_attached"    # TAKE_OVER once a client was ever attached, else REFUSE
    FIRST_ATTACH_IF_FOR_LATER = "first_attach_if_for_later"  # FIRST_ATTACH if started for a later client, else as above
    FIRST_ATTACH = "first_attach"                      # started with no client: hand out its cookie, no SIGHUP
    SIGHUP_AND_WAIT = "sighup_and_wait"                # suspend: SIGHUP, wait for SUSPENDED
    NOTHING = "nothing"                                # already where the operation leads
    TERMINATE = "terminate"                            # SIGTERM, again, then SIGKILL
    REFUSE = "refuse"                                  # wrong state: the caller hears which


#: nxagent (nxcomp) gives up waiting for its first client after 60 s, a
#: limit compiled in (INIT_TIMEOUT, and 3 accepts of 20 s).  An agent of a
#: session started for later that lived at least this long before giving
#: up is replaced by a fresh one; one that ended sooner failed.
RENEW_AFTER_SECONDS = 40.0

#: A terminating agent gets a second SIGTERM after this long (see _terminate_agent).
SECOND_SIGTERM_SECONDS = 2.0

L = State
#: What each operation does in each live state.  Ended states are not
#: listed: an ended session is not found by any operation.
OPERATIONS: dict[Op, dict[State, Action]] = {
    Op.RESTORE: {
        L.SUSPENDED: Action.RESUME,
        L.SUSPENDING: Action.WAIT_SUSPENDED_THEN_RESUME,
        # A session that never had a client is still on its way to its
        # first one: taking it over would steal a start in progress.
        L.RUNNING: Action.TAKE_OVER_IF_ATTACHED,
        # A session started for a later client (StartSession over D-Bus)
        # waits for its first one, listed as Suspended: attaching it is
        # that first connection.
        L.WAITING: Action.FIRST_ATTACH_IF_FOR_LATER,
        L.RESUMING: Action.TAKE_OVER_IF_ATTACHED,
        L.CREATED: Action.REFUSE,
        L.STARTING: Action.REFUSE,
        L.TERMINATING: Action.REFUSE,
    },
    Op.SUSPEND: {
        L.RUNNING: Action.SIGHUP_AND_WAIT,
        L.SUSPENDED: Action.NOTHING,
        L.CREATED: Action.REFUSE,
        L.STARTING: Action.REFUSE,
        L.WAITING: Action.REFUSE,
        L.SUSPENDING: Action.REFUSE,
        L.RESUMING: Action.REFUSE,
        L.TERMINATING: Action.REFUSE,
    },
    Op.TERMINATE: {state: Action.TERMINATE for state in State if state.live},
    Op.LISTEN_AGAIN: {
        # Only while the client it was resumed for may still come (the caller checks the timer).
        L.SUSPENDED: Action.RESUME,
        L.CREATED: Action.NOTHING,
        L.STARTING: Action.NOTHING,
        L.WAITING: Action.NOTHING,
        L.RUNNING: Action.NOTHING,
        L.SUSPENDING: Action.NOTHING,
        L.RESUMING: Action.NOTHING,
        L.TERMINATING: Action.NOTHING,
    },
}


def action(op: Op, state: State, ever_attached: bool = False, for_later: bool = False) -> Action:
    """What ``op`` does to a session in ``state`` (conditional entries
    resolved; ``for_later``: started with no client, never attached yet)."""
    chosen = OPERATIONS[op][state]
    if chosen is Action.FIRST_ATTACH_IF_FOR_LATER:
        if for_later and not ever_attached:
            return Action.FIRST_ATTACH
        chosen = Action.TAKE_OVER_IF_ATTACHED
    if chosen is Action.TAKE_OVER_IF_ATTACHED:
        return Action.TAKE_OVER if ever_attached else Action.REFUSE
    return chosen


class Background:
    """Fire-and-forget work, each with an errback that logs.

    The Deferreds still running are kept, so stopping can see (and tests
    can check) what is in flight."""

    def __init__(self) -> None:
        self.running: set[defer.Deferred[Any]] = set()

    def __call__(self, work: Coroutine[Any, Any, Any], what: str, session_id: str | None = None) -> defer.Deferred[Any]:
        deferred = defer.ensureDeferred(work)
        if deferred.called:
            return deferred.addErrback(self._failed, what, session_id)
        self.running.add(deferred)

        def done(result: Any) -> Any:
            self.running.discard(deferred)
            return result

        return deferred.addBoth(done).addErrback(self._failed, what, session_id)

    @staticmethod
    def _failed(failure: Any, what: str, session_id: str | None) -> None:
        log.failure("session {id}: {what} failed", failure, id=session_id or "-", what=what)


@dataclass
class Runtime:
    """What the life cycle holds for a live session besides its record."""

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
    agent_since: float = 0.0  # when the current agent was spawned (reactor seconds)
    listening: defer.Deferred[None] | None = None  # fired by a renewed agent's "waiting" line


class Lifecycle:
    """The one owner of in-memory session state: the live sessions and what
    is held for each (:class:`Runtime`).  It follows each agent's log through
    :data:`TRANSITIONS <nxgate.vocabulary.model.TRANSITIONS>`, acts on requests
    through :data:`OPERATIONS`, and writes every change through the
    write-behind queue; the agent supervisor does the processes."""

    def __init__(self, reactor: Any, config: Callable[[], Config], settings: Callable[[], SessionsSection],
                 layout: StateLayout, supervisor: AgentSupervisor, writer: StoreWriter, store: SessionStore,
                 displays: DisplayAllocator, background: Background, extras: Extras | None = None) -> None:
        self.reactor = reactor
        self._config = config
        self._settings = settings
        self.layout = layout
        self.supervisor = supervisor
        self.writer = writer
        self.store = store
        self.displays = displays
        self.background = background
        # The services beside the screen (nxgate.node.extras): started once the
        # agent listens, stopped at suspend and end; they never raise.
        self.extras = extras or Extras()
        self.sessions: dict[str, Session] = {}
        self.runtime: dict[str, Runtime] = {}
        # Who hears of every creation and state change (the D-Bus door's
        # signals); filled by the composition root, never by a door import.
        self.observers: list[SessionObserver] = []
        # On a store shared by a cluster: (per user, per node, total) limits
        # counted over every member in the store's one admission step, so two
        # starts through two gateways cannot both take a user's last place.
        self.admission: Callable[[Caller], tuple[int, int, int]] | None = None

    @property
    def config(self) -> Config:
        return self._config()

    @property
    def settings(self) -> SessionsSection:
        return self._settings()

    async def launch(self, caller: Caller, session: Session, settings: DisplaySettings,
                     plan: nxagent.AgentPlan, secret: str | None = None,
                     judge: Callable[[str], SessionError | None] | None = None) -> Session:
        """Start a new, registered session's agent; the session, once it listens.

        With ``plan.program_early`` the program (a viewer) starts as soon as
        the agent listens, gets ``secret`` on stdin, and its status line is
        ``judge``d before the client is answered.  The secret lives in
        memory only, until the program has it."""
        session = session.evolve(options={**session.options, "display": settings.as_dict(), "plan": plan.as_dict()})
        # Memory first, in this turn (limits and display were decided in it
        # too): no other start can take the same place while the store answers.
        self.sessions[session.id] = session
        try:
            hit = await self.writer.insert_first(session, self.admission(caller) if self.admission else None)
        except StoreError as error:
            # Nothing is held: no display, no place in the user's limit.
            del self.sessions[session.id]
            self.displays.release(session.display)
            log.error("session {id} for {user} not started: the session store refused it: {error}",
                      id=session.id, user=session.user, error=str(error))
            reason = storage_reason(error)
            raise SessionError(Kind.STORAGE_FULL if reason == STORAGE_FULL else Kind.UNAVAILABLE,
                               f"Session startup failed: {reason}.") from None
        if hit is not None:
            del self.sessions[session.id]
            self.displays.release(session.display)
            log.info("session for {user} not started: the cluster's {limit} limit is reached", user=session.user,
                     limit=hit)
            raise limit_reached(hit, session.user)
        runtime = self.runtime[session.id] = Runtime(self.layout.agent_files(session.id), secret=secret)
        self._notify(session, None)
        # A new session's lock is free: held from registration until it is
        # ready, so a restore or suspend of it waits and then sees its state.
        runtime.lock.acquire()
        try:
            log.info(
                "starting session {id} ({type}, display :{display}) for {user} from {address}{later}",
                id=session.id, type=session.type, display=session.display, user=session.user,
                address=caller.address, later=" for a later client" if session.for_later else "",
                audit="session_start",
            )
            try:
                launched = self.reactor.seconds()
                await self._start_agent(session, runtime, settings, plan)
                await self._wait_for(session.id, {State.WAITING}, self.settings.agent_start_timeout)
                metrics.agent_started(self.reactor.seconds() - launched)
                await self.extras.start(self.sessions[session.id])
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
            if not self.sessions[session.id].for_later:
                self._expect_client(session.id)  # one started for later waits without a timer
            return await self._own_listener(session.id)
        finally:
            runtime.lock.release()

    async def resume(self, caller: Caller, request: RestoreRequest, owned: Callable[[], Session]) -> Session:
        """Resume a session for ``caller`` under its lock (``owned()`` looks it
        up again, with the owner check, once the lock is held); the session,
        once its agent listens again."""
        session_id, settings, encrypted = request.session_id, request.display, request.encrypted
        runtime = self.runtime[session_id]
        await runtime.lock.acquire()
        try:
            session = owned()
            todo = action(Op.RESTORE, session.state, session.ever_attached, session.for_later)
            if todo is Action.FIRST_ATTACH:
                wanted = request.cookie if request.cookie and _cookie(request.cookie) == request.cookie else ""
                if wanted and wanted != session.cookie and encrypted == session.encrypted:
                    session = await self._first_client_cookie(session, runtime, wanted)
                return await self._first_attach(caller, session, encrypted)
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
                session.id, cookie=_cookie(request.cookie), client_address=printable(caller.address),
                encrypted=encrypted,
                geometry=settings.geometry, depth=settings.depth, render=settings.render,
                fullscreen=settings.fullscreen, options={**session.options, "display": settings.as_dict(),
                                                         "services": grant_for(request.services,
                                                                               self.config.services, session.display,
                                                                               session.id, session.user)},
            )
            self.supervisor.write_agent_files(session, runtime.files, settings)
            await self.supervisor.drop_saved_caches(session, runtime.files)
            log.info("resuming session {id} of {user} for {address}", id=session.id, user=session.user,
                     address=caller.address, audit="session_resume")
            await self._sighup_until_listening(session.id)
            await self.extras.start(self.sessions[session.id])
        except (SessionEnded, WaitTimeout) as error:
            raise SessionError(Kind.FAILED_TO_RESUME, f"Session resume failed: {error}",
                               session_id=session_id) from None
        finally:
            runtime.lock.release()
        self._expect_client(session.id)
        return await self._own_listener(session.id)

    async def _first_attach(self, caller: Caller, session: Session, encrypted: bool) -> Session:
        """The first client of a session started for later (under its lock).

        Its agent has waited since the start, with the cookie and display
        settings it was started with: nxagent reads them once, and only a
        resume (SIGHUP) would read them again, which an agent that never had
        a client does not take.  The cookie was never handed to anyone
        before (StartSession answers without it), so the client gets it now.
        The agent's listener (socket or port) was chosen at the start too."""
        if encrypted != session.encrypted:
            wanted = "an encrypted" if session.encrypted else "an unencrypted"
            raise SessionError(Kind.WRONG_STATE, f"Session {session.id} was started for {wanted} connection.",
                               session_id=session.id)
        session = self._update(session.id, client_address=printable(caller.address))
        log.info("first client of session {id} of {user}, started for later, from {address}", id=session.id,
                 user=session.user, address=caller.address, audit="session_resume")
        self._expect_client(session.id)
        return await self._own_listener(session.id)

    async def suspend_session(self, session_id: str) -> None:
        """Suspend a running session wherever it is attached (SIGHUP)."""
        session = self.sessions[session_id]
        if action(Op.SUSPEND, session.state) is Action.SIGHUP_AND_WAIT:
            runtime = self.runtime[session_id]
            await runtime.lock.acquire()
            try:
                session = self.sessions.get(session_id, session)  # looked up again under the lock
                if action(Op.SUSPEND, session.state) is Action.SIGHUP_AND_WAIT:
                    self._signal_agent(session, signal.SIGHUP)
                    await self._wait_for(session.id, {State.SUSPENDED}, self.settings.suspend_timeout)
                    return
            except (SessionEnded, WaitTimeout) as error:
                raise SessionError(Kind.FAILED_TO_SUSPEND, f"Session suspend failed: {error}",
                                   session_id=session_id) from None
            finally:
                runtime.lock.release()
        if not session.state.live:
            raise SessionError(Kind.FAILED_TO_SUSPEND, f"Session suspend failed: the session {session.state.value}",
                               session_id=session_id)
        if action(Op.SUSPEND, session.state) is Action.REFUSE:
            raise SessionError(Kind.WRONG_STATE, f"Session {session.id} is {session.state.value}.",
                               session_id=session_id)

    async def _start_agent(self, session: Session, runtime: Runtime, settings: DisplaySettings,
                           plan: nxagent.AgentPlan) -> None:
        runtime.agent_since = self.reactor.seconds()
        agent, runtime.follower = await self.supervisor.spawn(
            session, runtime.files, settings, plan, lambda line: self._agent_line(session.id, line))
        session = self._update(session.id, agent_pid=agent.pid, agent_started=agent.started)
        self._watch_agent(session.id, agent)

    def _renewable(self, session: Session) -> bool:
        """Whether the agent of ``session`` ending now is nxagent giving up
        waiting for a first client that was never promised to come soon:
        started for later, never attached, still waiting, and not being
        ended by the gateway (which records a reason first)."""
        return session.for_later and session.state is State.WAITING and not session.failure

    async def _renew_agent(self, session_id: str) -> None:
        """Start a fresh agent for a session started for later (see
        :data:`RENEW_AFTER_SECONDS`): the session stays waiting, listed as
        Suspended, with its display and cookie, for as long as its user
        likes (housekeeping's ``suspended_expiry`` still ends it).  Under
        the session's lock: a first client that comes meanwhile waits until
        the fresh agent listens."""
        runtime = self.runtime.get(session_id)
        if runtime is None:
            return
        await runtime.lock.acquire()
        try:
            session = self.sessions.get(session_id)
            if session is None or self.runtime.get(session_id) is not runtime or not self._renewable(session):
                return
            self._stop_watching(runtime)
            log.info("session {id} of {user}, started for later: nxagent stopped waiting for a first client (its "
                     "own 60-second limit); starting a fresh agent that waits on", id=session_id, user=session.user)
            await self._fresh_agent(session, runtime)
        finally:
            runtime.listening = None
            runtime.lock.release()

    async def _fresh_agent(self, session: Session, runtime: Runtime) -> None:
        """A new agent for a session whose agent never had a client (under
        its lock, the old agent no longer watched); the session stays waiting."""
        session_id = session.id
        try:
            settings = DisplaySettings.from_dict(session.options.get("display", {}))
            runtime.listening = defer.Deferred()
            runtime.last_error = ""
            runtime.agent_since = self.reactor.seconds()
            try:
                agent, runtime.follower = await self.supervisor.renew(
                    session, runtime.files, settings, self.supervisor.plan(session),
                    lambda line: self._agent_line(session_id, line))
            except (LaunchError, OSError) as error:
                await self._end(session_id, State.FAILED, f"its agent could not be started again: {error}")
                return
            self._update(session_id, agent_pid=agent.pid, agent_started=agent.started)
            self._watch_agent(session_id, agent)
            listening = runtime.listening
            listening.addTimeout(self.settings.agent_start_timeout, self.reactor)
            try:
                await listening
            except defer.TimeoutError:
                log.warn("session {id}: its fresh agent does not say it listens; ending the session", id=session_id)
                self.background(self.terminate_session(session_id, "its agent did not start again"), "ending it",
                                session_id)
        finally:
            runtime.listening = None

    async def _first_client_cookie(self, session: Session, runtime: Runtime, cookie: str) -> Session:
        """A first client that brings its own cookie (an X2Go client takes it
        from the listing it made before: nxgate.gateway.doors.conch.x2go).  nxagent reads
        its options once before a first client, so the waiting agent, which
        never had a client and runs no program yet, is replaced by a fresh one
        with that cookie (under the session's lock)."""
        self._stop_watching(runtime)
        old = ProcessId(session.agent_pid, session.agent_started)
        self._signal_agent(session, signal.SIGTERM)
        for _ in range(50):
            if not old.alive():
                break
            await _sleep(self.reactor, 0.1)
        else:
            self.supervisor.kill_if_alive(old)
            await _sleep(self.reactor, 0.2)
        session = self._update(session.id, cookie=cookie)
        log.info("session {id} of {user}, started for later: a fresh agent with the first client's cookie",
                 id=session.id, user=session.user)
        await self._fresh_agent(session, runtime)
        if not self.sessions.get(session.id, session).state.live:
            raise SessionEnded(f"session {session.id} ended")
        return self.sessions[session.id]

    async def _start_program(self, session_id: str, report: bool = False) -> str:
        """Start the session's program; with ``report``, return its status line
        (a viewer's ``ready ...`` or ``error ...``), waited for within the
        remote connect timeout."""
        session = self.sessions[session_id]
        runtime = self.runtime[session_id]
        plan = self.supervisor.plan(session)
        if not plan.program:
            return ""
        secret, runtime.secret = runtime.secret, None
        try:
            started, status = await self.supervisor.start_program(session, runtime.files, secret, report,
                                                                  self.extras.environment(session))
        except (LaunchError, OSError, KeyError) as error:
            log.warn("session {id}: could not start {program}: {error}", id=session_id,
                     program=plan.program[0], error=str(error))
            await self.terminate_session(session_id, "session program failed to start")
            return f"error protocol: could not start {plan.program[0]}"
        if session_id not in self.runtime:
            # The session ended while the program started; it has no display left.
            self.supervisor.end_program_group(session.evolve(app_pid=started.pid, app_started=started.started))
            return "error protocol: the session ended"
        log.info("session {id}: started {program} (pid {pid})", id=session_id, program=plan.program[0],
                 pid=started.pid)
        self._update(session_id, app_pid=started.pid, app_started=started.started)
        runtime.app_watch = self.supervisor.watch_exit(started, lambda: self._program_exited(session_id))
        if not report:
            return ""
        status.addTimeout(self.config.remote.connect_timeout + 10, self.reactor)
        try:
            return await status
        except defer.TimeoutError:
            return "error timeout: no answer from the viewer"
        except LaunchError as error:
            return f"error protocol: {error}"

    async def start_application(self, session_id: str, argv: tuple[str, ...]) -> None:
        """Start ``argv`` in a running session beside what runs there (a
        published application): as the user, in the session's namespaces
        and environment, its own process group; its end ends nothing, and
        the session's end ends it (it carries the session's marker)."""
        if self.sessions[session_id].state in (State.STARTING, State.WAITING, State.RESUMING):
            # X2Go's clients send it as soon as their link is up: the agent says it is attached a moment later.
            try:
                await self._wait_for(session_id, {State.RUNNING}, self.settings.agent_start_timeout)
            except (WaitTimeout, SessionEnded) as error:
                raise SessionError(Kind.WRONG_STATE, f"Session {session_id} is not running ({error}).",
                                   session_id=session_id) from None
        session = self.sessions[session_id]
        if session.state is not State.RUNNING:
            raise SessionError(Kind.WRONG_STATE, f"Session {session_id} is not running.", session_id=session_id)
        runtime = self.runtime[session_id]
        try:
            started, _ = await self.supervisor.start_program(session, runtime.files, None, False,
                                                            self.extras.environment(session), argv=argv)
        except (LaunchError, OSError, KeyError) as error:
            log.warn("session {id}: could not start {program}: {error}", id=session_id, program=argv[0],
                     error=str(error))
            raise SessionError(Kind.FAILED_TO_START, f"Could not start {argv[0]}.", session_id=session_id) from None
        log.info("session {id}: started {program} (pid {pid}) for its client", id=session_id, program=argv[0],
                 pid=started.pid)

    def _program_exited(self, session_id: str) -> None:
        session = self.sessions.get(session_id)
        if session is None or not session.state.live:
            return
        log.info("session {id}: its program ended; ending the session", id=session_id)
        self.background(self.terminate_session(session_id, "session program ended"), "ending it", session_id)

    def _signal_agent(self, session: Session, signum: int) -> None:
        self.supervisor.signal_agent(session, signum)

    async def _sighup_until_listening(self, session_id: str) -> None:
        """SIGHUP a suspended agent until it listens again (see AgentSupervisor.resend_sighup)."""
        await self.supervisor.resend_sighup(
            lambda: self.sessions[session_id],
            lambda states, seconds: self._wait_for(session_id, states, seconds), WaitTimeout)

    async def terminate_session(self, session_id: str, reason: str) -> None:
        """End a session and return when its agent is gone: SIGTERM, again
        after 2 s, SIGKILL at the timeout (unlocked: it pre-empts, see
        nxgate.node.lifecycle)."""
        session = self.sessions.get(session_id)
        if session is None or not session.state.live:
            return
        self._set_failure_reason(session_id, reason)
        agent = ProcessId(session.agent_pid, session.agent_started)
        await self._terminate_agent(session_id, session, agent, reason)
        await self.supervisor.kill_lingering(session_id, agent)

    async def _terminate_agent(self, session_id: str, session: Session, agent: ProcessId, reason: str) -> None:
        if not agent.alive():
            await self._end(session_id, State.TERMINATED, reason)
            return
        self._signal_agent(session, signal.SIGTERM)
        try:
            await self._wait_for(session_id, {State.TERMINATED, State.FAILED}, SECOND_SIGTERM_SECONDS)
            return
        except WaitTimeout:
            # It can sleep in a select() nothing will end (its peer's answer
            # came before it waited for it): a signal ends that select.
            log.info("session {id}: nxagent has not terminated after {seconds:g} s; SIGTERM again",
                     id=session_id, seconds=SECOND_SIGTERM_SECONDS)
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

    def _agent_line(self, session_id: str, line: str) -> None:
        event = parse_line(line)
        if event is not None:
            self._agent_event(session_id, event)

    def _agent_event(self, session_id: str, event: LogEvent) -> None:
        session = self.sessions.get(session_id)
        runtime = self.runtime.get(session_id)
        if session is None or runtime is None:
            return
        renewing = self._renewable(session)
        if event.event is AgentEvent.ERROR:
            lost = client_gone(event.text)
            runtime.last_error = CLIENT_GONE if lost else event.text
            # Its client leaving, giving up on a first client (_agent_exited starts a fresh one) or being
            # ended by us: the session's own line says what happened; other errors are the admin's to see.
            expected = lost or renewing or bool(session.failure)
            log.emit(LogLevel.debug if expected else LogLevel.warn, "session {id}: nxagent: {text}",
                     id=session_id, text=event.text)
            return
        if event.event is AgentEvent.WAITING and runtime.listening is not None and not runtime.listening.called:
            runtime.listening.callback(None)
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
        if renewing and new in (State.TERMINATING, State.TERMINATED):
            # The session waits on: its agent is replaced once it has exited
            # (_agent_exited), which an aborted agent is told to do now.
            if new is State.TERMINATED:
                self._signal_agent(session, signal.SIGTERM)
            return
        changes: dict[str, Any] = {}
        if new is State.RUNNING:
            changes["ever_attached"] = True
        reason = session.failure or runtime.last_error or "nxagent ended"
        self._transition(session_id, new, **changes)
        if new is State.SUSPENDED:
            self.background(self.extras.stop(self.sessions[session_id]), "stopping its services", session_id)
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
            plan = self.supervisor.plan(session)
            if plan.program_early and plan.attach_signal and not session.ever_attached:
                self.supervisor.signal_program(session, plan.attach_signal)  # the viewer may draw now
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
        log.debug("session {id} of {user}: screen {geometry}{mode}", id=session.id, user=session.user,
                 geometry=event.text, mode=" full screen" if event.fullscreen else "")

    def _end_watchdog(self, session: Session) -> None:
        self.supervisor.end_watchdog(session).addErrback(
            lambda failure: log.failure("session {id}: ending its watchdog failed", failure, id=session.id))

    def _agent_exited(self, session_id: str) -> None:
        session = self.sessions.get(session_id)
        if session is None or not session.state.live:
            return
        runtime = self.runtime.get(session_id)
        if (runtime is not None and self._renewable(session)
                and self.reactor.seconds() - runtime.agent_since >= RENEW_AFTER_SECONDS):
            self.background(self._renew_agent(session_id), "starting its agent again", session_id)
            return
        if session.ever_attached or session.state is State.TERMINATING:
            final, reason = State.TERMINATED, session.failure or "nxagent ended"
        else:
            final, reason = State.FAILED, self.runtime[session_id].last_error or "nxagent ended before a client connected"
        self.background(self._end(session_id, final, reason), "recording its end", session_id)

    def _watch_agent(self, session_id: str, agent: ProcessId) -> None:
        self.runtime[session_id].agent_watch = self.supervisor.watch_exit(agent, lambda: self._agent_exited(session_id))

    def _expect_client(self, session_id: str) -> None:
        """End a session whose client never connects after start or resume."""
        runtime = self.runtime[session_id]
        self._cancel_connect_timer(runtime)

        def check() -> None:
            runtime.connect_timer = None
            session = self.sessions.get(session_id)
            if session is not None and session.state is State.WAITING:
                if session.for_later:
                    log.info("session {id}: its client did not come; it waits for another", id=session_id)
                elif session.ever_attached:
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

    def _update(self, session_id: str, **changes: Any) -> Session:
        session = self.sessions[session_id].evolve(**changes)
        self.sessions[session_id] = session
        self.writer.save(session)
        return session

    @property
    def unsaved(self) -> dict[str, Session]:
        """Session changes not in the store yet (it refused them: a full disk)."""
        return self.writer.unsaved

    def flush(self) -> defer.Deferred[int]:
        """Write the session changes the store refused earlier, in order."""
        return self.writer.flush()

    def _set_failure_reason(self, session_id: str, reason: str) -> None:
        if not self.sessions[session_id].failure:
            self._update(session_id, failure=reason)

    def _transition(self, session_id: str, new: State, **changes: Any) -> None:
        old, attached_before = self.sessions[session_id].state, self.sessions[session_id].ever_attached
        session = self._update(session_id, state=new, changed=self.reactor.seconds(), **changes)
        # A client attaching is worth a line; the other steps have theirs (suspended, ended) or none.
        log.emit(LogLevel.info if new is State.RUNNING else LogLevel.debug, "session {id} of {user}: {old} -> {new}",
                 id=session_id, user=session.user, old=old.value, new=new.value)
        self._notify(session, old, attached_before)
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

    def _notify(self, session: Session, old: State | None, attached_before: bool = False) -> None:
        """Tell the observers; one that fails is logged and the rest still hear."""
        if not self.observers:
            return
        event = SessionEvent(SessionView.of(session), old, attached_before)
        for observer in list(self.observers):
            try:
                observer(event)
            except Exception:
                log.failure("a session observer failed on session {id}", id=session.id)

    def rename(self, session_id: str, name: str) -> Session:
        """Give a live session a new name (what clients list); stored like any change."""
        return self._update(session_id, name=name, changed=self.reactor.seconds())

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

    async def mount_share(self, session_id: str, mount: Any) -> None:
        """Mount a shared folder once the session is attached (its smb channel
        is up then); a session that suspends or ends first gets no mount."""
        sharing = self.extras.by_name.get("sharing")
        if sharing is None:
            return
        try:
            await self._wait_for(session_id, {State.RUNNING}, self.settings.connect_timeout)
        except (SessionEnded, WaitTimeout) as problem:
            log.warn("session {id}: {share!r} not mounted: {problem}", id=session_id, share=mount.share,
                     problem=problem)
            return
        await sharing.mount(self.sessions[session_id], mount)

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
        shadow = session.options.get("shadow")
        # A shadow's end is one line, its detach (the audit log has both events).
        log.emit(LogLevel.debug if shadow else LogLevel.info, "session {id} of {user} ended ({state}: {reason})",
                 id=session_id, user=session.user, state=final.value, reason=session.failure or reason,
                 audit="session_end")
        if shadow:
            log.info("shadow detach: {user} no longer watches {target} of {owner}: session {id} ended ({why})",
                     user=session.user, target=shadow["target"], owner=shadow["owner"], id=session_id,
                     why=f"{final.value}: {session.failure or reason}", audit="shadow_detach")
        if runtime is not None:
            self._stop_watching(runtime)
            self._cancel_connect_timer(runtime)
        await self.extras.stop(session)
        await self.supervisor.clean_up(session)

    @staticmethod
    def _stop_watching(runtime: Runtime) -> None:
        for watcher in (runtime.follower, runtime.agent_watch, runtime.app_watch):
            if watcher is not None:
                watcher.stop()

    def reconcile(self) -> defer.Deferred[None]:
        """Take back the sessions of a previous gateway run (fired when done;
        at once with an inline ``blocking``)."""
        return defer.ensureDeferred(self._reconcile())

    async def _reconcile(self) -> None:
        # Every stored session is registered and holds its display first, in
        # one turn: no start meanwhile can be given one of their displays.
        taken_back = []
        for session in await self._own_live():
            self.sessions[session.id] = session
            self.runtime[session.id] = Runtime(self.layout.agent_files(session.id))
            self.displays.claim(session.display)
            taken_back.append(session)
        for session in taken_back:
            agent = ProcessId(session.agent_pid, session.agent_started)
            if not agent.alive():
                log.warn("session {id} of {user}: nxagent ended while the gateway was away", id=session.id,
                         user=session.user)
                final = State.TERMINATED if session.ever_attached else State.FAILED
                self.background(self._end(session.id, final, "nxagent ended while the gateway was away"),
                                "recording its end", session.id)
                continue
            adopted = await self.supervisor.adopt(session, lambda line, sid=session.id: self._agent_line(sid, line))
            runtime = self.runtime.get(session.id)
            if runtime is None:  # ended meanwhile
                if adopted.follower is not None:
                    adopted.follower.stop()
                continue
            runtime.follower = adopted.follower
            replay = adopted.replay
            if replay.state is not self.sessions[session.id].state:
                self._transition(session.id, replay.state, ever_attached=session.ever_attached or replay.attached)
            if replay.screen is not None:
                self._screen_changed(self.sessions[session.id], replay.screen)
            self._watch_agent(session.id, agent)
            program = ProcessId(session.app_pid, session.app_started)
            if session.app_pid and not program.alive():
                self.background(self.terminate_session(session.id, "session program ended while the gateway was away"),
                                "ending it", session.id)
            elif session.app_pid:
                runtime.app_watch = self.supervisor.watch_exit(
                    program, lambda sid=session.id: self._program_exited(sid))
            if self.sessions[session.id].state is State.SUSPENDED:
                await self.extras.stop(self.sessions[session.id])  # what a killed gateway left running
            log.info("session {id} of {user} taken back ({state})", id=session.id, user=session.user,
                     state=self.sessions[session.id].state.value, audit="session_reattach")
        await self.supervisor.find_orphans(lambda session_id: session_id in self.sessions, self.store.path,
                                           self.store.backup_path)

    async def _own_live(self) -> list[Session]:
        """The live sessions this box runs, as stored.  On a store shared by a
        cluster, only this member's; and those this box ran before it joined
        (no node, its server name) become its own."""
        name = member_name(self.config)
        if not name:
            return await self.store.live()
        own = await self.store.live(node=name)
        for session in await self.store.live(node=""):
            if session.server_name == self.config.server_name:
                session = session.evolve(node=name)
                self.writer.save(session)
                own.append(session)
        return own

    async def _own_listener(self, session_id: str) -> Session:
        """The session, once it is sure its port is held by its own agent."""
        session = self.sessions[session_id]
        if session.encrypted:
            return session  # its socket is in the user's private directory (nxgate.wire.agentsocket)
        if not await self.supervisor.listens(session):
            log.error("session {id}: port {port} is not held by its agent (pid {pid}); not relaying there",
                      id=session_id, port=session.port, pid=session.agent_pid)
            self.background(self.terminate_session(session_id, "its port was taken by another process"),
                            "ending it", session_id)
            raise SessionError(Kind.FAILED_TO_START, "Session startup failed: its port is in use by another "
                               "process.", session_id=session_id)
        return session


def _cookie(wanted: str) -> str:
    """A resumed agent's cookie: the one the client was shown (32 hex
    digits, nxgate.gateway.doors.conch.x2go), or a fresh one."""
    return wanted if len(wanted) == 32 and all(c in "0123456789abcdef" for c in wanted) else secrets.token_hex(16)


def _sleep(reactor: Any, seconds: float) -> defer.Deferred[None]:
    from twisted.internet.task import deferLater

    return deferLater(reactor, seconds, lambda: None)
