"""Cluster membership: heartbeats in the shared store, up and down by the
last heartbeat, and the admin's ``nodes`` and ``drain --node``."""

from __future__ import annotations

import dataclasses
import io
import json
import os
from contextlib import redirect_stdout
from types import SimpleNamespace

from twisted.internet import defer, reactor
from twisted.trial.unittest import SkipTest, SynchronousTestCase, TestCase

from nxgate.gateway.membership import DOWN_AFTER, Membership, available_memory, load_average, reachable, state
from nxgate.config import Config, StoreSection
from nxgate.gateway.doors.admin import cli
from nxgate.gateway.doors.admin.server import AdminProtocol
from nxgate.node.files import StateLayout
from nxgate.vocabulary.model import Member
from nxgate.store.errors import StoreUnavailable
from nxgate.store.factory import open_store, sqlite_store
from tests.harness import databases
from tests.harness.clock import FakeReactor

PROC = {"/proc/loadavg": "0.42 0.30 0.20 1/234 5678\n",
        "/proc/meminfo": "MemTotal:  16000000 kB\nMemFree:  100 kB\nMemAvailable:   8000000 kB\n"}


def cluster_config(name="node-a", heartbeat=2.0, roles=frozenset({"gateway", "node"}), weight=1.5):
    cluster = SimpleNamespace(name=name, address=f"{name}.example:7022", roles=roles, heartbeat=heartbeat,
                              weight=weight)
    config = Config()
    object.__setattr__(config, "cluster", cluster)
    return config


def member(last_heartbeat):
    return Member(name="n", address="a:1", roles=frozenset({"node"}), started=0.0, last_heartbeat=last_heartbeat,
                  sessions=0, load=0.0, cpus=1, free_memory=0)


class PureTests(SynchronousTestCase):
    def test_up_for_three_heartbeats_then_down(self):
        self.assertEqual(state(member(100.0), 100.0 + DOWN_AFTER * 2.0, 2.0), "up")
        self.assertEqual(state(member(100.0), 100.0 + DOWN_AFTER * 2.0 + 0.01, 2.0), "down")
        self.assertEqual(state(member(100.0), 99.0, 2.0), "up")  # a reader whose clock is a little behind
        self.assertEqual(state(member(100.0), 130.0, 10.0), "up")
        self.assertEqual(state(member(100.0), 130.5, 10.0), "down")

    def test_a_node_this_gateway_links_to_is_up_only_while_the_link_works(self):
        fresh = member(100.0)
        self.assertEqual(state(fresh, 101.0, 2.0, "up"), "up")
        self.assertEqual(state(fresh, 101.0, 2.0, None), "up")  # no link kept: this member, one serving no doors
        gateway = dataclasses.replace(fresh, roles=frozenset({"gateway"}))
        self.assertEqual(state(gateway, 101.0, 2.0, "connecting"), "up")  # gateways link to nodes only
        self.assertEqual(state(fresh, 101.0, 2.0, "connecting"), "connecting")
        refused = "refused: certificate not from the cluster's CA"
        self.assertEqual(state(fresh, 101.0, 2.0, refused), refused)  # its heartbeat is no help
        self.assertEqual(state(fresh, 200.0, 2.0, "up"), "down")  # nor a link without heartbeats
        self.assertEqual([reachable(s) for s in ("up", "connecting", refused, "unreachable: x", "down")],
                         [True, True, False, False, False])

    def test_proc_parsers(self):
        self.assertEqual(load_average(PROC["/proc/loadavg"]), 0.42)
        self.assertEqual(available_memory(PROC["/proc/meminfo"]), 8000000 * 1024)
        self.assertEqual(available_memory("MemTotal: 1 kB\n"), 0)


class Flaky:
    """A store whose heartbeat fails while ``down``."""

    def __init__(self, store):
        self.store, self.down, self.broken, self.calls = store, False, False, 0

    def heartbeat(self, member):
        self.calls += 1
        if self.broken:
            raise RuntimeError("an error nobody planned for")
        if self.down:
            return defer.fail(StoreUnavailable("the session database cannot be reached", "test"))
        return self.store.heartbeat(member)

    def __getattr__(self, name):
        return getattr(self.store, name)


class MembershipTests(TestCase):
    def setUp(self):
        database = sqlite_store(os.path.abspath(self.mktemp()), None, inline=True)
        self.addCleanup(database.close)
        self.store = Flaky(database)
        self.clock = FakeReactor()
        self.clock.advance(1000)
        self.live = 2
        self.membership = Membership(cluster_config(), self.store, self.clock, lambda: self.live, PROC.__getitem__)
        self.membership.startService()
        self.addCleanup(self.membership.stopService)

    def rows(self):
        return self.successResultOf(self.store.members())

    def test_a_heartbeat_at_start_and_every_period(self):
        (row,) = self.rows()
        self.assertEqual(row, Member(name="node-a", address="node-a.example:7022", roles=frozenset({"gateway", "node"}),
                                     started=1000.0, last_heartbeat=1000.0, sessions=2, load=0.42,
                                     cpus=os.cpu_count(), free_memory=8000000 * 1024, drained=False, weight=1.5))
        self.live = 5
        self.clock.advance(2.0)
        (row,) = self.rows()
        self.assertEqual((row.last_heartbeat, row.sessions, row.started), (1002.0, 5, 1000.0))

    def test_heartbeats_keep_the_admins_drain(self):
        self.assertTrue(self.successResultOf(defer.ensureDeferred(self.membership.drain("node-a", True))))
        self.clock.advance(2.0)
        self.assertTrue(self.rows()[0].drained)
        self.assertFalse(self.successResultOf(defer.ensureDeferred(self.membership.drain("node-z", True))))

    def test_a_store_that_fails_is_logged_once_and_heartbeats_go_on(self):
        messages = []
        from twisted.logger import globalLogPublisher
        observer = messages.append
        globalLogPublisher.addObserver(observer)
        self.addCleanup(globalLogPublisher.removeObserver, observer)
        self.store.down = True
        for _ in range(3):
            self.clock.advance(2.0)
        self.store.down = False
        self.clock.advance(2.0)
        texts = [m.get("log_format", "") for m in messages if m.get("log_namespace") == "nxgate.gateway.membership"]
        self.assertEqual(sum("heartbeat not written" in t for t in texts), 1)
        self.assertEqual(sum("written again" in t for t in texts), 1)
        self.assertEqual(self.store.calls, 5)
        self.assertEqual(self.rows()[0].last_heartbeat, 1008.0)

    def test_an_unexpected_error_is_logged_and_heartbeats_go_on(self):
        """Issue 23: a LoopingCall stops for good on its first exception; then
        every gateway listed this member's sessions as lost."""
        self.store.broken = True
        self.clock.advance(2.0)
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
        self.store.broken = False
        self.clock.advance(2.0)
        self.assertEqual(self.store.calls, 3)
        self.assertEqual(self.rows()[0].last_heartbeat, 1004.0)

    def test_views_say_up_and_down(self):
        self.successResultOf(self.store.heartbeat(Member(
            name="node-b", address="b:7022", roles=frozenset({"node"}), started=900.0, last_heartbeat=993.0,
            sessions=1, load=1.5, cpus=8, free_memory=1)))
        views = self.successResultOf(defer.ensureDeferred(self.membership.views()))
        self.assertEqual([(v.name, v.state) for v in views], [("node-a", "up"), ("node-b", "down")])
        self.assertEqual(views[1].roles, ("node",))


class AdminTests(MembershipTests):
    """``nxgate-admin nodes`` and ``drain --node`` through the admin door."""

    def ask(self, command, **args):
        gateway = SimpleNamespace(membership=self.membership, sessions=None, api=None, config=None, started=0.0)
        line = json.dumps({"command": command, "args": args}).encode()
        return self.successResultOf(defer.ensureDeferred(AdminProtocol(gateway)._handle(line)))

    def test_nodes_has_the_fields_scripts_rely_on(self):
        (row,) = self.ask("nodes")["result"]
        for field in ("name", "address", "roles", "state", "sessions", "load", "last_heartbeat", "drained"):
            self.assertIn(field, row)
        self.assertEqual((row["name"], row["roles"], row["state"], row["sessions"], row["drained"]),
                         ("node-a", ["gateway", "node"], "up", 2, False))
        self.assertEqual(row["last_heartbeat"], "1970-01-01T00:16:40Z")

    def test_drain_a_member_and_back(self):
        self.assertEqual(self.ask("drain", on=True, node="node-a")["result"], {"node": "node-a", "drained": True})
        self.assertTrue(self.ask("nodes")["result"][0]["drained"])
        self.assertEqual(self.ask("drain", on=False, node="node-a")["result"], {"node": "node-a", "drained": False})
        answer = self.ask("drain", on=True, node="node-q")
        self.assertEqual((answer["ok"], answer["kind"]), (False, "invalid_request"))
        self.assertIn("no cluster member 'node-q'", answer["error"])

    def test_a_single_box_lists_its_one_node_and_drains_it_with_drain_on(self):
        box = Membership(Config(), self.store, self.clock, lambda: 3, PROC.__getitem__, draining=lambda: True)
        beats = self.store.calls
        gateway = SimpleNamespace(membership=box, sessions=None, api=None, config=None, started=0.0)

        def ask(command, **args):
            line = json.dumps({"command": command, "args": args}).encode()
            return self.successResultOf(defer.ensureDeferred(AdminProtocol(gateway)._handle(line)))

        (row,) = ask("nodes")["result"]
        self.assertEqual((row["name"], row["roles"], row["state"], row["sessions"], row["drained"], row["cpus"]),
                         (Config().server_name, ["gateway", "node"], "up", 3, True, os.cpu_count()))
        answer = ask("drain", on=True, node="node-a")
        self.assertEqual(answer["ok"], False)
        self.assertIn("single box", answer["error"])
        self.assertEqual(self.store.calls, beats)  # a single box writes no heartbeat, reads no member

    def test_a_member_the_link_refuses_shows_why(self):
        refused = "refused: certificate not from the cluster's CA"
        self.successResultOf(self.store.heartbeat(Member(
            name="node-x", address="x:7022", roles=frozenset({"node"}), started=900.0, last_heartbeat=1000.0,
            sessions=0, load=0.0, cpus=8, free_memory=1)))
        api = SimpleNamespace(links={"node-a": "connecting", "node-x": refused}.get)
        gateway = SimpleNamespace(membership=self.membership, sessions=None, api=api, config=None, started=0.0)
        line = json.dumps({"command": "nodes", "args": {}}).encode()
        rows = self.successResultOf(defer.ensureDeferred(AdminProtocol(gateway)._handle(line)))["result"]
        # Its own node (node-a) is in process: no link, up by its heartbeat.
        self.assertEqual({row["name"]: row["state"] for row in rows}, {"node-a": "up", "node-x": refused})

    def test_the_command_line(self):
        args = cli.parse_arguments(["drain", "--node", "node-b", "--off"])
        self.assertEqual((args.command, args.node, args.off, args.state), ("drain", "node-b", True, None))
        self.assertEqual(cli.parse_arguments(["drain", "on"]).state, "on")
        rows = self.ask("nodes")["result"]
        text = cli.show("nodes", rows)
        self.assertIn("LAST HEARTBEAT", text.splitlines()[0])
        self.assertIn("gateway,node", text)
        self.assertEqual(cli.main(["drain", "--socket", "/nonexistent"]), 2)


class NodesCommandLineTests(TestCase):
    """``nxgate-admin nodes --json`` prints the list itself."""

    def test_json_is_the_list_of_members(self):
        answer = {"ok": True, "result": [{"name": "node-a", "state": "up"}]}
        self.patch(cli, "request", lambda path, command, **args: answer)
        out = io.StringIO()
        with redirect_stdout(out):
            self.assertEqual(cli.main(["nodes", "--json", "--socket", "/x"]), 0)
        self.assertEqual(json.loads(out.getvalue()), answer["result"])


class PostgreSQLMembershipTests(TestCase):
    """Two members heartbeating into one real PostgreSQL; one falls silent."""

    def setUp(self):
        why = databases.PostgresServer.available()
        if why:
            raise SkipTest(why)
        server = databases.shared(databases.PostgresServer)
        config = Config(store=StoreSection(url=server.new_database(), password_file=server.password_file))
        self.stores = [open_store(config, StateLayout("/nonexistent"), reactor) for _ in range(2)]
        for store in self.stores:
            self.addCleanup(store.close)

    def test_two_members_and_one_going_down(self):
        clock = FakeReactor()
        clock.advance(5000)
        a = Membership(cluster_config("node-a"), self.stores[0], clock, lambda: 1, PROC.__getitem__)
        b = Membership(cluster_config("node-b", roles=frozenset({"node"})), self.stores[1], clock, lambda: 3,
                       PROC.__getitem__)

        async def scenario():
            await a.beat()
            await b.beat()
            views = await a.views()
            self.assertEqual([(v.name, v.state, v.sessions) for v in views], [("node-a", "up", 1), ("node-b", "up", 3)])
            self.assertTrue(await a.drain("node-b", True))
            for _ in range(4):  # node-b falls silent for four heartbeats
                clock.advance(2.0)
                await a.beat()
            views = await b.views()
            self.assertEqual([(v.name, v.state, v.drained) for v in views],
                             [("node-a", "up", False), ("node-b", "down", True)])
            await b.beat()
            self.assertEqual([v.state for v in await a.views()], ["up", "up"])
            self.assertTrue((await a.views())[1].drained)

        return defer.ensureDeferred(scenario())
