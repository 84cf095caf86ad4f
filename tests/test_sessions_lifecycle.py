"""The written operations table and the background-work watch."""

from __future__ import annotations

from twisted.internet import defer
from twisted.trial.unittest import TestCase

from nxgate.vocabulary.model import FOR_LATER, Session, State, listed_status
from nxgate.vocabulary.results import SessionView
from nxgate.node.lifecycle import OPERATIONS, Action, Background, Op, action


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

    def test_a_session_started_for_later_is_attached_first_while_it_waits(self):
        self.assertIs(action(Op.RESTORE, State.WAITING, ever_attached=False, for_later=True), Action.FIRST_ATTACH)
        # Once a client came, it is a session like any other.
        self.assertIs(action(Op.RESTORE, State.WAITING, ever_attached=True, for_later=True), Action.TAKE_OVER)
        # Only a waiting one: a start still under way is refused as before.
        self.assertIs(action(Op.RESTORE, State.STARTING, for_later=True), Action.REFUSE)
        self.assertIs(action(Op.RESTORE, State.RUNNING, ever_attached=False, for_later=True), Action.REFUSE)
        self.assertIs(action(Op.SUSPEND, State.WAITING, for_later=True), Action.REFUSE)

    def test_a_session_waiting_for_a_later_client_is_listed_as_suspended(self):
        later = Session(id="A" * 32, user="alice", uid=1000, gid=1000, type="unix-console", name="work",
                        display=1001, server_name="host", cookie="c" * 32, state=State.WAITING,
                        options={FOR_LATER: True})
        self.assertTrue(later.for_later)
        self.assertEqual(SessionView.of(later).status, "Suspended")
        self.assertEqual(SessionView.of(later.evolve(options={})).status, "Running")
        attached = later.evolve(ever_attached=True)
        self.assertFalse(attached.for_later)
        self.assertEqual(SessionView.of(attached).status, "Running")
        self.assertEqual(SessionView.of(later.evolve(state=State.RUNNING, ever_attached=True)).status, "Running")
        self.assertEqual(listed_status(State.STARTING, for_later=True), "Running")


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
