"""End to end: the session store under stress, with the real gateway,
OpenSSH as nxssh and real nxagents.

Odd bytes from clients (a session name that is not UTF-8, a user name that
is not, ``%0A`` in a parameter), a state directory on a full disk (a small
tmpfs), and a store that was truncated or damaged while agents ran.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time

from twisted.trial.unittest import SkipTest, TestCase

from tests.harness.gateway import REPO, Gateway
from tests.harness.process import wait_for
from tests.harness.shared import class_fixture
from tests.harness.ssh import NXClient, SessionInfo
from tests.harness.users import NEED_ROOT, create_user, is_root

START = ('startsession --session="{name}" --type="unix-console" --geometry="800x600" '
         '--screeninfo="800x600x24+render" --link="lan" --encryption="1" --cache="16M" --images="64M" '
         '--keyboard="pc105/us" --client="linux" --media="0" --backingstore="1" {extra}')
OPTIONS = {"sessions": {"display_base": "1900", "display_limit": "60", "connect_timeout": "300",
                        "max_sessions_per_user": "2"},
           "types": {"unix-console": "xterm -geometry 40x10+10+10"}}
STORAGE_FULL = b"NX> 596 Error: Session startup failed: the server's storage is full."


def agent_processes(user: str) -> list[int]:
    result = subprocess.run(["pgrep", "-u", user, "-x", "nxagent"], capture_output=True, text=True)
    return [int(pid) for pid in result.stdout.split()]


def end_agents(*users) -> None:
    for user in users:
        for pid in agent_processes(user.name):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
    for user in users:
        wait_for(lambda u=user: not agent_processes(u.name), 20, "the agents to end")


def stored_state(state_dir: str, session_id: str) -> str | None:
    db = sqlite3.connect(os.path.join(state_dir, "nxgate.sqlite"))
    try:
        row = db.execute("SELECT state FROM sessions WHERE id=?", (session_id,)).fetchone()
    finally:
        db.close()
    return None if row is None else row[0]


def audit_records(state_dir: str) -> list[dict]:
    with open(os.path.join(state_dir, "audit.log"), encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def wait_stored(state_dir: str, session_id: str, state: str) -> None:
    """The store runs in its own threads, written behind the replies: a
    client may read its answer a moment before the row has the state."""
    wait_for(lambda: stored_state(state_dir, session_id) == state, 10, f"session {session_id} stored as {state}")


def admin_status(state_dir: str) -> dict:
    result = subprocess.run([sys.executable, "-m", "nxgate.gateway.doors.admin.cli", "--socket", os.path.join(state_dir, "admin.sock"),
                             "--json", "status"], capture_output=True, text=True, timeout=60, check=True,
                            env=dict(os.environ, PYTHONPATH=REPO), cwd="/")
    return json.loads(result.stdout)["result"]


def listed(reply: bytes) -> dict[str, bytes]:
    """Session id -> its whole listing row."""
    return {m.group(1).decode(): m.group(0)
            for m in re.finditer(rb"^\d+\s+[\w-]+\s+([0-9A-F]{32})\s.*$", reply, re.MULTILINE)}


class StoreTestCase(TestCase):
    timeout = 300

    def setUp(self):
        if not is_root():
            raise SkipTest(NEED_ROOT)

    def login(self, gateway: Gateway, user) -> NXClient:
        client = NXClient(gateway.port)
        self.addCleanup(client.close)
        client.greet()
        self.assertIn(b"NX> 103 ", client.login(user.name, user.password))
        client.prompt()
        return client

    def start(self, client: NXClient, name: str | bytes = "desk", extra: str = "") -> SessionInfo:
        line = START.encode().replace(b"{name}", name if isinstance(name, bytes) else name.encode())
        reply = client.command(line.replace(b"{extra}", extra.encode()), timeout=60)
        self.assertIn(b"NX> 710 Session status: running", reply, reply)
        return SessionInfo.parse(reply)


class ClientBytesTests(StoreTestCase):
    """Bytes no client should send are kept escaped and logged on one line."""

    def setUp(self):
        super().setUp()
        self.user, self.gateway = class_fixture(type(self), self.make_fixture)
        self.addCleanup(end_agents, self.user)

    def make_fixture(self):
        user = create_user()
        gateway = Gateway(OPTIONS).start()

        def teardown():
            gateway.stop()
            user.remove()

        return (user, gateway), teardown

    def test_a_session_name_that_is_not_utf8_starts_and_is_listed_escaped(self):
        """It used to fail at the store insert (surrogates not allowed) as an
        internal error, leaving a phantom that held a display and a place
        in the limit."""
        client = self.login(self.gateway, self.user)
        info = self.start(client, b"bad\xff\x1b[2J")
        again = self.start(client, b"second")  # the limit of 2 has room: nothing phantom
        rows = listed(client.command('listsession --status="suspended,running"'))
        self.assertIn(b"bad\\xff\\x1b[2J", rows[info.session_id])
        self.assertIn(again.session_id, rows)
        wait_stored(self.gateway.state_dir, info.session_id, "waiting")

    def test_a_user_name_that_is_not_utf8_keeps_the_audit_log_going(self):
        """Twisted used to disable the audit observer on such a login: the
        login_failed lines fail2ban reads stopped for the rest of the run."""
        for name in (b"evil\xff\x1b[1m", b"nobody-here"):
            client = NXClient(self.gateway.port)
            self.addCleanup(client.close)
            client.greet()
            self.assertIn(b"NX> 404 ", client.login(name, "wrong"))
            client.close()
        failed = [r["user"] for r in audit_records(self.gateway.state_dir) if r["event"] == "login_failed"]
        # What cannot be a user name may be a password typed at the User:
        # prompt: it is logged masked (its length only), never as typed.
        self.assertEqual(failed[-2:], ["<masked 9 chars>", "nobody-here"])

    def test_a_client_value_never_starts_a_line_of_the_log(self):
        client = self.login(self.gateway, self.user)
        forged = "2026-12-03T10:00:00+0000 [nxgate#info] NX login: user 'root' from 192.0.2.66"
        line = START.replace("{name}", "x").replace('--link="lan"', '--link="lan%0A' + forged.replace(" ", "%20") + '"')
        reply = client.command(line.replace("{extra}", ""))
        self.assertIn(b"NX> 597 Error: Invalid value 'lan\\x0a2026-12-03T10:00:00+0000 [nxgate#info] NX login", reply)
        mentions = [text for text in self.gateway.log().split("\n") if "192.0.2.66" in text]
        self.assertTrue(mentions)
        for text in mentions:
            self.assertIn("refused", text)  # on the refusal's own line, escaped
            self.assertIn("\\x0a2026", text)


class FullDiskTests(StoreTestCase):
    """The state directory on a small tmpfs that a test fills up."""

    def setUp(self):
        super().setUp()
        self.mount = tempfile.mkdtemp(prefix="nxgate-test-full-")
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m,mode=0711", "tmpfs", self.mount],
                                 capture_output=True, text=True)
        if mounted.returncode != 0:
            os.rmdir(self.mount)
            raise SkipTest(f"cannot mount a small tmpfs to fill (root without CAP_SYS_ADMIN?): {mounted.stderr}")
        self.addCleanup(self.unmount)
        self.user, self.other = create_user(), create_user()
        self.addCleanup(self.user.remove)
        self.addCleanup(self.other.remove)
        self.gateway = Gateway(OPTIONS, state_dir=os.path.join(self.mount, "state")).start()
        self.addCleanup(self.gateway.stop)
        self.addCleanup(end_agents, self.user, self.other)
        self.filler = os.path.join(self.mount, "filler")

    def unmount(self):
        if subprocess.run(["umount", self.mount]).returncode != 0:
            subprocess.run(["umount", "-l", self.mount], check=False)
        os.rmdir(self.mount)

    def fill_disk(self):
        """Fill the tmpfs, and the last block of the audit log too (with
        empty lines), so that its next line finds no space either."""
        for path, data in ((self.filler, b"\0" * 65536), (os.path.join(self.gateway.state_dir, "audit.log"), b"\n")):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                while True:
                    os.write(fd, data)
            except OSError:
                pass
            finally:
                os.close(fd)

    def test_a_full_disk_refuses_starts_cleanly_and_loses_nothing(self):
        client = self.login(self.gateway, self.user)
        running = self.start(client)
        wait_stored(self.gateway.state_dir, running.session_id, "waiting")
        self.fill_disk()
        self.addCleanup(lambda: os.path.exists(self.filler) and os.unlink(self.filler))
        for _ in range(3):  # beyond the user's limit of 2: a refused start holds nothing
            reply = client.command(START.format(name="more", extra=""), timeout=60)
            self.assertIn(STORAGE_FULL, reply)
            self.assertIn(b"NX> 500 ERROR: Last operation failed.", reply)
        # Other users are served meanwhile.
        other = self.login(self.gateway, self.other)
        self.assertIn(b"NX> 148 ", other.command('listsession --status="suspended,running"'))
        # Terminate works and the session is gone from the listing at once.
        reply = client.command(f'terminate --sessionid="{running.session_id}"', timeout=60)
        self.assertIn(f"NX> 900 Session id: {running.session_id} terminated.".encode(), reply)
        self.assertNotIn(running.session_id, listed(client.command('listsession --status="suspended,running"')))
        self.assertEqual(stored_state(self.gateway.state_dir, running.session_id), "waiting")
        self.assertEqual(admin_status(self.gateway.state_dir)["unsaved_changes"], 1)
        # Space returns: the store catches up without a restart, and starts work.
        os.unlink(self.filler)
        wait_for(lambda: stored_state(self.gateway.state_dir, running.session_id) in ("terminated", "failed"), 20,
                 "the kept end of the session to reach the store")
        first, second = self.start(client, "after 1"), self.start(client, "after 2")
        wait_stored(self.gateway.state_dir, first.session_id, "waiting")
        wait_stored(self.gateway.state_dir, second.session_id, "waiting")
        self.assertIn("the session store can be written again", self.gateway.log())
        # The audit log lost what came while the disk was full, says so, and goes on.
        events = [r["event"] for r in audit_records(self.gateway.state_dir)]
        self.assertIn("audit_lost", events)
        self.assertEqual(events[events.index("audit_lost") + 1:].count("session_start"), 2)


class DamagedStoreTests(StoreTestCase):
    """The store lost or damaged between two runs while agents ran on."""

    options = {**OPTIONS, "sessions": {**OPTIONS["sessions"], "store_backup_interval": "1"}}

    def setUp(self):
        super().setUp()
        self.user = create_user()
        self.addCleanup(self.user.remove)
        self.addCleanup(end_agents, self.user)
        self.gateway = Gateway(self.options).start()
        self.addCleanup(self.gateway.stop)
        self.backup = os.path.join(self.gateway.state_dir, "nxgate.sqlite.backup")

    def restart(self) -> Gateway:
        """A new gateway on the same state directory (the old one stopped)."""
        self.gateway.stop(cleanup=False)
        gateway = Gateway(self.options, state_dir=self.gateway.state_dir)
        self.addCleanup(gateway.stop)
        return gateway

    def backed_up(self, session_id: str) -> bool:
        if not os.path.exists(self.backup):
            return False
        db = sqlite3.connect(f"file:{self.backup}?mode=ro", uri=True)
        try:
            return db.execute("SELECT 1 FROM sessions WHERE id=?", (session_id,)).fetchone() is not None
        finally:
            db.close()

    def test_a_truncated_store_reports_the_sessions_it_lost(self):
        client = self.login(self.gateway, self.user)
        lost = self.start(client)
        client.close()
        wait_for(lambda: self.backed_up(lost.session_id), 10, "the periodic backup")
        state_dir = self.gateway.state_dir
        gateway = self.restart()
        os.truncate(os.path.join(state_dir, "nxgate.sqlite"), 0)
        for suffix in ("-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(state_dir, "nxgate.sqlite" + suffix))
        gateway.start()  # it listens before its services start: wait for the report
        report = f"session {lost.session_id} of {self.user.name} (display :{lost.display}, nxagent pid"
        wait_for(lambda: report in gateway.log(), 10, "the report of the lost session")
        self.assertIn("runs but the session store does not know it", gateway.log())
        orphans = [r for r in audit_records(state_dir) if r["event"] == "session_orphan"]
        self.assertEqual([(r["session"], r["display"]) for r in orphans], [(lost.session_id, lost.display)])
        unknown = admin_status(state_dir)["unknown_sessions"]
        self.assertEqual([(u["id"], u["user"], u["display"]) for u in unknown],
                         [(lost.session_id, self.user.name, lost.display)])
        client = self.login(gateway, self.user)
        self.assertNotEqual(self.start(client, "new").display, lost.display)
        # The backup, the one copy that still knows the lost session, is kept.
        wait_for(lambda: "session store not backed up" in gateway.log(), 10, "a skipped backup")
        self.assertTrue(self.backed_up(lost.session_id))

    def test_a_damaged_store_stops_the_start_with_one_line(self):
        wait_for(lambda: os.path.exists(self.backup), 10, "the periodic backup")
        state_dir = self.gateway.state_dir
        gateway = self.restart()
        with open(os.path.join(state_dir, "nxgate.sqlite"), "wb") as handle:
            handle.write(b"not a database at all " * 300)
        with self.assertRaises(AssertionError) as caught:
            gateway.start()
        message = str(caught.exception)
        path = os.path.join(state_dir, "nxgate.sqlite")
        self.assertIn(f"nxgate: the session store {path} is damaged (file is not a database); to recover, move",
                      message)
        self.assertIn(f"copy the backup {path}.backup to {path}", message)
        self.assertNotIn("Traceback", message)


#: Another process's write lock on the store file, with a line once it holds it, held until a
#: line on its stdin (at most 60 s).
HOLD_LOCK = """
import select, sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=10)
db.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
select.select([sys.stdin], [], [], 60)
db.execute("COMMIT")
print("released", flush=True)
"""


class LockedStoreTests(StoreTestCase):
    """Issue 23: SQLite ran on the reactor with a 5 s busy timeout, so
    another writer on the file (an admin's sqlite3 shell, a backup tool)
    froze every door while a session change waited for the lock.  The store
    runs in its own threads now: the doors answer meanwhile, and the change
    is written when the lock goes."""

    def test_the_doors_answer_while_another_process_holds_the_store(self):
        user = create_user()
        self.addCleanup(user.remove)
        gateway = Gateway(OPTIONS).start()
        self.addCleanup(gateway.stop)
        self.addCleanup(end_agents, user)
        starter = self.login(gateway, user)
        holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, os.path.join(gateway.state_dir, "nxgate.sqlite")],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.addCleanup(holder.wait)
        self.addCleanup(holder.stdin.close)
        self.assertEqual(holder.stdout.readline().strip(), "locked")
        starter.send(START.replace("{name}", "during-the-lock").replace("{extra}", ""))  # its insert waits
        took = {}
        before = time.monotonic()
        status = admin_status(gateway.state_dir)
        took["nxgate-admin status"] = time.monotonic() - before
        before = time.monotonic()
        client = NXClient(gateway.port)
        self.addCleanup(client.close)
        client.greet()
        self.assertIn(b"NX> 103 ", client.login(user.name, user.password))
        client.prompt()
        took["NX login"] = time.monotonic() - before
        print(f"\nwhile the store was locked: {', '.join(f'{k} {v:.2f} s' for k, v in took.items())}")
        # Both answered while the lock was held: it goes only now.  (A door that waited for the store
        # would answer only when the start's insert gave up, after SQLite's busy timeout, and then
        # the start would have failed.)
        self.assertIsNone(holder.poll(), "the lock was let go before the doors answered")
        holder.stdin.write("go\n")
        holder.stdin.flush()
        self.assertEqual(holder.stdout.readline().strip(), "released")
        self.assertIn("sessions", status)
        # The start waited for the lock in a store thread, and went through after it.
        reply = starter.prompt(timeout=30)
        self.assertIn(b"NX> 710 Session status: running", reply)
        wait_stored(gateway.state_dir, SessionInfo.parse(reply).session_id, "waiting")
