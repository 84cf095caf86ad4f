"""The written operations table and the background-work watch."""

from __future__ import annotations

from twisted.internet import defer
from twisted.trial.unittest import TestCase

from nxgate.sessions.model import State
from nxgate.sessions.lifecycle import OPERATIONS, Action, Background, Op, action


class OperationsTableTests(TestCase):
    def test_every_operation_decides_every_live_state(self):
        live = {state for state in State if state.live}
        for op in Op:
            self.assertEqual(set(OPERATIONS[op]), live, f"{op.value} leaves states undecided")

    def test_take_over_only_of_a_session_that_had_a_client(self):
        self.assertIs(action(Op.RESTORE, State.RUNNING, ever_attached=True), Action.TAKE_OVER)
        self.assertIs(action(Op.RESTORE, State.WAITING, ever_attached=False), Action.REFUSE)
        self.assertIs(action(Op.RESTORE, State.SUSPENDED), Action.RESUME)
        self.assertIs(action(Op.SUSPEND, State.SUSPENDED), Action.NOTHING)
        self.assertIs(action(Op.SUSPEND, State.WAITING), Action.REFUSE)
        self.assertIs(action(Op.TERMINATE, State.STARTING), Action.TERMINATE)


class BackgroundTests(TestCase):
    def test_a_failure_is_logged_and_the_work_forgotten(self):
        background = Background()
        gate: defer.Deferred[None] = defer.Deferred()

        async def work():
            await gate
            raise ValueError("boom")

        d = background(work(), "testing", "S1")
        self.assertEqual(len(background.running), 1)
        gate.callback(None)
        self.assertEqual(background.running, set())
        self.assertIsNone(self.successResultOf(d))
        self.assertEqual(len(self.flushLoggedErrors(ValueError)), 1)

    def test_work_done_at_once_is_not_kept(self):
        background = Background()

        async def work():
            return 1

        self.assertEqual(self.successResultOf(background(work(), "testing")), 1)
        self.assertEqual(background.running, set())
