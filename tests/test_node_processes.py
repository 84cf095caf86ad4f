"""Finding what a session started by the marker in its environment."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from twisted.logger import formatEvent, globalLogPublisher
from twisted.trial.unittest import SkipTest, TestCase

from nxgate.host import processes

SESSION = "C0FFEE" * 5 + "AB"


class TaggedProcessesTests(TestCase):
    def spawn(self, env: dict[str, str], uid: int | None = None) -> int:
        def become() -> None:
            if uid is not None:
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)

        process = subprocess.Popen(["sleep", "600"], env={"PATH": os.defpath, **env}, preexec_fn=become)
        self.addCleanup(lambda: (process.kill(), process.wait()))
        return process.pid

    def found(self, uid: int) -> set[int]:
        return {process.pid for process in processes.tagged_processes(SESSION, uid)}

    def test_finds_the_sessions_processes_only(self):
        tagged = self.spawn({processes.SESSION_MARKER: SESSION, "OTHER": "x"})
        untagged = self.spawn({"OTHER": "x"})
        other_session = self.spawn({processes.SESSION_MARKER: "1" + SESSION[1:]})
        prefix = self.spawn({processes.SESSION_MARKER: SESSION + "0"})
        found = self.found(os.getuid())
        self.assertIn(tagged, found)
        for pid in (untagged, other_session, prefix):
            self.assertNotIn(pid, found)

    def test_never_another_users_process(self):
        if os.getuid() != 0:
            raise SkipTest("needs root to start a process as another user")
        nobody = 65534
        theirs = self.spawn({processes.SESSION_MARKER: SESSION}, uid=nobody)
        self.assertNotIn(theirs, self.found(0))
        self.assertIn(theirs, self.found(nobody))


class SendSignalTests(TestCase):
    """Signals go to a process only while it still is the one we mean: a
    recycled pid never gets root's SIGKILL."""

    def setUp(self):
        self.events = []
        globalLogPublisher.addObserver(self.events.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.events.append)

    def child(self, *argv: str) -> subprocess.Popen:
        process = subprocess.Popen(list(argv) or ["sleep", "600"])
        self.addCleanup(lambda: (process.kill(), process.wait()))
        return process

    def logged(self) -> list[str]:
        return [formatEvent(event) for event in self.events]

    def test_a_wrong_start_time_gets_no_signal(self):
        """Our own pid with another start time: what a recycled pid looks like."""
        me = processes.ProcessId(os.getpid(), 1)
        self.assertFalse(processes.send_signal(me, signal.SIGKILL))  # we are still here to see it
        self.assertTrue(any(f"pid {os.getpid()}" in line and "SIGKILL" in line for line in self.logged()))

    def test_a_recycled_pid_keeps_running(self):
        child = self.child()
        started = processes.start_time(child.pid)
        self.assertFalse(processes.send_signal(processes.ProcessId(child.pid, started + 1), signal.SIGKILL))
        self.assertIsNone(child.poll())

    def test_the_right_process_gets_it(self):
        child = self.child()
        self.assertTrue(processes.send_signal(processes.ProcessId.of(child.pid), signal.SIGTERM))
        self.assertEqual(child.wait(10), -signal.SIGTERM)

    def test_an_ended_process_is_no_error(self):
        child = self.child("true")
        identity = processes.ProcessId.of(child.pid) or processes.ProcessId(child.pid, 0)
        child.wait(10)
        self.assertFalse(processes.send_signal(identity, signal.SIGKILL))
        self.assertFalse(processes.send_signal(processes.ProcessId(0, 0), signal.SIGKILL))

    def test_a_group_is_signalled_only_while_its_leader_lives(self):
        leader = subprocess.Popen(["sleep", "600"], start_new_session=True)
        self.addCleanup(lambda: (leader.kill(), leader.wait()))
        identity = processes.ProcessId.of(leader.pid)
        self.assertFalse(processes.signal_group(processes.ProcessId(leader.pid, identity.started + 1), signal.SIGTERM))
        self.assertIsNone(leader.poll())
        self.assertTrue(processes.signal_group(identity, signal.SIGTERM))
        self.assertEqual(leader.wait(10), -signal.SIGTERM)


class ChildrenTests(TestCase):
    def test_named_children_carry_their_start_time(self):
        parent = subprocess.Popen(["sh", "-c", "sleep 600 & sleep 600 & wait"])

        def stop():
            for child in processes.named_children(parent.pid, "sleep"):
                processes.send_signal(child, signal.SIGKILL)
            parent.kill()
            parent.wait()

        self.addCleanup(stop)
        for _ in range(100):
            children = processes.named_children(parent.pid, "sleep")
            if len(children) == 2:
                break
            time.sleep(0.05)
        self.assertEqual(len(children), 2)
        for child in children:
            self.assertTrue(child.alive())
        self.assertEqual(sorted(processes.children_named(parent.pid, "sleep")), sorted(c.pid for c in children))


class JailedChildTests(TestCase):
    """The host pid of a command bubblewrap runs in a new PID namespace."""

    def test_the_command_under_bwraps_init_is_found_and_is_in_another_namespace(self):
        import shutil
        if not shutil.which("bwrap"):
            raise SkipTest("bubblewrap is not installed")
        outer = subprocess.Popen(["bwrap", "--unshare-pid", "--ro-bind", "/", "/", "--proc", "/proc", "--",
                                  "sleep", "30"])
        self.addCleanup(outer.wait)
        self.addCleanup(outer.kill)
        found = None
        for _ in range(250):
            found = processes.jailed_child(outer.pid, "sleep")
            if found is not None:
                break
            time.sleep(0.02)
        self.assertIsNotNone(found)
        with open(f"/proc/{found.pid}/cmdline", "rb") as handle:
            self.assertEqual(handle.read(), b"sleep\x0030\x00")
        self.assertFalse(processes.same_pid_namespace(found.pid))
        self.assertTrue(processes.same_pid_namespace(os.getpid()))
        self.assertIsNone(processes.jailed_child(outer.pid, "nxagent"))
