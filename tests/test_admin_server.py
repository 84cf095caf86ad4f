"""The admin socket's JSON answers carry the session service's error kind,
never NX wire text."""

from __future__ import annotations

import json

from twisted.internet import defer
from twisted.trial.unittest import TestCase

from nxgate.admin.server import AdminProtocol
from nxgate.session.model import State
from nxgate.sessions.errors import Kind, SessionError
from tests import test_session_manager as manager_tests

MISSING = "0" * 32


class Gateway:
    def __init__(self, sessions, config):
        self.sessions = sessions
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
