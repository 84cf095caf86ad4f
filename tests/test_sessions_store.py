"""The SQLite session store: round trips, live queries, schema versions,
and its failures in words (the SQL store with the SQLite dialect, run inline)."""

import os
import sqlite3

from twisted.trial.unittest import SynchronousTestCase

from nxgate.vocabulary.model import Session, State
from nxgate.store import rows, sql as sql_module
from nxgate.store import sqlite as sqlite_module
from nxgate.store.errors import STORAGE_FULL, StoreCorrupt, StoreError, StoreUnavailable
from tests.harness.stores import inline_store

SCHEMA_VERSION = sql_module.SCHEMA_VERSION


def session(sid="A" * 32, user="alice", state=State.SUSPENDED, changed=100.0):
    return Session(id=sid, user=user, uid=1000, gid=1000, type="unix-kde", name="desk 1", display=1001,
                   server_name="h", cookie="c" * 32, state=state, changed=changed, rootless=True,
                   options={"display": {"geometry": "800x600"}, "program": ["startkde"]})


class StoreTests(SynchronousTestCase):
    def setUp(self):
        self.path = os.path.abspath(self.mktemp())
        self.store = inline_store(self.path)

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
        self.assertEqual((self.store.path, self.store.backup_path), (self.path, self.path + ".backup"))

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
        self.assertRaises(StoreError, inline_store, self.path)
        self.store = inline_store(os.path.abspath(self.mktemp()))

    def test_reopen_keeps_data(self):
        self.store.insert(session())
        self.store.close()
        self.store = inline_store(self.path)
        self.assertEqual(self.store.get("A" * 32).name, "desk 1")


class FailureTests(SynchronousTestCase):
    """Every failure is a StoreError kind the manager can act on."""

    def setUp(self):
        self.path = os.path.abspath(self.mktemp())

    def open(self):
        store = inline_store(self.path)
        self.addCleanup(store.close)
        return store

    def test_text_that_is_not_utf8_is_a_store_error(self):
        error = self.assertRaises(StoreError, self.open().insert, session(sid="B" * 32).evolve(name="bad\udcff"))
        self.assertIn("not valid text", str(error))

    def test_a_full_disk_says_so(self):
        store = self.open()
        store.count()  # this thread's connection, made
        connection = store.deferred.connections.local.connection.raw
        (pages,) = connection.execute("PRAGMA page_count").fetchone()
        connection.execute(f"PRAGMA max_page_count={pages}")
        with self.assertRaises(StoreUnavailable) as caught:
            for n in range(1000):
                store.insert(session(sid=f"{n:032X}"))
        self.assertEqual(caught.exception.reason, STORAGE_FULL)
        self.assertIn("database or disk is full", str(caught.exception))

    def test_a_file_that_is_not_a_database_names_itself_and_the_way_back(self):
        with open(self.path, "wb") as handle:
            handle.write(b"this is no SQLite file, just some bytes " * 200)
        error = self.assertRaises(StoreCorrupt, inline_store, self.path)
        self.assertIn(self.path, str(error))
        self.assertIn("file is not a database", str(error))
        self.assertIn("no backup", str(error))
        self.assertNotIn("\n", str(error))

    def test_a_truncated_file_is_refused_and_the_backup_named(self):
        store = inline_store(self.path)
        for n in range(300):
            store.insert(session(sid=f"{n:032X}", user=f"user{n}"))
        store.backup()
        store.close()
        checkpoint = sqlite3.connect(self.path)
        checkpoint.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        checkpoint.close()
        with open(self.path, "r+b") as handle:
            handle.truncate(os.path.getsize(self.path) // 2)
        error = self.assertRaises(StoreCorrupt, inline_store, self.path)
        self.assertIn(f"copy the backup {self.path}.backup to {self.path}", str(error))

    def test_backup_is_a_private_consistent_copy(self):
        store = self.open()
        store.insert(session())
        path = store.backup()
        self.assertEqual(path, self.path + ".backup")
        self.assertEqual(os.stat(path).st_mode & 0o777, 0o600)
        copy = inline_store(path)
        self.addCleanup(copy.close)
        self.assertEqual(copy.get("A" * 32), session())
        self.assertEqual([name for name in os.listdir(os.path.dirname(path)) if name.endswith(".tmp")], [])

    def test_a_schema_migration_keeps_a_copy_of_the_old_store(self):
        self.open().insert(session())
        self.patch(sql_module, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
        self.patch(sqlite_module, "MIGRATIONS", {**sqlite_module.MIGRATIONS,
                                                 SCHEMA_VERSION + 1: ["ALTER TABLE sessions ADD COLUMN note TEXT"]})
        self.open()
        old = sqlite3.connect(f"{self.path}.schema-{SCHEMA_VERSION}")
        self.addCleanup(old.close)
        self.assertEqual(old.execute("PRAGMA user_version").fetchone()[0], SCHEMA_VERSION)
        self.assertEqual(old.execute("SELECT name FROM sessions").fetchall(), [("desk 1",)])
        new = sqlite3.connect(self.path)
        self.addCleanup(new.close)
        self.assertEqual(new.execute("PRAGMA user_version").fetchone()[0], SCHEMA_VERSION + 1)


class SchemaTwoTests(SynchronousTestCase):
    """Schema 2 (several machines): a store written by the previous release
    is migrated on start, keeping its sessions and a copy of the old file."""

    def test_a_version_1_file_is_migrated_on_open(self):
        path = os.path.abspath(self.mktemp())
        old = sqlite3.connect(path)
        old.executescript(f"BEGIN; {'; '.join(sqlite_module.MIGRATIONS[1])}; PRAGMA user_version=1; COMMIT;")
        v1_columns = [c for c in rows.SESSION_COLUMNS if c not in ("node", "revision")]
        row = rows.session_row(session(), v1_columns)
        old.execute(f"INSERT INTO sessions ({','.join(v1_columns)}) VALUES ({','.join('?' * len(row))})", row)
        old.commit()
        old.close()
        store = inline_store(path)
        self.addCleanup(store.close)
        check = sqlite3.connect(path)
        self.addCleanup(check.close)
        self.assertEqual(check.execute("PRAGMA user_version").fetchone()[0], 2)
        self.assertEqual(store.get("A" * 32), session())
        self.assertEqual((store.get("A" * 32).node, store.get("A" * 32).revision), ("", 0))
        self.assertEqual(store.live(node=""), [session()])
        self.assertEqual(store.members(), [])
        copy = sqlite3.connect(f"{path}.schema-1")
        self.addCleanup(copy.close)
        self.assertEqual(copy.execute("PRAGMA user_version").fetchone()[0], 1)
