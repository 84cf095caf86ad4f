"""Displays (nxgate.node.displays): claims between gateways on one machine,
the judgement of what holds a display (the kernel's word, never a lock's),
taking over what others left in /tmp, the search without a fixed count,
and the abstract X name held from claim to release."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile

from twisted.internet import defer
from twisted.logger import globalLogPublisher
from twisted.trial.unittest import TestCase

from nxgate.node import displays
from nxgate.node.agents import x11
from nxgate.node.displays import Facts, LockFile


CLAIM_IN_ANOTHER_PROCESS = """
import sys
from nxgate.node import displays
sys.exit(0 if displays.claim_display(int(sys.argv[1]), sys.argv[2]) else 3)
"""


class DisplayClaimTests(TestCase):
    def setUp(self) -> None:
        self.directory = tempfile.mkdtemp(prefix="nxgate-claims-")
        self.addCleanup(subprocess.run, ["rm", "-rf", self.directory], check=False)

    def other_process_claims(self, display: int) -> bool:
        result = subprocess.run([sys.executable, "-c", CLAIM_IN_ANOTHER_PROCESS, str(display), self.directory],
                                check=False)
        self.assertIn(result.returncode, (0, 3))
        return result.returncode == 0

    def test_a_claimed_display_cannot_be_claimed_by_another_gateway(self) -> None:
        self.assertTrue(displays.claim_display(7301, self.directory))
        self.addCleanup(displays.release_display, 7301)
        self.assertFalse(self.other_process_claims(7301))
        self.assertTrue(self.other_process_claims(7302))

    def test_a_released_display_can_be_claimed_again(self) -> None:
        self.assertTrue(displays.claim_display(7303, self.directory))
        displays.release_display(7303)
        self.assertTrue(self.other_process_claims(7303))

    def test_the_same_gateway_may_claim_its_own_display_again(self) -> None:
        self.assertTrue(displays.claim_display(7304, self.directory))
        self.addCleanup(displays.release_display, 7304)
        self.assertTrue(displays.claim_display(7304, self.directory))


def facts(display: int = 5, **changes) -> Facts:
    base = dict(display=display, abstract=False, listening=False, lock=None, socket_file=False, temp_lock=False,
                port_free=True)
    base.update(changes)
    return Facts(**base)


class JudgeTests(TestCase):
    """Held is what the kernel says: a bound X socket, a taken port; a lock
    naming a live pid is not enough."""

    def test_a_lock_naming_pid_1_holds_nothing(self) -> None:
        verdict = displays.judge(facts(lock=LockFile(True, 1042, 1, True)))
        self.assertTrue(verdict.free)
        self.assertEqual(verdict.leftovers, (displays.LOCK,))
        self.assertIn("naming pid 1, a live process that is no X server", verdict.why)

    def test_no_live_process_named_by_a_lock_holds_its_display(self) -> None:
        """Not even a fresh one of the lock's owner: anyone can start one, again and again."""
        self.assertTrue(displays.judge(facts(lock=LockFile(True, 1042, 777, True))).free)
        self.assertTrue(displays.judge(facts(lock=LockFile(True, 1042, 778, False))).free)

    def test_bound_sockets_and_taken_ports_hold(self) -> None:
        for held in (dict(abstract=True), dict(listening=True), dict(port_free=False)):
            self.assertFalse(displays.judge(facts(lock=LockFile(True, 1042, 1, True), **held)).free, held)

    def test_what_is_in_the_way_is_named(self) -> None:
        verdict = displays.judge(facts(lock=LockFile(False, 1042), socket_file=True, temp_lock=True))
        self.assertTrue(verdict.free)
        self.assertEqual(verdict.leftovers, (displays.LOCK, displays.SOCKET_FILE, displays.TEMP_LOCK))
        self.assertEqual(displays.judge(facts()), displays.Judgement(True, "", ()))

    def test_the_kernels_table_names_abstract_and_path_sockets(self) -> None:
        table = ("Num       RefCount Protocol Flags    Type St Inode Path\n"
                 "0000000000000000: 00000002 00000000 00010000 0001 01 4711 @/tmp/.X11-unix/X3301\n"
                 "0000000000000000: 00000003 00000000 00000000 0001 03 4712 @/tmp/.X11-unix/X3301\n"
                 "0000000000000000: 00000002 00000000 00010000 0001 01 4713 /tmp/.X11-unix/X3302\n"
                 "0000000000000000: 00000002 00000000 00010000 0001 01 4714 @/tmp/.X11-unix/X33x\n"
                 "0000000000000000: 00000002 00000000 00010000 0001 01 4715\n")
        found = displays.x_sockets(table)
        self.assertEqual((found.abstract, found.path), ({3301: {4711, 4712}}, {3302: {4713}}))

    def test_a_real_lock_naming_pid_1_is_read_as_such(self) -> None:
        directory = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, directory)
        path = os.path.join(directory, "lock")
        with open(path, "w") as handle:
            handle.write("%10d\n" % 1)
        lock = displays.read_lock(path)
        self.assertEqual((lock.regular, lock.pid, lock.pid_lives), (True, 1, True))
        self.assertIsNone(displays.read_lock(os.path.join(directory, "none")))
        os.symlink("/etc/passwd", os.path.join(directory, "link"))
        self.assertFalse(displays.read_lock(os.path.join(directory, "link")).regular)


class TakeOverTests(TestCase):
    """What another user left at a display's paths in /tmp is replaced by a
    file of the new session's user, in one step (here in a directory of the test)."""

    def setUp(self) -> None:
        self.tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.tmp)
        os.mkdir(os.path.join(self.tmp, "x11"))
        self.patch(x11, "X_LOCK", os.path.join(self.tmp, ".X{n}-lock"))
        self.patch(x11, "X_SOCKET", os.path.join(self.tmp, "x11", "X{n}"))
        self.patch(displays, "X_TEMP_LOCK", os.path.join(self.tmp, ".tX{n}-lock"))
        self.owner = pwd.getpwnam("nobody")

    def test_a_planted_lock_socket_file_and_temporary_lock_are_taken_over_for_the_user(self) -> None:
        os.symlink("/etc/shadow", x11.X_LOCK.format(n=7))  # a link: never followed
        os.mkdir(x11.X_SOCKET.format(n=7))  # a directory where the socket goes
        with open(os.path.join(x11.X_SOCKET.format(n=7), "inside"), "w"):
            pass
        with open(displays.X_TEMP_LOCK.format(n=7), "w"):
            pass
        displays.take_over(7, (displays.LOCK, displays.SOCKET_FILE, displays.TEMP_LOCK), self.owner.pw_uid,
                           self.owner.pw_gid)
        lock = os.lstat(x11.X_LOCK.format(n=7))
        self.assertEqual((lock.st_uid, oct(lock.st_mode)), (self.owner.pw_uid, oct(0o100444)))
        with open(x11.X_LOCK.format(n=7)) as handle:
            self.assertEqual(int(handle.read()), displays.NO_PROCESS)
        self.assertEqual(os.lstat(x11.X_SOCKET.format(n=7)).st_uid, self.owner.pw_uid)
        self.assertFalse(os.path.lexists(displays.X_TEMP_LOCK.format(n=7)))
        self.assertTrue(os.path.exists("/etc/shadow"))
        self.assertEqual(sorted(os.listdir(self.tmp)), [".X7-lock", "x11"])  # no temporary file left


class SearchTests(TestCase):
    """find_free over facts the test gives (its claims in a directory of its own)."""

    BASE = 7400

    def setUp(self) -> None:
        self.claims = tempfile.mkdtemp(prefix="nxgate-claims-")
        self.addCleanup(shutil.rmtree, self.claims)
        self.facts: dict[int, Facts] = {}
        self.taken_over: list[tuple[int, tuple[str, ...]]] = []
        self.patch(displays, "read_facts", lambda n, sockets: self.facts.get(n, facts(n)))
        self.patch(displays, "take_over", lambda n, leftovers, uid, gid: self.taken_over.append((n, tuple(leftovers))))
        self.patch(displays, "hold_name", lambda n: True)  # the real one is tested below

    def search(self, count: int = 4, taken=()) -> displays.Search:
        found = displays.find_free(self.BASE, count, taken, 1042, 1042, directory=self.claims)
        if found.display is not None:
            self.addCleanup(displays.release_display, found.display)
        return found

    def test_planted_locks_are_taken_over_not_passed_over(self) -> None:
        for n in range(self.BASE, self.BASE + 300):
            self.facts[n] = facts(n, lock=LockFile(True, 1043, 1, True))
        found = self.search()
        self.assertEqual(found.display, self.BASE)
        self.assertEqual(self.taken_over, [(self.BASE, (displays.LOCK,))])
        self.assertEqual(found.passed_over, [])

    def test_no_count_stops_the_search_past_displays_others_hold(self) -> None:
        for n in range(self.BASE, self.BASE + 1000):
            self.facts[n] = facts(n, abstract=True)
        found = self.search()
        self.assertEqual(found.display, self.BASE + 1000)
        self.assertEqual(len(found.passed_over), 1000)

    def test_ours_count_against_the_range_and_it_runs_out(self) -> None:
        self.facts[self.BASE + 1] = facts(self.BASE + 1, listening=True)  # somebody else's: not counted
        found = self.search(count=2, taken=[self.BASE])
        self.assertEqual(found.display, self.BASE + 2)
        self.assertIsNone(self.search(count=2, taken=[self.BASE]).display)  # BASE + 2 is this process's now

    def test_another_gateways_claim_counts_against_the_range(self) -> None:
        script = ("import sys, time\nfrom nxgate.node import displays\n"
                  "displays.claim_display(int(sys.argv[1]), sys.argv[2])\nprint('held', flush=True)\ntime.sleep(60)\n")
        other = subprocess.Popen([sys.executable, "-c", script, str(self.BASE), self.claims], stdout=subprocess.PIPE)
        self.addCleanup(other.wait)
        self.addCleanup(other.kill)
        self.assertEqual(other.stdout.readline(), b"held\n")
        self.assertIsNone(self.search(count=1).display)
        self.assertEqual(self.search(count=2).display, self.BASE + 1)


class AbstractNameTests(TestCase):
    """A claim holds the display's abstract X name until it is released."""

    DISPLAY = 7499

    def setUp(self) -> None:
        self.claims = tempfile.mkdtemp(prefix="nxgate-claims-")
        self.addCleanup(shutil.rmtree, self.claims)
        self.patch(displays, "DISPLAY_CLAIMS", self.claims)

    def bind(self) -> bool:
        probe = socket.socket(socket.AF_UNIX)
        try:
            probe.bind("\0" + x11.X_SOCKET.format(n=self.DISPLAY))
            return True
        except OSError:
            return False
        finally:
            probe.close()

    def test_the_name_is_ours_from_the_claim_until_the_release(self) -> None:
        self.assertTrue(displays.claim_display(self.DISPLAY, self.claims))
        self.addCleanup(displays.release_display, self.DISPLAY)
        fd = displays.name_holder(self.DISPLAY)
        self.assertEqual(displays.name_holder(self.DISPLAY), fd)  # one socket, handed to each agent in turn
        self.assertFalse(self.bind())
        displays.release_display(self.DISPLAY)
        self.assertTrue(self.bind())

    def test_a_name_somebody_else_bound_cannot_be_held(self) -> None:
        squatter = socket.socket(socket.AF_UNIX)
        squatter.bind("\0" + x11.X_SOCKET.format(n=self.DISPLAY))
        self.addCleanup(squatter.close)
        self.addCleanup(displays.release_display, self.DISPLAY)
        self.assertRaises(displays.DisplayTaken, displays.name_holder, self.DISPLAY)


class AllocatorTests(TestCase):
    def test_the_search_runs_through_blocking_and_its_log_is_bounded(self) -> None:
        events: list[dict] = []
        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        calls = []

        def blocking(function, *args):
            calls.append((function, args))
            passed = [(n, "its abstract X socket is bound") for n in range(100)]
            return defer.succeed(displays.Search(None, passed, [], []))

        allocator = displays.DisplayAllocator(lambda: (7400, 4), lambda: [7401], blocking)
        failure = self.failureResultOf(defer.ensureDeferred(allocator.allocate(1042, 1043)))
        failure.trap(displays.NoFreeDisplay)
        self.assertEqual(calls, [(displays.find_free, (7400, 4, [7401], 1042, 1043))])
        (said,) = [e for e in events if "passed over" in e.get("log_format", "")]
        self.assertEqual(said["count"], 100)
        self.assertTrue(said["displays"].endswith(":15 and 84 more"), said["displays"])

    def test_the_same_displays_of_others_are_a_warning_once(self) -> None:
        """Each new session passes over the displays others hold: a warning when they change, else debug."""
        events: list[dict] = []
        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        passed = [[(7401, "its X lock names a live process")], [(7401, "its X lock names a live process")],
                  [(7401, "its abstract X socket is bound"), (7403, "its abstract X socket is bound")]]

        def blocking(function, *args):
            return defer.succeed(displays.Search(7402, passed.pop(0), [], []))

        allocator = displays.DisplayAllocator(lambda: (7400, 4), lambda: [], blocking)
        for _ in range(3):
            self.successResultOf(defer.ensureDeferred(allocator.allocate(1042, 1043)))
        self.assertEqual([e["log_level"].name for e in events if "passed over" in e.get("log_format", "")],
                         ["warn", "debug", "warn"])
