"""The agent supervisor alone: signals recorded through the injected
``send_signal``, blocking work run ``inline``, no session manager."""

from __future__ import annotations

import os
import signal
import subprocess

from twisted.internet import defer
from twisted.test.proto_helpers import MemoryReactorClock
from twisted.trial.unittest import TestCase

from nxgate.config import Config, SessionsSection
from nxgate.node import supervisor as supervision
from nxgate.node.supervisor import AgentSupervisor
from nxgate.node import files, processes
from nxgate.vocabulary.model import Session, State
from nxgate.node.processes import ProcessId
from tests.test_sessions_manager import ME, FakeLauncher, FakeNotifier, short_state_dir


class SupervisorTests(TestCase):
    def setUp(self):
        self.reactor = MemoryReactorClock()
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

    def test_leftovers_get_sigterm_then_sigkill(self):
        agent = self.stand_in()
        tagged = [ProcessId(agent.pid, agent.started)]
        self.patch(processes, "tagged_processes", lambda session_id, uid: tagged)
        self.successResultOf(self.supervisor.end_leftovers(self.session(agent)))
        self.assertEqual(self.signals, [(agent.pid, signal.SIGTERM)])
        self.reactor.advance(supervision.LEFTOVER_GRACE_SECONDS)
        self.assertEqual(self.signals, [(agent.pid, signal.SIGTERM), (agent.pid, signal.SIGKILL)])

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
