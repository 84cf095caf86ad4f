"""End to end: ``nxgate-client`` against the real gateway.

The client runs as a separate process (``python -m nxgate.clients.nx``), the
way users and other tests run it; the gateway is the real ``twistd nxgate``
with real Unix users and PAM.  The session tests draw on an Xvfb standing
in for the user's screen and check its pixels.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

from twisted.conch.ssh.keys import Key
from twisted.trial.unittest import SkipTest, TestCase

from tests.harness.gateway import REPO, Gateway, user_and_gateway
from tests.harness.process import stop, wait_for
from tests.harness.shared import class_fixture
from tests.harness.users import NEED_ROOT, is_root

RED = (255, 0, 0)
BLACK = (0, 0, 0)
TYPES = {"unix-console": "xterm -bg #ff0000 -fg #ffff00 -geometry 60x15+10+10"}
ROW = re.compile(r"^([0-9A-F]{32}) (\d+) ([\w-]+) (\w+) (.*)$")
# A valid key that no gateway has (Twisted's test key, public).
STRANGER_KEY = ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl")


def agent_processes(user: str) -> list[int]:
    result = subprocess.run(["pgrep", "-u", user, "-x", "nxagent"], capture_output=True, text=True)
    return [int(pid) for pid in result.stdout.split()]


class ClientTestCase(TestCase):
    """A gateway and a Unix user shared by a class's tests; the client is run
    with its own TMPDIR so that its leftovers can be checked."""

    timeout = 240
    options: dict[str, dict[str, str]] = {}

    def setUp(self):
        if not is_root():
            raise SkipTest(NEED_ROOT)
        self.user, self.gateway = class_fixture(type(self), self.make_fixture)[:2]
        self.tmp = tempfile.mkdtemp(prefix="nxgate-client-test-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.known_hosts = os.path.join(self.tmp, "known_hosts")

    def make_fixture(self):
        return user_and_gateway(self.options)

    # -------------------------------------------------------------- helpers
    def env(self, password: str | None = None, **extra: str) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items() if key != "NXGATE_PASSWORD"}
        env.update(PYTHONPATH=REPO, TMPDIR=self.tmp, NXGATE_PASSWORD=self.user.password if password is None
                   else password, **extra)
        return env

    def background(self, argv: list[str], **env: str) -> subprocess.Popen[str]:
        """The client ``argv`` running in the background, stopped at cleanup."""
        process = subprocess.Popen(argv, env=self.env(**env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)

        def cleanup():
            stop(process)
            process.stdout.close()
            process.stderr.close()

        self.addCleanup(cleanup)
        return process

    def finished(self, process: subprocess.Popen[str], timeout: float = 30) -> tuple[int, str]:
        process.wait(timeout)
        return process.returncode, process.stderr.read()

    def argv(self, *args: str, port: int | None = None, host_keys: bool = False) -> list[str]:
        checks = ["--known-hosts", self.known_hosts] if host_keys else ["--accept-any-host-key"]
        return [sys.executable, "-m", "nxgate.clients.nx", *checks, *args,
                f"{self.user.name}@127.0.0.1:{port or self.gateway.port}"]

    def client(self, *args: str, password: str | None = None, port: int | None = None, host_keys: bool = False,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(*args, port=port, host_keys=host_keys), env=env or self.env(password),
                              capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)

    def sessions(self) -> dict[str, tuple[str, str, str, str]]:
        """Session id -> (display, type, status, name), from ``--list``."""
        result = self.client("--list")
        self.assertEqual(result.returncode, 0, result.stderr)
        rows = {}
        for line in result.stdout.splitlines():
            match = ROW.match(line)
            self.assertIsNotNone(match, f"bad --list line {line!r}")
            rows[match.group(1)] = match.group(2, 3, 4, 5)
        return rows

    def assert_no_leftovers(self):
        self.assertEqual([name for name in os.listdir(self.tmp) if name.startswith("nxgate-client-")], [])


class ClientScreenTestCase(ClientTestCase):
    """A ClientTestCase with one 800x600 client screen (Xvfb) shared by the
    class's tests, for clients that draw (``self.screen``)."""

    def setUp(self):
        super().setUp()
        self.screen = class_fixture(type(self), self.make_fixture)[2]

    def make_fixture(self):
        from tests.harness.x11 import ClientScreen

        (user, gateway), teardown = super().make_fixture()
        try:
            screen = ClientScreen(800, 600)
        except BaseException:
            teardown()
            raise

        def teardown_all():
            screen.close()
            teardown()

        return (user, gateway, screen), teardown_all


class ListAndLoginTests(ClientTestCase):
    def test_list_without_sessions(self):
        result = self.client("--list")
        self.assertEqual((result.returncode, result.stdout, result.stderr), (0, "", ""))
        self.assertRegex(self.gateway.log(), rf"NX login: user '{self.user.name}' from 127\.0\.0\.1 \(password\)")

    def test_verbose_shows_the_dialogue_but_not_the_password(self):
        result = self.client("--list", "--verbose")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("C: hello NXCLIENT - Version 3.5.0\n", result.stderr)
        self.assertIn("S: NX> 148 Server capacity: not reached for user: " + self.user.name, result.stderr)
        self.assertIn("C: ********\n", result.stderr)
        self.assertNotIn(self.user.password, result.stderr)

    def test_a_reader_that_goes_away_does_not_stop_the_client(self):
        """``nxgate-client --verbose ... 2>&1 | head -1``: stderr's pipe closes
        after the first line; the client still finishes its work and ends."""
        process = self.background(self.argv("--list", "--verbose"))
        process.stderr.close()
        self.assertEqual(process.wait(60), 0)
        self.assertEqual(process.stdout.read(), "")

    def test_verbose_shows_the_ssh_steps_in_order(self):
        result = self.client("--list", "--verbose")
        self.assertEqual(result.returncode, 0, result.stderr)
        steps = [line for line in result.stderr.splitlines() if line.startswith("nxgate-client: ")]
        self.assertRegex(steps[0], rf"^nxgate-client: connected to 127\.0\.0\.1:{self.gateway.port}$")
        # AES-GCM (its own tag, no separate MAC): what both ends prefer.
        self.assertRegex(steps[1], r"^nxgate-client: SSH: keys exchanged \([\w@.-]+, aes256-gcm@openssh\.com\)$")
        self.assertEqual(steps[2], "nxgate-client: SSH: logged in as nx")
        self.assertLess(result.stderr.index(steps[2]), result.stderr.index("S: HELLO NXSERVER"))

    def test_wrong_password(self):
        result = self.client("--list", password="not-the-password")
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn("NX> 404 ERROR: wrong password or login\n", result.stderr)
        self.assertEqual(result.stdout, "")

    def test_legacy_free_login_with_password(self):
        result = self.client("--list", "--ssh-user", self.user.name, "--verbose")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn(f"S: NX> 103 Welcome to: nxgate.test user: {self.user.name}", result.stderr)
        self.assertNotIn("NX> 101", result.stderr)  # no NX login prompts: SSH said who we are
        self.assertRegex(self.gateway.log(), rf"SSH login of '{self.user.name}' from 127\.0\.0\.1")
        self.assertRegex(self.gateway.log(), rf"NX login: user '{self.user.name}' from 127\.0\.0\.1 \(ssh\)")

    def test_legacy_free_login_with_wrong_password(self):
        result = self.client("--list", "--ssh-user", self.user.name, password="wrong")
        self.assertEqual(result.returncode, 3, result.stderr)
        self.assertIn(f"authentication as '{self.user.name}' failed", result.stderr)
        # One password attempt, not one per method the server offers again.
        self.assertEqual(self.gateway.log().count(f"SSH login failed for user '{self.user.name}'"), 1)

    def test_legacy_free_login_with_own_key_asks_no_password(self):
        key = os.path.join(self.tmp, "id_rsa")
        subprocess.run(["ssh-keygen", "-q", "-t", "rsa", "-b", "3072", "-N", "", "-f", key], check=True)
        ssh_dir = os.path.join(self.user.home, ".ssh")
        os.makedirs(ssh_dir, mode=0o700, exist_ok=True)
        shutil.copy(key + ".pub", os.path.join(ssh_dir, "authorized_keys"))
        for path in (ssh_dir, os.path.join(ssh_dir, "authorized_keys")):
            os.chown(path, self.user.entry.pw_uid, self.user.entry.pw_gid)
        self.addCleanup(shutil.rmtree, ssh_dir, True)
        env = self.env()
        del env["NXGATE_PASSWORD"]  # and no terminal: a password prompt would fail
        result = self.client("--list", "--ssh-user", self.user.name, "--identity", key, env=env)
        self.assertEqual((result.returncode, result.stderr), (0, ""))
        self.assertRegex(self.gateway.log(), rf"SSH login of '{self.user.name}' from 127\.0\.0\.1 \(publickey")

    def test_unknown_key_for_nx(self):
        key = os.path.join(self.tmp, "id_ed25519")
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key], check=True)
        result = self.client("--list", "--identity", key)
        self.assertEqual(result.returncode, 3, result.stderr)
        self.assertIn("authentication as 'nx' failed", result.stderr)

    def test_new_session_refused_by_the_server(self):
        result = self.client("--type", "unix-nosuchtype", "--geometry", "800x600", env=self.env(DISPLAY=":9"))
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertRegex(result.stderr, r"NX> 596 Error: Session type 'unix-nosuchtype' is not supported\..*\n"
                                        r"NX> 500 ERROR: Last operation failed\.\n")
        self.assert_no_leftovers()

    def test_terminate_unknown_session(self):
        result = self.client("--terminate", "0123456789ABCDEF0123456789ABCDEF")
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn("NX> 596 ", result.stderr)

    def test_usage_errors(self):
        for args in (["--type", "unix-application"], ["--resume", "not-an-id"], ["--list", "--terminate", "x"]):
            result = self.client(*args, env=self.env(DISPLAY=":9"))
            self.assertEqual(result.returncode, 2, (args, result.stderr))

    def test_nothing_listens(self):
        with socket_port() as port:
            result = self.client("--list", port=port)
        self.assertEqual(result.returncode, 3, result.stderr)
        self.assertIn("cannot connect to 127.0.0.1:", result.stderr)


class socket_port:
    """A loopback port that nothing listens on (bound, never listening)."""

    def __enter__(self) -> int:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        return self.sock.getsockname()[1]

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


class HostKeyTests(ClientTestCase):
    def entry(self, port: int) -> str:
        return f"[127.0.0.1]:{port}"

    def test_first_use_records_the_key_then_it_is_known(self):
        result = self.client("--list", host_keys=True)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn(f"added the host key of {self.entry(self.gateway.port)}", result.stderr)
        with open(self.known_hosts) as handle:
            lines = handle.read().splitlines()
        self.assertEqual(len(lines), 1)
        self.assertTrue(lines[0].startswith(self.entry(self.gateway.port) + " ssh-ed25519 "))  # preferred
        self.assertEqual(os.stat(self.known_hosts).st_mode & 0o777, 0o600)
        # The recorded key is one of the gateway's own host keys.
        directory = os.path.join(self.gateway.state_dir, "hostkeys")
        host_keys = [Key.fromFile(os.path.join(directory, name)).public() for name in os.listdir(directory)
                     if name.startswith("ssh_host_") and name.endswith("_key")]
        self.assertEqual(len(host_keys), 2)
        self.assertIn(Key.fromString(lines[0].split(None, 1)[1].encode()), host_keys)
        again = self.client("--list", host_keys=True)
        self.assertEqual((again.returncode, again.stderr), (0, ""))

    def test_changed_key_is_refused(self):
        with open(self.known_hosts, "w") as handle:
            handle.write(f"{self.entry(self.gateway.port)} {STRANGER_KEY}\n")
        logins = self.gateway.log().count("SSH login of ")
        result = self.client("--list", host_keys=True)
        self.assertEqual(result.returncode, 3, result.stderr)
        self.assertIn(f"the host key of {self.entry(self.gateway.port)} has changed", result.stderr)
        self.assertEqual(self.gateway.log().count("SSH login of "), logins)  # refused before authenticating
        with open(self.known_hosts) as handle:
            self.assertEqual(handle.read(), f"{self.entry(self.gateway.port)} {STRANGER_KEY}\n")

    def test_another_gateway_behind_a_known_name_is_refused(self):
        result = self.client("--list", host_keys=True)
        self.assertEqual(result.returncode, 0, result.stderr)
        other = Gateway().start()  # its own, different host keys
        self.addCleanup(other.stop)
        with open(self.known_hosts) as handle:
            line = handle.read().strip()
        with open(self.known_hosts, "w") as handle:  # as if the first gateway had been on the second's port
            handle.write(line.replace(self.entry(self.gateway.port), self.entry(other.port)) + "\n")
        result = self.client("--list", host_keys=True, port=other.port)
        self.assertEqual(result.returncode, 3, result.stderr)
        self.assertIn("has changed", result.stderr)
        self.assertNotIn("SSH login of ", other.log())


class SessionTests(ClientScreenTestCase):
    """Start, suspend, list, resume and terminate real sessions with the client."""

    options = {"sessions": {"display_base": "760", "display_limit": "100", "connect_timeout": "60"},
               "types": TYPES}

    def setUp(self):
        super().setUp()
        self.addCleanup(self.end_all_sessions)

    def end_all_sessions(self):
        for pid in agent_processes(self.user.name):
            with contextlib.suppress(ProcessLookupError):  # an agent that ended since it was listed
                os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not agent_processes(self.user.name), 20, "the agents to end")

    def attach(self, *args: str, geometry: bool = True) -> subprocess.Popen[str]:
        """Run the client in the background, attached to a session."""
        size = ["--geometry", "800x600"] if geometry else []
        return self.background(self.argv(*size, *args), DISPLAY=self.screen.name)

    def only_session(self) -> tuple[str, tuple[str, str, str, str]]:
        sessions = self.sessions()
        self.assertEqual(len(sessions), 1, sessions)
        return next(iter(sessions.items()))

    def test_start_suspend_resume_terminate(self):
        first = self.attach("--name", "client test")
        self.screen.wait_for_colour(RED, 20000, timeout=60)
        session_id, (display, type_, status, name) = self.only_session()
        self.assertEqual((type_, status, name), ("unix-console", "Running", "client test"))
        self.assertTrue(int(display) >= 760)
        self.check_nxproxy(first.pid)

        # SIGTERM: the client drops the connection and the server suspends the session.
        first.send_signal(signal.SIGTERM)
        code, stderr = self.finished(first)
        self.assertEqual(code, 0, stderr)
        self.assertIn(f"session {session_id} stays on the server", stderr)
        wait_for(lambda: self.sessions().get(session_id, ("",) * 3)[2] == "Suspended", 30, "the suspension")
        self.screen.wait_for_colour(BLACK, 800 * 600 - 100)
        self.assert_no_leftovers()

        second = self.attach("--resume", session_id)
        self.screen.wait_for_colour(RED, 20000, timeout=60)
        self.assertEqual(self.sessions()[session_id][2], "Running")

        # --suspend from elsewhere: the attached client is dropped, the session stays.
        result = self.client("--suspend", session_id)
        self.assertEqual((result.returncode, result.stdout), (0, f"Session {session_id} suspended.\n"),
                         result.stderr)
        code, stderr = self.finished(second)
        self.assertEqual(code, 0, stderr)
        self.assertEqual(self.sessions()[session_id][2], "Suspended")
        # The stream does not say why it ended; the client asks the server (issue 25).
        self.assertIn(f"disconnected from session {session_id}: it was suspended and stays on the server "
                      f"(--resume {session_id} attaches to it again)", stderr)
        third = self.attach("--resume", session_id)
        self.screen.wait_for_colour(RED, 20000, timeout=60)

        result = self.client("--terminate", session_id)
        self.assertEqual((result.returncode, result.stdout), (0, f"Session {session_id} terminated.\n"),
                         result.stderr)
        code, stderr = self.finished(third)
        self.assertEqual(code, 0, stderr)
        self.assertIn(f"disconnected from session {session_id}: it was terminated (it is no longer on the server)",
                      stderr)
        self.assertNotIn("closed the connection", stderr)
        self.assertEqual(self.sessions(), {})
        self.assert_no_leftovers()

    def test_taken_over_by_another_client(self):
        first = self.attach("--name", "taken over")
        self.screen.wait_for_colour(RED, 20000, timeout=60)
        session_id, _ = self.only_session()
        second = self.attach("--resume", session_id)
        code, stderr = self.finished(first, 60)
        self.assertEqual(code, 0, stderr)
        self.assertIn(f"disconnected from session {session_id}: another client took it over", stderr)
        self.screen.wait_for_colour(RED, 20000, timeout=60)
        self.assertEqual(self.sessions()[session_id][2], "Running")
        self.assertIsNone(second.poll())

    def test_a_gateway_that_goes_away_leaves_the_question_open(self):
        """The stream ends and the listing that would say why cannot be had:
        the client says who closed the connection and that it could not ask."""
        gateway = Gateway({**self.options, "sessions": {**self.options["sessions"], "display_base": "860"}}).start()
        self.addCleanup(gateway.stop)
        client = self.background(self.argv("--geometry", "800x600", port=gateway.port), DISPLAY=self.screen.name)
        self.screen.wait_for_colour(RED, 20000, timeout=60)
        gateway.stop(cleanup=False)  # its sessions outlive it (end_all_sessions ends them)
        code, stderr = self.finished(client, 60)
        self.assertEqual(code, 0, stderr)
        self.assertRegex(stderr, r"disconnected from session [0-9A-F]{32}: (nxproxy|the server) closed the "
                                 r"connection \(asking the server what became of the session failed: cannot connect "
                                 rf"to 127\.0\.0\.1:{gateway.port}.*; --list shows it\)")

    def check_nxproxy(self, client_pid: int) -> None:
        """nxproxy runs with a private NX_HOME, without the password in its
        environment, and without the session cookie in its argv."""
        pids = subprocess.run(["pgrep", "-P", str(client_pid), "-x", "nxproxy"], capture_output=True,
                              text=True).stdout.split()
        self.assertEqual(len(pids), 1, pids)
        with open(f"/proc/{pids[0]}/cmdline", "rb") as handle:
            argv = handle.read().split(b"\0")
        self.assertRegex(argv[2].decode(), r"^nx/nx,options=.*/options:\d+$")
        self.assertNotIn(b"cookie", b" ".join(argv))
        with open(f"/proc/{pids[0]}/environ", "rb") as handle:
            environ = dict(entry.split(b"=", 1) for entry in handle.read().split(b"\0") if b"=" in entry)
        self.assertNotIn(b"NXGATE_PASSWORD", environ)
        home = environ[b"NX_HOME"].decode()
        self.assertEqual(os.path.dirname(home), self.tmp)
        self.assertEqual(os.stat(home).st_mode & 0o777, 0o700)
        self.assertEqual(environ[b"DISPLAY"].decode(), self.screen.name)

    def test_the_window_has_the_requested_size(self):
        """On a desktop with a window manager, --geometry is the size of the
        session's window and of its screen, --fullscreen the whole screen."""
        from tests.harness.x11 import ClientScreen, session_screen_size

        screen = ClientScreen(1280, 800, window_manager=True)
        self.addCleanup(screen.close)
        for args, expected in ((("--geometry", "1024x768"), (1024, 768)), (("--fullscreen",), (1280, 800))):
            process = subprocess.Popen(self.argv(*args), env=self.env(DISPLAY=screen.name), stdin=subprocess.DEVNULL,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.addCleanup(stop, process)
            screen.wait_for_colour(RED, 20000, timeout=60)
            session_id, (display, _, _, _) = self.only_session()
            (agent,) = agent_processes(self.user.name)

            def sizes(display=int(display), agent=agent):
                window = screen.agent_window()
                return (window and window[:2]), session_screen_size(display, agent)

            wait_for(lambda: sizes() == (expected, expected), 20, f"window and screen of {expected} with {args}",
                     interval=0.2)
            print(f"\n    nxgate-client {' '.join(args)} on a 1280x800 client: {expected[0]}x{expected[1]}")
            stop(process)
            self.end_all_sessions()

    def test_rootless_application_session_at_the_screen_size(self):
        process = self.attach("--type", "unix-application", "--rootless", "--verbose",
                              "--application", "xterm -bg #ff0000 -geometry 40x10+0+0 -e sh -c 'sleep 600'",
                              geometry=False)
        self.screen.wait_for_colour(RED, 5000, timeout=60)
        session_id, (_, type_, status, _) = self.only_session()
        self.assertEqual((type_, status), ("unix-application", "Running"))
        process.send_signal(signal.SIGINT)
        code, stderr = self.finished(process)
        self.assertEqual(code, 0, stderr)
        # The size of the client's screen, found with xdpyinfo; the application %XX-escaped.
        self.assertIn('--geometry="800x600" --screeninfo="800x600x24+render"', stderr)
        self.assertIn('--application="xterm%20-bg%20#ff0000%20-geometry%2040x10+0+0%20-e%20sh%20-c%20%27sleep'
                      '%20600%27" --rootless="1"', stderr)
        self.assertIn(f"SIGINT: disconnecting; session {session_id} stays on the server", stderr)

    def test_nxproxy_that_never_connects(self):
        result = subprocess.run(self.argv("--geometry", "800x600", "--nxproxy", "false"),
                                env=self.env(DISPLAY=self.screen.name), capture_output=True, text=True, timeout=120)
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn("nxproxy exited with status 1 before it connected", result.stderr)
        self.assert_no_leftovers()

    def test_missing_nxproxy_is_a_usage_error(self):
        result = subprocess.run(self.argv("--nxproxy", "/nonexistent/nxproxy"), env=self.env(DISPLAY=self.screen.name),
                                capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertEqual(self.sessions(), {})  # nothing was started
