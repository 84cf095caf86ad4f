"""End to end: the real gateway keeping its sessions in a database server
(``[store] url = postgresql://...`` / ``mysql://...``), with real nxagents
and OpenSSH as nxssh; the server stopped under it and started again."""

from __future__ import annotations

import os

from twisted.trial.unittest import SkipTest

from nxgate.store.dialects import dialect
from nxgate.store.location import parse
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


def admin(gateway, *argv, check=True):
    import subprocess
    import sys

    from tests.harness.gateway import REPO

    return subprocess.run([sys.executable, "-m", "nxgate.gateway.doors.admin.cli", "--socket",
                           os.path.join(gateway.state_dir, "admin.sock"), *argv], capture_output=True, text=True,
                          timeout=60, check=check, env=dict(os.environ, PYTHONPATH=REPO), cwd="/")


class StartTests(StoreTestCase):
    def test_a_database_that_is_down_at_start_stops_it_with_one_line(self):
        if databases.PostgresServer.available():
            raise SkipTest(databases.PostgresServer.available())
        from tests.harness.gateway import Gateway
        from tests.harness.net import free_port

        url = f"postgresql://nxgate:hunter2-secret@127.0.0.1:{free_port()}/nxgate"  # nothing listens there
        gateway = Gateway({"store": {"url": url}})
        self.addCleanup(gateway.stop)
        status, err = gateway.start_refused()
        self.assertNotEqual(status, 0)
        self.assertIn("nxgate: the session database cannot be reached (PostgreSQL at 127.0.0.1:", err)
        self.assertNotIn("hunter2", err + gateway.log())


class ClusterMemberTests(StoreTestCase):
    """One member of a cluster: its heartbeat in PostgreSQL, ``nxgate-admin
    nodes`` and ``drain --node``, and down after three silent heartbeats."""

    def test_nodes_and_drain_through_the_admin_socket(self):
        import json
        import tempfile
        import time

        from nxgate.wire import tls
        from nxgate.gateway.membership import state
        from nxgate.vocabulary.model import Member
        from tests.harness.gateway import Gateway
        from tests.harness.net import free_port

        why = databases.PostgresServer.available()
        if why:
            raise SkipTest(why)
        server = databases.shared(databases.PostgresServer)
        url = server.new_database()
        ca = tempfile.mkdtemp(prefix="nxgate-test-ca-")
        self.addCleanup(__import__("shutil").rmtree, ca, True)
        tls.make_ca(ca)
        certificate, key = tls.make_cert("member-a", ca)
        port = free_port()
        gateway = Gateway({**OPTIONS, "store": {"url": url, "password_file": server.password_file},
                           "cluster": {"name": "member-a", "roles": "gateway, node",
                                       "listen": f"tcp:{port}:interface=127.0.0.1", "address": f"127.0.0.1:{port}",
                                       "ca": os.path.join(ca, "ca.pem"), "certificate": certificate, "key": key,
                                       "heartbeat": "0.5"}}).start()
        self.addCleanup(gateway.stop)
        nodes = lambda: json.loads(admin(gateway, "nodes", "--json").stdout)  # noqa: E731
        (row,) = wait_for(nodes, 10, "the first heartbeat")
        self.assertEqual((row["name"], row["address"], row["roles"], row["state"], row["sessions"], row["drained"]),
                         ("member-a", f"127.0.0.1:{port}", ["gateway", "node"], "up", 0, False))
        self.assertIsInstance(row["load"], float)
        self.assertIn("T", row["last_heartbeat"])
        self.assertIn("member-a", admin(gateway, "nodes").stdout)
        self.assertIn("drained", admin(gateway, "drain", "--node", "member-a").stdout)
        time.sleep(1.2)  # heartbeats in between keep the admin's drain
        self.assertTrue(nodes()[0]["drained"])
        refused = admin(gateway, "drain", "--node", "member-z", check=False)
        self.assertEqual(refused.returncode, 1)
        self.assertIn("no cluster member 'member-z'", refused.stderr)
        admin(gateway, "drain", "--node", "member-a", "--off")
        self.assertFalse(nodes()[0]["drained"])
        # The member stops: its heartbeats stop, and three later it is down.
        gateway.stop(cleanup=False)
        location = parse(url, server.password_file)
        kind = dialect(location.kind)

        def member():
            connection = kind.connect(location)
            try:
                cursor = connection.cursor()
                cursor.execute("SELECT last_heartbeat FROM members WHERE name=%s", ("member-a",))
                (last,) = cursor.fetchone()
            finally:
                connection.close()
            return Member(name="member-a", address="", roles=frozenset(), started=0, last_heartbeat=last,
                          sessions=0, load=0, cpus=1, free_memory=0)

        stopped = member()
        time.sleep(1.6)
        self.assertEqual(member(), stopped)
        self.assertEqual(state(stopped, time.time(), 0.5), "down")
