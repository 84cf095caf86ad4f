"""The agent supervisor alone: signals recorded through the injected
``send_signal``, blocking work run ``inline``, no session manager."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time

from twisted.internet import defer
from twisted.logger import formatEvent, globalLogPublisher
from twisted.trial.unittest import TestCase

from nxgate.config import Config, SessionsSection
from nxgate.node import supervisor as supervision
from nxgate.node.supervisor import AgentSupervisor
from nxgate.node import files, processes
from nxgate.node.agents import nxagent
from nxgate.vocabulary.model import Session, State
from nxgate.node.processes import ProcessId
from tests.test_sessions_manager import ME, FakeLauncher, FakeNotifier, short_state_dir
from tests.harness.clock import FakeReactor


class SupervisorTests(TestCase):
    def setUp(self):
        self.reactor = FakeReactor()
        self.layout = files.StateLayout(short_state_dir(self))
        self.layout.prepare()
        self.signals = []
        config = Config(sessions=SessionsSection(display_base=3400))
        self.supervisor = AgentSupervisor(self.reactor, lambda: config, self.layout, FakeLauncher(self),
                                          FakeNotifier(), "nxgate", send_signal=self.record)

    def record(self, process, signum):
        self.signals.append((process.pid, signum))
        return True

    def session(self, agent: ProcessId, **changes) -> Session:
        return Session(id="A" * 32, user=ME, uid=os.getuid(), gid=os.getgid(), type="unix-console", name="s",
                       display=3401, server_name="h", cookie="0" * 32, agent_pid=agent.pid,
                       agent_started=agent.started, **changes)

    def stand_in(self) -> ProcessId:
        process = subprocess.Popen(["sleep", "600"])
        self.addCleanup(lambda: (process.kill(), process.wait()))
        return ProcessId.of(process.pid)

    def test_a_lingering_agent_gets_sigkill_through_send_signal(self):
        agent = self.stand_in()
        d = defer.ensureDeferred(self.supervisor.kill_lingering("A" * 32, agent))
        self.reactor.advance(5)
        self.assertEqual(self.signals, [(agent.pid, signal.SIGKILL)])
        self.reactor.advance(5)
        self.successResultOf(d)

    def test_the_real_send_signal_spares_a_recycled_pid(self):
        """A pid whose start time is not the agent's any more gets nothing."""
        self.assertFalse(processes.send_signal(ProcessId(os.getpid(), 1), signal.SIGKILL))

    def test_the_sighup_is_sent_again_until_the_agent_takes_it(self):
        agent = self.stand_in()
        session = self.session(agent, state=State.SUSPENDED)
        waits = []

        class Late(Exception):
            pass

        async def taken(states, seconds):
            waits.append(frozenset(states))
            if len(waits) < 3:
                raise Late()

        self.successResultOf(defer.ensureDeferred(self.supervisor.resend_sighup(lambda: session, taken, Late)))
        # Two SIGHUPs not taken, the third taken, then the wait for it to listen.
        self.assertEqual(self.signals, [(agent.pid, signal.SIGHUP)] * 3)
        self.assertEqual(waits, [frozenset({State.RESUMING, State.WAITING})] * 3 + [frozenset({State.WAITING})])

    def leftover_lines(self) -> list[str]:
        events: list[dict] = []
        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        return events

    def test_leftovers_get_sigterm_then_sigkill(self):
        agent, daemon = self.stand_in(), self.stand_in()
        tagged = [agent, daemon]
        self.patch(processes, "tagged_processes", lambda session_id, uid: tagged)
        events = self.leftover_lines()
        self.successResultOf(self.supervisor.end_leftovers(self.session(agent)))
        self.assertEqual(self.signals, [(agent.pid, signal.SIGTERM), (daemon.pid, signal.SIGTERM)])
        told = [formatEvent(event) for event in events if event.get("count") is not None]
        self.assertEqual(told, ["session " + "A" * 32 + " of " + ME + ": ending 1 processes it started"])
        self.reactor.advance(supervision.LEFTOVER_GRACE_SECONDS)
        self.assertEqual(self.signals[2:], [(agent.pid, signal.SIGKILL), (daemon.pid, signal.SIGKILL)])

    def test_the_agent_on_its_way_out_is_no_leftover(self):
        """A normal end finds only the agent that said it ended: it gets its
        SIGTERM, but no line tells of leftovers and no SIGKILL round follows
        (a lingering agent is kill_if_alive's)."""
        agent = self.stand_in()
        self.patch(processes, "tagged_processes", lambda session_id, uid: [agent])
        events = self.leftover_lines()
        self.successResultOf(self.supervisor.end_leftovers(self.session(agent)))
        self.reactor.advance(supervision.LEFTOVER_GRACE_SECONDS)
        self.assertEqual(self.signals, [(agent.pid, signal.SIGTERM)])
        self.assertEqual([event for event in events if event.get("count") is not None], [])

    def test_adopt_replays_the_log_and_follows_on_from_its_end(self):
        agent = self.stand_in()
        session = self.session(agent, state=State.WAITING)
        agent_files = self.layout.agent_files(session.id)
        os.mkdir(agent_files.directory, 0o700)
        with open(agent_files.log, "w") as log:
            log.write("Info: Waiting for connection from '127.0.0.1' on socket 'tcp:*:7000'.\n"
                      "Session: Session started at 'now'.\nSession: Session suspended at 'now'.\nhalf a li")
        lines = []
        adopted = self.successResultOf(defer.ensureDeferred(self.supervisor.adopt(session, lines.append)))
        self.assertEqual((adopted.replay.state, adopted.replay.attached), (State.SUSPENDED, True))
        self.assertEqual(lines, [])  # the follower reads on from there, not the replayed lines again
        with open(agent_files.log, "a") as log:
            log.write("ne\n")
        adopted.follower.read()
        self.assertEqual(lines, ["half a line"])
        adopted.follower.stop()

    def test_unknown_directories_without_an_agent_are_removed(self):
        stale = self.layout.agent_files("D" * 32).directory
        os.mkdir(stale, 0o700)
        self.successResultOf(defer.ensureDeferred(self.supervisor.find_orphans(lambda sid: False, "db", None)))
        self.assertFalse(os.path.exists(stale))
        self.assertEqual(self.supervisor.orphans, {})


class SavedCacheTests(TestCase):
    """Before a resume the caches nxcomp saved when the last client left go
    (a loaded one stalls nx-libs' reconnection), and nothing else."""

    def setUp(self):
        self.reactor = FakeReactor()
        self.layout = files.StateLayout(short_state_dir(self))
        self.layout.prepare()
        config = Config(sessions=SessionsSection(display_base=3400))
        self.supervisor = AgentSupervisor(self.reactor, lambda: config, self.layout, FakeLauncher(self),
                                          FakeNotifier(), "nxgate")
        self.session = Session(id="A" * 32, user=ME, uid=os.getuid(), gid=os.getgid(), type="unix-console",
                               name="s", display=3401, server_name="h", cookie="0" * 32)
        self.agent_files = self.layout.agent_files(self.session.id)
        files.make_session_dir(self.agent_files.directory, os.getuid(), os.getgid())
        self.caches = os.path.join(self.agent_files.directory, "cache-console")

    def test_the_saved_caches_go_and_nothing_else(self):
        os.mkdir(self.caches)
        saved = ["C-" + "0123456789ABCDEF" * 2, "S-" + "F" * 32]
        kept = ["C-notacache", "notes.txt", "c-" + "0" * 32]
        for name in saved + kept:
            open(os.path.join(self.caches, name), "w").close()
        open(os.path.join(self.agent_files.directory, "C-" + "1" * 32), "w").close()  # not in the cache directory
        self.successResultOf(defer.ensureDeferred(self.supervisor.drop_saved_caches(self.session, self.agent_files)))
        self.assertEqual(sorted(os.listdir(self.caches)), sorted(kept))
        self.assertTrue(os.path.exists(os.path.join(self.agent_files.directory, "C-" + "1" * 32)))

    def test_a_link_in_place_of_the_cache_directory_is_not_followed(self):
        outside = tempfile.mkdtemp(prefix="nxgate-outside-")
        self.addCleanup(subprocess.run, ["rm", "-rf", outside], check=False)
        planted = os.path.join(outside, "C-" + "0" * 32)
        open(planted, "w").close()
        os.symlink(outside, self.caches)
        self.successResultOf(defer.ensureDeferred(self.supervisor.drop_saved_caches(self.session, self.agent_files)))
        self.assertTrue(os.path.exists(planted))

    def test_no_cache_directory_is_no_error(self):
        self.successResultOf(defer.ensureDeferred(self.supervisor.drop_saved_caches(self.session, self.agent_files)))

    def test_the_cache_directory_is_named_by_the_session_kind(self):
        application = self.session.evolve(type="unix-application")
        self.assertEqual(nxagent.cache_directory(application, self.agent_files),
                         os.path.join(self.agent_files.directory, "cache-application"))


class WatchdogTests(TestCase):
    """nxagent's watchdog is ended once the agent sleeps in select(), where
    the SIGCHLD of its end wakes it; not earlier, where that SIGCHLD is lost
    and the agent sleeps out a 5-second select (see end_watchdog)."""

    def setUp(self):
        self.reactor = FakeReactor()
        self.layout = files.StateLayout(short_state_dir(self))
        self.layout.prepare()
        self.signals = []
        self.answers = []
        self.asked = 0
        config = Config(sessions=SessionsSection(display_base=3400))
        self.supervisor = AgentSupervisor(self.reactor, lambda: config, self.layout, FakeLauncher(self),
                                          FakeNotifier(), "nxgate", send_signal=self.record,
                                          in_select=self.in_select)
        self.agent = ProcessId(4242, 1)
        self.watchdog = ProcessId(4243, 2)
        self.patch(processes, "named_children",
                   lambda pid, name: [self.watchdog] if (pid, name) == (self.agent.pid, "nxagent") else [])

    def record(self, process, signum):
        self.signals.append((process.pid, signum))
        return True

    def in_select(self, pid):
        self.assertEqual(pid, self.agent.pid)
        self.asked += 1
        return self.answers.pop(0) if self.answers else self.default

    def session(self) -> Session:
        return Session(id="A" * 32, user=ME, uid=os.getuid(), gid=os.getgid(), type="unix-console", name="s",
                       display=3401, server_name="h", cookie="0" * 32, agent_pid=self.agent.pid,
                       agent_started=self.agent.started)

    def test_an_agent_in_select_has_its_watchdog_ended_at_once_without_a_timer(self):
        self.default = True
        self.successResultOf(self.supervisor.end_watchdog(self.session()))
        self.assertEqual(self.signals, [(self.watchdog.pid, signal.SIGKILL)])
        self.assertEqual(self.reactor.getDelayedCalls(), [])

    def test_the_watchdog_lives_until_the_agent_reaches_select(self):
        self.answers, self.default = [False, False], True
        d = self.supervisor.end_watchdog(self.session())
        self.assertEqual(self.signals, [])  # still writing its log lines: a SIGCHLD now would be lost
        self.reactor.advance(supervision.WATCHDOG_AGENT_CHECK_SECONDS)
        self.assertEqual(self.signals, [])
        self.reactor.advance(supervision.WATCHDOG_AGENT_CHECK_SECONDS)
        self.successResultOf(d)
        self.assertEqual((self.signals, self.asked), ([(self.watchdog.pid, signal.SIGKILL)], 3))

    def test_an_agent_never_seen_in_select_still_has_its_watchdog_ended(self):
        self.default = False
        d = self.supervisor.end_watchdog(self.session())
        for _ in range(supervision.WATCHDOG_AGENT_CHECKS):
            self.reactor.advance(supervision.WATCHDOG_AGENT_CHECK_SECONDS)
        self.successResultOf(d)
        self.assertEqual(self.signals, [(self.watchdog.pid, signal.SIGKILL)])

    def test_where_proc_cannot_tell_the_watchdog_is_ended_at_once(self):
        self.default = None
        self.successResultOf(self.supervisor.end_watchdog(self.session()))
        self.assertEqual((self.signals, self.asked), ([(self.watchdog.pid, signal.SIGKILL)], 1))

    def test_no_watchdog_no_signal(self):
        self.default = True
        self.patch(processes, "named_children", lambda pid, name: [])
        self.successResultOf(self.supervisor.end_watchdog(self.session()))
        self.assertEqual((self.signals, self.asked), ([], 0))


class InSelectTests(TestCase):
    """The /proc/PID/syscall reading (pure)."""

    def test_pselect6_and_select_are_select_on_x86_64(self):
        self.assertTrue(supervision.in_select("270 0xb 0x7ffc 0x0 0x0 0x7ffc 0x0 0x7ffc 0x7f12\n", "x86_64"))
        self.assertTrue(supervision.in_select("23 0xb 0x7ffc 0x0 0x0 0x7ffc 0x7ffc 0x7f12\n", "x86_64"))
        self.assertTrue(supervision.in_select("72 0xb 0x7ffc 0x0 0x0 0x7ffc 0x0 0x7ffc 0x7f12\n", "aarch64"))

    def test_other_calls_running_and_preempted_are_not(self):
        self.assertFalse(supervision.in_select("1 0x2 0x55d0 0x3b 0x0 0x0 0x0 0x7ffc 0x7f12\n", "x86_64"))
        self.assertFalse(supervision.in_select("running\n", "x86_64"))
        self.assertFalse(supervision.in_select("-1 0x7ffc 0x7f12\n", "x86_64"))

    def test_unknown_machines_and_garbage_cannot_tell(self):
        self.assertIsNone(supervision.in_select("270 0xb\n", "riscv64"))
        self.assertIsNone(supervision.in_select("", "x86_64"))
        self.assertIsNone(supervision.in_select("what\n", "x86_64"))

    def test_a_process_blocked_in_select_is_seen_there(self):
        """The real /proc of a child sleeping in select()."""
        child = subprocess.Popen(["python3", "-c", "import select, sys; select.select([sys.stdin], [], [], 30)"],
                                 stdin=subprocess.PIPE)
        self.addCleanup(lambda: (child.kill(), child.wait(), child.stdin.close()))
        for _ in range(500):  # until it got there (the test measures no time)
            if supervision.waits_in_select(child.pid):
                break
            time.sleep(0.01)
        self.assertTrue(supervision.waits_in_select(child.pid))
        self.assertFalse(supervision.waits_in_select(os.getpid()))  # this one is reading its own /proc file
