"""Finding the console safely: the files it reads sit where users can put a
FIFO or a link in their place (their home, /tmp), and the gateway must
neither hang nor read elsewhere as root."""

from __future__ import annotations

import os
import tempfile
import threading

from twisted.trial.unittest import SynchronousTestCase

from nxgate import threads
from nxgate.node.agents import x11
from nxgate.node import displays, files
from nxgate.node import console

COOKIE = "0123456789abcdef" * 2


def finishes(test: SynchronousTestCase, function, *args, timeout: float = 5.0):
    """``function(*args)``'s result; fails the test if it blocks (a daemon
    thread, so a hang before the fix cannot keep the test run alive)."""
    outcome: list = []
    worker = threading.Thread(target=lambda: outcome.append(function(*args)), daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        test.fail(f"{getattr(function, '__name__', function)} still blocked after {timeout} s")
    return outcome[0]


class ReadCookieTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.home = tempfile.mkdtemp(prefix="nxgate-console-")
        self.addCleanup(files.remove_tree, self.home)
        self.path = os.path.join(self.home, ".Xauthority")

    def test_a_regular_file_gives_the_cookie(self) -> None:
        with open(self.path, "wb") as handle:
            handle.write(x11.xauthority(7, COOKIE))
        self.assertEqual(console._read_cookie(self.path, 7), COOKIE)
        self.assertIsNone(console._read_cookie(self.path, 8))

    def test_a_fifo_as_xauthority_does_not_block(self) -> None:
        os.mkfifo(self.path)
        self.assertIsNone(finishes(self, console._read_cookie, self.path, 7))

    def test_a_link_is_not_followed(self) -> None:
        elsewhere = os.path.join(self.home, "elsewhere")
        with open(elsewhere, "wb") as handle:
            handle.write(x11.xauthority(7, COOKIE))
        os.symlink(elsewhere, self.path)
        self.assertIsNone(console._read_cookie(self.path, 7))

    def test_a_file_of_someone_else_is_refused(self) -> None:
        with open(self.path, "wb") as handle:
            handle.write(x11.xauthority(7, COOKIE))
        os.chown(self.path, 4242, 4242)
        self.assertIsNone(console._read_cookie(self.path, 7, (1000, 0)))
        self.assertEqual(console._read_cookie(self.path, 7, (4242,)), COOKIE)

    def test_reads_are_bounded(self) -> None:
        with open(self.path, "wb") as handle:
            handle.write(b"x" * 10000)
        self.assertEqual(len(files.read_regular_file(self.path, 100)), 100)


class LockFileTests(SynchronousTestCase):
    """/tmp/.XN-lock can be planted by any user before a display is used."""

    DISPLAY = 4711

    def setUp(self) -> None:
        directory = tempfile.mkdtemp(prefix="nxgate-locks-")
        self.addCleanup(files.remove_tree, directory)
        self.patch(x11, "X_LOCK", os.path.join(directory, ".X{n}-lock"))
        self.lock = x11.X_LOCK.format(n=self.DISPLAY)

    def test_a_fifo_as_lock_does_not_block_find_console(self) -> None:
        os.mkfifo(self.lock)
        self.assertIsNone(finishes(self, console.find_console, f":{self.DISPLAY}"))

    def test_a_fifo_as_lock_is_read_as_no_file_without_blocking(self) -> None:
        os.mkfifo(self.lock)
        self.assertEqual(finishes(self, displays.read_lock, self.lock), displays.LockFile(False, os.getuid()))

    def test_lock_holder(self) -> None:
        self.assertIsNone(displays.read_lock(self.lock))
        with open(self.lock, "w") as handle:
            handle.write(f"{os.getpid():10d}\n")
        self.assertEqual(displays.read_lock(self.lock), displays.LockFile(True, os.getuid(), os.getpid(), True))
        self.assertEqual(console._server_pid(self.DISPLAY), os.getpid())

    def test_no_console_configured_or_running(self) -> None:
        self.assertIsNone(console.find_console(""))
        self.assertIsNone(self.successResultOf(console.find_console_with(threads.inline, f":{self.DISPLAY}")))
