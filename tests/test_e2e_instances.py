"""End to end: a second gateway on the same state directory, and a busy port.

Started by mistake (a second ``twistd nxgate``, a port someone else holds),
the gateway must say so in one line and leave the running one untouched.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile

from twisted.trial.unittest import SkipTest, TestCase

from tests.harness.gateway import Gateway
from tests.harness.process import wait_for
from tests.harness.users import NEED_ROOT, is_root


def answers(path: str) -> dict | None:
    """The admin socket's status, or None while nobody listens there."""
    try:
        return admin_status(path)
    except (FileNotFoundError, ConnectionRefusedError):
        return None


def admin_status(path: str) -> dict:
    """Ask a gateway's admin socket for its status, as nxgate-admin does."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(10)
        conn.connect(path)
        conn.sendall(b'{"command": "status"}\n')
        answer = b""
        while not answer.endswith(b"\n"):
            chunk = conn.recv(4096)
            if not chunk:
                break
            answer += chunk
    return json.loads(answer)


class StartupRefusalTests(TestCase):
    timeout = 120

    def setUp(self):
        if not is_root():
            raise SkipTest(NEED_ROOT)

    def assert_one_clear_line(self, status: int, stderr: str, *words: str) -> None:
        self.assertNotEqual(status, 0)
        self.assertNotIn("Traceback", stderr)
        lines = stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, stderr)
        for word in words:
            self.assertIn(word, lines[0])

    def test_second_gateway_on_the_same_state_dir_is_refused_and_harmless(self):
        sockets = tempfile.mkdtemp(prefix="nxgate-sockets-")
        self.addCleanup(shutil.rmtree, sockets, True)
        options = {"server": {"shell_socket": os.path.join(sockets, "shell.sock")}}
        first = Gateway(options).start()
        self.addCleanup(first.stop)
        second = Gateway(options, state_dir=first.state_dir)
        self.addCleanup(second.stop)
        status, stderr = second.start_refused()
        self.assert_one_clear_line(status, stderr, "already running", first.state_dir,
                                   f"pid {first.process.pid}", "--state-dir")
        self.assertNotIn("Traceback", second.log())
        # The running gateway keeps its sockets, and they still answer (the first's may come a moment
        # after its SSH port).
        admin_socket = os.path.join(first.state_dir, "admin.sock")
        self.assertTrue(wait_for(lambda: answers(admin_socket), 15, "the first gateway's admin socket")["ok"])
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(os.path.join(sockets, "shell.sock"))

    def test_shell_socket_of_another_gateway_is_left_alone(self):
        sockets = tempfile.mkdtemp(prefix="nxgate-sockets-")
        self.addCleanup(shutil.rmtree, sockets, True)
        options = {"server": {"shell_socket": os.path.join(sockets, "shell.sock")}}
        first = Gateway(options).start()
        self.addCleanup(first.stop)
        second = Gateway(options)  # its own state directory, the same shell socket
        self.addCleanup(second.stop)
        status, stderr = second.start_refused()
        self.assert_one_clear_line(status, stderr, os.path.join(sockets, "shell.sock"), "in use",
                                   "[server] shell_socket")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(os.path.join(sockets, "shell.sock"))

    def test_busy_port_is_named_in_one_line(self):
        holder = socket.socket()
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        self.addCleanup(holder.close)
        port = holder.getsockname()[1]
        gateway = Gateway({"server": {"listen": f"tcp:{port}:interface=127.0.0.1"}})
        self.addCleanup(gateway.stop)
        status, stderr = gateway.start_refused()
        self.assert_one_clear_line(status, stderr, f"port {port}", "already in use", "--port", "[server] listen")
        self.assertNotIn("Traceback", gateway.log())

    def test_stale_sockets_of_a_dead_gateway_are_replaced(self):
        first = Gateway()
        first.start()
        admin_socket = os.path.join(first.state_dir, "admin.sock")
        # The SSH port may listen a moment before the admin socket exists.
        wait_for(lambda: os.path.exists(admin_socket), 15, "the first gateway's admin socket")
        first.process.kill()  # SIGKILL: no chance to remove its sockets
        first.process.wait()
        first.process.stderr.close()
        first.process = None
        self.assertTrue(os.path.exists(admin_socket))
        second = Gateway(state_dir=first.state_dir).start()
        self.addCleanup(first.stop)
        self.addCleanup(second.stop)
        # The SSH port may listen a moment before the stale admin socket is replaced.
        self.assertTrue(wait_for(lambda: answers(admin_socket), 15, "the second gateway's admin socket")["ok"])
