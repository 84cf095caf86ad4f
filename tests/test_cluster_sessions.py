"""The router: where a gateway sends each call of the session API
(placement, resume affinity, the merged listing, lost sessions, the store
down), with a fake store and fake nodes (issue 13)."""

from __future__ import annotations

from types import SimpleNamespace

from twisted.internet import defer
from twisted.trial.unittest import SynchronousTestCase

from nxgate.gateway.placement import NO_NODE
from nxgate.gateway.router import Router
from nxgate.config import Config
from nxgate.protocols.nx.dispatch import as_nx
from nxgate.vocabulary.caller import Caller
from nxgate.vocabulary.errors import Kind, SessionError
from nxgate.vocabulary.model import Member, Session, State
from nxgate.vocabulary.requests import DisplaySettings, RestoreRequest, ShadowRequest, ShareMount, StartRequest
from nxgate.vocabulary.results import Listing, Ready, ServiceStatus, SessionView, ShadowTarget
from nxgate.store.errors import StoreUnavailable
from tests.harness.fakes import FakeNodeAPI
from tests.harness.clock import FakeReactor

NOW = 5000.0
GIB = 1024 ** 3
ALICE = Caller("alice", 1001, 1001, address="192.0.2.7")
BOB = Caller("bob", 1002, 1002, address="192.0.2.8")
ADMIN = Caller("root", 0, 0, admin=True)
START = StartRequest(type="unix-default", name="work", display=DisplaySettings(), encrypted=True, rootless=False)


def member(name, sessions=0, beat=NOW, roles=("gateway", "node"), drained=False):
    return Member(name=name, address=f"127.0.0.{ord(name[-1]) - 95}:7022", roles=frozenset(roles), started=0.0,
                  last_heartbeat=beat, sessions=sessions, load=0.0, cpus=2, free_memory=GIB, drained=drained)


def row(session_id, user="alice", node="node-b", state=State.SUSPENDED, created=1.0, name="work"):
    return Session(id=session_id, user=user, uid=1001, gid=1001, type="unix-default", name=name, display=1001,
                   server_name="host", cookie="c" * 32, state=state, created=created, node=node)


class FakeStore:
    def __init__(self):
        self.members_ = {}
        self.rows = {}
        self.down = False

    def _answer(self, value):
        if self.down:
            return defer.fail(StoreUnavailable("the database server cannot be reached", "connection refused"))
        return defer.succeed(value)

    def members(self):
        return self._answer(sorted(self.members_.values(), key=lambda m: m.name))

    def live(self, user=None, node=None):
        return self._answer(sorted((r for r in self.rows.values() if r.state.live and user in (None, r.user)
                                    and node in (None, r.node)), key=lambda r: r.created))

    def get(self, session_id):
        return self._answer(self.rows.get(session_id))

    def swap(self, session):
        stored = self.rows.get(session.id)
        if stored is None or stored.revision != session.revision:
            return self._answer(False)
        self.rows[session.id] = session.evolve(revision=session.revision + 1)
        return self._answer(True)


class FakeNode(FakeNodeAPI):
    """A node: keeps what the tests compare in ``calls``, answers with the store's row."""

    def __init__(self, name, store, unreachable=False):
        self.name, self.store, self.calls, self.unreachable = name, store, [], unreachable
        super().__init__()

    def _check(self):
        if self.unreachable:
            error = SessionError(Kind.UNAVAILABLE, f"The session node {self.name} cannot be reached; try again later.")
            error.unreachable = True
            raise error

    async def on_start(self, caller, request):
        self._check()
        self.calls.append(("start", caller.user))
        session = row(f"{len(self.store.rows):032X}", caller.user, self.name, State.WAITING)
        self.store.rows[session.id] = session
        return Ready(SessionView.of(session), "cookie", False, None)

    async def on_start_for_later(self, caller, session_type, name):
        self._check()
        self.calls.append(("start_for_later", session_type, name))
        return SessionView.of(row("F" * 32, caller.user, self.name, State.WAITING))

    async def on_restore(self, caller, request):
        self.calls.append(("restore", request.session_id))
        return Ready(SessionView.of(self.store.rows[request.session_id]), "cookie", True, None)

    async def _about(self, method, caller, session_id, *rest):
        self.calls.append((method, session_id) + rest)
        return SessionView.of(self.store.rows[session_id])

    async def on_suspend(self, caller, session_id):
        return await self._about("suspend", caller, session_id)

    async def on_terminate(self, caller, session_id, reason="user request"):
        return await self._about("terminate", caller, session_id, reason)

    async def on_rename(self, caller, session_id, name):
        return await self._about("rename", caller, session_id, name)

    async def on_show(self, caller, session_id):
        return await self._about("show", caller, session_id)

    async def on_add_mount(self, caller, session_id, mount):
        self.calls.append(("add_mount", session_id, mount.share))
        return True

    async def on_shadow_targets(self, caller):
        self._check()
        return (ShadowTarget(f"console-{self.name}", "alice", 0, "console", "unix-console"),)

    async def on_attach_shadow(self, caller, request, progress=lambda p: None):
        self.calls.append(("attach_shadow", request.target_id))
        return Ready(SessionView.of(row("S" * 32, caller.user, self.name, State.WAITING)), "cookie", False, None)

    async def on_status(self, caller):
        self.calls.append(("status",))
        return ServiceStatus(False, 0, 0, ())

    async def on_set_draining(self, caller, on):
        self.calls.append(("set_draining", on))
        return on

    async def on_list(self, caller):
        """This node's own sessions, as its memory has them (the router asks only the local node)."""
        self.calls.append(("list",))
        mine = [SessionView.of(r) for r in self.store.rows.values()
                if r.node == self.name and r.state.live and caller.owns(r.user)]
        return Listing(tuple(sorted(mine, key=lambda v: v.created)), capacity_reached=False)

    def session(self, session_id):
        return None  # the router then reads the store, as for another member's session

    async def on_thumbnail(self, caller, session_id):
        self.calls.append(("thumbnail", session_id))
        return b"PNG of " + session_id.encode()

    async def connect(self):
        self.calls.append(("connect",))


def cluster_config(name="node-a", roles=("gateway", "node"), per_user=10):
    config = Config()
    config = config.replace(sessions=config.sessions.__class__(**{**config.sessions.__dict__,
                                                                   "max_sessions_per_user": per_user}))
    object.__setattr__(config, "cluster", SimpleNamespace(name=name, roles=frozenset(roles), heartbeat=2.0))
    return config


class RouterTests(SynchronousTestCase):
    def setUp(self):
        self.clock = FakeReactor()
        self.clock.advance(NOW)
        self.store = FakeStore()
        for name in ("node-a", "node-b", "node-c"):
            self.store.members_[name] = member(name)
        self.nodes = {name: FakeNode(name, self.store) for name in self.store.members_}
        self.local = self.nodes["node-a"]
        self.asked = []
        self.config = cluster_config()
        self.links = {}
        self.api = Router(self.clock, lambda: self.config, self.local, self.store, self.remote, self.links.get)

    def remote(self, name, address):
        self.asked.append((name, address))
        return self.nodes[name]

    def ok(self, coroutine):
        return self.successResultOf(defer.ensureDeferred(coroutine))

    def refused(self, coroutine):
        return self.failureResultOf(defer.ensureDeferred(coroutine), SessionError).value

    # ------------------------------------------------------------- start
    def test_start_goes_to_the_least_loaded_node_and_bursts_spread(self):
        self.store.members_["node-a"] = member("node-a", sessions=3)
        ready = self.ok(self.api.start(ALICE, START))
        self.assertEqual(ready.view.node, "node-b")
        self.assertEqual(self.asked, [("node-b", "127.0.0.3:7022")])
        # node-b's row still says 0 sessions (no heartbeat since): the next goes to node-c, then node-b again.
        nodes = [self.ok(self.api.start(ALICE, START)).view.node for _ in range(3)]
        self.assertEqual(nodes, ["node-c", "node-b", "node-c"])
        # A new heartbeat of node-b (with its sessions counted) replaces what was placed before it.
        self.store.members_["node-b"] = member("node-b", sessions=2, beat=NOW + 2)
        self.clock.advance(2)
        self.assertEqual(self.api._pending(self.store.members_), {"node-c": 2})

    def test_this_member_runs_its_own_sessions_without_the_wire(self):
        self.store.members_["node-b"] = member("node-b", sessions=5)
        self.store.members_["node-c"] = member("node-c", sessions=5)
        self.assertEqual(self.ok(self.api.start(ALICE, START)).view.node, "node-a")
        self.assertEqual(self.asked, [])
        self.assertEqual(self.local.calls, [("start", "alice")])

    def test_a_gateway_only_member_runs_nothing_itself(self):
        self.config = cluster_config(roles=("gateway",))
        self.store.members_["node-a"] = member("node-a", roles=("gateway",))
        nodes = {self.ok(self.api.start(ALICE, START)).view.node for _ in range(4)}
        self.assertEqual(nodes, {"node-b", "node-c"})
        self.assertEqual(self.local.calls, [])

    def test_drained_and_down_nodes_get_nothing_and_none_left_is_599(self):
        self.store.members_["node-a"] = member("node-a", drained=True)
        self.store.members_["node-b"] = member("node-b", beat=NOW - 60)
        self.assertEqual({self.ok(self.api.start(ALICE, START)).view.node for _ in range(3)}, {"node-c"})
        self.store.members_["node-c"] = member("node-c", drained=True)
        error = self.refused(self.api.start(ALICE, START))
        self.assertEqual((error.kind, error.message), (Kind.LIMIT_REACHED, NO_NODE))
        self.assertEqual(as_nx(error).code, 599)

    def test_an_unreachable_node_is_skipped_for_the_next(self):
        self.store.members_["node-a"] = member("node-a", sessions=9)
        self.nodes["node-b"].unreachable = True
        self.assertEqual(self.ok(self.api.start(ALICE, START)).view.node, "node-c")
        self.nodes["node-c"].unreachable = True
        self.assertEqual(self.ok(self.api.start(ALICE, START)).view.node, "node-a")

    def test_a_refusal_of_the_node_is_not_retried_elsewhere(self):
        async def refuse(caller, request):
            raise SessionError(Kind.UNAVAILABLE, "Session type 'x' is not offered.")
        self.store.members_["node-a"] = member("node-a", sessions=9)
        self.store.members_["node-c"] = member("node-c", sessions=9)
        self.nodes["node-b"].start = refuse
        self.assertEqual(self.refused(self.api.start(ALICE, START)).message, "Session type 'x' is not offered.")
        self.assertEqual(self.nodes["node-c"].calls, [])

    def test_the_users_limit_counts_his_sessions_on_every_node(self):
        self.config = cluster_config(per_user=2)
        self.store.rows["A" * 32] = row("A" * 32, node="node-b")
        self.store.rows["B" * 32] = row("B" * 32, node="node-c")
        self.store.rows["C" * 32] = row("C" * 32, user="bob", node="node-c")
        error = self.refused(self.api.start(ALICE, START))
        self.assertEqual(error.kind, Kind.LIMIT_REACHED)
        self.assertEqual(error.message, "Server capacity: reached for user: alice")
        self.assertTrue(self.ok(self.api.list(ALICE)).capacity_reached)
        self.assertFalse(self.ok(self.api.list(BOB)).capacity_reached)
        self.ok(self.api.start(BOB, START))
        self.assertEqual(self.refused(self.api.start_for_later(ALICE, "unix-default", "later")).kind,
                         Kind.LIMIT_REACHED)

    def test_start_for_later_is_placed_too(self):
        self.store.members_["node-a"] = member("node-a", sessions=9)
        self.store.members_["node-b"] = member("node-b", sessions=9)
        view = self.ok(self.api.start_for_later(ALICE, "unix-default", "later"))
        self.assertEqual(view.node, "node-c")
        self.assertEqual(self.nodes["node-c"].calls, [("start_for_later", "unix-default", "later")])

    # ----------------------------------------------------- resume affinity
    def test_every_call_about_a_session_goes_to_its_node(self):
        self.store.rows["A" * 32] = row("A" * 32, node="node-c")
        restore = RestoreRequest(session_id="A" * 32, display=DisplaySettings(), encrypted=True)
        self.assertTrue(self.ok(self.api.restore(ALICE, restore)).resumed)
        self.ok(self.api.suspend(ALICE, "A" * 32))
        self.ok(self.api.rename(ALICE, "A" * 32, "new name"))
        self.ok(self.api.show(ALICE, "A" * 32))
        self.ok(self.api.terminate(ALICE, "A" * 32, "bye"))
        self.assertEqual(self.nodes["node-c"].calls, [("restore", "A" * 32), ("suspend", "A" * 32),
                                                      ("rename", "A" * 32, "new name"), ("show", "A" * 32),
                                                      ("terminate", "A" * 32, "bye")])
        self.assertEqual(self.nodes["node-b"].calls, [])

    def test_a_share_is_mounted_by_the_node_of_its_session(self):
        self.store.rows["A" * 32] = row("A" * 32, node="node-c")
        mount = ShareMount(share="docs", name="docs", username="alice", password="secret", computer="laptop")
        self.assertTrue(self.ok(self.api.add_mount(ALICE, "A" * 32, mount)))
        self.assertEqual(self.nodes["node-c"].calls, [("add_mount", "A" * 32, "docs")])
        self.assertEqual(self.nodes["node-b"].calls, [])

    def test_sessions_of_this_member_and_of_before_the_cluster_are_local(self):
        self.store.rows["A" * 32] = row("A" * 32, node="node-a")
        self.store.rows["B" * 32] = row("B" * 32, node="")
        self.ok(self.api.suspend(ALICE, "A" * 32))
        self.ok(self.api.suspend(ALICE, "B" * 32))
        self.assertEqual(self.local.calls, [("suspend", "A" * 32), ("suspend", "B" * 32)])
        self.assertEqual(self.asked, [])

    def test_someone_elses_or_no_session_is_not_found(self):
        self.store.rows["A" * 32] = row("A" * 32, node="node-b")
        self.store.rows["E" * 32] = row("E" * 32, node="node-b", state=State.TERMINATED)
        error = self.refused(self.api.suspend(BOB, "A" * 32))
        self.assertEqual((error.kind, error.message), (Kind.NOT_YOURS, f"Could not find session {'A' * 32}."))
        self.assertEqual(self.refused(self.api.terminate(ALICE, "E" * 32)).kind, Kind.NOT_FOUND)
        self.assertEqual(self.refused(self.api.show(ALICE, "0" * 32)).kind, Kind.NOT_FOUND)
        self.assertEqual(self.nodes["node-b"].calls, [])
        self.ok(self.api.suspend(ADMIN, "A" * 32))  # the admin acts on every user's
        self.assertEqual(self.nodes["node-b"].calls, [("suspend", "A" * 32)])

    # -------------------------------------------------------- lost sessions
    def test_sessions_on_a_down_node_are_listed_as_lost_and_refused_clearly(self):
        self.store.rows["A" * 32] = row("A" * 32, node="node-b", created=1.0)
        self.store.rows["B" * 32] = row("B" * 32, node="node-c", created=2.0)
        self.store.rows["C" * 32] = row("C" * 32, user="bob", node="node-c", created=3.0)
        self.store.members_["node-b"] = member("node-b", beat=NOW - 6.5)  # three heartbeats and a bit
        listing = self.ok(self.api.list(ALICE))
        self.assertEqual([(v.id, v.name, v.lost) for v in listing.sessions],
                         [("A" * 32, "work", True), ("B" * 32, "work", False)])
        self.assertEqual(listing.sessions[0].status, "Suspended")
        self.assertEqual((listing.sessions[0].shown_status, listing.sessions[0].shown_state), ("Lost", "lost"))
        self.assertEqual((listing.sessions[1].shown_status, listing.sessions[1].shown_state), ("Suspended", "suspended"))
        restore = RestoreRequest(session_id="A" * 32, display=DisplaySettings(), encrypted=True)
        error = self.refused(self.api.restore(ALICE, restore))
        self.assertEqual(error.kind, Kind.UNAVAILABLE)
        self.assertIn("runs on machine node-b, which is down", error.message)
        self.assertEqual(as_nx(error).code, 596)
        self.assertTrue(self.ok(self.api.show(ALICE, "A" * 32)).lost)
        self.assertEqual(self.nodes["node-b"].calls, [])
        # Back: listed and resumed as before.
        self.store.members_["node-b"] = member("node-b", beat=NOW)
        self.assertFalse(any(v.lost for v in self.ok(self.api.list(ALICE)).sessions))
        self.ok(self.api.restore(ALICE, restore))
        self.assertEqual(self.nodes["node-b"].calls, [("restore", "A" * 32)])

    def test_a_session_named_like_a_lost_one_is_not_lost(self):
        """Issue 23: "lost" was a suffix of the name, so a user could make a
        session read as lost; it is a field of the view now."""
        self.store.rows["A" * 32] = row("A" * 32, node="node-b", name="x (machine down)", state=State.RUNNING)
        (view,) = self.ok(self.api.list(ALICE)).sessions
        self.assertEqual((view.name, view.lost, view.shown_status, view.shown_state),
                         ("x (machine down)", False, "Running", "running"))

    def lost(self, session_id):
        return next(view for view in self.ok(self.api.list(ALICE)).sessions if view.id == session_id).lost

    def test_a_node_is_up_only_while_this_gateways_link_to_it_works(self):
        self.store.rows["A" * 32] = row("A" * 32, node="node-b")
        self.store.members_["node-a"] = member("node-a", sessions=9)
        self.store.members_["node-c"] = member("node-c", sessions=9)
        self.links["node-b"] = "unreachable: its connection closed"  # killed just after its last heartbeat
        self.clock.advance(0.2)
        self.assertTrue(self.lost("A" * 32))
        self.assertIn("node-b, which is down", self.refused(self.api.suspend(ALICE, "A" * 32)).message)
        self.assertNotEqual(self.ok(self.api.start(ALICE, START)).view.node, "node-b")
        # Heartbeats go on (a member whose certificate the link refused writes them into the database all
        # the same): still not up, never placed on.
        self.links["node-b"] = "refused: certificate not from the cluster's CA"
        for beat in (2.0, 4.0, 6.0, 8.0):
            self.clock.advance(2.0)
            for name in ("node-a", "node-b", "node-c"):
                self.store.members_[name] = member(name, sessions=0 if name == "node-b" else 9, beat=NOW + beat)
            self.assertTrue(self.lost("A" * 32))
            self.assertNotEqual(self.ok(self.api.start(ALICE, START)).view.node, "node-b")
        self.assertEqual(self.nodes["node-b"].calls, [])
        # The link works again: up, and its sessions with it.
        self.links["node-b"] = "up"
        self.assertFalse(self.lost("A" * 32))
        self.assertEqual(self.ok(self.api.start(ALICE, START)).view.node, "node-b")

    def test_a_node_whose_first_link_attempt_is_under_way_may_take_calls(self):
        self.store.members_["node-a"] = member("node-a", sessions=9)
        self.store.members_["node-c"] = member("node-c", sessions=9)
        self.links.update({"node-a": "refused: never asked about itself", "node-b": "connecting"})
        self.assertEqual(self.ok(self.api.start(ALICE, START)).view.node, "node-b")
        self.store.members_["node-b"] = member("node-b", sessions=20)
        self.assertEqual(self.ok(self.api.start(ALICE, START)).view.node, "node-a")  # its own node, in process

    def test_the_gateway_keeps_in_touch_with_every_other_node_that_is_up(self):
        self.links["node-b"] = "refused: certificate not from the cluster's CA"  # dialled again: it may be mended
        self.store.members_["node-c"] = member("node-c", beat=0.0)
        self.store.members_["gw-9"] = member("gw-9", roles=("gateway",))
        self.ok(self.api.keep_in_touch())
        self.assertEqual({name: node.calls for name, node in self.nodes.items()},
                         {"node-a": [], "node-b": [("connect",)], "node-c": []})  # not itself, nor down ones
        self.store.down = True
        self.ok(self.api.keep_in_touch())  # the store down: nothing, and no error

    def test_the_admin_ends_a_session_of_a_machine_that_is_down(self):
        self.store.rows["A" * 32] = row("A" * 32, node="node-b")
        self.store.members_["node-b"] = member("node-b", beat=0.0)
        # The user cannot (his machine may come back); the admin can.
        self.assertIn("which is down", self.refused(self.api.terminate(ALICE, "A" * 32)).message)
        view = self.ok(self.api.terminate(ADMIN, "A" * 32, "terminated by the admin"))
        self.assertEqual(view.state, State.TERMINATED)
        self.assertEqual(self.store.rows["A" * 32].state, State.TERMINATED)
        self.assertEqual(self.store.rows["A" * 32].failure, "machine node-b was down; ended by the admin")
        self.assertEqual(self.ok(self.api.list(ADMIN)).sessions, ())
        self.assertEqual(self.nodes["node-b"].calls, [])
        # Written by its node meanwhile (it is back): refused, nothing overwritten.
        self.store.rows["B" * 32] = row("B" * 32, node="node-b").evolve(revision=3)
        real_get = self.store.get
        self.store.get = lambda sid: real_get(sid).addCallback(lambda r: r.evolve(revision=2))
        self.assertIn("which is down", self.refused(self.api.terminate(ADMIN, "B" * 32)).message)
        self.assertEqual(self.store.rows["B" * 32].state, State.SUSPENDED)

    def test_a_node_that_left_the_store_counts_as_down(self):
        self.store.rows["A" * 32] = row("A" * 32, node="node-z")
        self.assertTrue(self.ok(self.api.list(ALICE)).sessions[0].lost)
        self.assertIn("node-z, which is down", self.refused(self.api.suspend(ALICE, "A" * 32)).message)

    def test_the_admin_lists_everyone_on_every_node(self):
        self.store.rows["A" * 32] = row("A" * 32, node="node-b", created=2.0)
        self.store.rows["C" * 32] = row("C" * 32, user="bob", node="node-c", created=1.0)
        self.assertEqual([(v.user, v.node) for v in self.ok(self.api.list(ADMIN)).sessions],
                         [("bob", "node-c"), ("alice", "node-b")])

    # ------------------------------------------------------------ store down
    def test_the_store_down_is_a_clear_596_for_every_new_request(self):
        self.store.rows["A" * 32] = row("A" * 32, node="node-b")
        self.store.down = True
        restore = RestoreRequest(session_id="A" * 32, display=DisplaySettings(), encrypted=True)
        for call in (self.api.start(ALICE, START), self.api.list(ALICE), self.api.restore(ALICE, restore),
                     self.api.suspend(ALICE, "A" * 32), self.api.shadow_targets(ALICE)):
            error = self.refused(call)
            self.assertEqual(error.kind, Kind.UNAVAILABLE)
            self.assertIn("session store cannot be reached", error.message)
            self.assertEqual(as_nx(error).code, 596)
        self.assertEqual([n.calls for n in self.nodes.values()], [[], [], []])
        self.store.down = False
        self.assertEqual(len(self.ok(self.api.list(ALICE)).sessions), 1)

    # ----------------------------------------------------------------- shadow
    def test_shadow_targets_of_every_up_node_and_attach_where_the_target_is(self):
        self.store.members_["node-c"] = member("node-c", beat=0.0)
        self.nodes["node-b"].unreachable = True
        targets = self.ok(self.api.shadow_targets(ALICE))
        self.assertEqual([t.id for t in targets], ["console-node-a"])
        self.nodes["node-b"].unreachable = False
        self.store.members_["node-c"] = member("node-c")
        self.assertEqual([t.id for t in self.ok(self.api.shadow_targets(ALICE))],
                         ["console-node-a", "console-node-b", "console-node-c"])
        shadow = ShadowRequest(target_id="console-node-c", display=DisplaySettings(), view_only=True)
        self.ok(self.api.attach_shadow(ALICE, shadow))
        self.assertEqual(self.nodes["node-c"].calls, [("attach_shadow", "console-node-c")])
        self.store.rows["A" * 32] = row("A" * 32, user="bob", node="node-b", state=State.RUNNING)
        self.ok(self.api.attach_shadow(ALICE, ShadowRequest(target_id="A" * 32, display=DisplaySettings(),
                                                             view_only=True)))
        self.assertEqual(self.nodes["node-b"].calls, [("attach_shadow", "A" * 32)])

    # ------------------------------------------------------ this member's own
    def test_status_and_draining_are_this_members(self):
        self.ok(self.api.status(ADMIN))
        self.assertTrue(self.ok(self.api.set_draining(ADMIN, True)))
        self.assertEqual(self.local.calls, [("status",), ("set_draining", True)])

    def test_it_offers_every_method_of_the_session_api(self):
        from nxgate.wire.protocol import METHODS
        missing = sorted(m for m in METHODS if not callable(getattr(Router, m, None)))
        self.assertEqual(missing, [])
        self.assertIsInstance(self.ok(self.api.list(ALICE)), Listing)


class NodeSideTests(SynchronousTestCase):
    """A member's own SessionService on a shared store: its sessions carry
    its name, and after a restart it takes back only its own."""

    def setUp(self):
        from tests import test_sessions_manager as manager_tests

        self.manager_tests = manager_tests
        manager_tests.ReconcileTests.setUp(self)

    def manager(self, name, per_user=10):
        from nxgate.config import SessionsSection
        from nxgate.node.service import SessionService

        config = Config(sessions=SessionsSection(display_base=3200, max_sessions_per_user=per_user),
                        types={"unix-console": ("true",)})
        object.__setattr__(config, "cluster", SimpleNamespace(name=name, roles=frozenset({"node"}), heartbeat=2.0))
        return SessionService(self.reactor, config, self.store.deferred, self.layout,
                              notifier=self.manager_tests.FakeNotifier(), launcher=self.launcher)

    def test_a_member_stamps_its_sessions_and_takes_back_only_its_own(self):
        import os

        from nxgate.node.processes import ProcessId

        manager = self.manager("node-a")
        self.assertEqual(manager.node_name, "node-a")
        fresh = self.successResultOf(defer.ensureDeferred(
            manager.new_session(ALICE, "unix-console", "x", DisplaySettings(), True)))
        manager.displays.release(fresh.display)
        self.assertEqual((fresh.node, SessionView.of(fresh).node), ("node-a", "node-a"))
        gone = ProcessId(os.getpid(), 1)  # no live process has this start time
        for session_id, node in (("A" * 32, "node-a"), ("B" * 32, "node-b")):
            self.store.insert(row(session_id, node=node, state=State.RUNNING).evolve(
                uid=os.getuid(), gid=os.getgid(), agent_pid=gone.pid, agent_started=gone.started, display=3201))
        manager.reconcile()
        # node-a found its own agent gone and recorded the end; node-b's row is untouched.
        self.assertEqual(self.store.get("A" * 32).state, State.FAILED)
        self.assertEqual(self.store.get("B" * 32).state, State.RUNNING)
        self.assertNotIn("B" * 32, manager.sessions)

    def test_a_box_that_joins_a_cluster_takes_its_earlier_sessions_as_its_own(self):
        import os

        from nxgate.node.processes import ProcessId

        gone = ProcessId(os.getpid(), 1)
        manager = self.manager("node-a")
        for session_id, server in (("C" * 32, manager.config.server_name), ("D" * 32, "another-box")):
            self.store.insert(row(session_id, node="", state=State.RUNNING).evolve(
                server_name=server, uid=os.getuid(), gid=os.getgid(), agent_pid=gone.pid,
                agent_started=gone.started, display=3202))
        manager.reconcile()
        self.assertEqual((self.store.get("C" * 32).node, self.store.get("C" * 32).state), ("node-a", State.FAILED))
        self.assertEqual((self.store.get("D" * 32).node, self.store.get("D" * 32).state), ("", State.RUNNING))

    def test_the_users_limit_holds_over_every_member_in_the_stores_admission(self):
        import os

        manager = self.manager("node-a", per_user=2)
        for session_id in ("A" * 32, "B" * 32):  # alice's two, on another member
            self.store.insert(row(session_id, node="node-b", state=State.RUNNING).evolve(uid=os.getuid()))
        self.assertEqual(manager.sessions, {})  # nothing here: the local count alone would let her in
        given, released = [], []
        allocate, release = manager.displays.allocate, manager.displays.release
        async def allocating(uid, gid):
            given.append(await allocate(uid, gid))
            return given[-1]

        manager.displays.allocate = allocating
        manager.displays.release = lambda display: (released.append(display), release(display))
        error = self.failureResultOf(defer.ensureDeferred(
            manager.start_for_later(ALICE, "unix-console", "third")), SessionError).value
        self.assertEqual((error.kind, error.message), (Kind.LIMIT_REACHED, "Server capacity: reached for user: alice"))
        self.assertEqual(manager.sessions, {})
        self.assertEqual(len(self.store.live(user="alice")), 2)
        self.assertEqual((len(given), released), (1, given))  # the display it was given is free again


class RouterOverOneBoxTests(SynchronousTestCase):
    """A single box is a cluster of one: every call goes to this machine's node."""

    def setUp(self):
        self.clock = FakeReactor()
        self.store = FakeStore()
        self.node = FakeNode("", self.store)
        self.api = Router(self.clock, lambda: Config(), self.node, self.store)

    def ok(self, coroutine):
        return self.successResultOf(defer.ensureDeferred(coroutine))

    def test_new_sessions_start_on_this_machines_node_without_members(self):
        ready = self.ok(self.api.start(ALICE, START))
        self.assertEqual(self.node.calls, [("start", "alice")])
        self.assertEqual(self.ok(self.api.list(ALICE)).sessions, (ready.view,))

    def test_calls_about_a_session_and_its_thumbnail_go_to_the_node(self):
        ready = self.ok(self.api.start(ALICE, START))
        self.ok(self.api.suspend(ALICE, ready.view.id))
        self.assertEqual(self.ok(self.api.thumbnail(ALICE, ready.view.id)), b"PNG of " + ready.view.id.encode())
        self.assertEqual(self.node.calls[1:], [("suspend", ready.view.id), ("thumbnail", ready.view.id)])

    def test_another_users_session_is_refused_before_the_node(self):
        ready = self.ok(self.api.start(ALICE, START))
        error = self.failureResultOf(defer.ensureDeferred(self.api.thumbnail(BOB, ready.view.id)), SessionError).value
        self.assertEqual(error.kind, Kind.NOT_YOURS)
        self.assertEqual(self.node.calls, [("start", "alice")])

    def test_the_nodes_events_reach_every_observer_even_after_one_fails(self):
        heard = []
        self.api.observers.extend([lambda event: 1 / 0, heard.append])
        self.node.publish(SimpleNamespace(view=SimpleNamespace(id="X")))
        self.assertEqual([event.view.id for event in heard], ["X"])
        self.assertEqual(len(self.flushLoggedErrors(ZeroDivisionError)), 1)

    def test_shadow_targets_are_this_machines(self):
        self.assertEqual([t.id for t in self.ok(self.api.shadow_targets(ALICE))], ["console-"])
