"""The write-behind queue against a store that answers late, and the SQLite
store's asynchronous answers."""

from __future__ import annotations

import os

from twisted.internet import defer
from twisted.trial.unittest import TestCase

from nxgate.vocabulary.model import Session, State
from nxgate.store.errors import STORAGE_FULL, StoreError, StoreUnavailable
from nxgate.store.factory import sqlite_store
from nxgate.node.writer import STORE_RETRY_SECONDS, StoreWriter
from tests.harness.clock import FakeReactor


def record(session_id: str, state: State = State.CREATED, **changes) -> Session:
    return Session(id=session_id, user="alice", uid=1000, gid=1000, type="unix-desktop", name="n", display=1,
                   server_name="h", cookie="c", state=state, **changes)


class LateStore:
    """An asynchronous store whose every answer comes a reactor turn later
    (``clock.advance(0)``), as a database server's would; it logs the
    writes in the order it performed them."""

    def __init__(self, clock):
        self.clock = clock
        self.rows: dict[str, Session] = {}
        self.writes: list[tuple[str, str, State]] = []
        self.full = False
        self.path, self.backup_path = "late", None

    def _later(self, function, *args):
        d = defer.Deferred()

        def run():
            try:
                d.callback(function(*args))
            except Exception as error:  # the failure travels in the Deferred
                d.errback(error)

        self.clock.callLater(0, run)
        return d

    def _insert(self, session):
        if self.full:
            raise StoreUnavailable(STORAGE_FULL, "full")
        self.rows[session.id] = session
        self.writes.append(("insert", session.id, session.state))

    def _update(self, session):
        if self.full:
            raise StoreUnavailable(STORAGE_FULL, "full")
        if session.id not in self.rows:
            raise StoreError(f"no session {session.id} to update")
        self.rows[session.id] = session
        self.writes.append(("update", session.id, session.state))

    def insert(self, session):
        return self._later(self._insert, session)

    def update(self, session):
        return self._later(self._update, session)


class WriterTests(TestCase):
    def setUp(self):
        self.clock = FakeReactor()
        self.store = LateStore(self.clock)
        self.writer = StoreWriter(self.store, self.clock)

    def test_changes_reach_a_late_store_in_order_one_at_a_time(self):
        d = defer.ensureDeferred(self.writer.insert_first(record("A")))
        self.assertNoResult(d)  # nobody may assume it fired
        self.clock.advance(0)
        self.successResultOf(d)
        for state in (State.STARTING, State.WAITING, State.RUNNING):
            self.writer.save(record("A", state))
        self.writer.save(record("B", State.WAITING))  # no row yet: inserted, memory is authoritative
        self.writer.save(record("A", State.SUSPENDED))  # coalesced: A's newest record, after B
        for _ in range(6):
            self.clock.advance(0)
        self.assertEqual(self.store.writes, [("insert", "A", State.CREATED), ("update", "A", State.STARTING),
                                             ("insert", "B", State.WAITING), ("update", "A", State.SUSPENDED)])
        self.assertEqual(self.writer.unsaved, {})

    def test_a_full_store_keeps_changes_and_catches_up_by_itself(self):
        self.writer.save(record("A"))
        self.clock.advance(0)
        self.store.full = True
        self.writer.save(record("A", State.RUNNING))
        self.clock.advance(0)
        self.writer.save(record("A", State.TERMINATED))
        self.clock.advance(0)
        self.assertEqual(self.writer.unsaved, {"A": record("A", State.TERMINATED)})
        self.clock.advance(STORE_RETRY_SECONDS)
        self.clock.advance(0)
        self.assertEqual(self.store.rows["A"].state, State.CREATED)
        self.store.full = False
        self.clock.advance(STORE_RETRY_SECONDS)
        self.clock.advance(0)
        self.assertEqual(self.store.rows["A"].state, State.TERMINATED)
        self.assertEqual(self.writer.unsaved, {})

    def test_a_refused_first_record_refuses_the_start(self):
        self.store.full = True
        d = defer.ensureDeferred(self.writer.insert_first(record("A")))
        self.clock.advance(0)
        self.failureResultOf(d, StoreUnavailable)


class SQLiteStoreTests(TestCase):
    def test_every_call_is_a_deferred_that_carries_store_errors(self):
        path = os.path.join(self.mktemp())
        os.makedirs(path)
        store = db = sqlite_store(os.path.join(path, "s.sqlite"), None, inline=True)
        self.addCleanup(db.close)
        self.successResultOf(store.insert(record("A")))
        self.assertEqual(self.successResultOf(store.get("A")), record("A"))
        self.failureResultOf(store.update(record("B")), StoreError)
        self.assertEqual([s.id for s in self.successResultOf(store.live())], ["A"])
        self.assertEqual(self.successResultOf(store.backup()), db.backup_path)
        self.assertTrue(os.path.exists(db.backup_path))

    def test_pruning_reads_a_bounded_step_oldest_first(self):
        path = self.mktemp()
        os.makedirs(path)
        store = db = sqlite_store(os.path.join(path, "s.sqlite"), None, inline=True)
        self.addCleanup(db.close)
        for n in range(5):
            self.successResultOf(store.insert(record(f"E{n}", State.TERMINATED, changed=float(10 - n))))
        self.successResultOf(store.insert(record("L", State.RUNNING, changed=0.0)))
        step = self.successResultOf(store.ended_before(100.0, limit=3))
        self.assertEqual([s.id for s in step], ["E4", "E3", "E2"])
