"""Client bytes in the text log and the audit log: one event, one line,
whatever the bytes, and a full disk loses lines, never the log."""

import errno
import io
import json
import os

from twisted.logger import Logger, LogPublisher, textFileLogObserver
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from nxgate.audit import AuditLog, audit_record
from nxgate import logs
from nxgate.logs import OneLineObserver
from nxgate.safetext import printable

HOSTILE = "bob\udcff\n2026-12-03T10:00:00+0000 [nxgate#info] NX login: user 'root'\r\x1b[2K\u2028\x85"


class PrintableTests(SynchronousTestCase):
    def test_plain_and_international_text_is_kept(self):
        for text in ("desk 1", "Büro – Schreibtisch", "桌面", "a\\b"):
            self.assertEqual(printable(text), text)

    def test_undecodable_bytes_and_controls_are_escaped(self):
        self.assertEqual(printable("bad\udcff\udc80"), "bad\\xff\\x80")
        self.assertEqual(printable("a\nb\rc\x00d\x1be\x7ff"), "a\\x0ab\\x0dc\\x00d\\x1be\\x7ff")
        self.assertEqual(printable("x\x85y\u2028z\u2029"), "x\\x85y\\u2028z\\u2029")
        escaped = printable(HOSTILE)
        self.assertEqual(escaped.splitlines(), [escaped])
        escaped.encode("utf-8")  # never raises


class AuditTests(SynchronousTestCase):
    def test_client_values_are_escaped_in_the_record(self):
        record = audit_record({"audit": "login_failed", "user": HOSTILE, "address": "192.0.2.1\nforged"})
        self.assertEqual(record["user"], printable(HOSTILE))
        self.assertEqual(record["address"], "192.0.2.1\\x0aforged")

    def test_a_login_with_bytes_that_are_not_utf8_keeps_the_audit_file_going(self):
        """Twisted drops an observer that raises; fail2ban then reads nothing."""
        path = os.path.abspath(self.mktemp())
        audit = AuditLog(path)
        publisher = LogPublisher(audit)
        log = Logger(observer=publisher)
        log.warn("login failed for {user!r}", user=HOSTILE, address="192.0.2.1", audit="login_failed")
        log.warn("login failed for {user!r}", user="alice", address="192.0.2.1", audit="login_failed")
        audit.close()
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().split("\n")
        self.assertEqual(lines[-1], "")
        records = [json.loads(line) for line in lines[:-1]]
        self.assertEqual([r["user"] for r in records], [printable(HOSTILE), "alice"])

    def test_a_full_disk_loses_lines_not_the_log(self):
        audit = AuditLog("/dev/full")
        self.addCleanup(audit.close)
        audit({"audit": "login", "user": "bob"})  # ENOSPC: counted, not raised
        audit({"audit": "login", "user": "carol"})
        self.assertEqual(audit.lost, 2)
        path = os.path.abspath(self.mktemp())
        os.close(audit.fd)
        audit.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)  # space is back
        audit({"audit": "login", "user": "dave"})
        with open(path, encoding="utf-8") as handle:
            records = [json.loads(line) for line in handle]
        self.assertEqual([(r["event"], r.get("count"), r.get("user")) for r in records],
                         [("audit_lost", 2, None), ("login", None, "dave")])
        self.assertEqual(audit.lost, 0)


class TextLogTests(SynchronousTestCase):
    def setUp(self):
        self.out = io.StringIO()
        self.log = Logger(observer=OneLineObserver(textFileLogObserver(self.out)))

    def lines(self):
        return self.out.getvalue().split("\n")[:-1]

    def test_a_client_value_never_starts_a_line(self):
        self.log.info("login failed for {user} ({why})", user=HOSTILE, why=ValueError("x\ny"))
        self.log.info("refused: {error}", error="Invalid value 'a\nforged' for 'link'")
        (first, second) = self.lines()
        self.assertIn("login failed for bob\\xff\\x0a2026-12-03T10:00:00+0000 [nxgate#info] NX login", first)
        self.assertIn("(x\\x0ay)", first)
        self.assertIn("refused: Invalid value 'a\\x0aforged' for 'link'", second)

    def test_ordinary_events_are_unchanged(self):
        event = {"log_format": "session {id} of {user}", "id": "A" * 32, "user": "bob", "log_level": None}
        from nxgate.logs import one_line
        self.assertIs(one_line(event), event)
        self.log.info("braces {{kept}} and {user}", user="caf\u00e9")
        self.assertIn("braces {kept} and caf\u00e9", self.lines()[0])

    def test_a_traceback_still_spans_its_lines(self):
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            self.log.failure("{what} failed", Failure(), what="a\nb")
        text = self.out.getvalue()
        self.assertIn("a\\x0ab failed", text)
        self.assertIn("RuntimeError: boom", text)
        self.assertTrue(all(line.startswith(("\t", self.lines()[0][:4])) for line in self.lines()))

    def test_a_failed_write_is_not_raised(self):
        def full(event):
            raise OSError(errno.ENOSPC, "No space left on device")

        OneLineObserver(full)({"log_format": "x", "log_level": None})


class AuditAfterReloadTests(SynchronousTestCase):
    """After a reload to ``log_level = warn`` the info-level audit events
    (login, session start, resume and end) stopped reaching the audit log:
    the level filter wrapped the audit observer too, and the gateway's
    stopService could then no longer remove it."""

    AUDITED = ("login", "session_start", "session_resume", "session_end")

    def test_info_audit_events_are_kept_after_a_reload_to_warn(self):
        publisher = LogPublisher()
        self.patch(logs, "globalLogPublisher", publisher)
        text = io.StringIO()
        publisher.addObserver(textFileLogObserver(text))
        path = self.mktemp()
        audit = AuditLog(path)
        self.addCleanup(os.close, audit.fd)
        logs.filter_global_log("info")  # the start
        publisher.addObserver(audit)
        logs.filter_global_log("warn")  # the reload
        log = Logger(namespace="nxgate", observer=publisher)
        for event in self.AUDITED:
            log.info("{what} of alice", what=event, user="alice", address="192.0.2.1", audit=event)
        log.info("chatter below the level")
        with open(path, encoding="utf-8") as handle:
            self.assertEqual([json.loads(line)["event"] for line in handle], list(self.AUDITED))
        self.assertNotIn("chatter", text.getvalue())
        publisher.removeObserver(audit)
        self.assertNotIn(audit, publisher._observers)
