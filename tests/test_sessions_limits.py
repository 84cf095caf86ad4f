"""Admission limits alone (no manager); display allocation is tests/test_node_displays.py."""

from __future__ import annotations

from twisted.trial.unittest import TestCase

from nxgate.config import Config, SessionsSection
from nxgate.vocabulary.model import Session, State
from nxgate.vocabulary.caller import Caller
from nxgate.vocabulary.errors import Kind, SessionError
from nxgate.limits import Limits


def session(user: str, state: State = State.RUNNING) -> Session:
    return Session(id=user + str(id(object())), user=user, uid=1000, gid=1000, type="unix-desktop", name="x",
                   display=1, server_name="n", cookie="c", created=0.0, changed=0.0, state=state)


class LimitsTests(TestCase):
    def setUp(self):
        self.config = Config(sessions=SessionsSection(max_sessions=3, max_sessions_per_user=1),
                             limits={"user.bob": 2, "group.staff": 0, "group.few": 1})
        self.limits = Limits(lambda: self.config)
        self.alice = Caller(user="alice", uid=1000, gid=1000)

    def refused(self, caller, sessions):
        error = self.assertRaises(SessionError, self.limits.check, caller, sessions)
        self.assertEqual(error.kind, Kind.LIMIT_REACHED)
        return error.message

    def test_per_user_then_per_group_then_total(self):
        self.limits.check(self.alice, [session("bob"), session("alice", State.TERMINATED)])
        self.assertEqual(self.refused(self.alice, [session("alice")]), "Server capacity: reached for user: alice")
        staff = Caller(user="alice", uid=1000, gid=1000, groups=frozenset({"staff", "few"}))
        self.limits.check(staff, [session("alice")])  # group 0 means no limit
        self.assertEqual(self.limits.user_limit("bob"), 2)
        self.assertIn("maximum number", self.refused(staff, [session("a"), session("b"), session("c")]))

    def test_draining_refuses_everyone_and_counts_as_capacity(self):
        self.limits.draining = True
        self.assertIn("maintenance", self.refused(self.alice, []))
        self.assertTrue(self.limits.at_capacity(self.alice, []))
        self.limits.draining = False
        self.assertFalse(self.limits.at_capacity(self.alice, []))

    def test_placement_is_the_local_node(self):
        self.assertEqual(self.limits.node_for(self.alice), self.config.server_name)
