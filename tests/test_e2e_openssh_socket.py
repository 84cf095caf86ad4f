"""End to end: the OpenSSH mode's shell socket, spoken to directly by local users.

The socket is open to every local user (0666) by design, so whatever a
local process writes there is hostile input: who it is comes from the
kernel (SO_PEERCRED), the client address in its hello is only a claim.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile

from twisted.trial.unittest import SkipTest, TestCase

from tests.harness.gateway import Gateway
from tests.harness.process import wait_for
from tests.harness.shared import class_fixture
from tests.harness.users import NEED_ROOT, create_user, is_root

# Run as a local user: connect, send the frames given as JSON on stdin
# ([[kind, text], ...]), print the frames the gateway sends back (as JSON)
# until it closes or ``until`` appears.  Stands alone: the user cannot read
# the test tree.
SPEAKER = r"""
import json, socket, struct, sys, time
path, until = sys.argv[1], sys.argv[2].encode()
conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
conn.connect(path)
for kind, text in json.load(sys.stdin):
    payload = text.encode()
    try:
        conn.sendall(kind.encode() + struct.pack(">I", len(payload)) + payload)
    except OSError:  # the gateway hung up early: read what it said
        break
conn.settimeout(20)
data, frames = b"", []
while True:
    try:
        chunk = conn.recv(65536)
    except (socket.timeout, ConnectionResetError):  # reset: it hung up on frames it never read (after its answer)
        break
    if not chunk:
        break
    data += chunk
    while len(data) >= 5 and len(data) >= 5 + struct.unpack(">I", data[1:5])[0]:
        length = struct.unpack(">I", data[1:5])[0]
        frames.append([data[:1].decode(), data[5:5 + length].decode("utf-8", "replace")])
        data = data[5 + length:]
    if until and until in b"".join(f[1].encode() for f in frames):
        break
print(json.dumps(frames))
"""

GREETING = [["D", "hello NXCLIENT - Version 3.0.0\n"], ["D", "SET SHELL_MODE SHELL\n"],
            ["D", "SET AUTH_MODE PASSWORD\n"], ["D", "login\n"]]


class ShellSocketTests(TestCase):
    timeout = 120

    def setUp(self):
        if not is_root():
            raise SkipTest(NEED_ROOT)
        self.nx, self.user, self.gateway, self.socket = class_fixture(type(self), self.make_fixture)

    def make_fixture(self):
        directory = tempfile.mkdtemp(prefix="nxgate-shellsock-")
        os.chmod(directory, 0o755)
        socket_path = os.path.join(directory, "shell.sock")
        nx, user = create_user(prefix="nxs"), create_user()
        gateway = Gateway({"server": {"shell_socket": socket_path}, "ssh": {"nx_user": nx.name}}).start()

        def teardown():
            gateway.stop()
            nx.remove()
            user.remove()
            shutil.rmtree(directory, ignore_errors=True)

        return (nx, user, gateway, socket_path), teardown

    def speak(self, account: str, frames: list[list[str]], until: str = "") -> list[list[str]]:
        """What the gateway answers a local process of ``account`` sending ``frames``."""
        entry = pwd.getpwnam(account)
        result = subprocess.run([sys.executable, "-c", SPEAKER, self.socket, until],
                                input=json.dumps(frames).encode(), capture_output=True, timeout=60,
                                user=entry.pw_uid, group=entry.pw_gid, extra_groups=[], cwd="/")
        self.assertEqual(result.returncode, 0, result.stderr)
        return json.loads(result.stdout)

    def audit(self) -> list[dict]:
        with open(os.path.join(self.gateway.state_dir, "audit.log"), encoding="utf-8") as handle:
            return [json.loads(line) for line in handle]

    def assert_refused_hello(self, hello: str) -> None:
        frames = self.speak(self.nx.name, [["H", hello], *GREETING])
        self.assertEqual(frames, [["D", "NX> 500 ERROR: Malformed greeting from nxgate-shell.\nNX> 999 Bye.\n"],
                                  ["X", "1"]])

    def test_claimed_address_is_marked_and_identity_comes_from_the_kernel(self):
        uid = pwd.getpwnam(self.user.name).pw_uid
        frames = self.speak(self.user.name, [["H", '{"remote": "203.0.113.9"}'], *GREETING], until="NX> 103")
        self.assertIn(f"NX> 103 Welcome to: nxgate.test user: {self.user.name}", "".join(f[1] for f in frames))
        marked = f"203.0.113.9 (claimed by uid {uid})"
        wait_for(lambda: f"NX login: user '{self.user.name}' from {marked}" in self.gateway.log(), 10,
                 "the login in the log")
        self.assertIn(f"NX conversation through sshd for uid {uid} ({self.user.name}), client address 203.0.113.9",
                      self.gateway.log())
        logins = [record for record in self.audit() if record["event"] == "login" and record["user"] == self.user.name]
        self.assertEqual([record["address"] for record in logins], [marked])

    def test_newline_in_the_address_cannot_forge_a_log_line(self):
        forged = "[nxgate.gateway.doors.conversation#info] NX login: user 'root' from 192.0.2.66 (forged)"
        self.assert_refused_hello(json.dumps({"remote": f"203.0.113.9\n2026-12-03T10:00:00+0000 {forged}"}))
        wait_for(lambda: "refused a malformed hello" in self.gateway.log(), 10, "the refusal in the log")
        self.assertIn('"remote" in the hello is not an IP address', self.gateway.log())
        self.assertNotIn("forged", self.gateway.log())
        self.assertNotIn("forged", open(os.path.join(self.gateway.state_dir, "audit.log")).read())

    def test_malformed_hellos_get_a_clear_error_not_a_traceback(self):
        for hello in ("[]", '["remote", "203.0.113.9"]', "42", '{"remote": 7}', '{"remote": ["::1"]}', "{nope"):
            with self.subTest(hello=hello):
                self.assert_refused_hello(hello)
        log = self.gateway.log()
        self.assertGreaterEqual(log.count("refused a malformed hello on the shell socket from uid"), 6)
        self.assertIn("hello is not a JSON object", log)
        self.assertNotIn("Traceback", log)
        self.assertNotIn("Unhandled", log)

    def test_frames_before_hello_are_refused(self):
        self.assertEqual(self.speak(self.user.name, [["D", "login\n"]]), [])
        wait_for(lambda: "no hello first" in self.gateway.log(), 10, "the refusal in the log")
