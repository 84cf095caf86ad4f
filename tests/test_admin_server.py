"""The admin socket's JSON answers carry the session service's error kind,
never NX wire text."""

from __future__ import annotations

import json

from twisted.internet import defer
from twisted.trial.unittest import TestCase

from nxgate.gateway.doors.admin.server import AdminProtocol
from nxgate.vocabulary.model import State
from nxgate.vocabulary.errors import Kind, SessionError
from tests import test_sessions_manager as manager_tests
from tests.harness.fakes import FakeSessionAPI

MISSING = "0" * 32


class Gateway:
    def __init__(self, sessions, config):
        self.sessions = self.api = sessions
        self.config = config
        self.started = 0.0


class AdminErrorTests(TestCase):
    def setUp(self):
        manager_tests.ManagerTests.setUp(self)
        self.admin = AdminProtocol(Gateway(self.manager, self.config))

    def ask(self, command, **args):
        line = json.dumps({"command": command, "args": args}).encode()
        return self.successResultOf(defer.ensureDeferred(self.admin._handle(line)))

    def test_a_missing_session_is_not_found(self):
        for command in ("suspend", "terminate", "show"):
            answer = self.ask(command, id=MISSING)
            self.assertEqual(answer, {"ok": False, "error": f"no live session {MISSING}", "kind": "not_found"})

    def test_a_session_that_cannot_be_suspended_yet_is_in_the_wrong_state(self):
        d, session_id = manager_tests.ManagerTests.start(self)
        self.assertIs(self.manager.sessions[session_id].state, State.CREATED)
        answer = self.ask("suspend", id=session_id)
        self.assertEqual(answer, {"ok": False, "error": f"Session {session_id} is created.", "kind": "wrong_state"})
        self.assertNotIn("NX>", json.dumps(answer))
        self.manager._agent_line(session_id, manager_tests.READY)
        self.successResultOf(d)

    def test_the_admin_acts_on_every_users_sessions(self):
        d, session_id = manager_tests.ManagerTests.start(self)
        self.manager._agent_line(session_id, manager_tests.READY)
        self.successResultOf(d)
        (row,) = self.ask("sessions")["result"]
        self.assertEqual(row["id"], session_id)
        self.assertEqual(self.ask("show", id=f"host-1-{session_id}")["result"]["state"], "waiting")

    def test_status_and_draining_through_the_service(self):
        self.assertEqual(self.ask("drain", on=True)["result"], {"draining": True})
        status = self.ask("status")["result"]
        self.assertEqual((status["draining"], status["sessions"], status["unsaved_changes"], status["unknown_sessions"]),
                         (True, 0, 0, []))
        d = defer.ensureDeferred(self.manager.set_draining(manager_tests.caller(), False))
        self.assertEqual(self.failureResultOf(d, SessionError).value.kind, Kind.NOT_ALLOWED)  # users may not
        self.assertTrue(self.manager.draining)

    def test_bad_arguments_are_invalid_requests(self):
        self.assertEqual(self.ask("suspend", bogus=1)["kind"], "invalid_request")
        self.assertEqual(self.ask("nonsense")["kind"], "invalid_request")


#: The arguments each admin command takes; a new command fails the test below until it is listed here.
ARGS = {"status": {}, "sessions": {}, "show": {"id": MISSING}, "terminate": {"id": MISSING},
        "suspend": {"id": MISSING}, "drain": {"on": True}, "reload": {}, "nodes": {}}


class Refusing:
    """A membership that refuses every call with ``error``."""

    def __init__(self, error):
        self.error = error

    def __getattr__(self, name):
        async def refuse(*args, **kwargs):
            raise self.error
        return refuse


class RefusingGateway:
    def __init__(self, error):
        self.sessions = self.api = FakeSessionAPI(default=error)
        self.membership = Refusing(error)
        self.config = None
        self.started = 0.0
        self.error = error

    def reload(self):
        return defer.fail(self.error)


class ErrorPathTests(TestCase):
    """Every admin command's failure is JSON with a kind, and no NX text anywhere."""

    def ask(self, gateway, command):
        line = json.dumps({"command": command, "args": ARGS[command]}).encode()
        d = defer.ensureDeferred(AdminProtocol(gateway)._handle(line))
        d.addErrback(AdminProtocol._unexpected)  # as lineReceived does
        return self.successResultOf(d)

    def assertClean(self, answer, kind):
        text = json.dumps(answer)
        self.assertEqual((answer["ok"], answer["kind"]), (False, kind), text)
        self.assertNotIn("NX>", text)
        self.assertFalse(answer["error"].startswith("Error"), text)
        self.assertIn(answer["kind"], {k.value for k in Kind})

    def test_every_command_is_covered(self):
        self.assertEqual(sorted(name[3:] for name in dir(AdminProtocol) if name.startswith("do_")), sorted(ARGS))

    def test_every_kind_from_every_command(self):
        for kind in Kind:
            for command in ARGS:
                answer = self.ask(RefusingGateway(SessionError(kind, f"Something about {MISSING}.")), command)
                shown = Kind.NOT_FOUND if kind is Kind.NOT_YOURS else kind
                self.assertClean(answer, shown.value)
                if kind in (Kind.NOT_FOUND, Kind.NOT_YOURS) and "id" in ARGS[command]:
                    self.assertEqual(answer["error"], f"no live session {MISSING}")

    def test_a_bug_is_an_internal_error_from_every_command(self):
        for command in ARGS:
            answer = self.ask(RefusingGateway(RuntimeError("NX> 500 boom")), command)
            self.assertEqual(answer, {"ok": False, "error": "internal error (see the server log)", "kind": "internal"})
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), len(ARGS))

    def test_a_refused_reload_is_an_invalid_request(self):
        class Gateway:
            def reload(self):
                return defer.succeed({"ok": False, "problems": ["[auth] failed_login_delay: not a number"]})

        answer = self.ask(Gateway(), "reload")
        self.assertClean(answer, "invalid_request")
        self.assertIn("failed_login_delay", answer["error"])

    def test_a_reload_that_answers_late(self):
        pending: defer.Deferred = defer.Deferred()

        class Gateway:
            def reload(self):
                return pending

        line = json.dumps({"command": "reload", "args": {}}).encode()
        d = defer.ensureDeferred(AdminProtocol(Gateway())._handle(line))
        self.assertNoResult(d)
        pending.callback({"ok": True, "source": "/etc/nxgate.conf", "restart_needed_for": []})
        self.assertEqual(self.successResultOf(d)["result"]["source"], "/etc/nxgate.conf")
