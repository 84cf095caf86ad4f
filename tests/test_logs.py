"""Client bytes in the text log and the audit log: one event, one line,
whatever the bytes, and a full disk loses lines, never the log."""

import errno
import io
import json
import os
from struct import error as struct_error

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


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class RepeatLimiterTests(SynchronousTestCase):
    """Lines a client can repeat: a few a minute, then a count."""

    def setUp(self):
        self.clock = _Clock()
        self.limiter = logs.RepeatLimiter(self.clock, per_source=10, per_kind=60, window=60.0)

    def admit(self, kind="refused {x}", source="192.0.2.1", times=1):
        return [self.limiter.admit(kind, source, {"n": n, "log_format": kind}) for n in range(times)]

    def test_a_flood_of_one_kind_from_one_address_is_held_back_then_counted_once(self):
        self.assertEqual(self.admit(times=1000).count(True), 10)
        self.assertEqual(self.limiter.due(), [])  # its minute is not over
        self.clock.now += 59
        self.assertEqual(self.limiter.due(), [])
        self.clock.now += 1
        [held] = self.limiter.due()
        self.assertEqual((held.count, held.since, held.sample["n"]), (990, 1000.0, 999))
        self.clock.now += 5
        self.assertEqual(self.limiter.due(), [])  # told once
        self.assertEqual(self.admit(times=3), [True] * 3)  # a new minute

    def test_other_addresses_and_kinds_keep_their_share(self):
        self.admit(times=100)
        self.assertEqual(self.admit(source="192.0.2.2", times=10), [True] * 10)
        self.assertEqual(self.admit(kind="another {y}", times=10), [True] * 10)
        self.assertEqual(self.admit(source=None, times=11).count(True), 10)

    def test_one_kind_from_many_addresses_is_bounded_in_all(self):
        passed = sum(self.admit(source=f"10.0.{n // 250}.{n % 250}", times=3).count(True) for n in range(1000))
        self.assertEqual(passed, 60)
        self.clock.now += 61
        self.limiter.due()
        self.assertTrue(self.admit(source="10.9.9.9")[0])

    def test_a_count_is_told_when_the_same_kind_comes_back_after_its_minute(self):
        self.admit(times=15)
        self.clock.now += 61
        self.assertEqual(self.admit(), [True])
        [held] = self.limiter.due()
        self.assertEqual(held.count, 5)

    def test_the_table_stays_bounded_under_a_flood_from_many_addresses(self):
        limiter = logs.RepeatLimiter(self.clock, per_source=10, per_kind=10**6, capacity=100)
        for n in range(5000):
            limiter.admit("kind", f"10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}", {})
            if n % 1000 == 999:
                self.clock.now += 61
        self.assertLessEqual(len(limiter._sources), 101)


class RepeatObserverTests(SynchronousTestCase):
    def setUp(self):
        self.clock = _Clock()
        self.out = io.StringIO()
        self.observer = logs.RepeatObserver(OneLineObserver(textFileLogObserver(self.out)),
                                            logs.RepeatLimiter(self.clock))
        self.log = Logger(namespace="nxgate.ssh", observer=self.observer)

    def lines(self):
        return self.out.getvalue().split("\n")[:-1]

    def test_warnings_are_limited_per_address_and_info_lines_are_not(self):
        for n in range(1000):
            self.log.warn("refused global request {kind!r} for {user!r}", kind=f"r{n}", user="nx",
                          address="192.0.2.1")
            self.log.info("an info line {n}", n=n)
        lines = self.lines()
        self.assertEqual(sum("refused global request" in line for line in lines), logs.PER_SOURCE)
        self.assertEqual(sum("an info line" in line for line in lines), 1000)
        self.clock.now += 61
        self.log.info("later")  # any line tells what is due
        summary = [line for line in lines + self.lines()[len(lines):] if "more like it" in line]
        self.assertEqual(len(summary), 1)
        self.assertIn("[nxgate.ssh#warn] refused global request 'r999' for 'nx' ... and 990 more like it in 61 s",
                      summary[0])

    def test_tracebacks_are_limited_too_and_the_count_is_one_line(self):
        for _ in range(100):
            try:
                raise struct_error("unpack requires a buffer of 4 bytes")
            except struct_error:
                Logger(namespace="twisted.conch.ssh.filetransfer", observer=self.observer).failure(
                    "Failed to handle packet of type {packetType}", packetType="OPEN")
        self.assertEqual(self.out.getvalue().count("Traceback"), logs.PER_SOURCE)
        self.clock.now += 60
        logs._REPEAT_OBSERVERS.append(self.observer)
        self.addCleanup(logs._REPEAT_OBSERVERS.remove, self.observer)
        logs.flush_repeats()  # the gateway's timer, when nothing else is logged
        last = self.lines()[-1]
        self.assertIn("Failed to handle packet of type OPEN ... and 90 more like it", last)
        self.assertEqual(self.out.getvalue().count("Traceback"), logs.PER_SOURCE)

    def test_the_address_is_taken_from_the_usual_fields(self):
        from twisted.internet.address import IPv4Address

        self.assertEqual(logs.source_of({"peer": "192.0.2.7:40000"}), "192.0.2.7")
        self.assertEqual(logs.source_of({"address": IPv4Address("TCP", "192.0.2.8", 1)}), "192.0.2.8")
        self.assertEqual(logs.source_of({"source": "2001:db8::1"}), "2001:db8::1")
        self.assertIsNone(logs.source_of({"user": "bob"}))


class GlobalLogTests(SynchronousTestCase):
    """What the gateway installs in front of twistd's observers."""

    def test_the_gateways_log_holds_back_a_warning_flood(self):
        publisher = LogPublisher()
        self.patch(logs, "globalLogPublisher", publisher)
        clock = _Clock()
        self.patch(logs, "CLOCK", clock)
        text = io.StringIO()
        publisher.addObserver(textFileLogObserver(text))
        logs.filter_global_log("info")
        log = Logger(namespace="nxgate.ssh", observer=publisher)
        for _ in range(10000):
            log.warn("refused {what!r} for {user!r} from {address}", what=b"x11", user="nx", address="192.0.2.9")
        self.assertEqual(text.getvalue().count("refused b'x11'"), logs.PER_SOURCE)


class _Unopenable(Exception):
    pass


class SturdyLogFileTests(SynchronousTestCase):
    def log_file(self, keep=3, length=200):
        directory = self.mktemp()
        os.makedirs(directory)
        from twisted.python.logfile import LogFile

        made = LogFile("gateway.log", directory, rotateLength=length)
        self.addCleanup(lambda: made.closed or made.close())
        publisher = LogPublisher()
        self.patch(logs, "globalLogPublisher", publisher)
        observer = textFileLogObserver(made)
        publisher.addObserver(observer)
        logs.filter_global_log("info", rotated_files=keep)  # as the gateway does with twistd's file
        self.addCleanup(logs._LOG_FILES.remove, made)
        self.assertIsInstance(made, logs.SturdyLogFile)
        return made, Logger(namespace="nxgate", observer=publisher), directory

    def test_rotated_files_are_bounded_in_number(self):
        made, log, directory = self.log_file(keep=3)
        for n in range(200):
            log.info("line {n} of a long run", n=n)
        self.assertEqual(sorted(os.listdir(directory)),
                         ["gateway.log", "gateway.log.1", "gateway.log.2", "gateway.log.3"])
        with open(os.path.join(directory, "gateway.log")) as handle:
            self.assertIn("line 199 of a long run", handle.read())

    def test_a_rotation_that_cannot_open_a_new_file_writes_on_and_opens_one_later(self):
        made, log, directory = self.log_file(keep=5)
        opened = made._openFile
        failing = [True]

        def open_file():
            if failing[0]:
                raise OSError(errno.EMFILE, "Too many open files")
            opened()

        made._openFile = open_file
        for n in range(40):
            log.info("line {n} while the process has no file left", n=n)
        self.assertEqual(sorted(os.listdir(directory)), ["gateway.log.1"])  # renamed, written on
        with open(os.path.join(directory, "gateway.log.1")) as handle:
            self.assertIn("line 39 while the process has no file left", handle.read())
        failing[0] = False
        made.retry_at = 0  # a second later
        log.info("files are back")
        with open(os.path.join(directory, "gateway.log")) as handle:
            text = handle.read()
        self.assertIn("the log could not be reopened at its rotation (Too many open files)", text)
        self.assertIn("files are back", text)

    def test_a_rotation_that_cannot_rename_keeps_the_current_file(self):
        made, log, directory = self.log_file(keep=5)
        self.patch(logs.os, "rename", lambda *args: (_ for _ in ()).throw(OSError(errno.EROFS, "read-only")))
        for n in range(40):
            log.info("line {n}", n=n)
        self.assertEqual(os.listdir(directory), ["gateway.log"])
        with open(os.path.join(directory, "gateway.log")) as handle:
            self.assertIn("line 39", handle.read())


class ClassChatterTests(SynchronousTestCase):
    """Twisted's classes log through a Logger attribute (namespaced by the
    object's class): their per-connection info lines are debug; the
    gateway's own module loggers' are not."""

    def log_at(self, level):
        publisher = LogPublisher()
        self.patch(logs, "globalLogPublisher", publisher)
        text = io.StringIO()
        publisher.addObserver(textFileLogObserver(text))
        logs.filter_global_log(level)

        from twisted.conch.ssh.connection import SSHConnection
        from twisted.internet.protocol import Factory

        class NXConnection(SSHConnection):  # as the gateway's SSH door subclasses Conch's
            pass

        def class_logger(thing):  # what Twisted's Logger attribute gives an object (Logger.__get__)
            return Logger(f"{type(thing).__module__}.{type(thing).__name__}", thing, publisher)

        connection, factory = NXConnection(), Factory()
        class_logger(connection).info("sending close {id}", id=3)
        class_logger(connection).error("other side refused open\nreason: {reason}", reason="x")
        class_logger(factory).info("Starting factory {factory!r}", factory=factory)
        self.assertEqual(class_logger(connection).namespace, NXConnection._log.namespace)
        Logger(namespace="twisted.protocols.amp", observer=publisher).info("NodeAMP connection established")
        ours = Logger(namespace="nxgate.gateway.doors.conch.server", observer=publisher)
        ours.info("SSH connection from 192.0.2.1:5 closed")
        return text.getvalue()

    def test_at_info_only_the_gateways_lines_and_twisteds_errors(self):
        text = self.log_at("info")
        self.assertNotIn("sending close", text)
        self.assertNotIn("Starting factory", text)
        self.assertNotIn("connection established", text)
        self.assertIn("other side refused open", text)
        self.assertIn("SSH connection from 192.0.2.1:5 closed", text)

    def test_at_debug_everything(self):
        text = self.log_at("debug")
        self.assertIn("sending close 3", text)
        self.assertIn("Starting factory", text)
        self.assertIn("connection established", text)


class NamespaceTests(SynchronousTestCase):
    """Every logger of the gateway is ``Logger()`` at module level: its
    namespace is its module's path, which a log line names."""

    def test_no_logger_is_given_a_namespace_or_lives_in_a_class(self):
        import ast
        import pathlib

        root = pathlib.Path(logs.__file__).parent
        found = []
        for path in sorted(root.rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    for statement in node.body:
                        value = getattr(statement, "value", None)
                        if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "Logger":
                            found.append(f"{path.relative_to(root.parent)}:{statement.lineno} a Logger in a class")
                if (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Logger"
                        and any(keyword.arg in ("namespace", None) for keyword in node.keywords) | bool(node.args)):
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno} Logger with a namespace")
        self.assertEqual(found, [])

    def test_a_module_logger_is_named_after_its_module(self):
        from nxgate.gateway.doors.web import site
        from nxgate.node import lifecycle

        self.assertEqual((lifecycle.log.namespace, site.log.namespace),
                         ("nxgate.node.lifecycle", "nxgate.gateway.doors.web.site"))
