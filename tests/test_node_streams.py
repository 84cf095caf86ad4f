"""``open_stream`` on one box: the router and this machine's node (the real
session service, with stand-in agents), and what they refuse.

A stream is the one way a door reaches a session's bytes, so the node
checks it as every call about a session: another user's session is
NOT_YOURS with NOT_FOUND's words, a kind the node does not know and a
session that is not running are refused with words, and only an owner's
stream is connected, to the session's own agent socket.  The same refusals
through another member: tests/test_cluster_wire.py and
tests/test_e2e_cluster_streams.py.
"""

from __future__ import annotations

import os
import socket

from twisted.internet import defer
from twisted.trial.unittest import TestCase

from nxgate.config import Config, SessionsSection
from nxgate.gateway.router import Router
from nxgate.node import browser_viewer, files
from nxgate.node.local import LocalNode
from nxgate.node.service import SessionService
from nxgate.vocabulary.caller import Caller
from nxgate.vocabulary.errors import Kind, SessionError
from nxgate.vocabulary.model import State
from nxgate.vocabulary.requests import DisplaySettings, StartRequest
from nxgate.vocabulary.streams import AGENT, VIEW, StreamKind
from tests.harness.stores import inline_store
from tests.test_sessions_manager import (ME, READY, TERMINATED, FakeLauncher, FakeNotifier, caller,
                                         short_state_dir)
from tests.harness.clock import FakeReactor


class SameAccounts:
    """This machine's accounts are the callers' (the node resolves every caller again by name)."""

    async def here(self, who: Caller, machine: str) -> Caller:
        return who


class StreamCase(TestCase):
    def setUp(self) -> None:
        self.reactor = FakeReactor()
        layout = files.StateLayout(short_state_dir(self))
        layout.prepare()
        sessions = SessionsSection(display_base=3140, display_limit=20, connect_timeout=30, agent_start_timeout=5)
        self.config = Config(sessions=sessions, types={"unix-console": ("true",)})
        self.store = inline_store(layout.database)
        self.addCleanup(self.store.close)
        self.launcher = FakeLauncher(self)
        self.service = SessionService(self.reactor, self.config, self.store.deferred, layout,
                                      notifier=FakeNotifier(), launcher=self.launcher,
                                      send_signal=lambda process, signum: True, listens=lambda pid, port: True)
        self.viewers = browser_viewer.BrowserViewers(self.reactor, self.launcher, "/nonexistent", "/nonexistent")
        self.node = LocalNode(self.service, SameAccounts(), lambda: "this-box", lambda f, *a: f(*a), self.viewers)
        self.router = Router(self.reactor, lambda: self.config, self.node, self.store.deferred)
        self.owner = caller()
        self.other = Caller("bob", 4242, 4242, frozenset(), "192.0.2.7")

    def started(self) -> str:
        """A session of the owner whose agent waits for its client."""
        request = StartRequest("unix-console", "t", DisplaySettings(), True, False)
        d = defer.ensureDeferred(self.node.start(self.owner, request))
        (session_id,) = list(self.service.sessions)
        self.service._agent_line(session_id, READY)
        self.successResultOf(d)
        return session_id

    def agent_listens(self, session_id: str) -> socket.socket:
        """What the agent would do: listen on its socket in the session's directory."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.addCleanup(listener.close)
        listener.bind(os.path.join(self.service.layout.sessions, session_id, "agent.sock"))
        listener.listen()
        return listener

    def opened(self, api, who: Caller, session_id: str, kind: StreamKind = AGENT):
        d = defer.ensureDeferred(api.open_stream(who, session_id, kind))
        self.reactor.advance(0)  # the connect attempt
        return d

    def refused(self, api, who: Caller, session_id: str, kind: StreamKind = AGENT) -> SessionError:
        return self.failureResultOf(self.opened(api, who, session_id, kind), SessionError).value

class OpenStreamTests(StreamCase):
    def test_the_owner_gets_the_agents_own_socket(self) -> None:
        session_id = self.started()
        listener = self.agent_listens(session_id)
        for api in (self.router, self.node):
            stream = self.successResultOf(self.opened(api, self.owner, session_id))
            self.assertEqual((stream.session_id, stream.kind, stream.node), (session_id, AGENT, ""))
            sock = stream.take_socket()
            self.addCleanup(sock.close)
            accepted, _ = listener.accept()
            self.addCleanup(accepted.close)
            sock.sendall(b"NXPROXY")
            self.assertEqual(accepted.recv(10), b"NXPROXY")
            self.assertRaises(ValueError, stream.take_socket)  # one taker

    def test_another_users_session_is_not_yours_with_not_found_words(self) -> None:
        session_id = self.started()
        listener = self.agent_listens(session_id)
        listener.setblocking(False)
        for api in (self.router, self.node):
            for kind in (AGENT, VIEW):
                error = self.refused(api, self.other, session_id, kind)
                self.assertEqual((error.kind, error.message), (Kind.NOT_YOURS, f"Could not find session {session_id}."))
        self.assertRaises(BlockingIOError, listener.accept)  # nothing reached the agent

    def test_a_kind_the_node_does_not_know(self) -> None:
        session_id = self.started()
        for kind in (StreamKind("accept", 7), StreamKind("agent", 1), StreamKind("shell")):
            for api in (self.router, self.node):
                error = self.refused(api, self.owner, session_id, kind)
                self.assertEqual(error.kind, Kind.INVALID_REQUEST)
                self.assertEqual(error.message, f"Machine this-box opens no stream of kind {kind}.")
        self.assertRaises(ValueError, StreamKind, "Agent!")
        self.assertRaises(ValueError, StreamKind, "accept", -1)

    def test_a_session_that_is_not_running(self) -> None:
        session_id = self.started()
        self.service.sessions[session_id] = self.service.sessions[session_id].evolve(state=State.TERMINATING)
        self.assertEqual(self.refused(self.node, self.owner, session_id).kind, Kind.WRONG_STATE)
        self.service._agent_line(session_id, TERMINATED)
        for api in (self.router, self.node):
            error = self.refused(api, self.owner, session_id)
            self.assertEqual((error.kind, error.message), (Kind.NOT_FOUND, f"Could not find session {session_id}."))
        error = self.refused(self.router, self.owner, "F" * 32)
        self.assertEqual(error.kind, Kind.NOT_FOUND)

    def test_an_agent_that_does_not_listen_is_unavailable_in_time(self) -> None:
        session_id = self.started()
        d = self.opened(self.node, self.owner, session_id)
        self.assertNoResult(d)
        self.reactor.pump([0.1] * 40)  # the agent never listens: given up after a few seconds
        error = self.failureResultOf(d, SessionError).value
        self.assertEqual(error.kind, Kind.UNAVAILABLE)
        self.assertIn(f"The agent of session {session_id} cannot be reached", error.message)

    def test_a_view_of_a_session_that_never_had_a_client(self) -> None:
        """Nothing to show live (its agent has no screen yet): refused, and nothing is started."""
        session_id = self.started()
        error = self.refused(self.node, self.owner, session_id, VIEW)
        self.assertEqual((error.kind, error.message),
                         (Kind.WRONG_STATE, f"Session {session_id} cannot be shown in a browser now."))
        self.assertEqual(len(self.launcher.requests), 1)  # the agent only: no x11vnc
        self.assertEqual(self.viewers.count(), 0)

    def test_the_admin_does_not_view_anothers_session_live(self) -> None:
        """A live view is its owner's only (an admin shadows, which asks the owner as the policy says)."""
        session_id = self.started()
        admin = Caller("admin-" + ME, 0, 0, frozenset(), "192.0.2.9", admin=True)
        error = self.refused(self.node, admin, session_id, VIEW)
        self.assertEqual((error.kind, error.message), (Kind.NOT_YOURS, f"Could not find session {session_id}."))


class ShortOfFilesTests(StreamCase):
    """Every stream a user makes the gateway hold asks the users' file reserve first."""

    def test_no_stream_when_users_may_take_no_more_files(self) -> None:
        session_id = self.started()
        listener = self.agent_listens(session_id)
        listener.setblocking(False)
        asked: list[int] = []
        room = [False]
        self.node.room = lambda count: asked.append(count) or room[0]
        for api in (self.router, self.node):
            error = self.refused(api, self.owner, session_id)
            self.assertEqual(error.kind, Kind.LIMIT_REACHED)
            self.assertEqual(error.message, "Machine this-box is short of open files; please try again in a minute.")
        self.assertRaises(BlockingIOError, listener.accept)  # nothing was opened
        self.assertEqual(asked, [1, 1])
        room[0] = True
        stream = self.successResultOf(self.opened(self.node, self.owner, session_id))
        stream.close()

    def test_a_stream_from_another_member_asks_this_gateways_reserve(self) -> None:
        session_id = self.started()
        remote = []

        class Member:
            async def open_stream(self, *args):
                remote.append(args)
                raise AssertionError("opened past the reserve")

        router = Router(self.reactor, lambda: self.config, None, self.store.deferred, room=lambda count: False)
        router._node_of = lambda row: defer.succeed(Member())  # a session another member runs
        error = self.failureResultOf(defer.ensureDeferred(router.open_stream(self.owner, session_id, AGENT)),
                                     SessionError).value
        self.assertEqual((error.kind, error.message),
                         (Kind.LIMIT_REACHED, "The server is short of open files; please try again in a minute."))
        self.assertEqual(remote, [])
