"""End to end: the real gateway, the real OpenSSH client, real PAM and users.

Driven as nxclient's nxssh drives a server: ``ssh -T -i <NoMachine key>
nx@host`` with no command, then the NX dialogue on stdin/stdout.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

from twisted.trial.unittest import SkipTest, TestCase

from tests.harness.gateway import user_and_gateway
from tests.harness.net import free_port
from tests.harness.process import stop, wait_for
from tests.harness.shared import class_fixture
from tests.harness.ssh import NXClient, askpass_env, ssh_argv
from tests.harness.users import NEED_ROOT, create_user, is_root

TRICKY_PASSWORD = "p'a \"s$(id) `x` \\q ;&|<> ü:end"


class GatewayTestCase(TestCase):
    """One gateway and one Unix user for all the tests of a class."""

    options: dict[str, dict[str, str]] = {}
    timeout = 120

    def setUp(self):
        if not is_root():
            raise SkipTest(NEED_ROOT)
        self.user, self.gateway = class_fixture(type(self), self.make_fixture)

    def make_fixture(self):
        return user_and_gateway(self.options)

    def client(self, **kwargs) -> NXClient:
        client = NXClient(self.gateway.port, **kwargs)
        self.addCleanup(client.close)
        return client

    def logged_in_client(self) -> NXClient:
        client = self.client()
        client.greet()
        self.assertIn(b"NX> 103 ", client.login(self.user.name, self.user.password))
        client.prompt()
        return client


class LoginTests(GatewayTestCase):
    def test_greeting_and_negotiation(self):
        client = self.client()
        self.assertEqual(client.prompt(), b"HELLO NXSERVER - Version 3.5.0 - GPL\nNX> 105 ")
        self.assertEqual(client.command("hello NXCLIENT - Version 3.0.0"),
                         b"hello NXCLIENT - Version 3.0.0\nNX> 134 Accepted protocol: 3.0.0\nNX> 105 ")
        self.assertEqual(client.command("SET SHELL_MODE SHELL"), b"SET SHELL_MODE SHELL\nNX> 105 ")
        self.assertEqual(client.command("SET AUTH_MODE PASSWORD"), b"SET AUTH_MODE PASSWORD\nNX> 105 ")
        self.assertIn(b"NX> 554 ", client.command("listsession"))

    def test_right_password_then_empty_session_list(self):
        client = self.client()
        client.greet()
        answer = client.login(self.user.name, self.user.password)
        self.assertEqual(answer, f"**********\nNX> 103 Welcome to: nxgate.test user: {self.user.name}\n".encode())
        client.prompt()
        listing = client.command(f'listsession --user="{self.user.name}" --status="suspended,running" '
                                 '--type="unix-gnome" --geometry="1024x768x24+render"')
        lines = listing.decode().split("\n")
        self.assertEqual(lines[1], f"NX> 127 Session list of user '{self.user.name}':")
        self.assertTrue(lines[2].startswith("Display Type"))
        self.assertTrue(lines[3].startswith("------- ----"))
        self.assertEqual(lines[4:], ["", f"NX> 148 Server capacity: not reached for user: {self.user.name}", "NX> 105 "])
        client.send("quit")
        self.assertEqual(client.out.read_to_eof(), b"quit\nNX> 999 Bye.\n")
        self.assertEqual(client.close(), 0)
        self.assertRegex(self.gateway.log(), rf"NX login: user '{self.user.name}' from 127\.0\.0\.1 \(password\)")

    def test_wrong_password(self):
        client = self.client()
        client.greet()
        self.assertIn(b"NX> 404 ERROR: wrong password or login", client.login(self.user.name, "not-the-password"))
        client.prompt()
        wait_for(lambda: "NX login failed" in self.gateway.log(), 5, "the failure in the log")
        self.assertRegex(
            self.gateway.log(),
            rf"NX login failed for user '{self.user.name}' from 127\.0\.0\.1: PAM: Authentication failure",
        )

    def test_three_failures_close_the_connection(self):
        client = self.client()
        client.greet()
        for attempt in range(3):
            answer = client.login(self.user.name, f"wrong{attempt}")
            self.assertIn(b"NX> 404", answer)
            if attempt < 2:
                client.prompt()
        self.assertEqual(client.out.read_to_eof(), b"NX> 999 Bye.\n")
        self.assertEqual(client.close(), 0)

    def test_domain_style_name_is_refused_cleanly(self):
        client = self.client()
        client.greet()
        self.assertIn(b"NX> 404", client.login("LOWESTOFT\\mjs04", "secret"))
        client.prompt()
        self.assertIn(b"NX> 103", client.login(self.user.name, self.user.password))
        wait_for(lambda: "LOWESTOFT" in self.gateway.log(), 5, "the refusal in the log")
        self.assertIn("NX login failed for user 'LOWESTOFT\\\\mjs04' from 127.0.0.1", self.gateway.log())

    def test_expired_password_is_named(self):
        """The right password, expired (chage -d 0): the client is told so,
        in the same words as the browser portal, not "wrong password"."""
        user = create_user()
        self.addCleanup(user.remove)
        subprocess.run(["chage", "-d", "0", user.name], check=True)
        client = self.client()
        client.greet()
        self.assertIn(b"NX> 404 ERROR: wrong password or login (the password has expired;",
                      client.login(user.name, user.password))

    def test_password_typed_as_user_name_is_not_logged(self):
        client = self.client()
        client.greet()
        self.assertIn(b"NX> 404", client.login("Tr0ub4dor&3 horse", "whatever"))
        wait_for(lambda: "NX login failed for user '<masked 17 chars>'" in self.gateway.log(), 10, "the masked name")
        self.assertNotIn("Tr0ub4dor", self.gateway.log())
        with open(os.path.join(self.gateway.state_dir, "audit.log"), encoding="utf-8") as audit:
            self.assertNotIn("Tr0ub4dor", audit.read())

    def test_empty_password_is_refused_without_pam(self):
        client = self.client()
        client.greet()
        self.assertIn(b"NX> 404", client.login(self.user.name, ""))

    def test_pty_requested_as_some_clients_do(self):
        client = self.client(extra=["-tt"])
        client.greet()
        self.assertIn(b"NX> 103", client.login(self.user.name, self.user.password))

    def test_oversized_line_is_answered_and_closed(self):
        client = self.client()
        client.prompt()
        client.send(b"x" * 20000)
        out = client.out.read_to_eof()
        self.assertIn(b"NX> 500 ERROR: Line too long (the limit is 16384 bytes).\nNX> 999 Bye.\n", out)

    def test_garbage_bytes_get_nx_errors(self):
        client = self.client()
        client.prompt()
        self.assertIn(b"NX> 503 Error: undefined command", client.command(b"\xff\xfe\x00\x01 junk"))

    def test_bad_parameters_get_597_and_the_shell_goes_on(self):
        client = self.logged_in_client()
        self.assertIn(b'NX> 597 Error: Parsing parameters: string "type=x" has invalid format\nNX> 105 ',
                      client.command("startsession type=x"))
        self.assertIn(b"NX> 148", client.command('listsession --type="unix-kde"'))


class SpecialPasswordTests(GatewayTestCase):
    def test_password_with_quotes_spaces_and_shell_syntax(self):
        self.user.set_password(TRICKY_PASSWORD)
        client = self.client()
        client.greet()
        self.assertIn(b"NX> 103", client.login(self.user.name, TRICKY_PASSWORD))

    def test_locked_and_expired_accounts_are_refused(self):
        user = create_user("Locked-pw-1")
        self.addCleanup(user.remove)
        subprocess.run(["usermod", "--lock", user.name], check=True)
        client = self.client()
        client.greet()
        self.assertIn(b"NX> 404", client.login(user.name, "Locked-pw-1"))
        subprocess.run(["usermod", "--unlock", user.name], check=True)
        subprocess.run(["chage", "--expiredate", "1", user.name], check=True)
        client.prompt()
        self.assertIn(b"NX> 404", client.login(user.name, "Locked-pw-1"))
        subprocess.run(["chage", "--expiredate", "-1", user.name], check=True)
        client.prompt()
        self.assertIn(b"NX> 103", client.login(user.name, "Locked-pw-1"))


class SSHRefusalTests(GatewayTestCase):
    def run_ssh(self, argv, timeout=30, **kwargs):
        return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, **kwargs)

    def test_random_key_is_refused(self):
        key = os.path.join(self.gateway.workdir, "random_key")
        if not os.path.exists(key):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key], check=True)
        result = self.run_ssh(ssh_argv(self.gateway.port, key=key, extra=["-T", "-o", "BatchMode=yes"]))
        self.assertEqual(result.returncode, 255)
        self.assertIn(b"Permission denied", result.stderr)

    def test_exec_is_refused(self):
        result = self.run_ssh(ssh_argv(self.gateway.port, extra=["-T"], command=["id"]))
        self.assertNotEqual(result.returncode, 0)
        self.assertNotIn(b"uid=", result.stdout)
        self.assertIn(b"exec request failed", result.stderr)
        wait_for(lambda: "refused exec b'id'" in self.gateway.log(), 5, "the refusal in the log")

    def test_subsystem_is_refused(self):
        result = self.run_ssh(ssh_argv(self.gateway.port, extra=["-T", "-s"], command=["sftp"]))
        self.assertNotEqual(result.returncode, 0)

    def test_remote_forwarding_is_refused(self):
        result = self.run_ssh(ssh_argv(self.gateway.port, extra=[
            "-N", "-o", "ExitOnForwardFailure=yes", "-R", "0:127.0.0.1:22"]))
        self.assertEqual(result.returncode, 255)
        self.assertIn(b"forwarding failed", result.stderr)

    def test_local_forwarding_is_refused(self):
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        local_port = probe.getsockname()[1]
        probe.close()
        forward = subprocess.Popen(
            ssh_argv(self.gateway.port, extra=["-N", "-L", f"{local_port}:127.0.0.1:{self.gateway.port}"]),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.addCleanup(lambda: (stop(forward), forward.stderr.close()))

        def connect():
            try:
                return socket.create_connection(("127.0.0.1", local_port), timeout=2)
            except OSError:
                return None

        conn = wait_for(connect, 15, "ssh to listen for the forward")
        conn.settimeout(10)
        # Were the channel opened, the gateway's own SSH banner would come back.
        self.assertEqual(conn.recv(100), b"")
        conn.close()
        wait_for(lambda: "refused b'direct-tcpip' channel" in self.gateway.log(), 5, "the refusal in the log")

    def test_refused_jump_forwarding_is_one_info_line(self):
        target = free_port()
        result = self.run_ssh(ssh_argv(self.gateway.port, extra=["-W", f"127.0.0.1:{target}"]))
        self.assertNotEqual(result.returncode, 0)
        wanted = (f"[nxgate.gateway.doors.conch.server#info] refused b'direct-tcpip' channel to b'127.0.0.1':{target}"
                  " for 'nx' from 127.0.0.1")
        wait_for(lambda: wanted in self.gateway.log(), 10, "the refusal in the log")
        log = self.gateway.log()
        self.assertEqual(len([line for line in log.splitlines() if f":{target}" in line]), 1)
        self.assertNotIn("channel open failed", log)
        self.assertNotIn("#critical]", log)
        self.assertNotIn("Traceback", log)

    def test_agent_forwarding_refusal_is_logged(self):
        agent_socket = os.path.join(self.gateway.workdir, "agent.sock")
        agent = subprocess.Popen(["ssh-agent", "-D", "-a", agent_socket], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.addCleanup(stop, agent)
        wait_for(lambda: os.path.exists(agent_socket), 10, "ssh-agent")
        client = self.client(extra=["-A"], env=dict(os.environ, SSH_AUTH_SOCK=agent_socket))
        client.greet()
        wait_for(lambda: "refused b'agent forwarding' for 'nx' from 127.0.0.1" in self.gateway.log(), 10,
                 "the refusal in the log")

    def test_keepalives_are_answered_without_log_lines(self):
        client = self.client(extra=["-o", "ServerAliveInterval=1"])
        client.greet()
        time.sleep(3.5)  # three probes from ssh
        self.assertEqual(client.command("hello NXCLIENT - Version 3.0.0").count(b"NX> 134"), 1)
        self.assertNotIn("keepalive", self.gateway.log())

    def test_agent_and_x11_forwarding_do_not_break_the_shell(self):
        client = self.client(extra=["-A", "-X"])
        client.greet()
        self.assertIn(b"NX> 103", client.login(self.user.name, self.user.password))


class LegacyFreeLoginTests(GatewayTestCase):
    """Users who log in to SSH as themselves get an authenticated NX shell."""

    def assert_preauthenticated(self, client: NXClient):
        client.greet()
        client.send("login")
        self.assertEqual(client.expect(b"\n", 10), b"login\n")
        self.assertEqual(client.prompt(), f"NX> 103 Welcome to: nxgate.test user: {self.user.name}\nNX> 105 ".encode())
        self.assertIn(b"NX> 148", client.command('listsession --type="unix-kde"'))

    def test_own_authorized_key(self):
        key = os.path.join(self.gateway.workdir, "user_key")
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key], check=True)
        ssh_dir = os.path.join(self.user.home, ".ssh")
        os.makedirs(ssh_dir, mode=0o700, exist_ok=True)
        with open(key + ".pub") as public, open(os.path.join(ssh_dir, "authorized_keys"), "w") as target:
            target.write(public.read())
        entry = self.user.entry
        for path in (ssh_dir, os.path.join(ssh_dir, "authorized_keys")):
            os.chown(path, entry.pw_uid, entry.pw_gid)
        self.assert_preauthenticated(self.client(user=self.user.name, key=key))
        self.assertRegex(self.gateway.log(), rf"SSH login of '{self.user.name}' from 127\.0\.0\.1 \(publickey\)")

    def test_password(self):
        client = self.client(user=self.user.name, key=None, env=askpass_env(self.user.password),
                             extra=["-o", "PreferredAuthentications=password"])
        self.assert_preauthenticated(client)

    def test_keyboard_interactive(self):
        client = self.client(user=self.user.name, key=None, env=askpass_env(self.user.password),
                             extra=["-o", "PreferredAuthentications=keyboard-interactive"])
        self.assert_preauthenticated(client)
        self.assertRegex(self.gateway.log(), rf"SSH login of '{self.user.name}' from 127\.0\.0\.1 \(keyboard-interactive\)")

    def test_wrong_ssh_password_is_refused_and_logged(self):
        result = subprocess.run(
            ssh_argv(self.gateway.port, user=self.user.name, key=None,
                     extra=["-T", "-o", "PreferredAuthentications=password", "-o", "NumberOfPasswordPrompts=1"]),
            stdin=subprocess.DEVNULL, capture_output=True, timeout=30, env=askpass_env("wrong"))
        self.assertEqual(result.returncode, 255)
        wait_for(lambda: "SSH login failed" in self.gateway.log(), 5, "the failure in the log")
        self.assertRegex(self.gateway.log(),
                         rf"SSH login failed for user '{self.user.name}' from 127\.0\.0\.1 \(password\)")

    def test_nx_account_takes_no_password(self):
        result = subprocess.run(
            ssh_argv(self.gateway.port, user="nx", key=None,
                     extra=["-T", "-o", "PreferredAuthentications=password", "-o", "NumberOfPasswordPrompts=1"]),
            stdin=subprocess.DEVNULL, capture_output=True, timeout=30, env=askpass_env("anything"))
        self.assertEqual(result.returncode, 255)


class TimeoutTests(GatewayTestCase):
    options = {"auth": {"login_timeout": "2"}, "shell": {"idle_timeout": "1"}}

    def test_login_timeout(self):
        client = self.client()
        client.prompt()
        started = time.monotonic()
        try:
            while time.monotonic() - started < 10:  # keep the idle timer happy, never log in
                time.sleep(0.5)
                client.send("SET SHELL_MODE SHELL")
        except BrokenPipeError:
            pass
        out = client.out.read_to_eof()
        self.assertIn(b"NX> 500 ERROR: Login timeout: not logged in within 2 seconds.\nNX> 999 Bye.\n", out)

    def test_idle_timeout(self):
        client = self.logged_in_client()
        out = client.out.read_to_eof()
        self.assertEqual(out, b"\nNX> 500 ERROR: Idle timeout: no command for 1 seconds.\nNX> 999 Bye.\n")


class ParallelLoginTests(GatewayTestCase):
    # Logins in progress count against their address and account (issue 22):
    # fifty at once from one address and one account need limits above fifty;
    # and fifty unauthenticated connections from one address, as from behind
    # an office NAT, need it exempt from the per-address cap (issue 26).
    options = {"auth": {"throttle_per_address": "100", "throttle_per_account": "100"},
               "server": {"preauth_exempt": "127.0.0.1"}}

    def test_fifty_parallel_logins(self):
        def one_login(_):
            client = NXClient(self.gateway.port)
            try:
                client.greet()
                answer = client.login(self.user.name, self.user.password)
                client.prompt()
                listing = client.command('listsession --type="unix-kde"', timeout=60)
                return b"NX> 103" in answer and b"NX> 148" in listing
            except AssertionError:
                return False
            finally:
                client.close()

        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=50) as pool:
            results = list(pool.map(one_login, range(50)))
        elapsed = time.monotonic() - started
        self.assertEqual(results.count(True), 50, f"{results.count(False)} of 50 logins failed")
        print(f"\n    50 parallel logins served in {elapsed:.2f} s")
