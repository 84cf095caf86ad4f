"""The session state machine, driven by the agent's events."""

from twisted.trial.unittest import SynchronousTestCase

from nxgate.node.agents.agentlog import AgentEvent as E
from nxgate.vocabulary.model import Session, State as S, advance, listed_status


def run(events, state=S.CREATED):
    seen = []
    for event in events:
        new = advance(state, event)
        if new is not None:
            state = new
            seen.append(state)
    return seen


class TransitionTests(SynchronousTestCase):
    def test_start_attach_drop_resume_terminate(self):
        self.assertEqual(
            run([E.STARTING, E.WAITING, E.RUNNING, E.DISPLAY_FAILURE, E.SUSPENDING, E.SUSPENDED,
                 E.RESUMING, E.WAITING, E.RUNNING, E.TERMINATING, E.TERMINATED]),
            [S.STARTING, S.WAITING, S.RUNNING, S.SUSPENDING, S.SUSPENDED, S.RESUMING, S.WAITING, S.RUNNING,
             S.TERMINATING, S.TERMINATED],
        )

    def test_server_side_suspend(self):
        self.assertEqual(run([E.SUSPENDING, E.SUSPENDED], S.RUNNING), [S.SUSPENDING, S.SUSPENDED])

    def test_wrong_cookie_falls_back_to_suspended(self):
        self.assertEqual(run([E.DISPLAY_FAILURE, E.SUSPENDED], S.WAITING), [S.SUSPENDED])

    def test_abort_at_first_connection(self):
        self.assertEqual(run([E.ABORTING, E.ABORTED], S.WAITING), [S.TERMINATING, S.TERMINATED])

    def test_repeated_and_unexpected_events_change_nothing(self):
        self.assertIsNone(advance(S.RUNNING, E.RUNNING))
        self.assertIsNone(advance(S.SUSPENDED, E.RUNNING))
        self.assertIsNone(advance(S.TERMINATED, E.WAITING))
        self.assertIsNone(advance(S.FAILED, E.TERMINATED))

    def test_every_live_state_can_end(self):
        for state in S:
            if state.live:
                self.assertEqual(advance(state, E.TERMINATED), S.TERMINATED)

    def test_listed_status(self):
        self.assertEqual(listed_status(S.SUSPENDING), "Suspended")
        self.assertEqual(listed_status(S.WAITING), "Running")
        self.assertIsNone(listed_status(S.TERMINATING))
        self.assertIsNone(listed_status(S.FAILED))

    def test_full_id_and_port(self):
        session = Session(id="A" * 32, user="u", uid=1, gid=1, type="unix-kde", name="n", display=1001,
                          server_name="host", cookie="c")
        self.assertEqual(session.full_id, "host-1001-" + "A" * 32)
        self.assertEqual(session.port, 5001)
