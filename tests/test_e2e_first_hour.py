"""End to end: what a newcomer meets in the first hour with a real gateway.

The gateway runs as ``make run`` runs it, with ``--port`` on the command
line; it says in its first log line where it listens and that Unix
passwords log in there; root learns why he is refused; ``nxgate-admin``
takes its options after the command and a reload does not claim the port
from the command line needs a restart.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from twisted.trial.unittest import SkipTest, TestCase

from tests.harness.gateway import REPO, Gateway
from tests.harness.net import free_port
from tests.harness.shared import class_fixture
from tests.harness.ssh import NXClient
from tests.harness.users import NEED_ROOT, is_root

ADMIN = [sys.executable, "-m", "nxgate.gateway.doors.admin.cli"]


class FirstHourTests(TestCase):
    timeout = 120

    def setUp(self):
        if not is_root():
            raise SkipTest(NEED_ROOT)
        self.gateway = class_fixture(type(self), self.make_fixture)

    @staticmethod
    def make_fixture():
        gateway = Gateway().start(args=("--port", f"tcp:{free_port()}:interface=127.0.0.1"))
        return gateway, gateway.stop

    def admin(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*ADMIN, *args], capture_output=True, text=True, timeout=60, cwd="/",
                              env=dict(os.environ, PYTHONPATH=REPO))

    def test_start_up_line_says_where_and_for_whom_it_listens(self):
        log = self.gateway.log()
        self.assertIn(f"nxgate starting: listening on 127.0.0.1 only (this machine), port {self.gateway.port}", log)
        self.assertIn("for NX logins with the passwords of Unix accounts (PAM service ", log)
        self.assertIn("never as root)", log)

    def test_reload_json_after_the_command_and_port_from_the_command_line(self):
        result = self.admin("reload", "--json", "--state-dir", self.gateway.state_dir)
        self.assertEqual(result.returncode, 0, result.stderr)
        answer = json.loads(result.stdout)
        self.assertTrue(answer["ok"])
        self.assertEqual(answer["result"]["restart_needed_for"], [])

    def test_root_is_told_why_not_just_wrong_password(self):
        client = NXClient(self.gateway.port)
        self.addCleanup(client.close)
        client.greet()
        self.assertIn(b"NX> 404 ERROR: wrong password or login (user 'root' may not log in to this server; "
                      b"use an ordinary Unix account)\n", client.login("root", "any password"))
        self.assertIn("NX login failed for user 'root' from 127.0.0.1: user is in deny_users", self.gateway.log())

    def test_nodes_on_a_single_box_lists_its_one_node(self):
        """The README says ``nxgate-admin nodes`` lists the members: a single box is a cluster of one."""
        listed = self.admin("--json", "nodes", "--state-dir", self.gateway.state_dir)
        self.assertEqual(listed.returncode, 0, listed.stderr)
        (node,) = json.loads(listed.stdout)
        self.assertEqual((node["name"], node["roles"], node["state"], node["drained"], node["sessions"]),
                         ("nxgate.test", ["gateway", "node"], "up", False, 0))
        text = self.admin("nodes", "--state-dir", self.gateway.state_dir)
        self.assertEqual(text.returncode, 0, text.stderr)
        self.assertRegex(text.stdout.splitlines()[1], r"^nxgate\.test\s+-\s+gateway,node\s+up\s+0 ")
