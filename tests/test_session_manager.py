"""The session manager's state handling with a fake reactor and launcher.

Agents here are stand-ins (``sleep`` processes) and their log lines are
fed by the test; the real nxagent runs in the end-to-end tests.
"""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import time

from twisted.internet import defer
from twisted.test.proto_helpers import MemoryReactorClock
from twisted.trial.unittest import TestCase

from nxgate.config import Config, SessionsSection
from nxgate.conversation import Client
from nxgate.nx.errors import NXError
from nxgate.nx.params import parse_params
from nxgate.session import files, processes
from nxgate.session.manager import SIGHUP_RETRY_SECONDS, RelayTarget, SessionManager
from nxgate.session.model import State
from nxgate.session.processes import ProcessId
from nxgate.session.request import display_settings, start_request
from nxgate.session.store import SessionStore

ME = pwd.getpwuid(os.getuid()).pw_name
READY = "Info: Waiting for connection from '127.0.0.1' on socket 'tcp:*:7000'."
STARTED = "Session: Session started at 'now'."
SUSPENDED = "Session: Session suspended at 'now'."
TERMINATED = "Session: Session terminated at 'now'."


class FakeNotifier:
    def watch(self, *args, **kwargs):
        pass

    def ignore(self, *args):
        pass

    def startReading(self):
        pass

    def loseConnection(self):
        pass


class FakeLauncher:
    """Starts a harmless stand-in process for every request."""

    def __init__(self, test):
        self.requests = []
        self.closed = []
        self.processes = []
        self.test = test

    status = "ready 800x600"

    async def start(self, request):
        self.requests.append(request)
        process = subprocess.Popen(["sleep", "600"])
        self.processes.append(process)
        self.test.addCleanup(lambda: (process.kill(), process.wait()))
        return ProcessId.of(process.pid)

    async def start_reporting(self, request):
        process = await self.start(request)
        return process, defer.succeed(self.status if request.get("status_fd") else "")

    async def close_pam(self, request):
        self.closed.append(request)


class ManagerTests(TestCase):
    def setUp(self):
        self.reactor = MemoryReactorClock()
        state = self.mktemp()
        layout = files.StateLayout(state)
        layout.prepare()
        sessions = SessionsSection(display_base=3100, display_limit=20, max_sessions_per_user=2,
                                   connect_timeout=30, agent_start_timeout=5)
        self.config = Config(sessions=sessions, types={"unix-console": ("true",)})
        self.store = SessionStore(layout.database)
        self.addCleanup(self.store.close)
        self.launcher = FakeLauncher(self)
        self.manager = SessionManager(self.reactor, self.config, self.store, layout,
                                      notifier=FakeNotifier(), launcher=self.launcher)
        self.signals = []
        self.patch(self.manager, "_signal_agent", lambda session, signum: self.signals.append(signum))
        self.listening = True  # the stand-in agents hold no port; the real check runs end to end
        self.patch(processes, "listens", lambda pid, port: self.listening)
        self.client = Client(ME, "192.0.2.1")

    def agent_says(self, session_id, *lines):
        for line in lines:
            self.manager._agent_line(session_id, line)

    def start(self, params='--type="unix-console" --session="t"'):
        d = defer.ensureDeferred(self.manager.start(self.client, start_request(parse_params(params))))
        (session_id,) = [s.id for s in self.manager.sessions.values() if s.id not in getattr(self, "_seen", set())]
        self._seen = getattr(self, "_seen", set()) | {session_id}
        return d, session_id

    def started(self):
        d, session_id = self.start()
        self.agent_says(session_id, READY)
        reply = self.successResultOf(d)
        return session_id, reply

    def test_start_replies_when_the_agent_listens(self):
        d, session_id = self.start()
        self.assertNoResult(d)
        self.agent_says(session_id, "Session: Starting session at 'now'.", READY)
        reply = self.successResultOf(d)
        session = self.manager.sessions[session_id]
        self.assertEqual(reply.relay, RelayTarget(session_id, "127.0.0.1", 4000 + session.display))
        self.assertIn(f"NX> 701 Proxy cookie: {session.cookie}", reply.lines)
        self.assertIn(f"NX> 706 Agent cookie: {session.cookie}", reply.lines)
        self.assertEqual(self.store.get(session_id).state, State.WAITING)
        agent_request = self.launcher.requests[0]
        self.assertEqual(agent_request["user"], ME)
        self.assertNotIn(session.cookie, " ".join(agent_request["argv"]))
        with open(os.path.join(self.manager.layout.sessions, session_id, "options")) as options:
            self.assertIn(f"cookie={session.cookie}", options.read())
        mode = os.stat(os.path.join(self.manager.layout.sessions, session_id)).st_mode & 0o777
        self.assertEqual(mode, 0o700)

    def test_a_port_taken_by_another_process_is_never_relayed_to(self):
        self.listening = False
        d, session_id = self.start()
        self.agent_says(session_id, READY)
        self.assertIn("its port is in use by another process", self.failureResultOf(d, NXError).value.text)
        self.assertEqual(self.signals, [signal.SIGTERM])

    def test_program_starts_once_a_client_is_attached(self):
        session_id, _ = self.started()
        self.assertEqual(len(self.launcher.requests), 1)
        self.agent_says(session_id, STARTED)
        self.assertEqual(self.manager.sessions[session_id].state, State.RUNNING)
        self.assertEqual(self.launcher.requests[1]["argv"], ["true"])
        self.assertEqual(self.launcher.requests[1]["env_fixed"]["DISPLAY"],
                         f":{self.manager.sessions[session_id].display}")

    def test_start_timeout_fails_cleanly(self):
        d, session_id = self.start()
        self.reactor.advance(5)
        error = self.failureResultOf(d, NXError).value
        self.assertEqual(error.code, 596)
        self.assertEqual(self.store.get(session_id).state, State.FAILED)
        self.assertFalse(os.path.exists(os.path.join(self.manager.layout.sessions, session_id)))
        self.assertNotIn(session_id, self.manager.sessions)

    def test_agent_error_line_is_the_failure_reason(self):
        d, session_id = self.start()
        self.agent_says(session_id, "Error: Aborting session with 'Unable to open display'.",
                        "Session: Session aborted at 'now'.")
        self.assertIn("Unable to open display", self.failureResultOf(d, NXError).value.text)

    def test_unknown_type_names_the_available_ones(self):
        error = self.assertRaises(NXError, start_request, parse_params('--type="unix kde"'))
        self.assertEqual(error.code, 597)
        d = defer.ensureDeferred(self.manager.start(self.client, start_request(parse_params('--type="unix-kde"'))))
        text = self.failureResultOf(d, NXError).value.text
        self.assertIn("unix-kde", text)
        self.assertIn("Available types: unix-application, unix-console", text)

    def test_resume_with_a_fresh_cookie_resending_sighup(self):
        session_id, first = self.started()
        old_cookie = self.manager.sessions[session_id].cookie
        self.agent_says(session_id, STARTED, "Session: Display failure detected at 'now'.", SUSPENDED)
        d = defer.ensureDeferred(self.manager.restore(self.client, session_id,
                                                      display_settings(parse_params('--geometry="1280x1024"')), True))
        self.assertEqual(self.signals, [signal.SIGHUP])
        self.reactor.advance(SIGHUP_RETRY_SECONDS)  # the first SIGHUP was ignored (the recipe's race)
        self.assertEqual(self.signals, [signal.SIGHUP, signal.SIGHUP])
        self.agent_says(session_id, "Session: Resuming session at 'now'.")
        self.reactor.advance(5 * SIGHUP_RETRY_SECONDS)  # resuming: another SIGHUP would suspend it again
        self.assertEqual(self.signals, [signal.SIGHUP, signal.SIGHUP])
        self.assertNoResult(d)
        self.agent_says(session_id, READY)
        reply = self.successResultOf(d)
        session = self.manager.sessions[session_id]
        self.assertNotEqual(session.cookie, old_cookie)
        self.assertIn(f"NX> 701 Proxy cookie: {session.cookie}", reply.lines)
        self.assertEqual(session.geometry, "1280x1024")
        with open(os.path.join(self.manager.layout.sessions, session_id, "authority"), "rb") as authority:
            self.assertIn(bytes.fromhex(session.cookie), authority.read())

    def test_take_over_suspends_first(self):
        session_id, _ = self.started()
        self.agent_says(session_id, STARTED)
        d = defer.ensureDeferred(self.manager.restore(self.client, session_id, display_settings(parse_params("")), True))
        self.assertEqual(self.signals, [signal.SIGHUP])
        self.assertNoResult(d)
        self.agent_says(session_id, "Session: Suspending session at 'now'.", SUSPENDED)
        self.assertEqual(self.signals, [signal.SIGHUP, signal.SIGHUP])
        self.agent_says(session_id, READY)
        self.successResultOf(d)

    def test_other_users_sessions_do_not_exist(self):
        session_id, _ = self.started()
        stranger = Client("someone-else", "198.51.100.9")
        for call in (lambda: self.manager.restore(stranger, session_id, display_settings(parse_params("")), True),
                     lambda: self.manager.terminate(stranger, session_id),
                     lambda: self.manager.suspend(stranger, session_id)):
            error = self.failureResultOf(defer.ensureDeferred(call()), NXError).value
            self.assertEqual(error.text, f"Error: Could not find session {session_id}.")
        self.assertNotIn(session_id, "\n".join(self.manager.list(stranger, parse_params("")).lines))
        self.assertEqual(self.signals, [])

    def test_terminate_escalates(self):
        session_id, _ = self.started()
        d = defer.ensureDeferred(self.manager.terminate(self.client, session_id))
        self.assertEqual(self.signals, [signal.SIGTERM])
        self.reactor.advance(2)
        self.assertEqual(self.signals, [signal.SIGTERM, signal.SIGTERM])
        self.agent_says(session_id, "Session: Terminating session at 'now'.", TERMINATED)
        self.assertNoResult(d)  # the reply waits until the agent is gone: it lingers, so...
        self.reactor.advance(5)  # ...it is killed
        self.reactor.advance(5)
        reply = self.successResultOf(d)
        self.assertEqual(self.launcher.processes[0].wait(5), -signal.SIGKILL)
        self.assertIn(f"NX> 900 Session id: {session_id} terminated.", reply.lines)
        self.assertEqual(self.store.get(session_id).state, State.TERMINATED)
        self.assertEqual(self.launcher.closed[0]["user"], ME)

    def test_the_watchdog_the_agent_waits_for_is_killed(self):
        """Only the agent's forked ``nxagent`` child: not its other children
        (xkbcomp), and no pid from a log line a restarted gateway never saw."""
        forks = ("import os, time\n"
                 "parent = os.getpid()\n"
                 "for name in ('nxagent', 'xkbcomp'):\n"
                 "    if os.fork() == 0:\n"
                 "        open('/proc/self/comm', 'w').write(name)\n"
                 "        while os.getppid() == parent:\n"  # no orphans outlive the test
                 "            time.sleep(0.1)\n"
                 "        os._exit(0)\n"
                 "time.sleep(600)\n")
        self.patch(subprocess, "Popen", lambda argv, _popen=subprocess.Popen: _popen(["python3", "-c", forks]))
        session_id, _ = self.started()
        agent = self.manager.sessions[session_id].agent_pid
        children = {}
        for _ in range(100):
            children = {name: processes.children_named(agent, name) for name in ("nxagent", "xkbcomp")}
            if all(children.values()):
                break
            time.sleep(0.05)
        (watchdog,) = children["nxagent"]
        self.agent_says(session_id, STARTED, "Info: Waiting the watchdog process to complete.")
        for _ in range(100):
            if processes.children_named(agent, "nxagent") == []:
                break
            time.sleep(0.05)
        self.assertEqual(processes.children_named(agent, "nxagent"), [])
        self.assertIsNotNone(processes.start_time(children["xkbcomp"][0]))

    def test_client_that_never_connects(self):
        session_id, _ = self.started()
        self.reactor.advance(30)
        self.assertEqual(self.signals, [signal.SIGTERM])

    def test_listing_and_capacity(self):
        first, _ = self.started()
        self.agent_says(first, STARTED, SUSPENDED)
        second, _ = self.started()
        lines = self.manager.list(self.client, parse_params('--status="suspended,running"')).lines
        self.assertTrue(any(first in line and "Suspended" in line for line in lines))
        self.assertTrue(any(second in line and "Running" in line for line in lines))
        self.assertEqual(lines[-1], f"NX> 147 Server capacity: reached for user: {ME}")
        only_suspended = self.manager.list(self.client, parse_params('--status="suspended"')).lines
        self.assertFalse(any(second in line for line in only_suspended))
        d = defer.ensureDeferred(self.manager.start(self.client, start_request(parse_params('--type="unix-console"'))))
        error = self.failureResultOf(d, NXError).value
        self.assertEqual((error.code, error.text), (599, f"Server capacity: reached for user: {ME}"))
        self.assertTrue(error.last_operation_failed)

    def test_listing_shows_the_size_nxagent_reports(self):
        d, session_id = self.start('--type="unix-console" --geometry="1280x800" --screeninfo="1280x800x24+render"')
        self.agent_says(session_id, READY, STARTED)
        self.successResultOf(d)

        def row():
            lines = self.manager.list(self.client, parse_params("")).lines
            (line,) = [line for line in lines if session_id in line]
            return line.split()[3], line.split()[5]  # options, screen

        self.assertEqual(row(), ("-RD--PSA", "1280x800"))
        self.agent_says(session_id, "Info: Screen [0] resized to geometry [1280x776] fullscreen [0].")
        self.assertEqual(row(), ("-RD--PSA", "1280x776"))
        self.assertEqual(self.store.get(session_id).geometry, "1280x776")
        self.agent_says(session_id, "Info: Screen [0] resized to geometry [1024x768] fullscreen [1].")
        self.assertEqual(row(), ("FRD--PSA", "1024x768"))

    def test_long_suspended_sessions_expire_and_history_is_pruned(self):
        self.manager.settings = self.config.sessions.__class__(
            **{**self.config.sessions.__dict__, "expire_suspended_after": 1.0, "history_days": 1.0})
        session_id, _ = self.started()
        self.agent_says(session_id, STARTED, SUSPENDED)
        self.reactor.advance(3599)
        self.manager.housekeeping()
        self.assertEqual(self.signals, [])
        self.reactor.advance(2)
        self.manager.housekeeping()
        self.assertEqual(self.signals, [signal.SIGTERM])
        self.agent_says(session_id, TERMINATED)
        self.assertEqual(self.store.get(session_id).state, State.TERMINATED)
        self.reactor.advance(86401)
        self.manager.housekeeping()
        self.assertIsNone(self.store.get(session_id))
        self.assertFalse(os.path.exists(self.manager.layout.agent_files(session_id).log))

    def test_unencrypted_refused_by_default(self):
        d = defer.ensureDeferred(self.manager.start(
            self.client, start_request(parse_params('--type="unix-console" --encryption="0"'))))
        self.assertEqual(self.failureResultOf(d, NXError).value.text, "Unencrypted sessions are not allowed.")
        self.assertEqual(self.manager.sessions, {})


class ReconcileTests(TestCase):
    """A new gateway takes back what the previous one left running."""

    def setUp(self):
        self.reactor = MemoryReactorClock()
        self.layout = files.StateLayout(self.mktemp())
        self.layout.prepare()
        self.store = SessionStore(self.layout.database)
        self.addCleanup(self.store.close)
        self.launcher = FakeLauncher(self)

    def manager(self):
        config = Config(sessions=SessionsSection(display_base=3200), types={"unix-console": ("true",)})
        return SessionManager(self.reactor, config, self.store, self.layout, notifier=FakeNotifier(),
                              launcher=self.launcher)

    def leave_session(self, agent: ProcessId, log_lines: list[str], state: State):
        from nxgate.session.model import Session

        session = Session(id="B" * 32, user=ME, uid=os.getuid(), gid=os.getgid(), type="unix-console", name="left",
                          display=3201, server_name="h", cookie="0" * 32, state=state, ever_attached=True,
                          agent_pid=agent.pid, agent_started=agent.started, options={"plan": {"program": ["true"]}})
        self.store.insert(session)
        agent_files = self.layout.agent_files(session.id)
        os.mkdir(agent_files.directory, 0o700)
        with open(agent_files.log, "w") as log:
            log.write("\n".join(log_lines) + "\n")
        return session

    def test_live_agent_is_taken_back_in_its_logged_state(self):
        agent = self.successResultOf(defer.ensureDeferred(self.launcher.start({})))
        session = self.leave_session(agent, [READY, STARTED, "Session: Display failure detected at 'x'.",
                                             SUSPENDED], State.RUNNING)
        manager = self.manager()
        manager.reconcile()
        self.assertEqual(manager.sessions[session.id].state, State.SUSPENDED)
        self.assertEqual(self.store.get(session.id).state, State.SUSPENDED)
        self.assertIn(session.id, "\n".join(manager.list(Client(ME, "x"), parse_params("")).lines))

    def test_the_logged_screen_size_is_taken_back(self):
        agent = self.successResultOf(defer.ensureDeferred(self.launcher.start({})))
        session = self.leave_session(agent, [READY, STARTED, "Info: Screen [0] resized to geometry [900x700] "
                                             "fullscreen [0]."], State.RUNNING)
        manager = self.manager()
        manager.reconcile()
        self.assertEqual(manager.sessions[session.id].geometry, "900x700")
        self.assertEqual(self.store.get(session.id).geometry, "900x700")

    def test_dead_agent_is_marked_ended_and_cleaned_up(self):
        gone = ProcessId(os.getpid(), 1)  # a start time that no live process has
        session = self.leave_session(gone, [READY, STARTED], State.RUNNING)
        manager = self.manager()
        manager.reconcile()
        self.assertEqual(self.store.get(session.id).state, State.TERMINATED)
        self.assertNotIn(session.id, manager.sessions)
        self.assertFalse(os.path.exists(self.layout.agent_files(session.id).directory))
        self.assertEqual(len(self.launcher.closed), 1)
