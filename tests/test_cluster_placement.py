"""Placement: the documented score, who may take a session at all, ties,
and the NX error when no node can (issue 13)."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from nxgate.gateway.placement import MIN_FREE_MEMORY, NO_NODE, eligible, place, ranked, score
from nxgate.protocols.nx.dispatch import as_nx
from nxgate.vocabulary.errors import Kind, SessionError
from nxgate.vocabulary.model import Member

NOW = 1000.0
GIB = 1024 ** 3


def node(name, sessions=0, load=0.0, cpus=2, weight=1.0, drained=False, beat=NOW, memory=GIB,
         roles=("gateway", "node")):
    return Member(name=name, address=f"{name}:7022", roles=frozenset(roles), started=0.0, last_heartbeat=beat,
                  sessions=sessions, load=load, cpus=cpus, free_memory=memory, drained=drained, weight=weight)


class ScoreTests(SynchronousTestCase):
    def test_formula(self):
        self.assertEqual(score(node("a", sessions=3, load=1.0, cpus=2, weight=1.0)), (3 + 1 + 1.0) / 2)
        self.assertEqual(score(node("a", sessions=3, load=1.0, cpus=2, weight=2.0)), (3 + 1 + 1.0) / 4)
        self.assertEqual(score(node("a", sessions=3, load=1.0, cpus=2), pending=2), (3 + 2 + 1 + 1.0) / 2)

    def test_fewest_sessions_per_cpu_wins(self):
        self.assertEqual(place([node("a", sessions=4), node("b", sessions=1)], NOW).name, "b")
        # Same sessions, twice the CPUs: half the score.
        self.assertEqual(place([node("a", sessions=4, cpus=2), node("b", sessions=4, cpus=4)], NOW).name, "b")

    def test_load_counts_beside_sessions(self):
        self.assertEqual(place([node("a", sessions=1, load=3.0), node("b", sessions=2, load=0.0)], NOW).name, "b")

    def test_weight_shares(self):
        # b has twice the weight: it is chosen until it holds about twice a's sessions.
        self.assertEqual(place([node("a", sessions=2), node("b", sessions=4, weight=2.0)], NOW).name, "b")
        self.assertEqual(place([node("a", sessions=2), node("b", sessions=6, weight=2.0)], NOW).name, "a")

    def test_ties_go_to_the_first_name(self):
        self.assertEqual(place([node("zeta"), node("alpha"), node("mid")], NOW).name, "alpha")

    def test_pending_spreads_a_burst(self):
        members = [node("a"), node("b")]
        pending = {}
        chosen = []
        for _ in range(4):
            name = place(members, NOW, pending=pending).name
            pending[name] = pending.get(name, 0) + 1
            chosen.append(name)
        self.assertEqual(chosen, ["a", "b", "a", "b"])


class EligibilityTests(SynchronousTestCase):
    def test_never_a_node_whose_link_is_refused_or_broken(self):
        """A member whose certificate is from another CA heartbeats into the shared database like any; the
        gateway's link to it is refused, and placement never chooses it, however idle."""
        refused = "refused: certificate not from the cluster's CA"
        links = {"idle": refused, "cut": "unreachable: its connection closed", "new": "connecting"}.get
        members = [node("idle"), node("cut"), node("busy", sessions=9), node("new", sessions=5)]
        self.assertEqual([m.name for m in ranked(members, NOW, links=links)], ["new", "busy"])
        self.assertFalse(eligible(node("idle"), NOW, link=refused))
        with self.assertRaises(SessionError):
            place([node("idle")], NOW, links=links)

    def test_only_up_undrained_weighted_nodes_with_memory(self):
        self.assertTrue(eligible(node("a"), NOW))
        self.assertFalse(eligible(node("a", roles=("gateway",)), NOW))
        self.assertFalse(eligible(node("a", drained=True), NOW))
        self.assertFalse(eligible(node("a", weight=0.0), NOW))
        self.assertFalse(eligible(node("a", memory=MIN_FREE_MEMORY - 1), NOW))
        self.assertTrue(eligible(node("a", memory=MIN_FREE_MEMORY), NOW))
        # Down after three missed heartbeats, by the reader's clock.
        self.assertTrue(eligible(node("a", beat=NOW - 6.0), NOW, heartbeat=2.0))
        self.assertFalse(eligible(node("a", beat=NOW - 6.5), NOW, heartbeat=2.0))

    def test_the_best_node_is_skipped_when_it_cannot_take_one(self):
        members = [node("idle-drained", drained=True), node("idle-down", beat=0.0), node("busy", sessions=9)]
        self.assertEqual([m.name for m in ranked(members, NOW)], ["busy"])
        self.assertEqual(place(members, NOW).name, "busy")

    def test_no_node_is_a_clear_599(self):
        for members in ([], [node("a", drained=True)], [node("a", roles=("gateway",))]):
            with self.assertRaises(SessionError) as raised:
                place(members, NOW)
            self.assertIs(raised.exception.kind, Kind.LIMIT_REACHED)
            self.assertEqual(raised.exception.message, NO_NODE)
            nx = as_nx(raised.exception)
            self.assertEqual(nx.code, 599)
