"""The thumbnail's xwd dump is read with a bound (issue 22, item 2).

The X server decides how big ``xwd``'s dump is (a user's own agent can
claim a 16384x16384 screen: a 1 GiB dump, 4 GiB is possible), and the
gateway runs as root: it must stop reading at the limit, not read the whole
dump and then look at its size.  xwd is started, as every program run as a
user, by the node's launcher, which reads a program's output with that bound
(:meth:`nxgate.node.launcher.Launcher.output`).
"""

from __future__ import annotations

import os
import pwd
import resource
import shutil
import stat
import subprocess
import sys
import time
from typing import Any

from twisted.internet import defer, reactor
from twisted.trial.unittest import SkipTest, TestCase

from nxgate.node import thumbnails
from nxgate.node.launcher import Launcher, OutputTooLarge
from nxgate.node.processes import ProcessId

MB = 1 << 20


def as_root() -> None:
    from tests.harness.users import NEED_ROOT, is_root
    if not is_root():
        raise SkipTest(NEED_ROOT)


class OutputTests(TestCase):
    """The launcher's bounded reading of a program's output (as root: it starts programs as users)."""

    def setUp(self) -> None:
        as_root()

    def run_writing(self, total: int, limit: int) -> defer.Deferred:
        request = {"user": "root", "argv": ["head", "-c", str(total), "/dev/zero"], "env": {},
                   "env_fixed": {"PATH": "/usr/bin:/bin"}, "cwd": "/", "log": os.devnull}
        return defer.ensureDeferred(Launcher(reactor).output(request, limit, 60))

    @defer.inlineCallbacks
    def test_output_past_the_limit_is_stopped_while_reading(self):
        error = yield self.assertFailure(self.run_writing(64 * MB, MB), OutputTooLarge)
        self.assertGreater(error.read, MB)
        self.assertLess(error.read, MB + 256 * 1024)  # it stopped at the limit, not at the end

    @defer.inlineCallbacks
    def test_output_within_the_limit_is_read_whole(self):
        data = yield self.run_writing(MB, MB)
        self.assertEqual(data, b"\0" * MB)


class GrabTests(TestCase):
    @defer.inlineCallbacks
    def test_a_huge_xwd_dump_is_refused_with_bounded_memory(self):
        """An "xwd" that writes 300 MB: grab stops at the (here 4 MB) limit,
        and this process's peak memory does not grow by the dump."""
        as_root()
        directory = os.path.abspath(self.mktemp())
        os.makedirs(directory)
        os.chmod(directory, 0o755)
        fake = os.path.join(directory, "xwd")
        with open(fake, "w") as handle:
            handle.write("#!/bin/sh\nexec head -c 300000000 /dev/zero\n")
        os.chmod(fake, stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
        self.patch(thumbnails, "XWD", fake)
        self.patch(thumbnails, "MAX_DUMP_BYTES", 4 * MB)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        yield self.assertFailure(defer.ensureDeferred(thumbnails.grab(Launcher(reactor), 4321, "/nonexistent",
                                                                      pwd.getpwuid(os.getuid()).pw_name)),
                                 thumbnails.DumpTooLarge)
        grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        self.assertLess(grown_kib, 64 * 1024)


#: Bob's listener on a display's abstract X socket: counts the connections
#: it gets until stdin closes, then prints the count.
ABSTRACT_LISTENER = r"""
import select, socket, sys
s = socket.socket(socket.AF_UNIX)
s.bind("\0/tmp/.X11-unix/X" + sys.argv[1])
s.listen(8)
print("listening", flush=True)
got = 0
while True:
    ready, _, _ = select.select([sys.stdin, s], [], [])
    if sys.stdin in ready:
        break
    s.accept()[0].close()
    got += 1
print(got, flush=True)
"""


class GrabSourceTests(TestCase):
    """With an X server that listens on its path socket only (as a jailed
    agent does) and another user listening on the display's abstract
    socket, the picture comes from the X server and the listener gets no
    connection (libxcb would try it first)."""

    DISPLAY = 1779

    def setUp(self) -> None:
        from tests.harness.users import NEED_ROOT, create_user, is_root
        if not is_root():
            raise SkipTest(NEED_ROOT)
        if not shutil.which("Xvfb"):
            raise SkipTest("Xvfb is not installed")
        self.alice, self.bob = create_user(), create_user()
        self.addCleanup(self.alice.remove)
        self.addCleanup(self.bob.remove)
        for path in (f"/tmp/.X{self.DISPLAY}-lock", f"/tmp/.X11-unix/X{self.DISPLAY}"):
            self.addCleanup(lambda p=path: os.path.lexists(p) and os.unlink(p))

    def start(self, user: Any, argv: list[str], **options: Any) -> subprocess.Popen:
        entry = pwd.getpwnam(user.name)
        process = subprocess.Popen(argv, user=entry.pw_uid, group=entry.pw_gid, extra_groups=[], cwd="/",
                                   **options)
        self.addCleanup(lambda: process.poll() is None and (process.terminate(), process.wait()))
        return process

    @defer.inlineCallbacks
    def test_the_picture_never_comes_from_an_abstract_socket_squatter(self):
        listener = self.start(self.bob, [sys.executable, "-c", ABSTRACT_LISTENER, str(self.DISPLAY)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.assertEqual(listener.stdout.readline().strip(), "listening")
        server = self.start(self.alice, ["Xvfb", f":{self.DISPLAY}", "-screen", "0", "320x200x24", "-nolisten",
                                         "tcp", "-nolisten", "local", "-wr"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        def lock_holder() -> str:
            try:
                with open(f"/tmp/.X{self.DISPLAY}-lock") as handle:
                    return handle.read().strip()
            except OSError:
                return ""

        deadline = time.monotonic() + 15  # the server's own lock, then its socket (not a stale one)
        while lock_holder() != str(server.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        while not os.path.exists(f"/tmp/.X11-unix/X{self.DISPLAY}") and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.3)
        agent = ProcessId.of(server.pid)
        alice = pwd.getpwnam(self.alice.name)
        dump = yield defer.ensureDeferred(thumbnails.grab(Launcher(reactor), self.DISPLAY, "/dev/null", alice.pw_name,
                                                          (agent.pid, agent.started)))
        width, height, rgb = thumbnails.parse_xwd(dump)
        self.assertEqual((width, height), (320, 200))
        self.assertEqual(set(rgb), {255})  # -wr: the server's white root window
        listener.stdin.close()
        self.assertEqual(listener.stdout.readline().strip(), "0")
