"""One body of store tests, run against every back end behind
:class:`nxgate.store.interface.SessionStore`: SQLite here, and
PostgreSQL and MariaDB (private servers from tests.harness.databases) when
their drivers and server programs are installed."""

from __future__ import annotations

import functools
import os
import threading
import time

from twisted.internet import defer, reactor
from twisted.trial.unittest import SkipTest, TestCase

from nxgate.config import Config, StoreSection
from nxgate.node.files import StateLayout
from nxgate.vocabulary.model import Member, Session, State
from nxgate.store import sql as sql_module
from nxgate.store.dialects import dialect
from nxgate.store.errors import StoreError, StoreUnavailable
from nxgate.store.factory import open_store, sqlite_store
from nxgate.store.location import parse
from tests.harness import databases


def async_test(function):
    @functools.wraps(function)
    def run(self):
        return defer.ensureDeferred(function(self))
    return run


def session(n=1, user="alice", state=State.SUSPENDED, node="", created=None, changed=100.0):
    return Session(id=f"{n:032X}", user=user, uid=1000, gid=1000, type="unix-kde", name=f"desk {n} ü", display=1000 + n,
                   server_name="h", cookie="c" * 32, state=state, created=float(n) if created is None else created,
                   changed=changed, rootless=True, node=node,
                   options={"display": {"geometry": "800x600"}, "program": ["startkde"], "note": "naïve"})


def member(name="node-a", heartbeat=1000.5, **changes):
    values = dict(name=name, address="10.0.0.1:7022", roles=frozenset({"gateway", "node"}), started=999.25,
                  last_heartbeat=heartbeat, sessions=3, load=0.75, cpus=4, free_memory=2 ** 33, weight=1.0)
    values.update(changes)
    return Member(**values)


class StoreContract:
    """The behaviour every store owes the session layer.  Subclasses set
    ``open_store()`` -> a fresh, empty store (closed by the subclass)."""

    backs_itself_up = True

    async def open_store(self):
        raise NotImplementedError

    async def asyncSetUp(self):
        self.store = await self.open_store()

    def setUp(self):
        return defer.ensureDeferred(self.asyncSetUp())

    @async_test
    async def test_round_trip_and_revisions(self):
        original = session()
        await self.store.insert(original)
        self.assertEqual(await self.store.get(original.id), original)
        self.assertIsNone(await self.store.get("F" * 32))
        await self.store.update(original.evolve(state=State.RUNNING, ever_attached=True, node="node-b"))
        stored = await self.store.get(original.id)
        self.assertEqual((stored.state, stored.ever_attached, stored.node, stored.revision),
                         (State.RUNNING, True, "node-b", 1))
        self.assertEqual(stored.options, original.options)
        self.assertEqual(stored.name, "desk 1 ü")

    @async_test
    async def test_update_of_a_missing_session_fails(self):
        with self.assertRaises(StoreError):
            await self.store.update(session())

    @async_test
    async def test_swap_is_compare_and_set_on_the_revision(self):
        await self.store.insert(session())
        first = await self.store.get(session().id)
        self.assertTrue(await self.store.swap(first.evolve(state=State.RESUMING)))
        # A second writer that read the same revision loses, and changes nothing.
        self.assertFalse(await self.store.swap(first.evolve(state=State.TERMINATED)))
        now = await self.store.get(first.id)
        self.assertEqual((now.state, now.revision), (State.RESUMING, 1))
        self.assertTrue(await self.store.swap(now.evolve(state=State.RUNNING)))
        self.assertEqual((await self.store.get(first.id)).revision, 2)
        self.assertFalse(await self.store.swap(session(n=9)))

    @async_test
    async def test_live_by_user_and_node(self):
        await self.store.insert(session(1, "alice", State.RUNNING, node="a"))
        await self.store.insert(session(2, "bob", State.SUSPENDED, node="b"))
        await self.store.insert(session(3, "alice", State.TERMINATED, changed=10.0, node="a"))
        await self.store.insert(session(4, "alice", State.SUSPENDED, node="b"))
        ids = lambda sessions: [s.id[-1] for s in sessions]
        self.assertEqual(ids(await self.store.live()), ["1", "2", "4"])
        self.assertEqual(ids(await self.store.live("alice")), ["1", "4"])
        self.assertEqual(ids(await self.store.live(node="b")), ["2", "4"])
        self.assertEqual(ids(await self.store.live("alice", "a")), ["1"])
        self.assertEqual(await self.store.live("carol"), [])

    @async_test
    async def test_history_delete_and_count(self):
        await self.store.insert(session(1, state=State.RUNNING))
        await self.store.insert(session(2, state=State.TERMINATED, changed=10.0))
        await self.store.insert(session(3, state=State.FAILED, changed=20.0))
        await self.store.insert(session(4, state=State.FAILED, changed=90.0))
        self.assertEqual([s.id[-1] for s in await self.store.ended_before(50.0)], ["2", "3"])
        self.assertEqual([s.id[-1] for s in await self.store.ended_before(50.0, limit=1)], ["2"])
        await self.store.insert(session(5, state=State.FAILED, changed=30.0, node="b"))
        self.assertEqual([s.id[-1] for s in await self.store.ended_before(50.0, node="b")], ["5"])
        self.assertEqual([s.id[-1] for s in await self.store.ended_before(50.0, node="")], ["2", "3"])
        await self.store.delete([session(5).id])
        await self.store.delete([session(2).id, session(3).id])
        self.assertEqual(await self.store.count(), 2)
        await self.store.delete([])

    @async_test
    async def test_admit_counts_then_inserts(self):
        self.assertIsNone(await self.store.admit(session(1, "alice", node="a"), 2, 0, 0))
        self.assertIsNone(await self.store.admit(session(2, "alice", node="b"), 2, 0, 0))
        self.assertEqual(await self.store.admit(session(3, "alice", node="a"), 2, 0, 0), "user")
        self.assertIsNone(await self.store.get(session(3).id))
        self.assertEqual(await self.store.admit(session(3, "bob", node="a"), 2, 1, 0), "node")
        self.assertEqual(await self.store.admit(session(3, "bob", node="c"), 2, 1, 2), "total")
        await self.store.insert(session(5, "bob", State.TERMINATED, node="c"))  # ended sessions do not count
        self.assertIsNone(await self.store.admit(session(3, "bob", node="c"), 2, 1, 3))
        self.assertIsNone(await self.store.admit(session(4, "alice", node="a"), 0, 0, 0))
        self.assertEqual(len(await self.store.live()), 4)

    @async_test
    async def test_backup_and_path(self):
        await self.store.insert(session())
        copy = await self.store.backup()
        if self.backs_itself_up:
            self.assertIsNone(copy)  # the database server's own backups
            self.assertIsNone(self.store.backup_path)
            self.assertIn("://nxgate@127.0.0.1:", self.store.path)
        else:
            self.assertEqual(copy, self.store.backup_path)
            self.assertTrue(os.path.exists(copy))

    @async_test
    async def test_members_heartbeat_and_drain(self):
        self.assertEqual(await self.store.members(), [])
        self.assertFalse(await self.store.set_drained("node-a", True))
        await self.store.heartbeat(member("node-b", roles=frozenset({"node"}), weight=2.5))
        await self.store.heartbeat(member("node-a"))
        self.assertEqual(await self.store.members(), [member("node-a"), member("node-b", roles=frozenset({"node"}),
                                                                                   weight=2.5)])
        self.assertTrue(await self.store.set_drained("node-a", True))
        # The next heartbeat refreshes everything the member says of itself, not the admin's drain.
        await self.store.heartbeat(member("node-a", heartbeat=1002.5, sessions=5, drained=False))
        (a, _) = await self.store.members()
        self.assertEqual(a, member("node-a", heartbeat=1002.5, sessions=5, drained=True))
        self.assertTrue(await self.store.set_drained("node-a", False))
        self.assertFalse((await self.store.members())[0].drained)


class SQLiteStoreTests(StoreContract, TestCase):
    """The embedded default, in its thread pool as in production."""

    backs_itself_up = False

    async def open_store(self):
        store = sqlite_store(os.path.abspath(self.mktemp()), reactor)
        self.addCleanup(store.close)
        return store


def sleep(seconds):
    d = defer.Deferred()
    reactor.callLater(seconds, d.callback, None)
    return d


class ServerStore:
    """Opens stores on a private database server (shared by the tests of
    this process; a fresh database for each test)."""

    server_kind: type = databases.DatabaseServer

    def server(self):
        why = self.server_kind.available()
        if why:
            raise SkipTest(why)
        return databases.shared(self.server_kind)

    def config(self, url, password_file=None):
        server = self.server()
        return Config(store=StoreSection(url=url, password_file=server.password_file if password_file is None
                                         else password_file))

    def open_url(self, url, **options):
        store = open_store(self.config(url, **options), StateLayout(self.mktemp()), reactor)
        self.addCleanup(store.close)
        return store

    async def open_store(self):
        self.url = self.server().new_database()
        return self.open_url(self.url)


class PostgreSQLStoreTests(ServerStore, StoreContract, TestCase):
    server_kind = databases.PostgresServer


class MariaDBStoreTests(ServerStore, StoreContract, TestCase):
    server_kind = databases.MariaDBServer


class SharedStoreTests(ServerStore):
    """What only a store shared by several machines must show: races
    between two connections, migrations at once, the server going away,
    passwords."""

    def setUp(self):
        self.url = self.server().new_database()

    @async_test
    async def test_two_stores_racing_one_user_past_the_limit_exactly_one_wins(self):
        first, second = self.open_url(self.url), self.open_url(self.url)
        for round_ in range(20):
            user = f"user{round_}"
            await first.insert(session(1000 + round_, user))  # one place left of two
            results = await defer.gatherResults([first.admit(session(2000 + round_, user), 2, 0, 0),
                                                 second.admit(session(3000 + round_, user), 2, 0, 0)])
            self.assertEqual(sorted(results, key=str), [None, "user"], f"round {round_}")
            self.assertEqual(len(await first.live(user)), 2)

    @async_test
    async def test_two_stores_swapping_one_revision_exactly_one_wins(self):
        first, second = self.open_url(self.url), self.open_url(self.url)
        for n in range(10):
            await first.insert(session(n))
            stored = await second.get(session(n).id)
            results = await defer.gatherResults([first.swap(stored.evolve(state=State.RESUMING, node="a")),
                                                 second.swap(stored.evolve(state=State.RESUMING, node="b"))])
            self.assertEqual(sorted(results), [False, True])
            self.assertEqual((await first.get(stored.id)).revision, 1)

    def test_members_starting_together_migrate_once(self):
        errors, stores = [], []

        def start():
            try:
                location = parse(self.url, self.server().password_file)
                stores.append(sql_module.SQLStore(dialect(location.kind), location, reactor))
            except Exception as error:  # reported below
                errors.append(error)

        workers = [threading.Thread(target=start) for _ in range(5)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(60)
        for store in stores:
            self.addCleanup(store.close)
        self.assertEqual((errors, len(stores)), ([], 5))
        connection = stores[0].dialect.connect(stores[0].location)
        self.addCleanup(connection.close)
        cursor = connection.cursor()
        cursor.execute("SELECT version FROM nxgate_schema")
        self.assertEqual(cursor.fetchall(), [(sql_module.SCHEMA_VERSION,)] if self.server_kind is
                         databases.PostgresServer else ((sql_module.SCHEMA_VERSION,),))

    def test_a_newer_schema_is_refused(self):
        store = self.open_url(self.url)
        connection = store.dialect.connect(store.location)
        cursor = connection.cursor()
        cursor.execute("UPDATE nxgate_schema SET version=%s", (sql_module.SCHEMA_VERSION + 1,))
        connection.commit()
        connection.close()
        error = self.assertRaises(StoreError, self.open_url, self.url)
        self.assertIn(f"has schema {sql_module.SCHEMA_VERSION + 1}", str(error))

    def test_a_wrong_password_is_a_clear_error_without_the_password(self):
        wrong = os.path.abspath(self.mktemp())
        with open(os.open(wrong, os.O_WRONLY | os.O_CREAT, 0o600), "w") as out:
            out.write("not-the-password-4711\n")
        error = self.assertRaises(StoreUnavailable, self.open_url, self.url, password_file=wrong)
        self.assertEqual(error.reason, sql_module.UNREACHABLE)
        self.assertNotIn("4711", str(error))

    def test_the_password_may_be_in_the_url_and_is_never_shown(self):
        password = open(self.server().password_file).read().strip()
        url = self.url.replace("nxgate@", f"nxgate:{password}@", 1)
        store = self.open_url(url, password_file="")
        self.assertNotIn(password, store.path)
        self.assertIn("nxgate:***@", store.path)

    def test_a_password_file_others_can_read_is_refused(self):
        loose = os.path.abspath(self.mktemp())
        with open(os.open(loose, os.O_WRONLY | os.O_CREAT, 0o644), "w") as out:
            out.write("secret\n")
        error = self.assertRaises(StoreError, self.open_url, self.url, password_file=loose)
        self.assertIn("can be read by every user", str(error))


class PostgreSQLSharedTests(SharedStoreTests, TestCase):
    server_kind = databases.PostgresServer


class MariaDBSharedTests(SharedStoreTests, TestCase):
    server_kind = databases.MariaDBServer


class OutageTests:
    """The database server going away and coming back: calls fail with
    StoreUnavailable in bounded time, and work again without a restart.
    A server of its own, since the test stops it."""

    server_kind: type = databases.DatabaseServer

    def setUp(self):
        why = self.server_kind.available()
        if why:
            raise SkipTest(why)
        self.server = self.server_kind()
        self.addCleanup(self.server.cleanup)
        self.server.start()
        location = parse(self.server.url, self.server.password_file)
        self.store = sql_module.SQLStore(dialect(location.kind), location, reactor, timeout=3)
        self.addCleanup(self.store.close)

    @async_test
    async def test_a_stopped_server_fails_calls_and_its_return_heals_them(self):
        await self.store.insert(session(1))
        self.server.stop()
        began = time.monotonic()
        for call in (lambda: self.store.live(), lambda: self.store.insert(session(2)), lambda: self.store.members()):
            with self.assertRaises(StoreUnavailable) as caught:
                await call()
            self.assertEqual(caught.exception.reason, sql_module.UNREACHABLE)
        self.assertLess(time.monotonic() - began, 30)  # a deadline: without the store's timeouts they hang for good
        self.server.start()
        self.assertEqual([s.id for s in await self.store.live()], [session(1).id])
        await self.store.insert(session(2))
        self.assertEqual(await self.store.count(), 2)

    @async_test
    async def test_a_server_that_hangs_fails_calls_in_bounded_time(self):
        await self.store.insert(session(1))
        self.server.pause()
        try:
            began = time.monotonic()
            with self.assertRaises(StoreUnavailable) as caught:
                await self.store.live()
            self.assertLess(time.monotonic() - began, 30)  # a deadline: without its timeout it waits for good
            self.assertIn("does not answer", str(caught.exception))
        finally:
            self.server.resume()
        await sleep(0.5)
        self.assertEqual(len(await self.store.live()), 1)


class PostgreSQLOutageTests(OutageTests, TestCase):
    server_kind = databases.PostgresServer


class MariaDBOutageTests(OutageTests, TestCase):
    server_kind = databases.MariaDBServer


class FactoryTests(TestCase):
    """``[store] url`` picks the back end; the default needs no server."""

    def test_the_default_is_the_state_directorys_sqlite_file(self):
        layout = StateLayout(os.path.abspath(self.mktemp()))
        os.makedirs(layout.root)
        store = open_store(Config(), layout, reactor)
        self.addCleanup(store.close)
        self.assertIsInstance(store, sql_module.SQLStore)
        self.assertEqual(store.dialect.name, "SQLite")
        self.assertEqual(store.path, layout.database)
        self.assertTrue(os.path.exists(layout.database))

    def test_a_sqlite_path_may_be_given(self):
        path = os.path.abspath(self.mktemp())
        store = open_store(Config(store=StoreSection(url=f"sqlite:{path}")), StateLayout("/nonexistent"), reactor)
        self.addCleanup(store.close)
        self.assertEqual(store.path, path)

    def test_urls_are_parsed_and_redacted(self):
        location = parse("postgresql://nx%40gate:p%2Fw@db.example:6543/sessions")
        self.assertEqual((location.kind, location.user, location.password, location.host, location.port,
                          location.database), ("postgresql", "nx@gate", "p/w", "db.example", 6543, "sessions"))
        self.assertEqual(location.safe_url, "postgresql://nx%40gate:***@db.example:6543/sessions")
        self.assertNotIn("p%2Fw", repr(location))
        self.assertEqual(parse("mariadb://nxgate@db/nx").port, 3306)
        self.assertEqual(parse("mysql://nxgate@db/nx").kind, "mysql")
        for bad in ("oracle://x@y/z", "postgresql://db.example/nx", "mysql://nxgate@db/"):
            self.assertRaises(StoreError, parse, bad)

    def test_the_config_refuses_an_unknown_url(self):
        from nxgate import config as configuration

        path = self.mktemp()
        with open(path, "w") as out:
            out.write("[store]\nurl = oracle://scott:tiger@db/x\n")
        error = self.assertRaises(configuration.ConfigError, configuration.load, path)
        self.assertIn("[store] url = 'oracle://scott:***@db/x'", str(error))
        self.assertNotIn("tiger", str(error))
        with open(path, "w") as out:
            out.write("[store]\nurl = postgresql://nxgate@db.example/nxgate\npassword_file = db.password\n")
        loaded = configuration.load(path)
        self.assertEqual(loaded.store.password_file, os.path.join(os.path.dirname(os.path.abspath(path)),
                                                                  "db.password"))


class ConnectionsTests(TestCase):
    def test_threads_wait_for_the_reactor(self):
        """twistd may daemonize (fork) after the store is opened: threads
        started before would be gone in the child and every call would hang."""

        class NotRunning:
            def __init__(self):
                self.when_running, self.triggers = [], []

            def callWhenRunning(self, f, *args):
                self.when_running.append((f, args))

            def addSystemEventTrigger(self, *args):
                self.triggers.append(args)
                return len(self.triggers)

            def removeSystemEventTrigger(self, trigger):
                pass

        fake = NotRunning()
        connections = sql_module.Connections(fake, lambda: None)
        self.assertFalse(connections.pool.started)
        self.assertEqual(connections.pool.threads, [])
        for f, args in fake.when_running:
            f(*args)
        self.assertTrue(connections.pool.started)
        connections.close()
        self.assertFalse(connections.pool.started)

    def test_threads_start_at_once_in_a_running_reactor(self):
        class Running:
            def callWhenRunning(self, f, *args):
                f(*args)

            def addSystemEventTrigger(self, *args):
                return 1

            def removeSystemEventTrigger(self, trigger):
                pass

        connections = sql_module.Connections(Running(), lambda: None)
        self.addCleanup(connections.close)
        self.assertTrue(connections.pool.started)


class RestartTests:
    """A server restart between two calls (the connections in the pool are
    all dead but nobody noticed yet) costs no caller an error."""

    server_kind: type = databases.DatabaseServer

    def setUp(self):
        why = self.server_kind.available()
        if why:
            raise SkipTest(why)
        self.server = self.server_kind()
        self.addCleanup(self.server.cleanup)
        self.server.start()
        location = parse(self.server.url, self.server.password_file)
        self.store = sql_module.SQLStore(dialect(location.kind), location, reactor)
        self.addCleanup(self.store.close)

    @async_test
    async def test_every_call_after_a_restart_works(self):
        await self.store.insert(session(1))
        for _ in range(3):  # every thread of the pool gets a connection
            await defer.gatherResults([self.store.live() for _ in range(8)])
        self.assertEqual(len(self.store.connections.connections), 4)
        self.server.restart()
        results = await defer.gatherResults([self.store.live() for _ in range(8)])
        self.assertEqual([len(r) for r in results], [1] * 8)
        await self.store.insert(session(2))
        self.assertEqual(await self.store.count(), 2)


class PostgreSQLRestartTests(RestartTests, TestCase):
    server_kind = databases.PostgresServer


class MariaDBRestartTests(RestartTests, TestCase):
    server_kind = databases.MariaDBServer
