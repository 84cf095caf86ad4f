"""Throttling, audit lines and per-user/group limits (pure parts)."""

import json
import os

from twisted.trial.unittest import SynchronousTestCase

from nxgate.audit import AuditLog, audit_record
from nxgate.gateway.auth.throttle import Outcome, Throttle
from tests.harness.clock import FakeReactor


class ThrottleTests(SynchronousTestCase):
    def setUp(self):
        self.clock = FakeReactor()
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


class InFlightThrottleTests(SynchronousTestCase):
    """Issue 22: attempts count from their start, so a burst sent at once
    cannot outrun the count of failures."""

    def setUp(self):
        self.clock = FakeReactor()
        self.throttle = Throttle(self.clock, per_address=3, per_account=5, window=60, block=30)

    def test_a_burst_is_cut_at_the_limit_while_the_first_attempts_are_pending(self):
        begun = [self.throttle.begin("192.0.2.1", "bob") for _ in range(40)]
        self.assertEqual(begun[:3], [None, None, None])
        refusal = begun[3]
        self.assertEqual((refusal.kind, refusal.seconds_left, refusal.pending), ("address", 0, 3))
        self.assertTrue(refusal.describe().startswith("throttled: "))
        self.assertTrue(all(r is not None for r in begun[3:]))
        # The pending guesses fail: the address is blocked, for the right password too.
        started = [self.throttle.end("192.0.2.1", "bob", Outcome.FAILED)[1] for _ in range(3)]
        self.assertEqual(started, [[], [], ["address"]])
        self.assertEqual(self.throttle.begin("192.0.2.1", "bob").seconds_left, 30)

    def test_the_account_is_capped_across_addresses(self):
        for n in range(5):
            self.assertIsNone(self.throttle.begin(f"192.0.2.{n}", "bob"))
        self.assertEqual(self.throttle.begin("198.51.100.1", "bob").kind, "account")
        self.assertIsNone(self.throttle.begin("198.51.100.1", "alice"))

    def test_pending_and_failures_add_up(self):
        self.throttle.failed("192.0.2.1", "bob")
        self.throttle.failed("192.0.2.1", "bob")
        self.assertIsNone(self.throttle.begin("192.0.2.1", "carol"))
        self.assertEqual(self.throttle.begin("192.0.2.1", "dave").kind, "address")
        self.throttle.end("192.0.2.1", "carol", Outcome.VOID)  # PAM broke: no guess, no failure
        self.assertIsNone(self.throttle.begin("192.0.2.1", "dave"))

    def test_a_success_frees_its_place_and_clears_failures_not_pending_ones(self):
        self.throttle.failed("192.0.2.1", "bob")
        self.assertIsNone(self.throttle.begin("192.0.2.1", "bob"))
        self.assertIsNone(self.throttle.begin("192.0.2.1", "bob"))
        self.assertEqual(self.throttle.end("192.0.2.1", "bob", Outcome.GRANTED), (None, []))
        self.assertIsNone(self.throttle.begin("192.0.2.1", "bob"))
        self.assertIsNone(self.throttle.begin("192.0.2.1", "bob"))
        self.assertEqual(self.throttle.begin("192.0.2.1", "bob").pending, 3)

    def test_a_success_that_ends_while_blocked_is_refused(self):
        for _ in range(3):
            self.throttle.begin("192.0.2.1", "bob")
        self.throttle.end("192.0.2.1", "bob", Outcome.FAILED)
        self.throttle.end("192.0.2.1", "bob", Outcome.FAILED)
        self.throttle.failed("192.0.2.1", "bob")  # a guess from before: the address is blocked now
        refusal, _ = self.throttle.end("192.0.2.1", "bob", Outcome.GRANTED)
        self.assertEqual(refusal.kind, "address")
        self.assertIn("too many failed logins", refusal.describe())

    def test_off_counts_nothing_and_settled_records_go(self):
        throttle = Throttle(self.clock, per_address=0, per_account=0, window=60, block=30)
        for _ in range(50):
            self.assertIsNone(throttle.begin("192.0.2.1", "bob"))
        throttle.configure(1, 1, 60, 30)
        self.assertEqual(throttle.end("192.0.2.1", "bob", Outcome.GRANTED), (None, []))  # nothing to settle
        self.assertIsNone(throttle.begin("192.0.2.1", None))  # a name too long to be a key: the address only
        throttle.end("192.0.2.1", None, Outcome.GRANTED)
        self.assertEqual((len(throttle.addresses.records), len(throttle.accounts.records)), (0, 0))


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
