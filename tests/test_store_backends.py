"""One body of store tests, run against every back end behind
:class:`nxgate.sessions.store.interface.SessionStore`: SQLite here, and
PostgreSQL and MariaDB (private servers from tests.harness.databases) when
their drivers and server programs are installed."""

from __future__ import annotations

import functools
import os

from twisted.internet import defer
from twisted.trial.unittest import TestCase

from nxgate.sessions.model import Member, Session, State
from nxgate.sessions.store.adapter import SyncStoreAdapter
from nxgate.sessions.store.errors import StoreError
from nxgate.sessions.store.sqlite import SessionStore as SQLiteDatabase


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
    async def open_store(self):
        database = SQLiteDatabase(os.path.abspath(self.mktemp()))
        self.addCleanup(database.close)
        return SyncStoreAdapter(database)
