"""One gateway per state directory; busy sockets and ports (nxgate.instance)."""

from __future__ import annotations

import os
import socket
import tempfile

from twisted.trial.unittest import SynchronousTestCase

from nxgate import instance
from nxgate.instance import StartupError


class LockTests(SynchronousTestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="nxgate-lock-")

    def test_second_lock_is_refused_naming_the_holder(self):
        fd = instance.lock_state_dir(self.dir)
        self.addCleanup(os.close, fd)
        error = self.assertRaises(StartupError, instance.lock_state_dir, self.dir)
        self.assertIn(f"pid {os.getpid()}", str(error))
        self.assertIn(self.dir, str(error))
        self.assertIn("--state-dir", str(error))

    def test_lock_is_free_again_when_its_holder_closes(self):
        os.close(instance.lock_state_dir(self.dir))
        os.close(instance.lock_state_dir(self.dir))


class UnixSocketTests(SynchronousTestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="nxgate-sock-")
        self.path = os.path.join(self.dir, "s.sock")

    def bound(self, listen: bool) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(self.path)
        if listen:
            sock.listen(1)
        self.addCleanup(sock.close)
        return sock

    def test_live_socket_is_left_alone(self):
        self.bound(listen=True)
        error = self.assertRaises(StartupError, instance.claim_unix_socket, self.path, "[server] shell_socket")
        self.assertIn("in use", str(error))
        self.assertIn("[server] shell_socket", str(error))
        self.assertTrue(os.path.exists(self.path))

    def test_stale_socket_is_removed(self):
        self.bound(listen=False)  # nobody accepts: what a dead gateway leaves
        instance.claim_unix_socket(self.path, "x")
        self.assertFalse(os.path.exists(self.path))
        instance.claim_unix_socket(self.path, "x")  # and nothing there is fine

    def test_other_files_are_never_deleted(self):
        with open(self.path, "w") as handle:
            handle.write("precious")
        self.assertRaises(StartupError, instance.claim_unix_socket, self.path, "x")
        self.assertTrue(os.path.exists(self.path))


class PortTests(SynchronousTestCase):
    def test_tcp_address(self):
        v4, v6 = socket.AF_INET, socket.AF_INET6
        self.assertEqual(instance.tcp_address("tcp:4022"), (v4, "0.0.0.0", 4022))
        self.assertEqual(instance.tcp_address("tcp:4022:interface=127.0.0.1"), (v4, "127.0.0.1", 4022))
        self.assertEqual(instance.tcp_address("TCP:port=22:backlog=5"), (v4, "0.0.0.0", 22))
        self.assertEqual(instance.tcp_address("tcp:4022:50:10.0.0.1"), (v4, "10.0.0.1", 4022))
        self.assertEqual(instance.tcp_address("tcp6:4022:interface=\\:\\:1"), (v6, "::1", 4022))
        for other in ("tcp:0", "tcp:0:interface=127.0.0.1", "unix:/x.sock", "systemd:domain=INET:index=0", "tcp:x"):
            self.assertIsNone(instance.tcp_address(other))

    def test_busy_port_is_named_with_the_way_out(self):
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        self.addCleanup(listener.close)
        port = listener.getsockname()[1]
        error = self.assertRaises(StartupError, instance.check_port_free, f"tcp:{port}:interface=127.0.0.1",
                                  "[server] listen, or --port")
        self.assertIn(f"port {port}", str(error))
        self.assertIn("--port", str(error))
        listener.close()
        instance.check_port_free(f"tcp:{port}:interface=127.0.0.1", "x")
