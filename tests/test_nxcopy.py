"""Tests for helpers/nxcopy, the C relay used in the OpenSSH deployment mode.

The module builds the helper once (``make -C helpers all asan``) and runs
every test twice: against the hardened binary and against the ASan/UBSan
build.  A sanitizer report (leak, memory error, undefined behaviour) makes
the test fail, both through the exit status (abort_on_error) and through a
scan of the helper's stderr.

All I/O on the test side is non-blocking with deadlines and every child is
killed after ``TIMEOUT`` seconds, so a broken relay fails a test instead of
hanging the run.
"""

import os
import random
import select
import socket
import struct
import subprocess
import tempfile
import threading
import time

from twisted.trial import unittest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HELPERS = os.path.join(REPO, "helpers")
TIMEOUT = 20.0
SANITIZER_MARKERS = (
    "AddressSanitizer",
    "LeakSanitizer",
    "UndefinedBehaviorSanitizer",
    "runtime error:",
)

_build_result = None


def build_helpers():
    """Build both binaries once per test run; raise with make's output on failure."""
    global _build_result
    if _build_result is None:
        proc = subprocess.run(
            ["make", "-C", HELPERS, "all", "asan"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        _build_result = (proc.returncode, proc.stdout.decode(errors="replace"))
    if _build_result[0] != 0:
        raise AssertionError("building helpers failed:\n" + _build_result[1])


# -- deadline-bounded I/O on non-blocking descriptors ------------------------


def _wait(fd, for_write, deadline):
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("fd %d not %s in time" % (fd, "writable" if for_write else "readable"))
    if for_write:
        select.select([], [fd], [], left)
    else:
        select.select([fd], [], [], left)


def write_all(fd, data, deadline, chunk=65536):
    view = memoryview(data)
    pos = 0
    while pos < len(view):
        _wait(fd, True, deadline)
        try:
            pos += os.write(fd, view[pos:pos + chunk])
        except BlockingIOError:
            pass


def read_some(fd, deadline, size=65536):
    """One read; b'' means EOF."""
    while True:
        _wait(fd, False, deadline)
        try:
            return os.read(fd, size)
        except BlockingIOError:
            pass


def read_exact(fd, n, deadline):
    out = bytearray()
    while len(out) < n:
        data = read_some(fd, deadline, n - len(out))
        if not data:
            raise AssertionError("EOF after %d of %d bytes" % (len(out), n))
        out += data
    return bytes(out)


def read_to_eof(fd, deadline, chunk=65536, pause_every=0, rng=None):
    """Read until EOF.  With ``rng`` the reads are tiny (1..64 bytes) and
    every ``pause_every`` reads the reader sleeps a little: a slow consumer."""
    out = bytearray()
    count = 0
    while True:
        size = rng.randint(1, 64) if rng else chunk
        data = read_some(fd, deadline, size)
        if not data:
            return bytes(out)
        out += data
        count += 1
        if pause_every and count % pause_every == 0:
            time.sleep(0.002)


def run_threads(*funcs):
    """Run the callables concurrently; re-raise the first exception."""
    errors = []

    def wrap(f):
        try:
            f()
        except BaseException as e:  # noqa: B902 - reported below
            errors.append(e)

    threads = [threading.Thread(target=wrap, args=(f,), daemon=True) for f in funcs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT + 5)
        if t.is_alive():
            raise AssertionError("I/O thread still running after the deadline")
    if errors:
        raise errors[0]


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- the two sides of the relay, seen from the test --------------------------


class ClientSide:
    """What sshd would be: nxcopy's stdin/stdout, as two pipes or one socketpair.

    ``w`` writes into nxcopy's input, ``r`` reads its output.
    """

    def __init__(self, test, kind, custom_fds=False):
        self.kind = kind
        self.sock = None
        if kind == "pipes":
            self.child_in, self.w = os.pipe()
            self.r, self.child_out = os.pipe()
            self.child_fds = [self.child_in, self.child_out]
        else:  # like sshd without USE_PIPES: one socket on both stdin and stdout
            self.sock, other = socket.socketpair()
            self.w = self.r = self.sock.fileno()
            self.child_in = self.child_out = other.detach()
            self.child_fds = [self.child_in]
        for fd in {self.r, self.w}:
            os.set_blocking(fd, False)
        self.custom_fds = custom_fds
        self.open_fds = {self.r, self.w} if not self.sock else set()
        test.addCleanup(self.close)

    def popen_kwargs(self):
        if self.custom_fds:
            return dict(stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, pass_fds=tuple(self.child_fds))
        return dict(stdin=self.child_in, stdout=self.child_out)

    def args(self):
        if self.custom_fds:
            return ["--in-fd", str(self.child_in), "--out-fd", str(self.child_out)]
        return []

    def spawned(self):
        for fd in self.child_fds:  # only nxcopy may hold them now, or EOF never comes
            os.close(fd)
        self.child_fds = []

    def close_write(self):
        if self.sock:
            self.sock.shutdown(socket.SHUT_WR)
        else:
            os.close(self.w)
            self.open_fds.discard(self.w)

    def close(self):
        for fd in self.child_fds + list(self.open_fds):
            os.close(fd)
        self.child_fds, self.open_fds = [], set()
        if self.sock:
            self.sock.close()


class ServerSide:
    """What nxagent would be: a TCP listener, a Unix listener or a socketpair (--fd)."""

    def __init__(self, test, kind, rcvbuf=None):
        self.kind = kind
        self.conn = None
        self.listener = None
        self.pass_fds = ()
        test.addCleanup(self.close)
        if kind == "tcp":
            self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.listener.bind(("127.0.0.1", 0))
            self.args = ["--connect", "127.0.0.1:%d" % self.listener.getsockname()[1]]
        elif kind == "unix":
            tmp = tempfile.mkdtemp(prefix="nxcopy-test-")
            path = os.path.join(tmp, "agent.sock")
            test.addCleanup(os.rmdir, tmp)
            test.addCleanup(os.unlink, path)
            self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.listener.bind(path)
            self.args = ["--unix", path]
        else:
            self.conn, theirs = socket.socketpair()
            self.theirs = theirs
            self.pass_fds = (theirs.fileno(),)
            self.args = ["--fd", str(theirs.fileno())]
        if rcvbuf:  # inherited by accepted sockets: forces short writes in nxcopy
            (self.listener or self.conn).setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        if self.listener:
            self.listener.listen(4)

    def spawned(self):
        if self.kind == "fd":
            self.theirs.close()

    def accept(self):
        if self.conn is None:
            self.listener.settimeout(TIMEOUT)
            self.conn, _ = self.listener.accept()
        self.fd = self.conn.fileno()
        os.set_blocking(self.fd, False)

    def close_write(self):
        self.conn.shutdown(socket.SHUT_WR)

    def reset(self):
        """Close with SO_LINGER 0: the kernel sends RST instead of FIN."""
        self.conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.conn.close()

    def close(self):
        for s in (self.conn, self.listener):
            if s is not None:
                s.close()


class Child:
    def __init__(self, test, argv, env, **kwargs):
        self.err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(argv, stderr=self.err, env=env, close_fds=True, **kwargs)
        test.addCleanup(self.cleanup)

    def wait(self, timeout=TIMEOUT):
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("nxcopy still running after %.0f s (killed)" % timeout)

    def stderr(self):
        self.err.seek(0)
        return self.err.read().decode(errors="replace")

    def cleanup(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.err.close()


# -- the tests, run once per binary -------------------------------------------


class NxcopyTestsMixin:
    binary = None
    sanitized = False

    def setUp(self):
        build_helpers()
        self.path = os.path.join(HELPERS, self.binary)
        self.env = dict(os.environ)
        if self.sanitized:
            self.env["ASAN_OPTIONS"] = "detect_leaks=1:abort_on_error=1"
            self.env["UBSAN_OPTIONS"] = "halt_on_error=1:print_stacktrace=1"
        self.rng = random.Random(0x4E58)

    def spawn(self, args, client=None, server=None, **kwargs):
        kw = dict(stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        pass_fds = set()
        argv = [self.path]
        if client:
            kw.update(client.popen_kwargs())
            pass_fds.update(kw.pop("pass_fds", ()))
            argv += client.args()
        if server:
            pass_fds.update(server.pass_fds)
            argv += server.args
        kw.update(kwargs)
        child = Child(self, argv + list(args), self.env, pass_fds=tuple(pass_fds), **kw)
        if client:
            client.spawned()
        if server:
            server.spawned()
        return child

    def finish(self, child, expected, timeout=TIMEOUT):
        """Wait for exit; check the status and that no sanitizer complained."""
        rc = child.wait(timeout)
        err = child.stderr()
        for marker in SANITIZER_MARKERS:
            self.assertNotIn(marker, err, "sanitizer report:\n" + err)
        self.assertEqual(rc, expected, "exit status %r, stderr:\n%s" % (rc, err))
        return err

    def assertSameBytes(self, got, want, what):
        if got != want:
            first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            self.fail("%s: got %d bytes, want %d; first difference at offset %d" % (what, len(got), len(want), first))

    def deadline(self):
        return time.monotonic() + TIMEOUT

    # bulk data, both directions at once ----------------------------------

    def bulk(self, client_kind, server_kind, extra=(), custom_fds=False):
        up = os.urandom(3 * 1024 * 1024 + 4321)
        down = os.urandom(3 * 1024 * 1024 + 1234)
        server = ServerSide(self, server_kind)
        client = ClientSide(self, client_kind, custom_fds=custom_fds)
        child = self.spawn(extra, client, server)
        server.accept()
        dl = self.deadline()
        got = {}

        def client_send():
            write_all(client.w, up, dl)
            client.close_write()

        def server_send():
            write_all(server.fd, down, dl)
            server.close_write()

        def server_recv():
            got["up"] = read_to_eof(server.fd, dl)

        def client_recv():
            got["down"] = read_to_eof(client.r, dl)

        run_threads(client_send, server_send, server_recv, client_recv)
        self.assertSameBytes(got["up"], up, "client->server")
        self.assertSameBytes(got["down"], down, "server->client")
        self.finish(child, 0)

    def test_custom_in_out_fds(self):
        self.bulk("pipes", "tcp", custom_fds=True)

    # small writes -----------------------------------------------------------

    def echo_roundtrips(self, client_kind, extra=()):
        server = ServerSide(self, "tcp")
        client = ClientSide(self, client_kind)
        child = self.spawn(extra, client, server)
        server.accept()
        dl = self.deadline()

        def echo():
            while True:
                data = read_some(server.fd, dl, 1)
                if not data:
                    server.close_write()
                    return
                write_all(server.fd, data, dl)

        def talk():
            for i in range(30):
                byte = bytes([i + 65])
                start = time.monotonic()
                write_all(client.w, byte, dl)
                self.assertEqual(read_exact(client.r, 1, start + 2.0), byte)
            client.close_write()
            self.assertEqual(read_to_eof(client.r, dl), b"")

        run_threads(echo, talk)
        self.finish(child, 0)

    def test_small_writes_pipes(self):
        self.echo_roundtrips("pipes")

    def test_small_writes_socketpair(self):
        self.echo_roundtrips("socketpair")

    def test_small_writes_no_splice(self):
        self.echo_roundtrips("pipes", ["--no-splice"])

    def test_small_writes_socketpair_no_splice(self):
        self.echo_roundtrips("socketpair", ["--no-splice"])

    # half-close ---------------------------------------------------------------

    def half_close_client_first(self, client_kind, extra=()):
        server = ServerSide(self, "tcp")
        client = ClientSide(self, client_kind)
        child = self.spawn(extra, client, server)
        server.accept()
        dl = self.deadline()
        reply = b"still talking after your EOF\n" + os.urandom(300000)
        write_all(client.w, b"hello", dl)
        client.close_write()
        self.assertEqual(read_to_eof(server.fd, dl), b"hello")  # the server saw EOF
        self.assertIsNone(child.proc.poll(), "nxcopy exited although server->client is open")
        got = {}
        run_threads(lambda: (write_all(server.fd, reply, dl), server.close_write()),
                    lambda: got.update(down=read_to_eof(client.r, dl)))
        self.assertSameBytes(got["down"], reply, "server->client after client EOF")
        self.finish(child, 0)

    def test_half_close_client_first_pipes(self):
        self.half_close_client_first("pipes")

    def test_half_close_client_first_socketpair(self):
        self.half_close_client_first("socketpair")

    def test_half_close_client_first_no_splice(self):
        self.half_close_client_first("pipes", ["--no-splice"])

    def half_close_server_first(self, client_kind, extra=()):
        server = ServerSide(self, "tcp")
        client = ClientSide(self, client_kind)
        child = self.spawn(extra, client, server)
        server.accept()
        dl = self.deadline()
        bye = b"bye\n" + os.urandom(200000)
        late = os.urandom(400000)
        got = {}
        run_threads(lambda: (write_all(server.fd, bye, dl), server.close_write()),
                    lambda: got.update(down=read_to_eof(client.r, dl)))  # stdout reached EOF
        self.assertSameBytes(got["down"], bye, "server->client")
        self.assertIsNone(child.proc.poll(), "nxcopy exited although stdin is still open")
        run_threads(lambda: (write_all(client.w, late, dl), client.close_write()),
                    lambda: got.update(up=read_to_eof(server.fd, dl)))
        self.assertSameBytes(got["up"], late, "client->server after server EOF")
        self.finish(child, 0)

    def test_half_close_server_first_pipes(self):
        self.half_close_server_first("pipes")

    def test_half_close_server_first_socketpair(self):
        self.half_close_server_first("socketpair")

    def test_half_close_server_first_no_splice(self):
        self.half_close_server_first("socketpair", ["--no-splice"])

    # slow consumers: short writes and EAGAIN inside nxcopy ------------------

    def slow_readers(self, client_kind, extra=()):
        up = os.urandom(512 * 1024)
        down = os.urandom(512 * 1024)
        server = ServerSide(self, "tcp", rcvbuf=4096)
        client = ClientSide(self, client_kind)
        child = self.spawn(["--buffer", "4096"] + list(extra), client, server)
        server.accept()
        dl = self.deadline()
        got = {}
        r1, r2 = random.Random(1), random.Random(2)
        run_threads(
            lambda: (write_all(client.w, up, dl), client.close_write()),
            lambda: (write_all(server.fd, down, dl), server.close_write()),
            lambda: got.update(up=read_to_eof(server.fd, dl, pause_every=64, rng=r1)),
            lambda: got.update(down=read_to_eof(client.r, dl, pause_every=64, rng=r2)),
        )
        self.assertSameBytes(got["up"], up, "client->server")
        self.assertSameBytes(got["down"], down, "server->client")
        self.finish(child, 0)

    def test_slow_readers_pipes(self):
        self.slow_readers("pipes")

    def test_slow_readers_socketpair(self):
        self.slow_readers("socketpair")

    def test_slow_readers_no_splice(self):
        self.slow_readers("pipes", ["--no-splice"])

    def test_no_busy_waiting(self):
        """Idle, half-closed and output-blocked states must sleep in poll()."""
        server = ServerSide(self, "tcp")
        client = ClientSide(self, "pipes")
        child = self.spawn([], client, server)
        server.accept()
        dl = self.deadline()
        pid = child.proc.pid

        def burn_during(seconds):
            before = cpu_seconds(pid)
            time.sleep(seconds)
            return cpu_seconds(pid) - before

        self.assertLess(burn_during(0.6), 0.15, "CPU burnt while idle")
        # Nobody reads nxcopy's stdout: it must wait for POLLOUT, not spin.
        flood = os.urandom(4 * 1024 * 1024)
        try:
            write_all(server.fd, flood, time.monotonic() + 0.5)
        except TimeoutError:
            pass  # expected: everything is full
        self.assertLess(burn_during(0.6), 0.15, "CPU burnt while stdout was blocked")
        server.close_write()
        got = read_to_eof(client.r, dl)
        self.assertEqual(got, flood[:len(got)])
        # server->client finished, client->server idle
        self.assertLess(burn_during(0.6), 0.15, "CPU burnt while half-closed")
        client.close_write()
        self.assertEqual(read_to_eof(server.fd, dl), b"")
        self.finish(child, 0)

    # errors ---------------------------------------------------------------------

    def test_peer_reset(self):
        server = ServerSide(self, "tcp")
        client = ClientSide(self, "pipes")
        child = self.spawn([], client, server)
        server.accept()
        dl = self.deadline()
        write_all(client.w, b"ping", dl)
        self.assertEqual(read_exact(server.fd, 4, dl), b"ping")
        write_all(server.fd, b"pong", dl)
        self.assertEqual(read_exact(client.r, 4, dl), b"pong")
        server.reset()  # client side stays open: only the RST can end it
        err = self.finish(child, 1)
        self.assertIn("reset", err.lower())

    def test_peer_reset_while_writing(self):
        server = ServerSide(self, "tcp")
        client = ClientSide(self, "socketpair")
        child = self.spawn([], client, server)
        server.accept()
        stop = threading.Event()

        def flood():  # keep nxcopy busy writing to a server that never reads
            block = os.urandom(65536)
            dl = self.deadline()
            while not stop.is_set():
                try:
                    write_all(client.w, block, min(dl, time.monotonic() + 0.2))
                except TimeoutError:
                    pass
                except OSError:  # nxcopy is gone
                    return

        t = threading.Thread(target=flood, daemon=True)
        t.start()
        time.sleep(0.5)
        server.reset()
        try:
            self.finish(child, 1)
        finally:
            stop.set()
            t.join(TIMEOUT)

    def test_connect_refused(self):
        s = socket.socket()  # bound but not listening: connect gets RST
        self.addCleanup(s.close)
        s.bind(("127.0.0.1", 0))
        child = self.spawn(["--connect", "127.0.0.1:%d" % s.getsockname()[1]])
        self.assertIn("refused", self.finish(child, 3).lower())

    def test_unix_path_missing(self):
        tmp = tempfile.mkdtemp(prefix="nxcopy-test-")
        self.addCleanup(os.rmdir, tmp)
        child = self.spawn(["--unix", os.path.join(tmp, "nothing-here")])
        self.finish(child, 3)

    def test_connect_timeout(self):
        # A listener whose accept queue is full silently drops SYNs, so the
        # connect() can only end by our timeout.
        lst = socket.socket()
        self.addCleanup(lst.close)
        lst.bind(("127.0.0.1", 0))
        lst.listen(0)
        addr = lst.getsockname()
        for _ in range(3):
            s = socket.socket()
            self.addCleanup(s.close)
            s.setblocking(False)
            s.connect_ex(addr)
        time.sleep(0.2)
        start = time.monotonic()
        child = self.spawn(["--connect", "127.0.0.1:%d" % addr[1], "--connect-timeout", "1"])
        self.finish(child, 3)
        self.assertGreater(time.monotonic() - start, 0.8)

    def test_usage_errors(self):
        good = ["--connect", "127.0.0.1:1"]
        for args in (
            [],
            ["--bogus"] + good,
            ["--connect"],
            ["--connect", "127.0.0.1"],
            ["--connect", ":4000"],
            ["--connect", "[::1]4000"],
            good + ["--unix", "/tmp/x"],
            good + ["stray"],
            ["--fd", "x"],
            ["--fd", "987"],  # not open
            ["--unix", ""],
            ["--unix", "/tmp/" + "x" * 200],
            good + ["--buffer", "12"],
            good + ["--buffer", "64k"],
            good + ["--in-fd", "-1"],
            good + ["--out-fd", "9x"],
            good + ["--connect-timeout", "0"],
            good + ["--connect-timeout", "soon"],
        ):
            child = self.spawn(args)
            err = self.finish(child, 2)
            self.assertIn("usage:", err, "args %r" % (args,))

    def test_help(self):
        out = tempfile.TemporaryFile()
        self.addCleanup(out.close)
        child = self.spawn(["--help"], stdout=out)
        self.finish(child, 0)
        out.seek(0)
        text = out.read().decode()
        self.assertIn("usage:", text)
        self.assertIn("3 cannot connect", text)

    # other descriptor types -------------------------------------------------------

    def file_stdin(self, extra=()):
        data = os.urandom(3 * 1024 * 1024 + 17)
        f = tempfile.TemporaryFile()
        self.addCleanup(f.close)
        f.write(data)
        f.seek(0)
        server = ServerSide(self, "tcp")
        r, w = os.pipe()
        self.addCleanup(os.close, r)
        child = self.spawn(extra, None, server, stdin=f, stdout=w)
        os.close(w)
        os.set_blocking(r, False)
        server.accept()
        dl = self.deadline()
        self.assertSameBytes(read_to_eof(server.fd, dl), data, "file->server")
        write_all(server.fd, b"thanks", dl)
        server.close_write()
        self.assertEqual(read_to_eof(r, dl), b"thanks")
        self.finish(child, 0)

    def test_file_stdin(self):
        self.file_stdin()

    def test_file_stdin_no_splice(self):
        self.file_stdin(["--no-splice"])

    def tty_stdin(self, extra=()):
        import pty

        master, slave = pty.openpty()
        self.addCleanup(os.close, master)
        self.addCleanup(os.close, slave)  # we keep the description shared with nxcopy
        server = ServerSide(self, "tcp")
        child = self.spawn(extra, None, server, stdin=slave)
        server.accept()
        dl = self.deadline()
        os.write(master, b"typed line\n")
        self.assertEqual(read_exact(server.fd, 11, dl), b"typed line\n")
        self.assertFalse(os.get_blocking(slave), "nxcopy should run the tty non-blocking")
        os.write(master, b"\x04")  # ^D at the start of a line: EOF for the reader
        self.assertEqual(read_to_eof(server.fd, dl), b"")
        server.close_write()
        self.finish(child, 0)
        self.assertTrue(os.get_blocking(slave), "nxcopy left the shared tty non-blocking")

    def test_tty_stdin(self):
        self.tty_stdin()

    def test_tty_stdin_no_splice(self):
        self.tty_stdin(["--no-splice"])

    def append_stdout(self, extra=()):
        # splice() refuses O_APPEND files with EINVAL only after data already
        # sits in nxcopy's pipe: the fallback must carry it over.
        data = os.urandom(2 * 1024 * 1024 + 5)
        fd, path = tempfile.mkstemp(prefix="nxcopy-test-")
        os.write(fd, b"prefix")
        os.close(fd)
        self.addCleanup(os.unlink, path)
        out = os.open(path, os.O_WRONLY | os.O_APPEND)
        server = ServerSide(self, "tcp")
        child = self.spawn(extra, None, server, stdin=subprocess.DEVNULL, stdout=out)
        os.close(out)
        server.accept()
        dl = self.deadline()
        self.assertEqual(read_to_eof(server.fd, dl), b"")
        write_all(server.fd, data, dl)
        server.close_write()
        self.finish(child, 0)
        with open(path, "rb") as f:
            self.assertSameBytes(f.read(), b"prefix" + data, "server->append file")

    def test_append_file_stdout(self):
        self.append_stdout()

    def test_append_file_stdout_no_splice(self):
        self.append_stdout(["--no-splice"])

    def connect_by(self, family, host, spec):
        try:
            lst = socket.socket(family, socket.SOCK_STREAM)
            lst.bind((host, 0))
        except OSError as e:
            raise unittest.SkipTest("cannot listen on %s: %s" % (host, e))
        self.addCleanup(lst.close)
        lst.listen(1)
        child = self.spawn(["--connect", spec % lst.getsockname()[1]], stdin=subprocess.DEVNULL)
        lst.settimeout(TIMEOUT)
        conn, _ = lst.accept()
        self.addCleanup(conn.close)
        conn.settimeout(TIMEOUT)
        self.assertEqual(conn.recv(1), b"")  # stdin is /dev/null: immediate EOF
        conn.shutdown(socket.SHUT_WR)
        self.finish(child, 0)

    def test_connect_ipv6_literal(self):
        self.connect_by(socket.AF_INET6, "::1", "[::1]:%d")

    def test_connect_host_name(self):
        # localhost may resolve to ::1 first; nxcopy must try the next address.
        self.connect_by(socket.AF_INET, "127.0.0.1", "localhost:%d")


def _add_bulk_tests():
    for client in ("pipes", "socketpair"):
        for server in ("tcp", "unix", "fd"):
            for splice in (True, False):
                extra = () if splice else ("--no-splice",)

                def test(self, client=client, server=server, extra=extra):
                    self.bulk(client, server, extra)

                name = "test_bulk_%s_%s%s" % (client, server, "" if splice else "_no_splice")
                test.__name__ = name
                test.__doc__ = "3 MB each way, byte-exact: client %s, server %s%s" % (
                    client, server, "" if splice else ", --no-splice")
                setattr(NxcopyTestsMixin, name, test)


_add_bulk_tests()


class NxcopyTests(NxcopyTestsMixin, unittest.SynchronousTestCase):
    binary = "nxcopy"


class NxcopySanitizerTests(NxcopyTestsMixin, unittest.SynchronousTestCase):
    binary = "nxcopy-asan"
    sanitized = True
