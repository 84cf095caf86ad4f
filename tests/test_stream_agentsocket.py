"""Connecting to an agent's socket in a directory its user controls."""

from __future__ import annotations

import os
import socket

from twisted.trial.unittest import SkipTest, TestCase

from nxgate.wire import agentsocket
from tests.harness.clock import FakeReactor


class ConnectTests(TestCase):
    def setUp(self):
        self.dir = self.mktemp()
        os.mkdir(self.dir, 0o700)

    def listener(self, name: str = "agent.sock") -> tuple[socket.socket, str]:
        path = os.path.join(self.dir, name)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(path)
        server.listen()
        self.addCleanup(server.close)
        return server, path

    def test_connects_to_the_users_socket(self):
        server, path = self.listener()
        client = agentsocket.connect(path, os.getuid())
        self.addCleanup(client.close)
        accepted, _ = server.accept()
        self.addCleanup(accepted.close)
        client.setblocking(True)
        client.sendall(b"NX")
        self.assertEqual(accepted.recv(2), b"NX")

    def test_a_link_the_user_put_there_is_not_followed(self):
        """It could lead to another user's agent, which the first bad
        connection makes abort."""
        server, target = self.listener("elsewhere.sock")
        link = os.path.join(self.dir, "agent.sock")
        os.symlink(target, link)
        self.assertRaises(OSError, agentsocket.connect, link, os.getuid())
        server.setblocking(False)
        self.assertRaises(BlockingIOError, server.accept)  # nothing reached it

    def test_only_a_socket(self):
        path = os.path.join(self.dir, "agent.sock")
        with open(path, "w"):
            pass
        self.assertIn("not a socket", str(self.assertRaises(OSError, agentsocket.connect, path, os.getuid())))
        self.assertRaises(FileNotFoundError, agentsocket.connect, path + ".missing", os.getuid())

    def test_only_the_sessions_users_socket(self):
        if os.getuid() != 0:
            raise SkipTest("chown needs root")
        server, path = self.listener()
        os.chown(path, 54321, 54321)
        error = self.assertRaises(OSError, agentsocket.connect, path, 12345)
        self.assertIn("belongs to uid 54321", str(error))
        server.setblocking(False)
        self.assertRaises(BlockingIOError, server.accept)


class ConnectSoonTests(TestCase):
    """A resumed agent that is made to listen again has no socket for a
    moment; a client that comes just then waits for it."""

    def setUp(self):
        self.dir = self.mktemp()
        os.mkdir(self.dir, 0o700)
        self.path = os.path.join(self.dir, "agent.sock")
        self.clock = FakeReactor()
        self.results = []
        agentsocket.connect_soon(self.clock, self.path, os.getuid(), lambda sock, error: self.results.append((sock, error)))

    def test_waits_for_the_agent_to_listen_again(self):
        self.assertEqual(self.results, [])  # never from inside the call
        self.clock.advance(0)
        self.clock.advance(1)
        self.assertEqual(self.results, [])
        server = socket.socket(socket.AF_UNIX)
        server.bind(self.path)
        server.listen()
        self.addCleanup(server.close)
        self.clock.advance(0.1)
        ((sock, error),) = self.results
        self.addCleanup(sock.close)
        self.assertEqual(error, "")
        self.assertEqual(sock.getpeername(), self.path)

    def test_gives_up_after_a_while(self):
        self.clock.pump([0.1] * 40)
        ((sock, error),) = self.results
        self.assertIsNone(sock)
        self.assertIn("No such file", error)

    def test_anything_but_a_missing_listener_fails_at_once(self):
        with open(self.path, "w"):
            pass
        self.clock.advance(0)
        ((sock, error),) = self.results
        self.assertIsNone(sock)
        self.assertIn("not a socket", error)
