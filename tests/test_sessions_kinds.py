"""Session kinds (issue 23): a kind answers a start request with a plan and
the session's options, or a refusal, and starts nothing itself."""

from __future__ import annotations

from twisted.internet import defer
from twisted.trial.unittest import SynchronousTestCase

from nxgate.config import Config, SessionsSection
from nxgate.vocabulary.caller import Caller
from nxgate.vocabulary.errors import ErrorKind, SessionError
from nxgate.node.kinds import DesktopKind, RemoteDesktopKind, kind_for
from nxgate.vocabulary.requests import DisplaySettings, StartRequest

CALLER = Caller("alice", 1000, 1000)


def request(session_type: str, encrypted: bool = True, rootless: bool = False) -> StartRequest:
    return StartRequest(type=session_type, name="n", display=DisplaySettings(), encrypted=encrypted, rootless=rootless)


class KindTests(SynchronousTestCase):
    def setUp(self):
        self.config = Config(sessions=SessionsSection(use_xsession=False), types={"unix-console": ("true",)})
        self.kinds = (RemoteDesktopKind(None, lambda: self.config),
                      DesktopKind(lambda: self.config, lambda: self.config.sessions))

    def prepare(self, start: StartRequest):
        return defer.ensureDeferred(kind_for(self.kinds, start.type).prepare(CALLER, start))

    def test_each_type_has_its_kind(self):
        self.assertIsInstance(kind_for(self.kinds, "windows"), RemoteDesktopKind)
        self.assertIsInstance(kind_for(self.kinds, "vnc"), RemoteDesktopKind)
        self.assertIsInstance(kind_for(self.kinds, "unix-console"), DesktopKind)
        error = self.assertRaises(SessionError, kind_for, self.kinds, "shadow")
        self.assertEqual(error.kind, ErrorKind.INVALID_REQUEST)

    def test_a_desktop_plan(self):
        launch = self.successResultOf(self.prepare(request("unix-console")))
        self.assertEqual((launch.plan.mode, launch.plan.program, launch.services, launch.options),
                         ("-D", ("true",), True, {}))
        self.assertEqual(self.successResultOf(self.prepare(request("unix-console", rootless=True))).plan.mode, "-R")

    def test_desktop_refusals(self):
        self.assertEqual(self.failureResultOf(self.prepare(request("unix-console", encrypted=False)),
                                              SessionError).value.kind, ErrorKind.ENCRYPTION_REQUIRED)
        self.assertEqual(self.failureResultOf(self.prepare(request("unix-nothing")), SessionError).value.kind,
                         ErrorKind.UNAVAILABLE)
