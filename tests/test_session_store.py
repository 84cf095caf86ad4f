"""The SQLite session store: round trips, live queries, schema versions."""

import os
import sqlite3

from twisted.trial.unittest import SynchronousTestCase

from nxgate.session.model import Session, State
from nxgate.session.store import SCHEMA_VERSION, SessionStore, StoreError


def session(sid="A" * 32, user="alice", state=State.SUSPENDED, changed=100.0):
    return Session(id=sid, user=user, uid=1000, gid=1000, type="unix-kde", name="desk 1", display=1001,
                   server_name="h", cookie="c" * 32, state=state, changed=changed, rootless=True,
                   options={"display": {"geometry": "800x600"}, "program": ["startkde"]})


class StoreTests(SynchronousTestCase):
    def setUp(self):
        self.path = os.path.abspath(self.mktemp())
        self.store = SessionStore(self.path)

    def tearDown(self):
        self.store.close()

    def test_round_trip(self):
        original = session()
        self.store.insert(original)
        self.assertEqual(self.store.get(original.id), original)
        self.store.update(original.evolve(state=State.RUNNING, ever_attached=True))
        self.assertEqual(self.store.get(original.id).state, State.RUNNING)
        self.assertTrue(self.store.get(original.id).ever_attached)

    def test_file_is_private_and_versioned(self):
        self.assertEqual(os.stat(self.path).st_mode & 0o777, 0o600)
        version = sqlite3.connect(self.path).execute("PRAGMA user_version").fetchone()[0]
        self.assertEqual(version, SCHEMA_VERSION)

    def test_live_and_history(self):
        self.store.insert(session("A" * 32, "alice", State.RUNNING))
        self.store.insert(session("B" * 32, "bob", State.SUSPENDED))
        self.store.insert(session("C" * 32, "alice", State.TERMINATED, changed=10.0))
        self.assertEqual({s.id for s in self.store.live()}, {"A" * 32, "B" * 32})
        self.assertEqual([s.id for s in self.store.live("alice")], ["A" * 32])
        self.assertEqual([s.id for s in self.store.ended_before(50.0)], ["C" * 32])
        self.store.delete(["C" * 32])
        self.assertEqual(self.store.count(), 2)

    def test_update_of_missing_session(self):
        self.assertRaises(StoreError, self.store.update, session())

    def test_newer_schema_is_refused(self):
        self.store.close()
        sqlite3.connect(self.path).execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
        self.assertRaises(StoreError, SessionStore, self.path)
        self.store = SessionStore(self.mktemp())

    def test_reopen_keeps_data(self):
        self.store.insert(session())
        self.store.close()
        self.store = SessionStore(self.path)
        self.assertEqual(self.store.get("A" * 32).name, "desk 1")
