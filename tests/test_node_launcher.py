"""The launcher's spares: a runas process started ahead carries the next
start's request, a new one follows, and a spare never starts a program at its
own low priority (the real runas, as root)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile

from twisted.internet import defer, reactor
from twisted.internet.error import ProcessDone, ProcessTerminated
from twisted.python.failure import Failure
from twisted.trial.unittest import SkipTest, SynchronousTestCase, TestCase

from nxgate.node import launcher as launcher_module
from nxgate.node.launcher import Launcher
from nxgate.node.processes import LaunchError
from tests.harness.clock import FakeReactor
from tests.harness.users import NEED_ROOT, is_root


class FakeProcess:
    """What spawnProcess returns: the launcher's stdin, recorded."""

    def __init__(self, protocol, pid: int, argv: list[str]) -> None:
        self.protocol, self.pid, self.argv = protocol, pid, argv
        self.written = b""
        self.stdin_closed = False

    def write(self, data: bytes) -> None:
        assert not self.stdin_closed, "written after stdin was closed"
        self.written += data

    def closeStdin(self) -> None:
        self.stdin_closed = True

    def request(self) -> dict:
        return json.loads(self.written)

    def ends(self, code: int = 0) -> None:
        reason = ProcessDone(0) if code == 0 else ProcessTerminated(code)
        self.protocol.processEnded(Failure(reason))


class FakeProcessReactor(FakeReactor):
    """The test reactor that also spawns (fake) processes."""

    def __init__(self) -> None:
        super().__init__()
        self.processes: list[FakeProcess] = []

    def spawnProcess(self, protocol, executable, args, env=None, path=None, childFDs=None):
        # pids of processes that do not exist: renicing them fails as for a spare that died
        process = FakeProcess(protocol, 4_000_000 + len(self.processes), list(args))
        self.processes.append(process)
        protocol.makeConnection(process)
        return process


class SpareTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.reactor = FakeProcessReactor()
        self.launcher = Launcher(self.reactor, spares=1)
        # The fake pids cannot be reniced or peeked at; RealLauncherTests checks those calls.
        self.patch(launcher_module.os, "setpriority", lambda *args: None)
        self.exited: set[int] = set()  # exited, their end not seen by the reactor yet
        self.patch(launcher_module, "_running", lambda pid: pid not in self.exited)

    def spares(self) -> list[FakeProcess]:
        return [process for process in self.reactor.processes if "--spare" in process.argv]

    def test_by_default_two_spares_one_for_the_agent_one_for_the_program(self) -> None:
        Launcher(self.reactor).prepare()
        self.assertEqual(len(self.spares()), 2)
        self.assertEqual([process.written for process in self.reactor.processes], [b"", b""])

    def test_prepare_starts_one_spare_without_a_request(self) -> None:
        self.launcher.prepare()
        self.assertEqual(len(self.reactor.processes), 1)
        spare = self.reactor.processes[0]
        self.assertIn("--spare", spare.argv)
        self.assertEqual(spare.written, b"")
        self.assertFalse(spare.stdin_closed)

    def test_a_start_hands_its_request_to_the_spare_then_a_new_spare_follows(self) -> None:
        self.launcher.prepare()
        spare = self.reactor.processes[0]
        started = defer.ensureDeferred(self.launcher.start({"user": "alice", "argv": ["xterm"]}))
        self.assertEqual(spare.request(), {"user": "alice", "argv": ["xterm"]})
        self.assertTrue(spare.stdin_closed)
        self.assertEqual(len(self.reactor.processes), 1, "the new spare waits for the next reactor turn")
        self.reactor.advance(0)
        self.assertEqual(len(self.spares()), 2)
        self.assertEqual(self.reactor.processes[1].written, b"")
        spare.protocol.outReceived(b"error: no such user\n")
        self.assertIsInstance(self.failureResultOf(started).value, LaunchError)

    def test_without_a_spare_a_start_spawns_its_own_launcher(self) -> None:
        self.launcher.prepare()
        self.reactor.processes[0].ends(1)
        started = defer.ensureDeferred(self.launcher.start({"user": "alice", "argv": ["xterm"]}))
        own = self.reactor.processes[1]
        self.assertNotIn("--spare", own.argv)
        self.assertEqual(own.request()["user"], "alice")
        self.reactor.advance(0)
        self.assertEqual(len(self.spares()), 2, "a new spare for the next start")
        own.ends(1)
        self.failureResultOf(started, LaunchError)

    def test_a_launcher_never_prepared_keeps_no_spares(self) -> None:
        defer.ensureDeferred(self.launcher.start({"user": "alice", "argv": ["xterm"]}))
        self.reactor.advance(0)
        self.assertEqual(len(self.reactor.processes), 1)
        self.assertEqual(self.spares(), [])

    def test_a_spare_that_died_is_not_used(self) -> None:
        self.launcher.prepare()
        dead = self.reactor.processes[0]
        dead.ends(1)
        defer.ensureDeferred(self.launcher.start({"user": "alice", "argv": ["xterm"]}))
        fresh = self.reactor.processes[1]
        self.assertNotIn("--spare", fresh.argv)
        self.assertEqual(fresh.request()["user"], "alice")
        self.assertEqual(dead.written, b"")

    def test_a_spare_that_exited_unseen_is_not_used(self) -> None:
        self.launcher.prepare()
        spare = self.reactor.processes[0]
        self.exited.add(spare.pid)
        defer.ensureDeferred(self.launcher.start({"user": "alice", "argv": ["xterm"]}))
        self.assertEqual(spare.written, b"")
        self.assertEqual(self.reactor.processes[1].request()["user"], "alice")

    def test_closing_a_pam_session_never_takes_the_spare(self) -> None:
        self.launcher.prepare()
        spare = self.reactor.processes[0]
        defer.ensureDeferred(self.launcher.close_pam({"user": "alice", "pam": {"service": "nxgate"}}))
        self.assertEqual(spare.written, b"")
        closing = self.reactor.processes[1]
        self.assertEqual(closing.request()["mode"], "close-pam")
        self.reactor.advance(0)
        self.assertEqual(len(self.spares()), 1, "no extra spare for background work")

    def test_stop_ends_the_spares_and_starts_no_more(self) -> None:
        self.launcher.prepare()
        spare = self.reactor.processes[0]
        self.launcher.stop()
        self.assertTrue(spare.stdin_closed)
        self.assertEqual(spare.written, b"", "a spare ends on an empty stdin")
        defer.ensureDeferred(self.launcher.start({"user": "alice", "argv": ["xterm"]}))
        self.reactor.advance(0)
        self.assertEqual(self.spares(), [spare])

    def test_no_spares_when_none_are_wanted(self) -> None:
        launcher = Launcher(self.reactor, spares=0)
        launcher.prepare()
        self.assertEqual(self.reactor.processes, [])
        defer.ensureDeferred(launcher.start({"user": "alice", "argv": ["xterm"]}))
        self.reactor.advance(0)
        self.assertEqual(len(self.reactor.processes), 1)

    def test_a_launchers_bounded_output_comes_through_a_spare(self) -> None:
        self.launcher.prepare()
        spare = self.reactor.processes[0]
        out = defer.ensureDeferred(self.launcher.output({"user": "alice", "argv": ["xwd"]}, 10, 5))
        self.assertTrue(spare.request()["pipe_stdout"])
        spare.protocol.outReceived(b"ok\npicture")
        spare.ends(0)
        self.assertEqual(self.successResultOf(out), b"picture")


class RealLauncherTests(TestCase):
    """The real runas: a spare waits at the lowest priority and starts the
    program at the gateway's; an unused spare ends quietly."""

    def setUp(self) -> None:
        if not is_root():
            raise SkipTest(NEED_ROOT)
        self.directory = tempfile.mkdtemp(prefix="nxgate-launcher-")
        self.addCleanup(shutil.rmtree, self.directory, True)
        self.launcher = Launcher(reactor, spares=1)
        self.addCleanup(self.stop_launcher)

    def stop_launcher(self) -> defer.Deferred:
        """Stop, and wait for the spares to end (no process left behind)."""
        spares = list(self.launcher._spares)
        self.launcher.stop()
        return defer.gatherResults([spare.ended for spare in spares if not spare.gone])

    async def spare_ready(self) -> tuple[int, int]:
        """(pid, niceness) of the spare once it waits for its request,
        blocked reading its stdin."""
        self.launcher.prepare()
        pid = self.launcher._spares[0].transport.pid
        for _ in range(1000):
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline, open(f"/proc/{pid}/wchan") as wchan:
                if b"--spare" in cmdline.read() and "pipe" in wchan.read():
                    with open(f"/proc/{pid}/stat") as stat:
                        return pid, int(stat.read().rsplit(")", 1)[1].split()[16])
            await defer_sleep(0.02)
        self.fail("the spare never waited for its request")

    async def test_the_spare_runs_the_program_at_the_gateways_priority(self) -> None:
        pid, waiting_nice = await self.spare_ready()
        self.assertEqual(waiting_nice, 19)
        out = os.path.join(self.directory, "out")
        code = await self.launcher.run({
            "user": "root", "argv": ["sh", "-c", f'echo "$$ $(nice)" > {out}'],
            "log": os.path.join(self.directory, "log"), "env": {"PATH": "/usr/bin:/bin"}, "cwd": self.directory,
        }, 20)
        self.assertEqual(code, 0)
        with open(out) as handle:
            program_pid, niceness = handle.read().split()
        self.assertEqual(int(program_pid), pid, "the spare itself became the program")
        self.assertEqual(int(niceness), os.getpriority(os.PRIO_PROCESS, 0))

    async def test_an_unused_spare_ends_quietly_when_its_stdin_closes(self) -> None:
        await self.spare_ready()
        spare = self.launcher._spares[0]
        self.launcher.stop()
        self.assertEqual(await spare.ended, 0)
        self.assertEqual(spare.errors + spare.output, b"")


    async def check_the_program_keeps_the_abstract_name_handed_over(self, spare: bool) -> None:
        """A display's abstract X name, bound by the gateway, reaches the
        program as its fd 3 (a spare's too, over its hand-over socket): the
        program holds the name, and nothing else of ours reaches it."""
        import socket

        if spare:
            await self.spare_ready()
        name = f"\0/tmp/.X11-unix/X{6900 + os.getpid() % 90}-nxgate-test"
        holder = socket.socket(socket.AF_UNIX)
        holder.bind(name)
        out = os.path.join(self.directory, "out")
        code = await self.launcher.run({
            "user": "root", "abstract_holder": holder.fileno(),
            "argv": ["python3", "-c", "import os, socket; fds = ' '.join(sorted(os.listdir('/proc/self/fd'))); "
                     f"s = socket.socket(fileno=3); open({out!r}, 'w').write(repr(s.getsockname()) + ' ' + fds)"],
            "log": os.path.join(self.directory, "log"), "env": {"PATH": "/usr/bin:/bin"}, "cwd": self.directory,
        }, 20)
        holder.close()
        self.assertEqual(code, 0)
        with open(out) as handle:
            bound, fds = handle.read().split(" ", 1)
        self.assertEqual(bound, repr(name.encode()))
        self.assertEqual(fds.split(), ["0", "1", "2", "3", "4"])  # 4: listdir's own

    async def test_a_fresh_launcher_hands_the_program_the_abstract_name(self) -> None:
        self.launcher = Launcher(reactor, spares=0)
        await self.check_the_program_keeps_the_abstract_name_handed_over(spare=False)

    async def test_a_spare_hands_the_program_the_abstract_name(self) -> None:
        await self.check_the_program_keeps_the_abstract_name_handed_over(spare=True)

def defer_sleep(seconds: float) -> defer.Deferred[None]:
    from twisted.internet.task import deferLater

    return deferLater(reactor, seconds, lambda: None)

