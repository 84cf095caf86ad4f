"""Who may shadow whom: the policy table, and reading X authority files."""

from twisted.trial.unittest import SynchronousTestCase

from nxgate.config import ShadowSection
from nxgate.node.agents.x11 import cookie_in_xauthority, xauthority
from nxgate.node.shadow_policy import decide

ADMINS = frozenset({"nxadmin"})
NOBODY = frozenset({"users"})


class PolicyTests(SynchronousTestCase):
    def test_own_sessions_without_asking(self):
        decision = decide("alice", NOBODY, "alice", ShadowSection())
        self.assertEqual((decision.allowed, decision.ask_owner, decision.interactive), (True, False, True))

    def test_admins_are_asked_for_by_default(self):
        decision = decide("bob", ADMINS, "alice", ShadowSection())
        self.assertEqual((decision.allowed, decision.ask_owner), (True, True))
        self.assertFalse(decide("bob", ADMINS, "alice", ShadowSection(ask_owner_for_admins=False)).ask_owner)

    def test_plain_users_may_not_shadow_others(self):
        decision = decide("carol", NOBODY, "alice", ShadowSection())
        self.assertFalse(decision.allowed)
        self.assertIn("may not shadow", decision.reason)
        self.assertTrue(decide("carol", NOBODY, "alice", ShadowSection(allow_others="everyone")).ask_owner)
        self.assertFalse(decide("bob", ADMINS, "alice", ShadowSection(allow_others="nobody")).allowed)

    def test_view_only(self):
        self.assertFalse(decide("alice", NOBODY, "alice", ShadowSection(), view_only_requested=True).interactive)
        self.assertFalse(decide("alice", NOBODY, "alice", ShadowSection(interactive=False)).interactive)

    def test_disabled(self):
        self.assertFalse(decide("alice", ADMINS, "alice", ShadowSection(enabled=False)).allowed)
        self.assertFalse(decide("alice", ADMINS, "alice", ShadowSection(allow_own=False)).allowed)


class XauthorityTests(SynchronousTestCase):
    def test_round_trip_and_lookup(self):
        data = xauthority(5, "00" * 16) + xauthority(7, "ab" * 16)
        self.assertEqual(cookie_in_xauthority(data, 7), "ab" * 16)
        self.assertEqual(cookie_in_xauthority(data, 5), "00" * 16)
        self.assertIsNone(cookie_in_xauthority(data, 6))

    def test_truncated_file(self):
        data = xauthority(7, "ab" * 16)
        self.assertIsNone(cookie_in_xauthority(data[: data.index(b"MIT-MAGIC-COOKIE-1") + 20], 7))
