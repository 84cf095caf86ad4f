"""Following agent logs without holding the reactor (nxgate.node.follow)."""

from __future__ import annotations

import os
import shutil
import tempfile

from twisted.logger import formatEvent, globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase

from nxgate import threads
from nxgate.node import follow
from tests.harness.clock import FakeReactor


class FakeNotifier:
    def __init__(self) -> None:
        self.watched: list[str] = []

    def watch(self, path, mask, callbacks) -> None:
        self.watched.append(path.path)
        self.callbacks = callbacks

    def ignore(self, path) -> None:
        self.watched.remove(path.path)


class FollowTests(SynchronousTestCase):
    def setUp(self) -> None:
        directory = tempfile.mkdtemp(prefix="nxgate-follow-")
        self.addCleanup(shutil.rmtree, directory)
        self.path = os.path.join(directory, "agent.log")
        open(self.path, "wb").close()
        self.notifier = FakeNotifier()
        self.clock = FakeReactor()
        self.lines: list[str] = []
        self.events: list[dict] = []
        globalLogPublisher.addObserver(self.events.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.events.append)

    def append(self, data: bytes) -> None:
        with open(self.path, "ab") as handle:
            handle.write(data)

    def follower(self, offset: int = 0) -> follow.LogFollower:
        return follow.LogFollower(self.notifier, self.path, self.lines.append, offset, reactor=self.clock)

    def changed(self) -> None:
        self.notifier.callbacks[0](None, None, 0)

    def test_live_reads_are_capped_per_reactor_turn(self) -> None:
        line = b"Info: a line an agent might write over and over again\n"
        count = 4 * follow.READ_CAP // len(line)
        watcher = self.follower()
        self.append(line * count)
        self.changed()
        self.assertLessEqual(len(self.lines) * len(line), follow.READ_CAP)
        self.assertGreater(len(self.lines), 0)
        self.changed()  # more news while a read is pending adds no second reader
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        for _ in range(10):
            self.clock.advance(0)
        self.assertEqual(len(self.lines), count)
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertEqual(watcher.offset, count * len(line))

    def test_what_was_there_before_is_read_at_once(self) -> None:
        self.append(b"one\ntwo\nthr")
        self.follower()
        self.assertEqual(self.lines, ["one", "two"])
        self.append(b"ee\n")
        self.changed()
        self.assertEqual(self.lines, ["one", "two", "three"])

    def test_replay_then_follow_from_its_offset(self) -> None:
        self.append(b"Session: Starting session at 'x'.\nInfo: half a li")
        replayed: list[str] = []
        offset = self.successResultOf(threads.inline(follow.replay, self.path, replayed.append))
        self.assertEqual(replayed, ["Session: Starting session at 'x'."])
        self.assertEqual(offset, len(b"Session: Starting session at 'x'.\n"))
        self.follower(offset)
        self.append(b"ne\n")
        self.changed()
        self.assertEqual(self.lines, ["Info: half a line"])

    def test_replay_of_a_missing_log_fails(self) -> None:
        self.failureResultOf(threads.inline(follow.replay, self.path + ".missing", print), OSError)

    def test_an_unreadable_log_is_reported_once(self) -> None:
        self.follower()
        os.unlink(self.path)
        os.symlink("/etc/hostname", self.path)  # O_NOFOLLOW: not read
        self.changed()
        self.changed()
        warnings = [formatEvent(e) for e in self.events if "cannot read the agent log" in formatEvent(e)]
        self.assertEqual(len(warnings), 1)
        self.assertIn(self.path, warnings[0])
        self.assertEqual(self.lines, [])

    def test_stop_cancels_the_pending_read(self) -> None:
        watcher = self.follower()
        self.append(b"x" * 10 + b"\n" + b"y" * (2 * follow.READ_CAP))
        self.changed()
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        watcher.stop()
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertEqual(self.notifier.watched, [])
