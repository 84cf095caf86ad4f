"""End to end: what an admin uses — nxgate-admin, the audit log and its
fail2ban filter, login throttling, limits by group, Prometheus metrics."""

from __future__ import annotations

import json
import os
import pwd
import re
import subprocess
import sys
import urllib.request

from tests.harness.gateway import REPO
from tests.test_e2e_sessions import START, SessionTestCase

ADMIN = [sys.executable, "-m", "nxgate.gateway.doors.admin.cli"]
LIMITED_GROUP = "nxgatetestlimited"


class OperationsTests(SessionTestCase):
    options = {
        "auth": {"throttle_per_address": "0", "throttle_per_account": "3", "throttle_window": "60",
                 "throttle_block": "20", "failed_login_delay": "0.1"},
        "metrics": {"listen": "tcp:0:interface=127.0.0.1"},
        # Displays of its own: the status it reads twice lists what others hold in its range, and other
        # modules' sessions (make test runs modules side by side) would come and go in a shared one.
        "sessions": {"display_base": "2100", "display_limit": "40"},
    }

    def admin(self, *args: str, user: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        socket_path = os.path.join(self.gateway.state_dir, "admin.sock")
        kwargs = {}
        if user is not None:
            entry = pwd.getpwnam(user)
            kwargs = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
        result = subprocess.run([*ADMIN, "--socket", socket_path, *args], capture_output=True, text=True,
                                timeout=60, env=dict(os.environ, PYTHONPATH=REPO), cwd="/", **kwargs)
        if check:
            self.assertEqual(result.returncode, 0, result.stderr)
        return result

    def audit(self) -> list[dict]:
        with open(os.path.join(self.gateway.state_dir, "audit.log")) as handle:
            return [json.loads(line) for line in handle]

    def test_admin_lists_shows_suspends_and_terminates(self):
        _, info = self.running_session()
        sessions = json.loads(self.admin("--json", "sessions").stdout)["result"]
        (row,) = [s for s in sessions if s["id"] == info.session_id]
        self.assertEqual((row["user"], row["type"], row["state"], row["display"], row["client_address"],
                          row["node"]), (self.user.name, "unix-console", "running", info.display, "127.0.0.1",
                                         "nxgate.test"))
        table = self.admin("sessions").stdout
        self.assertIn(info.session_id, table)
        self.assertTrue(table.startswith("ID"))
        shown = self.admin("--json", "show", info.session_id).stdout
        self.assertNotIn(info.cookie, shown)
        self.assertEqual(json.loads(self.admin("--json", "suspend", info.session_id).stdout)["result"]["state"],
                         "suspended")
        self.assertEqual(self.listing().get(info.session_id), "Suspended")
        self.admin("terminate", info.session_id)
        self.assertNotIn(info.session_id, self.listing())
        missing = self.admin("show", info.session_id, check=False)
        self.assertEqual(missing.returncode, 1)
        self.assertIn("no live session", missing.stderr)
        # The JSON answer says what kind of failure it is, in the session service's words, not NX's.
        gone = json.loads(self.admin("--json", "suspend", info.session_id, check=False).stdout)
        self.assertEqual(gone, {"ok": False, "error": f"no live session {info.session_id}", "kind": "not_found"})
        actions = [(r["event"], r.get("command"), r.get("session")) for r in self.audit() if r["event"] == "admin_action"]
        self.assertIn(("admin_action", "suspend", info.session_id), actions)
        self.assertIn(("admin_action", "terminate", info.session_id), actions)

    def test_status_reads_as_words_with_the_values_in_one_column(self):
        """Issue 25: ``status`` printed Python values (``False``, ``[]``);
        --json keeps the values themselves for scripts."""
        self.admin("drain", "on")
        self.addCleanup(self.admin, "drain", "off")
        text = self.admin("status").stdout
        data = json.loads(self.admin("--json", "status").stdout)["result"]
        self.assertIs(data["draining"], True)
        self.assertEqual(data["unknown_sessions"], [])
        for python in ("True", "False", "None", "[]", "{}", "'"):
            self.assertNotIn(python, text)
        # Displays that other programs on this machine hold are listed under their label, indented.
        held = [line for line in text.splitlines() if line.startswith("  ")]
        self.assertEqual(len(held), len(data["held_displays"]))
        lines = dict(line.split(":", 1) for line in text.splitlines() if not line.startswith("  "))
        self.assertEqual(lines["draining"].strip(), "yes")
        self.assertEqual(lines["unknown sessions"].strip(), "none")
        self.assertEqual(lines["held displays"].strip(), "" if held else "none")
        self.assertEqual(lines["sessions"].strip(), str(data["sessions"]))
        columns = {len(line) - len(line.split(":", 1)[1].lstrip()) for line in text.splitlines()
                   if not line.startswith("  ") and line.split(":", 1)[1]}
        self.assertEqual(len(columns), 1, text)  # every value starts in the same column
        print("\n    " + text.replace("\n", "\n    "))

    def test_admin_socket_is_for_root_only(self):
        result = self.admin("sessions", user=self.user.name, check=False)
        self.assertEqual(result.returncode, 3)
        self.assertIn("cannot talk to the gateway", result.stderr)

    def test_drain_refuses_new_sessions_and_keeps_old_ones(self):
        _, info = self.running_session()
        self.admin("drain", "on")
        reply = self.login().command(START.format(name="x", type="unix-console", extra=""), timeout=30)
        self.assertIn(b"NX> 599 This server takes no new sessions at the moment (maintenance).", reply)
        self.assertEqual(self.listing().get(info.session_id), "Running")
        self.assertTrue(json.loads(self.admin("--json", "status").stdout)["result"]["draining"])
        self.admin("drain", "off")
        self.assertIn(b"NX> 710", self.login().command(START.format(name="y", type="unix-console", extra=""),
                                                      timeout=60))

    def test_reload_applies_a_good_config_and_refuses_a_bad_one(self):
        config = self.gateway.config
        original = open(config).read()
        self.addCleanup(lambda: (open(config, "w").write(original), self.admin("reload", check=False)))
        with open(config, "a") as handle:
            handle.write("[bogus]\nthing = 1\n")
        result = self.admin("reload", check=False)
        self.assertEqual(result.returncode, 1)
        self.assertIn("unknown section [bogus]", result.stderr)
        subprocess.run(["groupadd", "-f", LIMITED_GROUP], check=True)
        subprocess.run(["usermod", "-aG", LIMITED_GROUP, self.user.name], check=True)
        with open(config, "w") as handle:
            handle.write(original + f"[limits]\ngroup.{LIMITED_GROUP} = 1\n")
        self.assertEqual(json.loads(self.admin("--json", "reload").stdout)["result"]["restart_needed_for"], [])
        client = self.login()
        self.start(client)
        reply = client.command(START.format(name="second", type="unix-console", extra=""), timeout=30)
        self.assertIn(f"NX> 599 Server capacity: reached for user: {self.user.name}".encode(), reply)
        self.assertIn(b"NX> 710", self.login(self.other).command(START.format(name="o", type="unix-console",
                                                                              extra=""), timeout=60))

    def test_audit_lines_and_the_fail2ban_filter(self):
        bad = self.login_attempt(self.other.name, "wrong-password")
        self.assertIn(b"NX> 404", bad)
        _, info = self.running_session()
        resumed_client = self.login()
        self.attach(resumed_client, self.restore(resumed_client, info.session_id))
        self.admin("terminate", info.session_id)
        events = [(r["event"], r.get("user"), r.get("session")) for r in self.audit()]
        for expected in (("login_failed", self.other.name, None), ("login", self.user.name, None),
                         ("session_start", self.user.name, info.session_id),
                         ("session_suspend", self.user.name, info.session_id),
                         ("session_resume", self.user.name, info.session_id),
                         ("session_end", self.user.name, info.session_id)):
            self.assertIn(expected, events)
        failed = [r for r in self.audit() if r["event"] == "login_failed"]
        self.assertEqual(failed[0]["address"], "127.0.0.1")
        result = subprocess.run(["fail2ban-regex", "--print-all-matched", os.path.join(self.gateway.state_dir, "audit.log"),
                                 os.path.join(REPO, "conf", "fail2ban", "filter.d", "nxgate.conf")],
                                capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        matched = re.search(r"Failregex: (\d+) total", result.stdout)
        self.assertEqual(int(matched.group(1)), len([r for r in self.audit() if r["event"] == "login_failed"]))
        self.assertIn("127.0.0.1", result.stdout)

    def login_attempt(self, user: str, password: str) -> bytes:
        from tests.harness.ssh import NXClient

        client = NXClient(self.gateway.port)
        self.addCleanup(client.close)
        client.greet()
        return client.login(user, password)

    def test_throttling_counts_failures_not_killed_sessions(self):
        _, info = self.running_session()
        self.admin("terminate", info.session_id)  # an admin kill is no login failure
        self.assertIn(b"NX> 103", self.login_attempt(self.user.name, self.user.password))
        for attempt in range(3):
            self.assertIn(b"NX> 404", self.login_attempt(self.other.name, f"wrong{attempt}"))
        # Blocked now, even with the right password, and PAM is not asked.
        self.assertIn(b"NX> 404", self.login_attempt(self.other.name, self.other.password))
        self.assertIn("throttled: too many failed logins for this account", self.gateway.log())
        self.assertTrue(any(r["event"] == "login_throttled" and r["user"] == self.other.name for r in self.audit()))
        self.assertIn(b"NX> 103", self.login_attempt(self.user.name, self.user.password))  # others unaffected

    def test_metrics(self):
        port = int(re.findall(r"Site starting on (\d+)", self.gateway.log())[-1])
        _, info = self.running_session()
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        self.assertRegex(text, r'nxgate_sessions\{node="[^"]+",state="running",type="unix-console"\} 1\.0')
        self.assertRegex(text, r'nxgate_logins_total\{result="granted"\} [1-9]')
        up = re.search(r'nxgate_relayed_bytes_total\{direction="up"\} (\S+)', text)
        self.assertGreater(float(up.group(1)), 0)
        self.assertRegex(text, r"nxgate_agent_start_seconds_count [1-9]")
        # The doors' guard (issue 26): nothing unauthenticated now, the files, the refusals by reason.
        self.assertRegex(text, r'nxgate_unauthenticated_connections\{node="[^"]+"\} 0\.0')
        self.assertRegex(text, r'nxgate_open_files\{node="[^"]+"\} [1-9]')
        self.assertRegex(text, r'nxgate_refused_connections_total\{node="[^"]+",reason="per_address"\} 0\.0')
