"""The life cycle's side of a session started for later outliving nxagent's
own 60-second wait for a first client (issue 27 b), with the fakes of
tests/test_sessions_manager.py (a clock, stand-in agent processes, the
agent's log lines fed by hand).  The real thing, five minutes with a real
nxagent: tests/test_e2e_dbus_later.py."""

from __future__ import annotations

import signal

from twisted.internet import defer
from twisted.trial.unittest import TestCase

from nxgate.node.lifecycle import RENEW_AFTER_SECONDS
from nxgate.node.supervisor import AGENT_EXIT_SECONDS
from nxgate.vocabulary.model import State
from tests import test_sessions_manager as manager_tests
from tests.test_sessions_manager import READY, STARTED, nx

#: What nxagent writes when its watchdog ends its wait for a first client.
GIVES_UP = ("Info: Aborting the procedure due to signal '1'.",
            "Error: Aborting session with 'Unable to open display 'nx/nx,options=/x/options:3100''.",
            "Session: Aborting session at 'now'.",
            "Session: Session aborted at 'now'.")


class RenewTests(TestCase):
    setUp = manager_tests.ManagerTests.setUp
    agent_says = manager_tests.ManagerTests.agent_says
    started_for_later = manager_tests.ManagerTests.started_for_later

    def gives_up(self, session_id: str, exits: bool = True) -> None:
        """The agent says it gave up, then (``exits``) its stand-in ends as nxagent does."""
        self.agent_says(session_id, *GIVES_UP)
        session = self.manager.sessions.get(session_id)
        if exits and session is not None:
            self.end_stand_in(session.agent_pid)
        self.manager.lifecycle._agent_exited(session_id)

    def end_stand_in(self, pid: int) -> None:
        (process,) = [p for p in self.launcher.processes if p.pid == pid]
        process.kill()
        process.wait()

    def test_an_agent_that_lingers_after_giving_up_is_gone_before_the_display_is_taken_over(self):
        """Its exit unlinks its lock and socket file: the fresh agent starts only once it is gone (killed
        after AGENT_EXIT_SECONDS), so that nobody wins what it leaves between the take-over and the start."""
        session_id, _ = self.started_for_later()
        self.reactor.advance(60)
        old = self.manager.sessions[session_id].agent_pid
        agents = len(self.launcher.requests)
        self.gives_up(session_id, exits=False)
        self.assertEqual(len(self.launcher.requests), agents, "a fresh agent beside the old one")
        self.reactor.advance(AGENT_EXIT_SECONDS)
        (process,) = [p for p in self.launcher.processes if p.pid == old]
        self.assertEqual(process.wait(timeout=10), -signal.SIGKILL)
        self.reactor.advance(AGENT_EXIT_SECONDS)  # the test reactor does not read the pidfd that says it went
        self.assertEqual(len(self.launcher.requests), agents + 1, "no fresh agent once the old one was gone")

    def test_a_fresh_agent_when_nxagent_stops_waiting(self):
        session_id, _ = self.started_for_later()
        first = self.manager.sessions[session_id]
        for round_ in range(3):
            self.reactor.advance(60)
            agents = len(self.launcher.requests)
            self.gives_up(session_id)
            self.assertEqual(self.manager.sessions[session_id].state, State.WAITING)
            self.assertEqual(len(self.launcher.requests), agents + 1, "no fresh agent")
            self.assertEqual(self.launcher.requests[-1]["argv"], self.launcher.requests[0]["argv"])
            self.agent_says(session_id, READY)
        session = self.manager.sessions[session_id]
        self.assertNotEqual(session.agent_pid, first.agent_pid)
        self.assertEqual((session.display, session.cookie, session.for_later), (first.display, first.cookie, True))
        self.assertEqual(self.store.get(session_id).state, State.WAITING)
        self.assertNotIn(signal.SIGHUP, self.signals)
        reply = self.successResultOf(nx(self.manager, self.client, "restoresession", f'--id="{session_id}"'))
        self.assertIn(f"NX> 701 Proxy cookie: {first.cookie}", reply.lines)
        self.agent_says(session_id, STARTED)
        self.assertEqual(self.manager.sessions[session_id].state, State.RUNNING)

    def test_a_first_client_during_the_renewal_waits_until_the_agent_listens(self):
        session_id, _ = self.started_for_later()
        self.reactor.advance(60)
        self.gives_up(session_id)
        restore = nx(self.manager, self.client, "restoresession", f'--id="{session_id}"')
        self.assertNoResult(restore)
        self.agent_says(session_id, READY)
        self.successResultOf(restore)

    def test_an_agent_that_ends_early_still_fails_the_session(self):
        session_id, _ = self.started_for_later()
        self.reactor.advance(RENEW_AFTER_SECONDS / 4)
        agents = len(self.launcher.requests)
        self.gives_up(session_id)
        self.assertNotIn(session_id, self.manager.sessions)  # a broken agent is not started again and again
        self.assertIn(self.store.get(session_id).state, (State.FAILED, State.TERMINATED))
        self.assertEqual(len(self.launcher.requests), agents)

    def test_terminate_still_ends_it(self):
        session_id, _ = self.started_for_later()
        self.reactor.advance(60)
        done = defer.ensureDeferred(self.manager.lifecycle.terminate_session(session_id, "user request"))
        self.agent_says(session_id, "Info: Aborting the procedure due to signal '15'.",
                        "Session: Terminating session at 'now'.", "Session: Session terminated at 'now'.")
        self.manager.lifecycle._agent_exited(session_id)
        self.assertNotIn(session_id, self.manager.sessions)
        self.assertEqual(self.store.get(session_id).state, State.TERMINATED)
        self.assertIn(signal.SIGTERM, self.signals)
        self.reactor.advance(30)  # the stand-in agent's escalation ends; nothing restarts it
        self.assertEqual(len([r for r in self.launcher.requests if r["argv"] == self.launcher.requests[0]["argv"]]), 1)
        del done

    def test_a_session_started_normally_is_not_renewed(self):
        d, session_id = manager_tests.ManagerTests.start(self)
        self.agent_says(session_id, READY)
        self.successResultOf(d)
        self.reactor.advance(20)
        agents = len(self.launcher.requests)
        self.gives_up(session_id)
        self.assertNotIn(session_id, self.manager.sessions)
        self.assertEqual(len(self.launcher.requests), agents)
