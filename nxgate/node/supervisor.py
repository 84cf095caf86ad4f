"""The local agent supervisor: every process the sessions of this node run.

It starts a session's nxagent (its files, the PAM request, the plan) and
program through the launcher, signals them, ends what they leave behind,
cleans up after them, and after a gateway restart takes back the agents
still running (replaying their logs) or reports those the store does not
know.  It holds no session state: the life cycle passes it the session
record and decides what happens next.

Every signal goes through the injected ``send_signal`` (default:
:func:`processes.send_signal`, a pidfd after a start-time check), so no
signal, not even the last SIGKILL of a terminate, reaches a recycled pid.
Work that may take long on the reactor thread (user look-ups, /proc scans,
removing a directory the user can fill, replaying a long log) goes through
the injected ``blocking`` (:mod:`nxgate.threads`).
"""

from __future__ import annotations

import grp
import os
import pwd
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from twisted.internet import defer, inotify, task
from twisted.logger import Logger

from nxgate.node.agents import jail, nxagent, x11
from nxgate.node.agents.agentlog import AgentEvent, LogEvent, parse_line
from nxgate.protocols import service_channels
from nxgate.config import Config
from nxgate.node import cgroups, displays
from nxgate.host import files, processes
from nxgate.node.follow import LogFollower, replay
from nxgate.host.launcher import Launcher
from nxgate.vocabulary.model import Session, State, advance
from nxgate.host.processes import ExitWatch, LaunchError, ProcessId
from nxgate.node.environment import (bus_environment, compose_cache_environment, login_environment,
                                     prepare_compose_cache)
from nxgate.vocabulary.requests import DisplaySettings
from nxgate.threads import Blocking, inline

log = Logger()

#: A suspended agent that has not started resuming this long after a SIGHUP
#: gets another one; one that started is left alone for RESUME_LISTEN_SECONDS.
SIGHUP_RETRY_SECONDS = 0.25
SIGHUP_ATTEMPTS = 40
RESUME_LISTEN_SECONDS = 10.0
#: How long what a session left behind has between SIGTERM and SIGKILL.
LEFTOVER_GRACE_SECONDS = 5.0
#: How long an agent that said it gave up has to exit before it is killed.
AGENT_EXIT_SECONDS = 5.0
#: The watchdog is ended once its agent sleeps in select() (see end_watchdog);
#: an agent not there yet is looked at again this often, at most this many times.
WATCHDOG_AGENT_CHECK_SECONDS = 0.002
WATCHDOG_AGENT_CHECKS = 50

SendSignal = Callable[[ProcessId, int], bool]


@dataclass(frozen=True)
class Orphan:
    """A live agent in a session directory the store does not know."""

    session_id: str
    user: str
    display: int
    agent: ProcessId


class ReplayState:
    """Replays a whole agent log to learn where a session stands now.
    Touches nothing else, so it can run in a thread."""

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


@dataclass
class Adopted:
    """What :meth:`AgentSupervisor.adopt` learnt of a running agent."""

    replay: ReplayState
    follower: LogFollower | None


class AgentSupervisor:
    def __init__(
        self,
        reactor: Any,
        config: Callable[[], Config],
        layout: files.StateLayout,
        launcher: Launcher,
        notifier: inotify.INotify,
        pam_service: str,
        blocking: Blocking = inline,
        send_signal: SendSignal = processes.send_signal,
        listens: Callable[[int, int], bool] | None = None,
        session_cgroups: cgroups.SessionCgroups | None = None,
        in_select: Callable[[int], bool | None] | None = None,
    ) -> None:
        self.reactor = reactor
        self.config = config
        self.layout = layout
        self.launcher = launcher
        self.notifier = notifier
        self.pam_service = pam_service
        self.blocking = blocking
        self.send_signal = send_signal
        self._listens = listens
        self._in_select = in_select or waits_in_select
        self.cgroups = session_cgroups or cgroups.SessionCgroups()
        self._said_no_cgroups = False
        self.orphans: dict[str, Orphan] = {}  # id -> a running session the store did not know at start

    @property
    def settings(self) -> Any:
        return self.config().sessions

    # -------------------------------------------------------------- start
    @staticmethod
    def plan(session: Session) -> nxagent.AgentPlan:
        return nxagent.AgentPlan.from_dict(session.options.get("plan", {}))

    def pam_request(self, session: Session) -> dict[str, Any]:
        return {"service": self.pam_service, "rhost": session.client_address, "tty": f":{session.display}"}

    def write_agent_files(self, session: Session, agent_files: nxagent.AgentFiles, settings: DisplaySettings) -> None:
        """The agent's cookie and options (rewritten before each resume)."""
        plan = self.plan(session)
        # Encrypted sessions reach their agent through the gateway only;
        # an unencrypted one's client connects to its TCP port directly.
        listen = (nxagent.listen_unix(agent_files.socket) if session.encrypted
                  else nxagent.listen_tcp(session.client_address))
        authority = b"".join(x11.xauthority(display, cookie)
                             for display, cookie in ((session.display, session.cookie), *plan.extra_cookies))
        granted_channels = tuple(service_channels.agent_options(session.options.get("services", ()), session.display))
        options = nxagent.options_line(session, settings, listen, (*plan.extra_options, *granted_channels))
        files.write_user_file(agent_files.authority, authority, session.uid, session.gid)
        files.write_user_file(agent_files.options, options.encode(), session.uid, session.gid)

    async def drop_saved_caches(self, session: Session, agent_files: nxagent.AgentFiles) -> None:
        """Before a resume: the message caches the agent saved when its last
        client left go, so that the resume does not load one (see
        :func:`nxgate.node.agents.nxagent.cache_directory`)."""
        directory = nxagent.cache_directory(session, agent_files)
        names = await self.blocking(files.names_in_dir, directory, nxagent.MAX_CACHE_NAMES)
        saved = [name for name in names if nxagent.is_saved_cache(name)]
        if saved:
            await self.blocking(files.remove_in_dir, directory, *saved)
            log.debug("session {id}: {count} saved link caches dropped before its resume", id=session.id,
                      count=len(saved))

    async def spawn(self, session: Session, agent_files: nxagent.AgentFiles, settings: DisplaySettings,
                    plan: nxagent.AgentPlan, on_line: Callable[[str], None],
                    fresh: bool = True) -> tuple[ProcessId, LogFollower]:
        """Start ``session``'s agent; its log lines go to ``on_line``
        (``fresh``: in a new session directory; else in the existing one, see :meth:`renew`)."""
        if fresh:
            files.make_session_dir(agent_files.directory, session.uid, session.gid)
        self.write_agent_files(session, agent_files, settings)
        for path in (agent_files.log, agent_files.app_log):
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600))
        follower = LogFollower(self.notifier, agent_files.log, on_line, reactor=self.reactor)
        try:
            user, jailed = await self._jailed(session, plan)
            # No abstract X socket of its own: we hold that name for it (nxgate.node.displays).
            extra = (*self.settings.agent_extra_options, *displays.AGENT_OPTIONS)
            argv = nxagent.agent_argv(self.settings.nxagent, session, agent_files, plan, extra)
            bwrap_options: list[str] = []
            if jailed:
                argv, bwrap_options = jail.hidden_bwrap_argv(
                    self.config().jail.bwrap, uid=user.pw_uid, gid=user.pw_gid, home=user.pw_dir,
                    session_dir=agent_files.directory, runtime_dir=f"/run/user/{user.pw_uid}", command=argv)
                log.info("session {id} of {user}: jailed (bubblewrap: own mount, PID and IPC namespaces)",
                         id=session.id, user=session.user)
            request = {
                "user": user.pw_name,
                "argv": argv,
                "env": login_environment(user, self.settings),
                "env_fixed": {**nxagent.agent_environment(session, agent_files, {}),
                              processes.SESSION_MARKER: session.id, processes.SESSION_ID_VARIABLE: session.id},
                "cwd": agent_files.directory,
                "log": agent_files.log,
                "pam": self.pam_request(session) if plan.pam else None,
                # bubblewrap starts as root; setpriv in it becomes the user.
                "as_root": jailed,
                "cgroup": await self.limit(session) if jailed else None,
                # Our socket on the display's abstract X name, kept by the agent
                # as fd 3 while it lives (it does not listen there).
                "abstract_holder": displays.name_holder(session.display),
                # bubblewrap's options (the session directory) on a pipe, not in ps.
                "args_fd": [jail.ARGS_FD, bwrap_options] if jailed else None,
            }
            launched = await self.launcher.start(request)
            if jailed:
                launched = await self.jailed_agent(launched)
            return launched, follower
        except BaseException:
            follower.stop()
            raise

    async def _jailed(self, session: Session, plan: nxagent.AgentPlan) -> tuple[pwd.struct_passwd, bool]:
        """The session's user, and whether its agent runs in a jail (NSS: off the reactor)."""
        user = await self.blocking(pwd.getpwuid, session.uid)
        return user, jail.applies(self.config().jail, session.type, await self.blocking(_group_names, user),
                                  shadow=plan.mode == "-S")

    async def renew(self, session: Session, agent_files: nxagent.AgentFiles, settings: DisplaySettings,
                    plan: nxagent.AgentPlan, on_line: Callable[[str], None]) -> tuple[ProcessId, LogFollower]:
        """A fresh agent for a session started for later whose agent gave up
        waiting for its first client (nxcomp's fixed 60-second limit, see
        :meth:`nxgate.node.lifecycle.Lifecycle._renew_agent`): same
        display, cookie and options, in the same directory.

        The display stays the session's while no agent runs: we hold its
        abstract X name all along, and an agent outside a jail (whose lock
        and socket are in the host's /tmp) finds what another user put there
        meanwhile taken over for its user.  The old agent's log is emptied
        first (it said only that it waited and gave up), so that a gateway
        restarted later replays the new agent's log alone; its stale socket
        goes (nxcomp binds a fresh one); its PAM session is closed, as the
        new agent opens one."""
        if session.agent_pid:
            await self._until_gone(session, ProcessId(session.agent_pid, session.agent_started))
        if not (await self._jailed(session, plan))[1]:
            await self.blocking(displays.take_over_for_restart, session.display, session.uid, session.gid)
        await self.blocking(_empty_file, agent_files.log)
        await self.blocking(files.remove_in_dir, agent_files.directory, os.path.basename(agent_files.socket))
        if session.agent_pid and plan.pam:
            try:
                await self.launcher.close_pam({"user": session.user, "pam": self.pam_request(session)})
            except (LaunchError, OSError) as error:
                log.warn("session {id}: closing the PAM session failed: {error}", id=session.id, error=str(error))
        return await self.spawn(session, agent_files, settings, plan, on_line, fresh=False)

    async def _until_gone(self, session: Session, old: ProcessId) -> None:
        """Wait for the agent that gave up to be gone before its display is
        taken over: it says so before it exits, and its exit unlinks its lock
        and socket file.  Under load that came after the take-over, another
        user won the files it left free, and the fresh agent could not listen
        ("Cannot establish any listening sockets")."""
        if await self.gone(old, AGENT_EXIT_SECONDS):
            return
        log.warn("session {id}: nxagent pid {pid} gave up waiting for its first client but did not exit; killing it",
                 id=session.id, pid=old.pid)
        self.send_signal(old, signal.SIGKILL)
        await self.gone(old, AGENT_EXIT_SECONDS)

    async def limit(self, session: Session) -> str | None:
        """The ``cgroup.procs`` of the jailed ``session``'s new cgroup with
        the configured limits, or None (no limits, or none possible here:
        said once in the log)."""
        settings = self.config().jail
        limits = cgroups.wanted(settings.memory_max, settings.cpu_max, settings.pids_max)
        if not limits:
            return None
        reason = await self.blocking(self.cgroups.unavailable, limits)
        if reason is None:
            try:
                return await self.blocking(self.cgroups.create, session.id, limits)
            except OSError as error:
                reason = str(error)
        if not self._said_no_cgroups:
            self._said_no_cgroups = True
            log.warn("jailed sessions run WITHOUT their resource limits ({limits}): {reason}",
                     limits=" ".join(f"{k}={v}" for k, v in limits.items()), reason=reason)
        return None

    async def jailed_agent(self, outer: ProcessId) -> ProcessId:
        """nxagent's own host pid in its jail: bubblewrap (``outer``) is not
        the agent, and signals to it would not reach nxagent."""
        deadline = self.reactor.seconds() + self.settings.agent_start_timeout
        while self.reactor.seconds() < deadline:
            agent = await self.blocking(processes.jailed_child, outer.pid, "nxagent")
            if agent is not None:
                return agent
            if not outer.alive():
                raise LaunchError("bubblewrap ended before nxagent ran in the jail (see the agent's log)")
            await task.deferLater(self.reactor, 0.02, lambda: None)
        self.send_signal(outer, signal.SIGKILL)
        raise LaunchError("nxagent did not start in its jail in time")

    async def start_program(self, session: Session, agent_files: nxagent.AgentFiles, secret: str | None,
                            report: bool, extra_env: dict[str, str] | None = None,
                            argv: tuple[str, ...] | None = None) -> tuple[ProcessId, defer.Deferred[str]]:
        """Start the session's program (raises LaunchError or OSError); with
        ``report``, the Deferred gives its status line.  ``extra_env``: what
        the session's services add (PULSE_SERVER, CUPS_SERVER, ...).  ``argv``:
        another program in the session instead (a published application)."""
        plan = self.plan(session)
        user = await self.blocking(pwd.getpwuid, session.uid)
        request = {
            "user": user.pw_name,
            "argv": list(argv if argv is not None else plan.program),
            "env": login_environment(user, self.settings),
            "env_fixed": {**nxagent.x11_environment(session, agent_files, {**(extra_env or {}), **dict(plan.program_env)}),
                          **bus_environment(self.config().dbus, os.environ),
                          processes.SESSION_MARKER: session.id, processes.SESSION_ID_VARIABLE: session.id},
            "cwd": user.pw_dir,
            "log": agent_files.app_log,
            "stdin": secret,
            "status_fd": report,
        }
        if session.agent_pid and not await self.blocking(processes.same_pid_namespace, session.agent_pid):
            # The agent is jailed: the program joins its namespaces (and cgroup).
            request["join"] = [session.agent_pid, session.agent_started]
            procs = os.path.join(self.cgroups.parent, session.id, "cgroup.procs")
            request["cgroup"] = procs if await self.blocking(os.path.exists, procs) else None
        else:  # a jail sees no state directory: only programs outside one share the user's compose cache
            cache = await self.blocking(prepare_compose_cache, self.layout.root, session.uid, session.gid)
            request["env"].update(compose_cache_environment(cache))
        return await self.launcher.start_reporting(request)

    def watch_exit(self, process: ProcessId, on_exit: Callable[[], None]) -> ExitWatch:
        return ExitWatch(self.reactor, process, on_exit)

    def listens(self, session: Session) -> defer.Deferred[bool]:
        """Whether the agent itself holds its session's TCP port (a scan of
        /proc/net/tcp{,6} and the agent's fds: through ``blocking``)."""
        check = self._listens or processes.listens
        return self.blocking(check, session.agent_pid, session.port)

    # ------------------------------------------------------------ signals
    def signal_agent(self, session: Session, signum: int) -> bool:
        return self.send_signal(ProcessId(session.agent_pid, session.agent_started), signum)

    def signal_program(self, session: Session, signum: int) -> bool:
        return self.send_signal(ProcessId(session.app_pid, session.app_started), signum)

    @staticmethod
    def end_program_group(session: Session) -> None:
        """The session program leads its own process group: end all of it."""
        processes.signal_group(ProcessId(session.app_pid, session.app_started), signal.SIGTERM)

    async def resend_sighup(self, session: Callable[[], Session],
                            taken: Callable[[set[State], float], Awaitable[Any]],
                            timeout_error: type[Exception]) -> None:
        """SIGHUP a suspended agent until it listens again.

        nxagent ignores a SIGHUP that comes right after it suspended (it is
        still tearing down the old link), which a take-over or a quick
        reconnect always meets: the signal is repeated soon, but only until
        the agent says it is resuming, as a SIGHUP then would suspend it
        again.  ``taken(states, seconds)`` waits for the session to reach
        one of ``states`` and raises ``timeout_error`` if it does not."""
        for attempt in range(SIGHUP_ATTEMPTS):
            current = session()
            self.signal_agent(current, signal.SIGHUP)
            try:
                await taken({State.RESUMING, State.WAITING}, SIGHUP_RETRY_SECONDS)
                break
            except timeout_error:
                log.debug("session {id}: SIGHUP {n} not taken yet", id=current.id, n=attempt + 1)
        else:
            raise timeout_error(f"nxagent did not resume after {SIGHUP_ATTEMPTS} SIGHUPs")
        await taken({State.WAITING}, RESUME_LISTEN_SECONDS)

    async def gone(self, process: ProcessId, timeout: float) -> bool:
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

    async def kill_lingering(self, session_id: str, agent: ProcessId) -> None:
        """The tail of a terminate: an agent that said it ended but lives on
        gets SIGKILL (through the pidfd, so only if it still is that agent)."""
        if not await self.gone(agent, 5.0):
            log.warn("session {id}: nxagent still running after it ended; killing it", id=session_id)
            self.send_signal(agent, signal.SIGKILL)
            await self.gone(agent, 5.0)

    def end_watchdog(self, session: Session) -> defer.Deferred[None]:
        """nxagent waits for its watchdog, which waits for a client proxy that
        may never say goodbye (Neatx saw agents that never exit): end it.
        The watchdog is the agent's forked ``nxagent`` child, found in /proc
        rather than from its log line, which a restarted gateway never saw.
        SIGKILL, because a fresh watchdog sometimes still runs nxagent's
        SIGTERM handler and lives on (one suspend in ~10 hung for 20 s); it
        holds nothing to clean up.

        Not before the agent sleeps in select(): nxcomp's wait re-checks its
        watchdog only when that select() returns, and the SIGCHLD of the
        watchdog's end is what makes it return.  A SIGCHLD that comes while
        the agent still writes its log lines is handled there and lost, and
        the agent then sleeps out its 5-second select (suspend) or until the
        second SIGTERM 2 s later (terminate): the "sometimes seconds" of a
        busy machine.  The agent is normally in select() by the time its log
        line has reached us, so this adds no wait; where /proc cannot tell
        (``in_select`` answers None), the watchdog is ended at once."""
        return defer.ensureDeferred(self._end_watchdog(session))

    async def _end_watchdog(self, session: Session) -> None:
        if not session.agent_pid:
            return
        children = await self.blocking(processes.named_children, session.agent_pid, "nxagent")
        if not children:
            return
        for _ in range(WATCHDOG_AGENT_CHECKS):
            if await self.blocking(self._in_select, session.agent_pid) is not False:
                break
            await task.deferLater(self.reactor, WATCHDOG_AGENT_CHECK_SECONDS, lambda: None)
        else:
            log.debug("session {id}: nxagent not seen in select(); ending its watchdog anyway", id=session.id)
        for child in children:
            log.debug("session {id}: ending nxagent's watchdog {pid}", id=session.id, pid=child.pid)
            self.send_signal(child, signal.SIGKILL)

    def end_leftovers(self, session: Session) -> defer.Deferred[None]:
        """Whatever the session started ends with it, also daemons that left
        its process group (gpg-agent, dbus-daemon): SIGTERM now, SIGKILL to
        what is still there after LEFTOVER_GRACE_SECONDS.  They are found by
        the session's marker in their environment (processes.tagged_processes)."""

        def signal_all(tagged: list[ProcessId], signum: int) -> int:
            for process in tagged:
                self.send_signal(process, signum)
            # The agent itself, on its way out after it said it ended, is no leftover to tell of (nor to
            # wait for here: kill_if_alive is its own).
            return sum(1 for process in tagged if process.pid != session.agent_pid)

        def scan() -> defer.Deferred[list[ProcessId]]:
            return self.blocking(processes.tagged_processes, session.id, session.uid)

        def later() -> None:
            def killed(left: int) -> None:
                if left:
                    log.warn("session {id} of {user}: killed {count} processes that ignored SIGTERM",
                             id=session.id, user=session.user, count=left)
            scan().addCallback(signal_all, signal.SIGKILL).addCallback(killed).addErrback(
                lambda failure: log.failure("session {id}: ending its leftovers failed", failure, id=session.id))

        def first(left: int) -> None:
            if left:
                log.info("session {id} of {user}: ending {count} processes it started", id=session.id,
                         user=session.user, count=left)
                self.reactor.callLater(LEFTOVER_GRACE_SECONDS, later)

        return scan().addCallback(signal_all, signal.SIGTERM).addCallback(first)

    def kill_if_alive(self, process: ProcessId) -> None:
        if process.alive():
            log.warn("nxagent pid {pid} lingered after its session ended; killing it", pid=process.pid)
            self.send_signal(process, signal.SIGKILL)

    # ------------------------------------------------------------ the end
    def remove(self, directory: str) -> defer.Deferred[None]:
        return self.blocking(files.remove_tree, directory).addErrback(
            lambda failure: log.failure("cannot remove {path}", failure, path=directory))

    async def clean_up(self, session: Session) -> None:
        """Everything an ended session leaves behind: its program's group, its
        leftovers, a lingering agent, its directory and its PAM session."""
        self.end_program_group(session)
        try:
            await self.end_leftovers(session)
        except Exception:
            log.failure("session {id}: ending its leftovers failed", id=session.id)
        agent = ProcessId(session.agent_pid, session.agent_started)
        if agent.alive():
            # It said it terminated; it should be gone in a moment.
            self.reactor.callLater(5, self.kill_if_alive, agent)
        await self.remove(self.layout.agent_files(session.id).directory)
        try:
            await self.blocking(self.cgroups.remove, session.id)
        except OSError as error:
            log.warn("session {id}: cannot remove its cgroup: {error}", id=session.id, error=str(error))
        if session.agent_pid and self.plan(session).pam:
            try:
                await self.launcher.close_pam({"user": session.user, "pam": self.pam_request(session)})
            except (LaunchError, OSError) as error:
                log.warn("session {id}: closing the PAM session failed: {error}", id=session.id, error=str(error))

    # ------------------------------------------------------------ restart
    async def adopt(self, session: Session, on_line: Callable[[str], None]) -> Adopted:
        """Take back a running agent: replay its log (in a thread) to learn
        its state, then follow the log from where the replay stopped."""
        agent_files = self.layout.agent_files(session.id)
        state = ReplayState()
        try:
            offset = await self.blocking(replay, agent_files.log, state.feed)
        except OSError as error:
            log.warn("session {id}: its log {path} cannot be read ({error}); its state stays as stored",
                     id=session.id, path=agent_files.log, error=str(error))
            state.state, state.attached = session.state, session.ever_attached
            return Adopted(state, None)
        follower = LogFollower(self.notifier, agent_files.log, on_line, offset=offset, reactor=self.reactor)
        return Adopted(state, follower)

    async def find_orphans(self, known: Callable[[str], bool], store_location: str,
                           backup_location: str | None) -> None:
        """Report what the store should know but does not (it was lost,
        truncated or replaced): agents still running in session
        directories, whose displays are then never handed out while they
        live, and directories of sessions whose agent is gone, removed."""
        try:
            names = os.listdir(self.layout.sessions)
        except OSError as error:
            log.error("cannot list {path} ({error}): sessions the store does not know stay unseen",
                      path=self.layout.sessions, error=str(error))
            names = []
        agents = await self.blocking(processes.agents_in, self.layout.sessions)
        for session_id in sorted(set(names) | set(agents)):
            if known(session_id):
                continue
            directory = os.path.join(self.layout.sessions, session_id)
            agent = agents.get(session_id)
            if agent is None:
                log.warn("session directory {path} belongs to no known session and no nxagent runs in it; "
                         "removing it", path=directory)
                await self.remove(directory)
                continue
            user = await self.blocking(_owner_of, agent.pid)
            display = processes.display_argument(agent.pid) or 0
            self.orphans[session_id] = Orphan(session_id, user, display, agent)
            log.error(
                "session {id} of {user} (display :{display}, nxagent pid {pid}) runs but the session store does "
                "not know it (was {store} lost or replaced?); its display stays reserved while it runs. Its user "
                "cannot reach it: end it with 'kill {pid}', or stop nxgate and restore the store from {backup}",
                id=session_id, user=user, display=display, pid=agent.pid, store=store_location,
                backup=backup_location, audit="session_orphan",
            )

    async def forget_orphans(self) -> None:
        """Free the displays of unknown sessions whose agent has ended."""
        for session_id, orphan in list(self.orphans.items()):
            if not orphan.agent.alive():
                del self.orphans[session_id]
                log.info("unknown session {id} of {user} on display :{display} has ended", id=session_id,
                         user=orphan.user, display=orphan.display)
                await self.remove(os.path.join(self.layout.sessions, orphan.session_id))


#: The system calls nxcomp's select() is made of, by machine (glibc's select
#: is pselect6 on these); /proc/PID/syscall starts with the number.
SELECT_SYSCALLS = {"x86_64": frozenset({23, 270}), "aarch64": frozenset({72})}


def in_select(syscall_line: str, machine: str) -> bool | None:
    """Whether a /proc/PID/syscall line says the process sleeps in select();
    None when that cannot be told on ``machine``."""
    numbers = SELECT_SYSCALLS.get(machine)
    first = syscall_line.split(" ", 1)[0].strip()
    if numbers is None or not first:
        return None
    if first == "running" or first.startswith("-"):
        return False  # on a CPU, or between system calls (preempted)
    try:
        return int(first) in numbers
    except ValueError:
        return None


def waits_in_select(pid: int) -> bool | None:
    """:func:`in_select` for a running process (root reads any /proc/PID/syscall;
    a small read, still run through ``blocking``)."""
    try:
        with open(f"/proc/{pid}/syscall", encoding="ascii", errors="replace") as handle:
            line = handle.read()
    except OSError:
        return None
    return in_select(line, os.uname().machine)


def _group_names(user: pwd.struct_passwd) -> list[str]:
    """The names of ``user``'s groups (an NSS look-up: through ``blocking``)."""
    names = []
    for gid in os.getgrouplist(user.pw_name, user.pw_gid):
        try:
            names.append(grp.getgrgid(gid).gr_name)
        except KeyError:
            continue  # a gid without a name is in no configured group
    return names


def _owner_of(pid: int) -> str:
    try:
        return pwd.getpwuid(os.stat(f"/proc/{pid}").st_uid).pw_name
    except (OSError, KeyError) as error:
        log.debug("owner of pid {pid} unknown: {error}", pid=pid, error=str(error))
        return "?"


def _empty_file(path: str) -> None:
    """Truncate a log of root's (the logs directory is root's alone)."""
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.ftruncate(fd, 0)
    finally:
        os.close(fd)


