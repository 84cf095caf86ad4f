"""The X2Go door's file surfaces without a gateway: the caps (pure), the SFTP
reader and handles on a string transport, the writer as the user, and what
"out of files" looks like to NSS, PAM and the count (in this process, its
limit lowered for a moment)."""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import struct
import tempfile

from twisted.conch.ssh import filetransfer
from twisted.internet import defer
from twisted.logger import globalLogPublisher
from twisted.trial.unittest import SkipTest, SynchronousTestCase

from nxgate import descriptors, users
from nxgate.gateway.auth.pam import TEMPORARY_NOTE, AuthResult, Authenticator, Verdict
from nxgate.gateway.doors.conch.x2go import allowance, files, scp, sftp
from nxgate.gateway.doors.conch.x2go.pushes import FileDesk, Refused
from tests.harness.clock import FakeReactor
from tests.harness.users import NEED_ROOT, create_user, is_root
from tests.test_nx_server_dialogue import Dialogue, sent


class AllowanceTests(SynchronousTestCase):
    def test_handles_per_user_are_capped_and_given_back(self):
        table = allowance.Allowance(FakeReactor().seconds)
        taken = sum(table.take_handle("alice") for _ in range(100))
        self.assertEqual(taken, allowance.HANDLES_PER_USER)
        self.assertTrue(table.take_handle("bob"))
        table.give_handle("alice")
        self.assertTrue(table.take_handle("alice"))
        for _ in range(200):
            table.give_handle("alice")
            table.give_handle("bob")
        self.assertEqual(len(table), 0)  # nobody holds anything: no entry left

    def test_pushes_per_user_are_capped_over_the_window(self):
        clock = FakeReactor()
        table = allowance.Allowance(clock.seconds)
        results = [table.take_push("alice", 10) for _ in range(allowance.FILES_PER_WINDOW + 1)]
        self.assertEqual(results[:-1], [None] * allowance.FILES_PER_WINDOW)
        self.assertIn("too many files copied", results[-1])
        self.assertIsNone(table.take_push("bob", 10))
        clock.advance(allowance.WINDOW)
        self.assertIsNone(table.take_push("alice", 10))
        self.assertIn("too many bytes", table.take_push("alice", allowance.BYTES_PER_WINDOW))

    def test_one_copy_is_capped_in_files_and_bytes(self):
        count = allowance.PushCount()
        self.assertEqual([count.refusal(1) for _ in range(allowance.FILES_PER_PUSH)],
                         [None] * allowance.FILES_PER_PUSH)
        self.assertIn("too many files", count.refusal(1))
        count = allowance.PushCount()
        self.assertIsNone(count.refusal(allowance.BYTES_PER_PUSH))
        self.assertIn("too many bytes", count.refusal(1))

    def test_an_scp_sink_stops_at_the_cap(self):
        sink = scp.Sink(".x2go/C-s")
        for number in range(allowance.FILES_PER_PUSH):
            sink.feed(f"C0600 1 f{number}\n".encode() + b"x\0")
        with self.assertRaisesRegex(scp.Failed, "too many files in one copy"):
            sink.feed(b"C0600 1 one-more\n")


class UsersReserveTests(SynchronousTestCase):
    def test_users_files_stop_two_reserves_short_of_the_limit_and_leave_the_doors_theirs(self):
        from nxgate.gateway.doors.guard import DoorGuard
        from nxgate.gateway.doors.preauth import Limits

        reactor = FakeReactor()
        files_open = [700]
        guard = DoorGuard(reactor, Limits(fd_reserve=128), count_files=lambda: files_open[0], file_limit=1024)
        taken = 0
        while guard.users_may_open(8):  # the estimate counts each grant until the next sample
            taken += 8
        self.assertEqual(taken, 64)  # 700 + 64 = 768 = 1024 - 2 x 128
        reactor.advance(1)
        files_open[0] = 768
        self.assertFalse(guard.users_may_open(1))
        self.assertEqual(guard.status()["refused_user_files"], 2)
        # The doors still admit: their reserve is the one above.
        self.assertNotEqual(guard.admit(None, "SSH", counted=False), False)


class FakeChannel:
    def __init__(self) -> None:
        self.data = b""
        self.lost = False

    def write(self, data: bytes) -> None:
        self.data += data

    def loseConnection(self) -> None:
        self.lost = True


class SftpServerTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.stored: list[tuple[str, bytes]] = []
        self.room = True
        self.desk = FileDesk(self.blocking, FakeReactor().seconds, lambda count: self.room)
        self.owner = files.Owner(1000, 1000, "/home/alice", "alice")
        self.events: list[dict] = []
        globalLogPublisher.addObserver(self.events.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.events.append)
        self.server, self.channel = self.open_channel()

    def blocking(self, function, *args):
        if function is files.write_as_user:
            self.stored.append((args[0], args[1]))
            return defer.succeed(None)
        return defer.maybeDeferred(function, *args)

    def open_channel(self):
        server = sftp.X2GoSFTPServer(sftp._X2GoFiles("alice", self.owner, self.desk))
        channel = FakeChannel()
        server.makeConnection(channel)
        server.dataReceived(struct.pack(">LBL", 5, filetransfer.FXP_INIT, 3))
        return server, channel

    def packets(self) -> list[tuple[int, bytes]]:
        """The server's packets so far (kind, body), taken from its output."""
        out, data = [], self.channel.data
        while data:
            (length,) = struct.unpack(">L", data[:4])
            out.append((data[4], data[5:4 + length]))
            data = data[4 + length:]
        self.channel.data = b""
        return out

    def open(self, request: int, path: bytes = b".x2go/C-s/.pulse-cookie") -> tuple[int, bytes]:
        body = struct.pack(">L", request) + struct.pack(">L", len(path)) + path
        body += struct.pack(">LL", filetransfer.FXF_WRITE | filetransfer.FXF_CREAT, 0)
        self.server.dataReceived(struct.pack(">LB", len(body) + 1, filetransfer.FXP_OPEN) + body)
        return self.packets()[-1]

    def warnings(self) -> list[str]:
        return [e["log_format"] for e in self.events if e.get("log_level") is not None
                and e["log_level"].name in ("warn", "error", "critical")]

    def test_a_file_is_written_as_the_user_when_it_is_closed(self):
        self.packets()  # VERSION
        kind, body = self.open(1)
        self.assertEqual(kind, filetransfer.FXP_HANDLE)
        handle = body[8:]
        write = struct.pack(">L", 2) + struct.pack(">L", len(handle)) + handle + struct.pack(">Q", 0)
        cookie = bytes(range(256))  # a PulseAudio cookie is 256 bytes: anything else is refused
        write += struct.pack(">L", len(cookie)) + cookie
        close = struct.pack(">L", 3) + struct.pack(">L", len(handle)) + handle
        # In pieces of three bytes: the reader keeps what it has until a packet is whole.
        stream = (struct.pack(">LB", len(write) + 1, filetransfer.FXP_WRITE) + write
                  + struct.pack(">LB", len(close) + 1, filetransfer.FXP_CLOSE) + close)
        for start in range(0, len(stream), 3):
            self.server.dataReceived(stream[start:start + 3])
        self.assertEqual(self.stored, [(".x2go/C-s/.pulse-cookie", cookie)])
        self.assertEqual([kind for kind, _ in self.packets()], [filetransfer.FXP_STATUS] * 2)

    def test_handles_are_capped_per_channel_and_per_user(self):
        self.packets()
        kinds = [self.open(number)[0] for number in range(allowance.HANDLES_PER_CHANNEL + 3)]
        self.assertEqual(kinds.count(filetransfer.FXP_HANDLE), allowance.HANDLES_PER_CHANNEL)
        self.assertEqual(kinds[-1], filetransfer.FXP_STATUS)
        servers = [self.open_channel() for _ in range(10)]
        opened = allowance.HANDLES_PER_CHANNEL
        for server, channel in servers:
            self.server, self.channel = server, channel
            self.packets()
            opened += sum(self.open(number)[0] == filetransfer.FXP_HANDLE
                          for number in range(allowance.HANDLES_PER_CHANNEL))
        self.assertEqual(opened, allowance.HANDLES_PER_USER)
        # A channel that ends gives its handles back, writing nothing.
        for server, _ in servers:
            server.connectionLost(None)
        self.assertEqual(self.desk.allowance.handles("alice"), allowance.HANDLES_PER_CHANNEL)
        self.assertEqual(self.stored, [])

    def test_a_packet_announcing_two_gigabytes_closes_the_channel_at_its_header(self):
        self.server.dataReceived(struct.pack(">LB", 0x7FFFFFFF, filetransfer.FXP_WRITE) + b"\0" * 4000)
        self.assertTrue(self.channel.lost)
        self.assertEqual(len(self.server.buf), 0)
        self.server.dataReceived(b"\0" * 100000)  # what the client still sends is dropped
        self.assertEqual(len(self.server.buf), 0)
        self.assertEqual(len(self.warnings()), 1)

    def test_a_malformed_packet_is_a_bad_message_in_one_line(self):
        self.packets()
        truncated_open = struct.pack(">LBLL", 9, filetransfer.FXP_OPEN, 7, 1000)
        self.server.dataReceived(truncated_open)
        ((kind, body),) = self.packets()
        self.assertEqual((kind, body[:4], struct.unpack(">L", body[4:8])[0]),
                         (filetransfer.FXP_STATUS, struct.pack(">L", 7), filetransfer.FX_BAD_MESSAGE))
        for _ in range(sftp.MAX_BAD_PACKETS):
            self.server.dataReceived(truncated_open)
        self.assertTrue(self.channel.lost)
        self.assertEqual(len(self.warnings()), 2)  # the first malformed packet, and the close
        self.assertEqual([e for e in self.events if e.get("log_failure")], [])
        self.assertEqual(self.flushLoggedErrors(), [])

    def test_a_write_to_a_handle_that_is_not_open_is_no_traceback(self):
        write = struct.pack(">L", 4) + struct.pack(">L", 2) + b"zz" + struct.pack(">Q", 0) + struct.pack(">L", 1) + b"x"
        self.server.dataReceived(struct.pack(">LB", len(write) + 1, filetransfer.FXP_WRITE) + write)
        self.assertEqual(self.packets()[-1][0], filetransfer.FXP_STATUS)
        self.assertEqual(self.flushLoggedErrors(), [])

    def test_without_room_in_the_reserve_a_write_is_refused(self):
        self.room = False
        self.assertIsInstance(self.failureResultOf(self.desk.store("alice", self.owner, ".x2go/a", b"x")).value,
                              Refused)
        self.assertEqual(self.stored, [])


@contextlib.contextmanager
def out_of_files():
    """This process with every descriptor it may have taken (its soft limit
    lowered to what it holds, the gap filled), for a moment."""
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    held: list[int] = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (descriptors.count_open_files() + 8, before[1]))
    try:
        with contextlib.suppress(OSError):
            while True:
                held.append(os.open(os.devnull, os.O_RDONLY))
        yield
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, before)


class OutOfFilesTests(SynchronousTestCase):
    def test_the_count_is_the_limit_when_none_is_left_to_list_them(self):
        with out_of_files():
            count, limit = descriptors.count_open_files(), descriptors.file_limit()
            short = descriptors.short_of_files()
        self.assertEqual(count, limit)  # it said 0 before
        self.assertTrue(short)
        self.assertFalse(descriptors.short_of_files())
        self.assertGreater(descriptors.count_open_files(), 2)

    def test_an_existing_account_is_unavailable_not_unknown(self):
        me = users.account("root").pw_name
        users.account("nobody")  # NSS's modules loaded, as in a gateway that ran a while
        with self.assertRaises(KeyError):
            users.account("no-such-user-nxgate")
        with out_of_files():
            with self.assertRaises(users.AccountsUnavailable):
                users.account("no-such-user-nxgate")
        self.assertEqual(me, "root")

    def test_a_node_out_of_files_refuses_a_session_for_now_not_for_a_missing_account(self):
        from nxgate.vocabulary.caller import Caller
        from nxgate.vocabulary.errors import Kind, SessionError

        def blocking(function, *args):
            return defer.fail(users.AccountsUnavailable(24, "out of open files"))

        directory = users.UserDirectory(blocking)
        failure = self.failureResultOf(defer.ensureDeferred(directory.here(Caller(user="alice"), "node1")),
                                       SessionError)
        self.assertEqual(failure.value.kind, Kind.LIMIT_REACHED)
        self.assertIn("out of open files", failure.value.message)

    def test_real_pam_out_of_files_is_a_temporary_error(self):
        if not is_root():
            raise SkipTest(NEED_ROOT)
        user = create_user()
        self.addCleanup(user.remove)
        authenticator = Authenticator(FakeReactor(), "login", failed_login_delay=0)
        answer = lambda prompts: [user.password] * len(prompts)  # noqa: E731
        self.assertTrue(authenticator._attempt(user.name, answer, "192.0.2.1").granted)  # PAM's modules loaded
        with out_of_files():
            result = authenticator._attempt(user.name, answer, "192.0.2.1")
        self.assertEqual((result.verdict, result.temporary), (Verdict.ERROR, True))
        self.assertIn("out of open files", result.reason)
        self.assertEqual(result.client_note, TEMPORARY_NOTE)

    def test_a_wrong_password_with_files_to_spare_is_still_a_denial(self):
        authenticator = Authenticator(FakeReactor(), "login", failed_login_delay=0,
                                      transaction=lambda *args: (7, "Authentication failure"))
        result = authenticator._attempt("nobody", lambda prompts: [], None)
        self.assertEqual((result.verdict, result.temporary, result.client_note), (Verdict.DENIED, False, ""))

    def test_the_nx_client_is_told_to_try_again(self):
        d = Dialogue()
        d.say(b"login\nbob\npw\n")
        note = AuthResult(Verdict.ERROR, "bob", "out of files", temporary=True).client_note
        self.assertEqual(sent(d.shell.authentication_finished(None, error=True, note=note)),
                         f"NX> 503 ERROR: {note[0].upper()}{note[1:]}.\nNX> 105 ".encode())


class WriterTests(SynchronousTestCase):
    """The writer process, run as we are (the e2e tests run it as a user)."""

    def setUp(self) -> None:
        self.home = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.home, True)
        self.owner = files.Owner(os.getuid(), os.getgid(), self.home, "")

    def test_the_writer_writes_below_x2go_and_says_why_not(self):
        files.write_as_user(".x2go/C-s/.pulse-cookie", b"\0\xffcookie", self.owner)
        with open(os.path.join(self.home, ".x2go", "C-s", ".pulse-cookie"), "rb") as handle:
            self.assertEqual(handle.read(), b"\0\xffcookie")
        os.symlink("/etc", os.path.join(self.home, ".x2go", "C-t"))
        with self.assertRaisesRegex(files.PathRefused, "C-t"):
            files.write_as_user(".x2go/C-t/passwd", b"x", self.owner)
        with self.assertRaisesRegex(files.PathRefused, "outside"):
            files.write_as_user("/etc/passwd", b"x", self.owner)
