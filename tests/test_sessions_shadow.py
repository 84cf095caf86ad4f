"""The shadow service does not block the reactor: the console is found in
a thread, and the owner's account comes from the user directory."""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile

from twisted.internet import defer
from twisted.trial.unittest import SynchronousTestCase

from nxgate.config import Config, ShadowSection
from nxgate.node.files import StateLayout
from nxgate.vocabulary.model import Session, State
from nxgate.node.processes import ProcessId
from nxgate.vocabulary.caller import Caller
from nxgate.vocabulary.errors import Kind, SessionError
from nxgate.vocabulary.requests import DisplaySettings, ShadowRequest
from nxgate.node import console, processes
from nxgate.node.shadow_sessions import ShadowService, Target
from nxgate import users
from nxgate.users import UserDirectory
from tests.harness.clock import FakeReactor

ME = pwd.getpwuid(os.getuid())
WATCHED = "A" * 32


class Manager:
    """What the shadow service reads of the session manager."""

    def __init__(self, layout):
        self.reactor = FakeReactor()
        self.layout = layout
        self.sessions = {WATCHED: Session(WATCHED, ME.pw_name, ME.pw_uid, ME.pw_gid, "unix-desktop", "desk", 7,
                                          "gw", "c0" * 16, state=State.RUNNING, ever_attached=True)}
        self.runs = []
        self.exit_code = 0

    @property
    def launcher(self):
        return self

    async def run(self, request, timeout):
        self.runs.append(request)
        return self.exit_code


class Late:
    """A ``blocking`` whose answers come when the test says (a thread that is slow)."""

    def __init__(self):
        self.calls = []

    def __call__(self, function, *args):
        d = defer.Deferred()
        self.calls.append((function, args, d))
        return d


class ShadowServiceTests(SynchronousTestCase):
    def setUp(self):
        root = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, root, True)
        self.manager = Manager(StateLayout(root))
        self.blocking = Late()
        config = Config(shadow=ShadowSection(console_display=":5"))
        self.service = ShadowService(self.manager, config, self.blocking, UserDirectory(self.blocking))
        self.caller = Caller(ME.pw_name, ME.pw_uid, ME.pw_gid, address="192.0.2.1")

    def test_the_console_is_found_through_blocking(self):
        d = defer.ensureDeferred(self.service.targets(self.caller))
        self.assertNoResult(d)  # the reactor goes on while the console is looked for
        ((function, args, pending),) = self.blocking.calls
        self.assertEqual((function, args), (console.find_console, (":5",)))
        pending.callback(console.Console(5, ME.pw_name, ME.pw_uid, ME.pw_gid, "ab" * 16, ProcessId(1, 1),
                                         home="/home/owner"))
        targets = self.successResultOf(d)
        self.assertEqual([(t.id, t.display, t.type) for t in targets][0], (WATCHED, 7, "unix-desktop"))
        self.assertEqual((targets[1].display, targets[1].type, targets[1].owner), (5, "console", ME.pw_name))
        self.assertEqual(len(self.blocking.calls), 1)  # the owner's home came with the console: no other look-up

    def test_the_consoles_authority_is_in_the_owners_home(self):
        d = defer.ensureDeferred(self.service._targets())
        self.blocking.calls[0][2].callback(console.Console(5, "owner", 1001, 1001, None, ProcessId(1, 1),
                                                           home="/home/owner"))
        (_, local) = self.successResultOf(d)
        self.assertEqual(local.authority, "/home/owner/.Xauthority")

    def test_no_console(self):
        d = defer.ensureDeferred(self.service.targets(self.caller))
        self.blocking.calls[0][2].callback(None)
        self.assertEqual([t.id for t in self.successResultOf(d)], [WATCHED])

    def test_a_jailed_session_is_no_target(self):
        """Its display exists only in its jail: on the host, :N is whoever
        binds /tmp/.X11-unix/XN, who would get the owner's cookie."""
        jailed = "B" * 32
        self.manager.sessions[jailed] = Session(jailed, ME.pw_name, ME.pw_uid, ME.pw_gid, "unix-desktop", "jailed",
                                                8, "gw", "c1" * 16, state=State.RUNNING, ever_attached=True,
                                                agent_pid=4242, agent_started=1)
        self.manager.sessions[WATCHED] = self.manager.sessions[WATCHED].evolve(agent_pid=4343, agent_started=1)
        self.patch(processes, "same_pid_namespace", lambda pid: pid != 4242)
        d = defer.ensureDeferred(self.service.targets(self.caller))
        self.blocking.calls[0][2].callback(None)
        self.assertEqual([t.id for t in self.successResultOf(d)], [WATCHED])

    def test_the_owner_is_looked_up_off_the_reactor_before_asking(self):
        target = Target(WATCHED, ME.pw_name, 7, "c0" * 16, "desk", "unix-desktop", "/x/authority", "/x/log")
        d = defer.ensureDeferred(self.service._ask(self.caller, target, "view-only"))
        self.assertNoResult(d)
        ((function, args, pending),) = self.blocking.calls
        self.assertEqual((function, args), (users.account, (ME.pw_name,)))
        self.assertEqual(self.manager.runs, [])  # no dialog before the account is known
        pending.callback(ME)
        self.assertIs(self.successResultOf(d), True)
        (request,) = self.manager.runs
        self.assertEqual((request["user"], request["cwd"]), (ME.pw_name, ME.pw_dir))
        self.assertEqual(request["env_fixed"], {"DISPLAY": ":7", "XAUTHORITY": "/x/authority"})

    def test_an_owner_without_an_account_fails_the_ask(self):
        target = Target(WATCHED, "gone", 7, None, "desk", "unix-desktop", "/x/authority", "/x/log")
        d = defer.ensureDeferred(self.service._ask(self.caller, target, "view-only"))
        self.blocking.calls[0][2].errback(KeyError("gone"))
        self.failureResultOf(d, KeyError)
        self.assertEqual(self.manager.runs, [])

    def ask_with_exit_code(self, code):
        self.manager.exit_code = code
        target = Target(WATCHED, ME.pw_name, 7, "c0" * 16, "desk", "unix-desktop", "/x/authority", "/x/log")
        d = defer.ensureDeferred(self.service._ask(self.caller, target, "view-only"))
        for _function, _args, pending in self.blocking.calls:  # the first time (the directory keeps it)
            if not pending.called:
                pending.callback(ME)
        return d

    def test_the_owners_answer_is_read_from_the_dialogs_exit_code(self):
        self.assertIs(self.successResultOf(self.ask_with_exit_code(0)), True)
        self.assertIs(self.successResultOf(self.ask_with_exit_code(3)), False)
        self.assertIsNone(self.successResultOf(self.ask_with_exit_code(None)))

    def test_a_dialog_that_never_opened_is_not_the_owners_refusal(self):
        """Issue 25: Python's exit 1 (no display: the consent dialog never reached the owner) was
        reported as "Authorization refused by user"."""
        error = self.failureResultOf(self.ask_with_exit_code(1), SessionError).value
        self.assertEqual(error.kind, Kind.UNAVAILABLE)
        self.assertIn("could not be asked", error.message)
        self.assertNotIn("refused", error.message)

    def test_a_jailed_session_asked_for_by_id_is_refused_with_the_reason(self):
        self.manager.sessions[WATCHED] = self.manager.sessions[WATCHED].evolve(agent_pid=4242, agent_started=1)
        self.patch(processes, "same_pid_namespace", lambda pid: pid != 4242)
        request = ShadowRequest(WATCHED, DisplaySettings(), view_only=True)
        d = defer.ensureDeferred(self.service.attach(self.caller, request))
        self.blocking.calls[0][2].callback(None)
        error = self.failureResultOf(d, SessionError).value
        self.assertEqual(error.kind, Kind.NOT_ALLOWED)
        self.assertIn("runs in a jail", error.message)
        self.assertIn("was not asked", error.message)
        self.assertEqual(self.manager.runs, [])  # no dialog


class NoticeEndTests(SynchronousTestCase):
    """However the owner's notice ends while the shadow runs, the shadow ends
    with it; only a shadow that ended first lets its notice go quietly."""

    def setUp(self):
        root = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, root, True)
        self.manager = Manager(StateLayout(root))
        self.shadow = "S" * 32
        me = ProcessId.of(os.getpid())  # the shadow's "agent": a process that lives
        self.manager.sessions[self.shadow] = Session(self.shadow, "viewer", ME.pw_uid, ME.pw_gid, "shadow", "s", 8,
                                                     "gw", "c1" * 16, state=State.RUNNING, agent_pid=me.pid,
                                                     agent_started=me.started)
        self.ended = []

        async def terminate_session(session_id, reason):
            self.ended.append((session_id, reason))

        self.manager.lifecycle = type("Lifecycle", (), {"terminate_session": staticmethod(terminate_session)})
        self.service = ShadowService(self.manager, Config(), defer.succeed, UserDirectory(
            lambda function, *args: defer.maybeDeferred(function, *args)))
        self.target = Target(WATCHED, ME.pw_name, 7, "c0" * 16, "desk", "unix-desktop", "/a", "/var/log/x.log")
        self.events = []
        from twisted.logger import globalLogPublisher

        globalLogPublisher.addObserver(self.events.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.events.append)

    def show(self, code):
        self.manager.exit_code = code
        viewer = Caller("viewer", 1, 1, address="192.0.2.9")
        self.successResultOf(defer.ensureDeferred(self.service._show_notice(viewer, self.target, "interactive",
                                                                           self.shadow)))
        return [e for e in self.events if e.get("log_namespace") == "nxgate.node.shadow_sessions"]

    def test_a_signal_ends_the_shadow_and_the_log_says_why(self):
        said = self.show(None)
        self.assertEqual(self.ended, [(self.shadow, "its notice on the watched screen went away")])
        self.assertIn("closed by a signal, not by its End button", said[-1]["words"])
        self.assertIn("the shadow is ended with it", said[-1]["words"])
        self.assertEqual(said[-1]["log_level"].name, "warn")

    def test_a_crash_or_a_false_gone_ends_it_too(self):
        from nxgate.node import shadow_sessions

        for code in (1, shadow_sessions.NOTICE_GONE):
            self.ended.clear()
            self.show(code)
            self.assertEqual(len(self.ended), 1, code)

    def test_the_end_button_ends_it_as_the_owners_wish(self):
        said = self.show(0)
        self.assertEqual(self.ended, [(self.shadow, f"ended by {ME.pw_name}, the watched session's owner")])
        self.assertEqual(said[-1]["log_level"].name, "info")

    def test_a_notice_that_goes_after_its_shadow_ended_is_quiet(self):
        from nxgate.node import shadow_sessions

        self.manager.sessions[self.shadow] = self.manager.sessions[self.shadow].evolve(state=State.TERMINATED)
        self.assertEqual(self.show(shadow_sessions.NOTICE_GONE), [])
        self.assertEqual(self.ended, [])

    def test_a_notice_that_cannot_start_ends_the_shadow(self):
        async def broken(request, timeout):
            raise OSError("the launcher failed")

        self.manager.run = broken
        said = self.show(None)
        self.assertEqual(len(self.ended), 1)
        self.assertIn("could not be shown (the launcher failed)", said[-1]["words"])


class ShadowNoticeTests(SynchronousTestCase):
    """The notice program's pure parts (its window is tested end to end: test_e2e_web_viewer)."""

    def test_it_reads_a_process_start_time_as_the_gateway_does(self):
        from nxgate.node import shadow_notice

        self.assertEqual(shadow_notice.start_time(os.getpid()), processes.start_time(os.getpid()))
        self.assertIsNone(shadow_notice.start_time(2 ** 22 + 1))  # above pid_max: no such process

    def test_it_ends_at_once_when_the_shadow_is_already_gone(self):
        from nxgate.node import shadow_notice

        started = processes.start_time(os.getpid())
        self.assertEqual(shadow_notice.main(["bob", "192.0.2.1", "view-only", str(os.getpid()), str(started + 1)]),
                         shadow_notice.GONE)
        self.assertEqual(shadow_notice.main(["bob", "192.0.2.1", "view-only", "x", "1"]), 2)

    def test_the_words_say_who_and_whether_he_can_use_the_session(self):
        from nxgate.node import shadow_notice

        self.assertEqual(shadow_notice.words("bob", "192.0.2.1", "interactive"),
                         "bob (192.0.2.1) watches and can use your screen")
        self.assertEqual(shadow_notice.words("bob", "192.0.2.1", "view-only"), "bob (192.0.2.1) watches your screen")
