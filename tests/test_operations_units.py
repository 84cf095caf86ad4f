"""Throttling, audit lines and per-user/group limits (pure parts)."""

import json
import os

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from nxgate.audit import AuditLog, audit_record
from nxgate.auth.throttle import Throttle


class ThrottleTests(SynchronousTestCase):
    def setUp(self):
        self.clock = Clock()
        self.throttle = Throttle(self.clock, per_address=3, per_account=5, window=60, block=30)

    def test_address_blocked_after_failures_within_the_window(self):
        for _ in range(2):
            self.assertEqual(self.throttle.failed("192.0.2.1", "bob"), [])
        self.assertEqual(self.throttle.failed("192.0.2.1", "bob"), ["address"])
        kind, left = self.throttle.blocked("192.0.2.1", "alice")
        self.assertEqual((kind, left), ("address", 30))
        self.assertIsNone(self.throttle.blocked("192.0.2.2", "alice"))
        self.clock.advance(31)
        self.assertIsNone(self.throttle.blocked("192.0.2.1", "alice"))

    def test_old_failures_fall_out_of_the_window(self):
        self.throttle.failed("192.0.2.1", "bob")
        self.throttle.failed("192.0.2.1", "bob")
        self.clock.advance(61)
        self.assertEqual(self.throttle.failed("192.0.2.1", "bob"), [])

    def test_account_blocked_from_many_addresses(self):
        for n in range(4):
            self.throttle.failed(f"192.0.2.{n}", "bob")
        self.assertEqual(self.throttle.failed("192.0.2.9", "bob"), ["account"])
        self.assertEqual(self.throttle.blocked("198.51.100.1", "bob")[0], "account")

    def test_success_clears(self):
        self.throttle.failed("192.0.2.1", "bob")
        self.throttle.failed("192.0.2.1", "bob")
        self.throttle.succeeded("192.0.2.1", "bob")
        self.assertEqual(self.throttle.failed("192.0.2.1", "bob"), [])

    def test_off_and_reconfigured(self):
        throttle = Throttle(self.clock, per_address=0, per_account=0, window=60, block=30)
        for _ in range(50):
            self.assertEqual(throttle.failed("192.0.2.1", "bob"), [])
        throttle.configure(2, 0, 60, 30)
        throttle.failed("192.0.2.1", "bob")
        self.assertEqual(throttle.failed("192.0.2.1", "bob"), ["address"])


class AuditTests(SynchronousTestCase):
    def test_only_audit_events_and_fixed_shape(self):
        self.assertIsNone(audit_record({"log_format": "x", "user": "bob"}))
        record = audit_record({"audit": "login_failed", "log_time": 0, "user": "bob", "address": "192.0.2.1",
                               "reason": "PAM: Authentication failure (7)", "attempt": 1, "log_namespace": "x",
                               "password": "never"})
        self.assertEqual(list(record), ["time", "event", "address", "user", "reason", "attempt"])
        self.assertEqual(record["time"], "1970-01-01T00:00:00Z")
        self.assertNotIn("password", json.dumps(record))

    def test_session_ids_are_called_session(self):
        record = audit_record({"audit": "session_start", "id": "A" * 32, "user": "bob", "display": 1001})
        self.assertEqual((record["session"], record["display"]), ("A" * 32, 1001))

    def test_file_is_private_and_line_per_event(self):
        path = os.path.abspath(self.mktemp())
        audit = AuditLog(path)
        audit({"audit": "login", "user": "bob", "address": "192.0.2.1", "method": "password"})
        audit({"log_format": "not an audit event"})
        audit.close()
        self.assertEqual(os.stat(path).st_mode & 0o777, 0o600)
        lines = open(path).read().splitlines()
        self.assertEqual(len(lines), 1)
        self.assertEqual(json.loads(lines[0])["event"], "login")
