"""The session manager's state handling with a fake reactor and launcher.

Agents here are stand-ins (``sleep`` processes) and their log lines are
fed by the test; the real nxagent runs in the end-to-end tests.
"""

from __future__ import annotations

import dataclasses
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time

from twisted.internet import defer
from twisted.logger import capturedLogs, formatEvent, globalLogPublisher
from twisted.trial.unittest import TestCase

from nxgate.config import Config, SessionsSection
from nxgate.protocols.nx.dispatch import NXDispatcher
from nxgate.protocols.nx.errors import NXError
from nxgate.protocols.nx.params import parse_params
from nxgate.node import files, processes
from nxgate.node.supervisor import SIGHUP_RETRY_SECONDS
from nxgate.node.service import SessionService
from nxgate.vocabulary.model import State
from nxgate.node.processes import ProcessId
from nxgate.protocols.nx.requests import start_request
from tests.harness.stores import inline_store
from nxgate.vocabulary.caller import Caller
from nxgate.vocabulary.errors import Kind, SessionError
from nxgate.vocabulary.results import StreamTarget
from tests.harness.clock import FakeReactor

ME = pwd.getpwuid(os.getuid()).pw_name


def caller(user=ME, address="192.0.2.1", groups=frozenset()):
    return Caller(user, os.getuid(), os.getgid(), groups, address)


def nx(manager, who, command, params=""):
    """``command`` through the NX dispatcher: what the client gets on the wire."""
    return defer.ensureDeferred(NXDispatcher(manager).execute(who, command, parse_params(params)))
READY = "Info: Waiting for connection from '127.0.0.1' on socket 'tcp:*:7000'."
STARTED = "Session: Session started at 'now'."
SUSPENDED = "Session: Session suspended at 'now'."
TERMINATED = "Session: Session terminated at 'now'."
#: nxagent's words when the link to its client breaks (the client went away).
CLIENT_GONE = ("Error: Failure reading from the peer proxy.", "Error: Connection with remote peer broken.",
               "Error: Please check the state of your network and retry.")


def short_state_dir(test: TestCase) -> str:
    """Agents' socket paths must fit in sun_path; trial's temp paths do not."""
    path = tempfile.mkdtemp(prefix="nxgate-unit-")
    test.addCleanup(shutil.rmtree, path, True)
    return os.path.join(path, "state")


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
        self.reactor = FakeReactor()
        layout = files.StateLayout(short_state_dir(self))
        layout.prepare()
        sessions = SessionsSection(display_base=3100, display_limit=20, max_sessions_per_user=2,
                                   connect_timeout=30, agent_start_timeout=5)
        self.config = Config(sessions=sessions, types={"unix-console": ("true",)})
        self.store = inline_store(layout.database)
        self.addCleanup(self.store.close)
        self.launcher = FakeLauncher(self)
        self.signals = []

        def record_signal(process, signum):
            """Signals to the stand-in agents are recorded; a SIGKILL (a lingering
            agent, a watchdog) is sent for real, as the tests check it took."""
            if signum == signal.SIGKILL:
                return processes.send_signal(process, signum)
            self.signals.append(signum)
            return True

        self.listening = True  # the stand-in agents hold no port; the real check runs end to end
        self.manager = SessionService(self.reactor, self.config, self.store.deferred, layout,
                                      notifier=FakeNotifier(), launcher=self.launcher,
                                      send_signal=record_signal, listens=lambda pid, port: self.listening)
        self.client = caller()

    def agent_says(self, session_id, *lines):
        for line in lines:
            self.manager._agent_line(session_id, line)

    def start(self, params='--type="unix-console" --session="t"'):
        d = nx(self.manager, self.client, "startsession", params)
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
        agent_socket = os.path.join(self.manager.layout.sessions, session_id, "agent.sock")
        self.assertEqual(reply.relay, StreamTarget(session_id, agent_socket, os.getuid()))
        self.assertIn(f"NX> 701 Proxy cookie: {session.cookie}", reply.lines)
        self.assertIn(f"NX> 706 Agent cookie: {session.cookie}", reply.lines)
        self.assertEqual(self.store.get(session_id).state, State.WAITING)
        agent_request = self.launcher.requests[0]
        self.assertEqual(agent_request["user"], ME)
        self.assertNotIn(session.cookie, " ".join(agent_request["argv"]))
        with open(os.path.join(self.manager.layout.sessions, session_id, "options")) as options:
            line = options.read()
        self.assertIn(f"cookie={session.cookie}", line)
        self.assertIn(f",listen=unix:{agent_socket},", line)  # no TCP port for other local users
        mode = os.stat(os.path.join(self.manager.layout.sessions, session_id)).st_mode & 0o777
        self.assertEqual(mode, 0o700)

    def test_a_port_taken_by_another_process_is_never_relayed_to(self):
        """Unencrypted sessions still listen on TCP (their client comes to the port)."""
        self.manager.settings = dataclasses.replace(self.manager.settings, allow_unencrypted=True)
        self.listening = False
        d, session_id = self.start('--type="unix-console" --encryption="0"')
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

    def logged(self, session_id, *lines, exits=False):
        """(level, text) of the log lines naming ``session_id`` while the agent says ``lines`` (and ``exits``)."""
        with capturedLogs() as events:
            self.agent_says(session_id, *lines)
            if exits:
                self.manager.lifecycle._agent_exited(session_id)
        return [(event["log_level"].name, formatEvent(event)) for event in events if session_id in formatEvent(event)]

    def test_a_client_that_goes_is_one_line_of_the_suspension_and_no_warning(self):
        session_id, _ = self.started()
        self.agent_says(session_id, STARTED)
        lines = self.logged(session_id, *CLIENT_GONE, "Session: Display failure detected at 'now'.",
                            "Session: Suspending session at 'now'.", SUSPENDED)
        self.assertEqual([line for line in lines if line[0] != "debug"],
                         [("info", f"session {session_id} of {ME} suspended (last client 192.0.2.1)")])

    def test_an_agent_that_ends_when_its_client_goes_ends_in_our_words(self):
        """A shadow's agent ends with its viewer (nxagent: "Please check the state of your network")."""
        session_id, _ = self.started()
        self.agent_says(session_id, STARTED)
        lines = self.logged(session_id, *CLIENT_GONE, "Session: Terminating session at 'now'.", TERMINATED,
                            exits=True)
        self.assertEqual([line for line in lines if line[0] != "debug"],
                         [("info", f"session {session_id} of {ME} ended (terminated: its client went away)")])

    def test_other_agent_errors_are_warnings(self):
        session_id, _ = self.started()
        self.agent_says(session_id, STARTED)
        with capturedLogs() as events:
            self.agent_says(session_id, "Error: Cannot open the font path.")
        self.assertEqual([(e["log_level"].name, formatEvent(e)) for e in events],
                         [("warn", f"session {session_id}: nxagent: Cannot open the font path.")])

    def test_unknown_type_names_the_available_ones(self):
        error = self.assertRaises(NXError, start_request, parse_params('--type="unix kde"'))
        self.assertEqual(error.code, 597)
        d = nx(self.manager, self.client, "startsession", '--type="unix-kde"')
        text = self.failureResultOf(d, NXError).value.text
        self.assertIn("unix-kde", text)
        self.assertIn("Available types: unix-application, unix-console", text)

    def test_rename_changes_the_name_for_the_owner_only(self):
        session_id, _ = self.started()
        view = self.successResultOf(defer.ensureDeferred(self.manager.rename(self.client, session_id, "Work\x07")))
        self.assertEqual(view.name, "Work\\x07")
        self.assertEqual(self.manager.sessions[session_id].name, "Work\\x07")
        self.assertEqual(self.store.get(session_id).name, "Work\\x07")
        other = self.failureResultOf(defer.ensureDeferred(
            self.manager.rename(caller(user="someone-else"), session_id, "Mine")), SessionError).value
        self.assertIs(other.kind, Kind.NOT_YOURS)
        empty = self.failureResultOf(defer.ensureDeferred(self.manager.rename(self.client, session_id, "  ")),
                                     SessionError).value
        self.assertIs(empty.kind, Kind.INVALID_REQUEST)
        self.assertEqual(self.manager.sessions[session_id].name, "Work\\x07")

    def test_observers_hear_creation_and_every_state_change(self):
        heard = []
        self.manager.observers.append(lambda event: heard.append((event.old, event.new, event.view.id)))
        self.manager.observers.append(lambda event: 1 / 0)  # a broken observer is logged; the rest still hear
        session_id, _ = self.started()
        self.agent_says(session_id, STARTED, "Session: Display failure detected at 'now'.", SUSPENDED)
        self.assertEqual([(old, new) for old, new, _ in heard],
                         [(None, State.CREATED), (State.CREATED, State.WAITING), (State.WAITING, State.RUNNING),
                          (State.RUNNING, State.SUSPENDING), (State.SUSPENDING, State.SUSPENDED)])
        self.assertEqual({id for _, _, id in heard}, {session_id})
        self.assertEqual(len(self.flushLoggedErrors(ZeroDivisionError)), 5)

    def test_resume_with_a_fresh_cookie_resending_sighup(self):
        session_id, first = self.started()
        old_cookie = self.manager.sessions[session_id].cookie
        self.agent_says(session_id, STARTED, "Session: Display failure detected at 'now'.", SUSPENDED)
        d = nx(self.manager, self.client, "restoresession", f'--id="{session_id}" --geometry="1280x1024"')
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

    def test_a_resume_starts_without_the_caches_the_last_link_saved(self):
        """nxcomp saves its caches when a slow link ends; a resume that loads
        one stalls 3.6 s in nx-libs (nxgate.node.agents.nxagent.cache_directory)."""
        session_id, first = self.started()
        self.agent_says(session_id, STARTED, "Session: Display failure detected at 'now'.", SUSPENDED)
        caches = os.path.join(self.manager.layout.sessions, session_id, "cache-console")
        os.mkdir(caches)
        saved = os.path.join(caches, "C-" + "AB" * 16)
        open(saved, "w").close()
        d = nx(self.manager, self.client, "restoresession", f'--id="{session_id}" --link="adsl"')
        self.assertFalse(os.path.exists(saved))
        self.assertEqual(self.signals, [signal.SIGHUP])
        self.agent_says(session_id, "Session: Resuming session at 'now'.", READY)
        self.successResultOf(d)

    def started_for_later(self):
        before = set(self.manager.sessions)
        d = defer.ensureDeferred(self.manager.start_for_later(self.client, "unix-console", ""))
        (session_id,) = set(self.manager.sessions) - before
        self.agent_says(session_id, READY)
        return session_id, self.successResultOf(d)

    def test_a_session_started_for_later_waits_listed_as_suspended_then_its_first_client_attaches(self):
        session_id, view = self.started_for_later()
        self.assertEqual((view.name, view.status), ("unix-console", "Suspended"))
        self.reactor.advance(10 * 30)  # the connect timeout does not end it: no client was expected yet
        self.assertEqual(self.manager.sessions[session_id].state, State.WAITING)
        self.assertEqual(self.signals, [])
        listed = nx(self.manager, self.client, "listsession", '--status="suspended"')
        self.assertIn(session_id, "\n".join(self.successResultOf(listed).lines))
        other = nx(self.manager, caller(user="someone-else"), "restoresession", f'--id="{session_id}"')
        self.failureResultOf(other, NXError)
        d = nx(self.manager, self.client, "restoresession", f'--id="{session_id}"')
        reply = self.successResultOf(d)  # it listens already: no SIGHUP, which would end a never-attached agent
        self.assertEqual(self.signals, [])
        self.assertIn(f"NX> 701 Proxy cookie: {self.manager.sessions[session_id].cookie}", reply.lines)
        self.reactor.advance(10 * 30)  # this client did not come either: it still waits for one
        self.assertEqual(self.manager.sessions[session_id].state, State.WAITING)
        self.agent_says(session_id, STARTED)
        session = self.manager.sessions[session_id]
        self.assertEqual((session.state, session.ever_attached, session.for_later), (State.RUNNING, True, False))
        self.assertEqual(self.launcher.requests[-1]["argv"], ["true"])  # its program starts at the first attach

    def test_only_types_that_need_nothing_more_start_for_later(self):
        for session_type, kind in (("unix-application", Kind.INVALID_REQUEST), ("vnc", Kind.INVALID_REQUEST),
                                   ("unix-kde", Kind.UNAVAILABLE)):
            error = self.failureResultOf(defer.ensureDeferred(
                self.manager.start_for_later(self.client, session_type, "x")), SessionError).value
            self.assertIs(error.kind, kind, session_type)
        self.assertEqual(self.manager.sessions, {})

    def test_start_for_later_counts_against_the_limit(self):
        self.started_for_later()
        self.started_for_later()
        error = self.failureResultOf(defer.ensureDeferred(
            self.manager.start_for_later(self.client, "unix-console", "")), SessionError).value
        self.assertIs(error.kind, Kind.LIMIT_REACHED)

    def resumed(self):
        """A session that was attached, suspended and now waits for its resuming client."""
        session_id, _ = self.started()
        self.agent_says(session_id, STARTED, "Session: Display failure detected at 'now'.", SUSPENDED)
        d = nx(self.manager, self.client, "restoresession", f'--id="{session_id}"')
        self.agent_says(session_id, "Session: Resuming session at 'now'.", READY)
        self.successResultOf(d)
        self.signals.clear()
        return session_id

    def test_a_failed_connection_during_a_resume_does_not_cost_the_resume(self):
        """A wrong cookie (or a connection that closes at once) makes the
        resumed nxagent suspend again: it is made to listen again, and the
        right client still gets in while the connect timeout runs."""
        session_id = self.resumed()
        self.agent_says(session_id, "Error: Authentication cookie 'x' doesn't match 'y'.",
                        "Session: Display failure detected at 'now'.", "Session: Suspending session at 'now'.",
                        SUSPENDED)
        self.assertEqual(self.signals, [signal.SIGHUP])
        self.agent_says(session_id, "Session: Resuming session at 'now'.", READY)
        self.assertEqual(self.manager.sessions[session_id].state, State.WAITING)
        self.agent_says(session_id, "Session: Session resumed at 'now'.")
        self.assertEqual(self.manager.sessions[session_id].state, State.RUNNING)
        self.reactor.advance(60)
        self.assertEqual(self.signals, [signal.SIGHUP])

    def test_after_the_connect_timeout_a_resumed_session_stays_suspended(self):
        session_id = self.resumed()
        self.reactor.advance(30)  # connect_timeout: no client came back
        self.assertEqual(self.signals, [signal.SIGHUP])
        self.agent_says(session_id, "Session: Suspending session at 'now'.", SUSPENDED)
        self.reactor.advance(10)
        self.assertEqual(self.signals, [signal.SIGHUP])
        self.assertEqual(self.manager.sessions[session_id].state, State.SUSPENDED)

    def test_take_over_of_a_waiting_resume_is_not_undone(self):
        session_id = self.resumed()
        d = nx(self.manager, self.client, "restoresession", f'--id="{session_id}"')
        self.assertEqual(self.signals, [signal.SIGHUP])
        self.agent_says(session_id, "Session: Suspending session at 'now'.", SUSPENDED)
        self.agent_says(session_id, "Session: Resuming session at 'now'.", READY)
        self.successResultOf(d)
        self.assertEqual(self.signals, [signal.SIGHUP, signal.SIGHUP])

    def test_take_over_suspends_first(self):
        session_id, _ = self.started()
        self.agent_says(session_id, STARTED)
        d = nx(self.manager, self.client, "restoresession", f'--id="{session_id}"')
        self.assertEqual(self.signals, [signal.SIGHUP])
        self.assertNoResult(d)
        self.agent_says(session_id, "Session: Suspending session at 'now'.", SUSPENDED)
        self.assertEqual(self.signals, [signal.SIGHUP, signal.SIGHUP])
        self.agent_says(session_id, READY)
        self.successResultOf(d)

    def test_a_restore_during_the_start_waits_for_it_then_decides(self):
        """Start holds the session's lock until ready: a restore meanwhile
        waits, then sees a session that never had a client (refused)."""
        d, session_id = self.start()
        restore = nx(self.manager, self.client, "restoresession", f'--id="{session_id}"')
        self.assertNoResult(restore)
        self.agent_says(session_id, READY)
        self.successResultOf(d)
        self.assertIn("cannot be resumed while it is waiting", self.failureResultOf(restore, NXError).value.text)
        self.assertEqual(self.signals, [])

    def test_terminate_pre_empts_a_take_over(self):
        """Terminate never queues behind the lock: the waiting restore fails cleanly."""
        session_id, _ = self.started()
        self.agent_says(session_id, STARTED)
        restore = nx(self.manager, self.client, "restoresession", f'--id="{session_id}"')
        self.assertEqual(self.signals, [signal.SIGHUP])
        terminate = nx(self.manager, self.client, "terminate", f'--sessionid="{session_id}"')
        self.assertEqual(self.signals, [signal.SIGHUP, signal.SIGTERM])
        self.agent_says(session_id, TERMINATED)
        self.assertIn("Session resume failed: the session terminated",
                      self.failureResultOf(restore, NXError).value.text)
        self.reactor.pump([1] * 12)  # the stand-in agent lingers and is killed
        self.assertIn(f"NX> 900 Session id: {session_id} terminated.", self.successResultOf(terminate).lines)

    def test_other_users_sessions_do_not_exist(self):
        session_id, _ = self.started()
        stranger = caller("someone-else", "198.51.100.9")
        for call in (lambda: nx(self.manager, stranger, "restoresession", f'--id="{session_id}"'),
                     lambda: nx(self.manager, stranger, "terminate", f'--sessionid="{session_id}"'),
                     lambda: nx(self.manager, stranger, "suspend", f'--sessionid="{session_id}"')):
            error = self.failureResultOf(defer.ensureDeferred(call()), NXError).value
            self.assertEqual(error.text, f"Error: Could not find session {session_id}.")
        self.assertNotIn(session_id, "\n".join(self.successResultOf(nx(self.manager, stranger, "listsession")).lines))
        self.assertEqual(self.signals, [])

    def test_terminate_escalates(self):
        session_id, _ = self.started()
        d = nx(self.manager, self.client, "terminate", f'--sessionid="{session_id}"')
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
        # The stand-in waits in select(), as nxagent does for its watchdog
        # (the supervisor ends the watchdog only once the agent is there).
        forks = ("import os, select, time\n"
                 "parent = os.getpid()\n"
                 "for name in ('nxagent', 'xkbcomp'):\n"
                 "    if os.fork() == 0:\n"
                 "        open('/proc/self/comm', 'w').write(name)\n"
                 "        while os.getppid() == parent:\n"  # no orphans outlive the test
                 "            time.sleep(0.1)\n"
                 "        os._exit(0)\n"
                 "select.select([], [], [], 600)\n")
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
        lines = self.successResultOf(nx(self.manager, self.client, "listsession", '--status="suspended,running"')).lines
        self.assertTrue(any(first in line and "Suspended" in line for line in lines))
        self.assertTrue(any(second in line and "Running" in line for line in lines))
        self.assertEqual(lines[-1], f"NX> 147 Server capacity: reached for user: {ME}")
        only_suspended = self.successResultOf(nx(self.manager, self.client, "listsession", '--status="suspended"')).lines
        self.assertFalse(any(second in line for line in only_suspended))
        d = nx(self.manager, self.client, "startsession", '--type="unix-console"')
        error = self.failureResultOf(d, NXError).value
        self.assertEqual((error.code, error.text), (599, f"Server capacity: reached for user: {ME}"))
        self.assertTrue(error.last_operation_failed)

    def test_listing_shows_the_size_nxagent_reports(self):
        d, session_id = self.start('--type="unix-console" --geometry="1280x800" --screeninfo="1280x800x24+render"')
        self.agent_says(session_id, READY, STARTED)
        self.successResultOf(d)

        def row():
            lines = self.successResultOf(nx(self.manager, self.client, "listsession")).lines
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

    def test_a_session_started_for_later_expires_like_a_suspended_one(self):
        self.manager.settings = self.config.sessions.__class__(
            **{**self.config.sessions.__dict__, "expire_suspended_after": 1.0})
        session_id, _ = self.started_for_later()
        self.reactor.advance(3599)
        self.manager.housekeeping()
        self.assertEqual(self.signals, [])
        self.reactor.advance(2)
        self.manager.housekeeping()
        self.assertEqual(self.signals, [signal.SIGTERM])
        self.assertEqual(self.manager.sessions[session_id].failure, "suspended too long")

    def test_unencrypted_refused_by_default(self):
        d = nx(self.manager, self.client, "startsession", '--type="unix-console" --encryption="0"')
        self.assertEqual(self.failureResultOf(d, NXError).value.text, "Unencrypted sessions are not allowed.")
        self.assertEqual(self.manager.sessions, {})


class ReconcileTests(TestCase):
    """A new gateway takes back what the previous one left running."""

    def setUp(self):
        self.reactor = FakeReactor()
        self.layout = files.StateLayout(short_state_dir(self))
        self.layout.prepare()
        self.store = inline_store(self.layout.database)
        self.addCleanup(self.store.close)
        self.launcher = FakeLauncher(self)

    def manager(self):
        config = Config(sessions=SessionsSection(display_base=3200), types={"unix-console": ("true",)})
        return SessionService(self.reactor, config, self.store.deferred, self.layout, notifier=FakeNotifier(),
                              launcher=self.launcher)

    def leave_session(self, agent: ProcessId, log_lines: list[str], state: State):
        from nxgate.vocabulary.model import Session

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
        self.assertIn(session.id, "\n".join(self.successResultOf(nx(manager, caller(ME, "x"), "listsession")).lines))

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


class StoreFailureTests(ManagerTests):
    """Memory and store never disagree for long: a start the store refuses
    holds nothing, and later writes it refuses are kept and retried."""

    def fill_store(self):
        """Make every write fail as SQLite does on a full disk."""
        self.store.fill()

    def free_store(self):
        self.store.free()

    def start_refused(self, params='--type="unix-console" --session="t"'):
        d = nx(self.manager, self.client, "startsession", params)
        return self.failureResultOf(d, NXError).value

    def test_a_start_the_store_refuses_holds_nothing_and_says_why(self):
        self.fill_store()
        for _ in range(3):  # beyond max_sessions_per_user=2: nothing is held
            error = self.start_refused()
            self.assertEqual((error.code, error.text),
                             (596, "Error: Session startup failed: the server's storage is full."))
            self.assertTrue(error.last_operation_failed)
        self.assertEqual(self.manager.sessions, {})
        self.assertEqual(self.manager.runtime, {})
        self.assertEqual(self.launcher.requests, [])
        self.free_store()
        self.started()
        self.started()  # both places in the limit are free again

    def test_names_that_are_not_utf8_or_hold_controls_are_kept_escaped(self):
        for raw, kept in (("bad\udcff", "bad\\xff"), ("esc%1B[31m", "esc\\x1b[31m"), ("caf\u00e9", "caf\u00e9")):
            d, session_id = self.start(f'--type="unix-console" --session="{raw}"')
            self.agent_says(session_id, READY)
            self.successResultOf(d)
            self.assertEqual(self.manager.sessions[session_id].name, kept)
            self.assertEqual(self.store.get(session_id).name, kept)
            listing = "\n".join(self.successResultOf(nx(self.manager, self.client, "listsession")).lines)
            self.assertIn(kept, listing)
            self.agent_says(session_id, TERMINATED)

    def test_terminate_on_a_full_disk_ends_the_session_and_the_store_catches_up(self):
        session_id, _ = self.started()
        self.agent_says(session_id, STARTED)
        self.fill_store()
        d = nx(self.manager, self.client, "terminate", f'--sessionid="{session_id}"')
        self.agent_says(session_id, TERMINATED)
        self.reactor.pump([1] * 12)  # the stand-in agent lingers and is killed
        self.assertIn(f"NX> 900 Session id: {session_id} terminated.", self.successResultOf(d).lines)
        self.assertNotIn(session_id, self.manager.sessions)
        self.assertEqual(self.store.get(session_id).state, State.RUNNING)  # refused, kept in memory
        self.assertIn(session_id, self.manager.unsaved)
        other, _ = self.started_once_space_returns()
        self.assertEqual(self.store.get(session_id).state, State.TERMINATED)
        self.assertEqual(self.store.get(session_id).failure, "user request")
        self.assertEqual(self.manager.unsaved, {})
        self.assertEqual(self.store.get(other).state, State.WAITING)

    def started_once_space_returns(self):
        self.reactor.advance(60)  # retries while the disk is full change nothing
        self.assertNotEqual(self.manager.unsaved, {})
        self.free_store()
        self.reactor.advance(5)  # the next retry writes what was kept
        return self.started()

    def test_agent_events_on_a_full_disk_reach_the_store_later(self):
        session_id, _ = self.started()
        self.fill_store()
        self.agent_says(session_id, STARTED, SUSPENDED)
        self.assertEqual(self.manager.sessions[session_id].state, State.SUSPENDED)
        self.assertEqual(self.store.get(session_id).state, State.WAITING)
        self.free_store()
        self.reactor.advance(5)
        self.assertEqual(self.store.get(session_id).evolve(revision=0), self.manager.sessions[session_id])  # the store counts its writes


class LostStoreTests(ReconcileTests):
    """A store that lost its rows (truncated, replaced): what still runs is
    found in the session directories, reported and its display kept."""

    def orphan_agent(self, session_id, display):
        """A stand-in nxagent (a copy of sh by that name, waiting on its
        stdin) running in a session directory, as the launcher starts agents."""
        directory = self.layout.agent_files(session_id).directory
        os.mkdir(directory, 0o700)
        program = os.path.join(os.path.abspath(self.mktemp()), "nxagent")
        os.makedirs(os.path.dirname(program))
        shutil.copy("/bin/sh", program)
        process = subprocess.Popen([program, "-c", "read line", f":{display}"], cwd=directory, stdin=subprocess.PIPE)
        self.addCleanup(lambda: (process.kill(), process.wait(), process.stdin.close()))
        wait_until(lambda: processes.display_argument(process.pid) == display)
        return process

    def test_unknown_agents_are_reported_and_their_displays_kept(self):
        process = self.orphan_agent("C" * 32, 3200)
        dead = self.layout.agent_files("D" * 32).directory
        os.mkdir(dead, 0o700)
        events = []
        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        manager = self.manager()
        manager.reconcile()
        (orphan,) = manager.orphans.values()
        self.assertEqual((orphan.session_id, orphan.display, orphan.agent.pid), ("C" * 32, 3200, process.pid))
        reports = [e for e in events if e.get("audit") == "session_orphan"]
        self.assertEqual([(e["id"], e["display"], e["pid"]) for e in reports], [("C" * 32, 3200, process.pid)])
        self.assertFalse(os.path.exists(dead))
        fresh = self.successResultOf(defer.ensureDeferred(manager._allocate_display(os.getuid(), os.getgid())))
        self.addCleanup(manager.displays.release, fresh)
        self.assertNotEqual(fresh, 3200)
        manager.backup()  # the old backup may be the one copy that knows the session: kept
        self.assertFalse(os.path.exists(self.store.backup_path))
        process.kill()
        process.wait()
        manager.housekeeping()
        self.assertEqual(manager.orphans, {})
        self.assertFalse(os.path.exists(self.layout.agent_files("C" * 32).directory))
        manager.backup()
        self.assertTrue(os.path.exists(self.store.backup_path))


def wait_until(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


class LateStoreTests(TestCase):
    """The service against a store whose every answer comes a reactor turn
    later (as a database server's would): nobody assumes a store call has
    fired, and the store ends up with memory's records, written in order."""

    start = ManagerTests.start
    agent_says = ManagerTests.agent_says

    def setUp(self):
        ManagerTests.setUp(self)
        adapter = self.store.deferred
        reactor = self.reactor
        self.writes = []
        test = self

        class LateStore:
            path, backup_path = adapter.path, adapter.backup_path

            def __getattr__(self, name):
                def call(*args):
                    if name in ("insert", "update"):
                        test.writes.append((name, args[0].id, args[0].state))
                    answer = defer.Deferred()
                    reactor.callLater(0, lambda: getattr(adapter, name)(*args).chainDeferred(answer))
                    return answer
                return call

        self.manager = SessionService(self.reactor, self.config, LateStore(), self.manager.layout,
                                      notifier=FakeNotifier(), launcher=self.launcher,
                                      send_signal=self.manager.supervisor.send_signal,
                                      listens=lambda pid, port: self.listening)

    def test_a_start_waits_for_the_store_and_the_store_follows_memory(self):
        d, session_id = self.start()
        self.assertEqual(self.launcher.requests, [])  # no agent before the store took the record
        self.assertIsNone(self.store.get(session_id))
        self.reactor.advance(0)
        self.assertEqual(len(self.launcher.requests), 1)
        self.agent_says(session_id, READY)
        self.successResultOf(d)
        self.agent_says(session_id, STARTED, SUSPENDED)
        for _ in range(10):
            self.reactor.advance(0)
        self.assertEqual(self.store.get(session_id).evolve(revision=0), self.manager.sessions[session_id])  # the store counts its writes
        states = [state for name, sid, state in self.writes if sid == session_id]
        self.assertEqual(states[0], State.CREATED)
        self.assertEqual(states[-1], State.SUSPENDED)
        self.assertEqual(self.manager.unsaved, {})

    def test_a_second_start_while_the_store_answers_does_not_take_the_same_place(self):
        """Memory decides admission in one turn: the limit (2 per user) and the
        displays hold while the store has not answered yet."""
        first = [self.start() for _ in range(2)]
        self.assertEqual(len({self.manager.sessions[sid].display for _, sid in first}), 2)
        refused = nx(self.manager, self.client, "startsession", '--type="unix-console" --session="t"')
        self.assertEqual(self.failureResultOf(refused, NXError).value.code, 599)
        self.reactor.advance(0)
