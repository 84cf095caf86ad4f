"""End to end: the real gateway keeping its sessions in a database server
(``[store] url = postgresql://...`` / ``mysql://...``), with real nxagents
and OpenSSH as nxssh; the server stopped under it and started again."""

from __future__ import annotations

import os

from twisted.trial.unittest import SkipTest

from nxgate.sessions.store.dialects import dialect
from nxgate.sessions.store.location import parse
from tests.harness import databases
from tests.harness.process import wait_for
from tests.test_e2e_store import OPTIONS, START, StoreTestCase, end_agents, listed
from tests.harness.users import create_user

UNREACHABLE = b"NX> 596 Error: Session startup failed: the session database cannot be reached."


class ServerStoreTests:
    """One test body for both servers (mixed into StoreTestCase below)."""

    server_kind: type = databases.DatabaseServer

    def setUp(self):
        super().setUp()
        why = self.server_kind.available()
        if why:
            raise SkipTest(why)
        self.server = self.server_kind()
        self.addCleanup(self.server.cleanup)
        self.server.start()
        self.user = create_user()
        self.addCleanup(self.user.remove)
        from tests.harness.gateway import Gateway

        options = {**OPTIONS, "store": {"url": self.server.url, "password_file": self.server.password_file}}
        self.gateway = Gateway(options).start()
        self.addCleanup(self.gateway.stop)
        self.addCleanup(end_agents, self.user)

    def stored(self, session_id):
        location = parse(self.server.url, self.server.password_file)
        kind = dialect(location.kind)
        connection = kind.connect(location)
        try:
            cursor = connection.cursor()
            cursor.execute(f"SELECT {kind.quote('state')}, {kind.quote('node')} FROM sessions WHERE "
                           f"{kind.quote('id')}=%s", (session_id,))
            row = cursor.fetchone()
            connection.commit()
            return None if row is None else tuple(row)
        finally:
            connection.close()

    def test_sessions_live_in_the_server_and_survive_its_outage(self):
        client = self.login(self.gateway, self.user)
        first = self.start(client, "in the database")
        self.assertEqual(self.stored(first.session_id), ("waiting", ""))
        self.assertIn(first.session_id, listed(client.command('listsession --status="suspended,running"')))
        # The database goes away: a start is refused in plain words, the
        # rest goes on (listing comes from the gateway's memory).
        self.server.stop()
        reply = client.command(START.format(name="refused", extra=""), timeout=60)
        self.assertIn(UNREACHABLE, reply)
        self.assertIn(b"NX> 500 ERROR: Last operation failed.", reply)
        self.assertIn(first.session_id, listed(client.command('listsession --status="suspended,running"')))
        # It comes back: the next start works without restarting the gateway.
        self.server.start()
        second = self.start(client, "after the outage")
        wait_for(lambda: self.stored(second.session_id) == ("waiting", ""), 20, "the new session in the database")
        log = self.gateway.log()
        self.assertIn("is unavailable", log)
        self.assertIn("answers again", log)
        password = open(self.server.password_file).read().strip()
        self.assertNotIn(password, log)
        for name in os.listdir(self.gateway.state_dir):
            self.assertFalse(name.startswith("nxgate.sqlite"), name)  # no SQLite file on the side


class PostgreSQLGatewayTests(ServerStoreTests, StoreTestCase):
    server_kind = databases.PostgresServer


class MariaDBGatewayTests(ServerStoreTests, StoreTestCase):
    server_kind = databases.MariaDBServer
