"""End to end: the fourth attack round, played against the real gateway.

What the third round's fixers noticed and left, and the surfaces added since:

* **One user's logins fill the gateway.**  After its login a connection no
  longer counts at the door, so one user with a password opened SSH login
  after SSH login (paramiko, as python-x2go; tests/harness/login_flood.py)
  or, as a local user, connection after connection to the OpenSSH mode's
  shell socket, until the doors' file reserve refused everyone: another
  user's right password got no answer.  Now each user holds at most
  ``[server] max_connections_per_user`` (32) connections over every door,
  and the rest are refused with the reason.
* **NX logins inside the nx account's connections** count the same way.
* **Reverse streams without a cap**: a session's own programs connecting to
  its printers' listener again and again, each connection carried to
  nxgate-client on an SSH channel of its own and held, each a descriptor
  of the gateway's.  Now one client connection carries at most 32 and every
  stream asks the users' reserve.
* **An account look-up that cannot tell** (the gateway out of files after an
  NX login): an internal error and a traceback before; now the NX client
  hears the same "try again" as a login that could not be checked.
* **The file limit in ``nxgate-admin status``** was the one read at start.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import resource
import subprocess
import sys
import tempfile
import shutil

from twisted.trial.unittest import SkipTest, TestCase

from tests.harness.cluster import admin_cli
from tests.harness.gateway import REPO, Gateway, users_and_gateway
from tests.harness.process import release, wait_for
from tests.harness.shared import class_fixture
from tests.harness.ssh import NXClient, askpass_env, ssh_argv
from tests.harness.users import NEED_ROOT, TestUser, create_user, is_root
from tests.harness.cups import client_printing
from tests.test_e2e_client import RED, ClientScreenTestCase
from tests.test_e2e_client import TYPES as CLIENT_TYPES
from tests.test_e2e_printing import QUEUE, _only_session, _program_env
from tests.test_e2e_sound import as_user

FILE_LIMIT = 256
#: The doors stop at FILE_LIMIT - FD_RESERVE open files, users' work at FILE_LIMIT - 2 x FD_RESERVE.
FD_RESERVE = 32
FLOOD = os.path.join(REPO, "tests", "harness", "login_flood.py")
SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's, with python3-paramiko (the venv has no paramiko)
#: A local user's connections to the shell socket, held: how many connected, and what the gateway said on them.
HOLDER = r"""
import json, select, socket, sys, time
path, count = sys.argv[1], int(sys.argv[2])
held, failed = [], 0
for _ in range(count):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)  # blocking: waits while the listener's backlog is full
    except OSError:
        failed += 1
        s.close()
        continue
    held.append(s)
# The gateway looks each account up (NSS, then PAM's account stack): what it says comes within seconds.
open_, refused, closed, other, said = set(held), 0, 0, 0, set()
deadline = time.monotonic() + 20
while open_ and time.monotonic() < deadline:
    ready, _, _ = select.select(list(open_), [], [], 1.0)
    for s in ready:
        try:
            data = s.recv(65536)
        except OSError:
            data = b""
        open_.discard(s)
        if b"connections to this server open already" in data:
            refused += 1
            said.add(data.decode(errors="replace")[:300])
        elif data:
            other += 1
            said.add(data.decode(errors="replace")[:300])
        else:
            closed += 1  # closed unheard: the door's own guard (max_startups) while look-ups were pending
print(json.dumps({"connected": len(held), "failed": failed, "open": len(open_), "refused": refused,
                  "closed": closed, "other": other, "said": sorted(said)}), flush=True)
sys.stdin.read()
"""


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _fixture():
    if not is_root():
        raise SkipTest(NEED_ROOT)
    directory = tempfile.mkdtemp(prefix="nxgate-round4-")
    os.chmod(directory, 0o755)
    socket_path = os.path.join(directory, "shell.sock")
    users, gateway, stop_both = users_and_gateway(
        3, {"server": {"shell_socket": socket_path, "fd_reserve": str(FD_RESERVE), "max_startups_per_address": "100"},
            "auth": {"throttle_per_address": "1000", "throttle_per_account": "1000"}}, file_limit=FILE_LIMIT)

    def teardown() -> None:
        stop_both()
        shutil.rmtree(directory, ignore_errors=True)

    return (users, gateway, socket_path), teardown


class Round4Case(TestCase):
    timeout = 600

    def setUp(self) -> None:
        (self.attacker, self.victim, self.third), self.gateway, self.socket = class_fixture(Round4Case, _fixture)
        self.log_start = len(self.gateway.log())

    def new_log(self) -> str:
        return self.gateway.log()[self.log_start:]

    def hold(self, argv: list[str], **options) -> tuple[dict, subprocess.Popen]:
        """Run an attacker that prints one JSON line and holds what it took until its stdin closes."""
        process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, **options)
        self.addCleanup(release, process)
        line = process.stdout.readline()
        if not line:
            raise AssertionError(f"the attacker ended: {process.stderr.read()[-3000:]}")
        return json.loads(line), process

    def nx_login(self, user: TestUser) -> bytes:
        client = NXClient(self.gateway.port)
        try:
            client.greet()
            return client.login(user.name, user.password)
        except Exception as error:  # the door closed the connection: that is the answer
            return f"no NX login: {error}".encode()
        finally:
            client.close()


class UserConnectionCapTests(Round4Case):
    def test_one_users_ssh_logins_are_capped_and_another_user_still_logs_in(self):
        """250 logins with one user's right password (paramiko, as python-x2go logs in), all kept."""
        got, _ = self.hold([SYSTEM_PYTHON, FLOOD, str(self.gateway.port), self.attacker.name, "250"],
                           env=dict(os.environ, NXGATE_TEST_PASSWORD=self.attacker.password))
        files = open_files(self.gateway.process.pid)
        answer = self.nx_login(self.victim)
        print(f"\n    250 SSH logins of one user: {got['held']} kept, {got['refused']} refused ({got['errors'][:3]},"
              f" {got['banners']}); the gateway holds"
              f" {files} of {FILE_LIMIT} files; another user's NX login: {answer.strip().splitlines()[-1:]}")
        self.assertIn(b"NX> 103 ", answer)
        self.assertEqual(got["held"], 32)  # [server] max_connections_per_user
        # What OpenSSH's client prints for one more (paramiko keeps no banner of a login it failed).
        argv = [option if option != "LogLevel=ERROR" else "LogLevel=INFO"  # INFO: ssh prints banners
                for option in ssh_argv(self.gateway.port, self.attacker.name, key=None,
                                       extra=["-o", "PreferredAuthentications=password",
                                              "-o", "NumberOfPasswordPrompts=1"], command=["echo $HOME"])]
        one_more = subprocess.run(argv, env=askpass_env(self.attacker.password), stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=60)
        self.assertNotEqual(one_more.returncode, 0)
        self.assertIn(f"nxgate: user {self.attacker.name} has 32 connections to this server open already, the most"
                      " one user may have at once; close one and try again", one_more.stderr)
        self.assertLess(files, FILE_LIMIT - FD_RESERVE)
        log = self.new_log()
        self.assertRegex(log, rf"SSH login of '{self.attacker.name}' from 127\.0\.0\.1 \(password\) refused: user"
                              rf" {self.attacker.name} has 32 connections to this server open already")
        self.assertNotIn("Traceback", log)

    def test_a_local_user_holding_the_shell_socket_is_capped(self):
        """A local user (the OpenSSH mode's socket is open to every local user, who comes in as himself)
        connects 300 times and keeps every connection."""
        entry = pwd.getpwnam(self.attacker.name)
        got, _ = self.hold([sys.executable, "-c", HOLDER, self.socket, "300"], user=entry.pw_uid, group=entry.pw_gid, extra_groups=[], cwd="/")
        files = open_files(self.gateway.process.pid)
        answer = self.nx_login(self.victim)
        print(f"\n    300 shell-socket connections of one local user: {got}; the gateway holds {files} of"
              f" {FILE_LIMIT} files; another user's NX login: {answer.strip().splitlines()[-1:]}")
        self.assertIn(b"NX> 103 ", answer)
        self.assertLessEqual(got["open"], 32)
        self.assertEqual(got["connected"], 300)
        # Past the 32 it holds, each connection was refused with the reason, or closed unheard by the door's
        # guard of unauthenticated connections (300 arrive faster than their accounts are looked up).
        self.assertEqual(got["other"], 0)
        self.assertEqual(got["refused"] + got["closed"], got["connected"] - got["open"])
        self.assertGreater(got["refused"], 0)
        self.assertIn(f"NX> 503 ERROR: User {self.attacker.name} has 32 connections to this server open already,"
                      " the most one user may have at once; close one and try again.", "".join(got["said"]))
        self.assertIn(f"refused {self.attacker.name} (uid {entry.pw_uid}) on the shell socket: user"
                      f" {self.attacker.name} has 32 connections", self.new_log())


class NXLoginCapTests(TestCase):
    """NX logins inside the nx account's connections count for their users too."""

    timeout = 300

    def setUp(self) -> None:
        if not is_root():
            raise SkipTest(NEED_ROOT)
        self.user = create_user()
        self.addCleanup(self.user.remove)
        self.gateway = Gateway({"server": {"max_connections_per_user": "2"}}).start()
        self.addCleanup(self.gateway.stop)

    def test_the_third_nx_login_of_a_user_is_refused_with_the_reason_and_the_first_goes_on(self):
        clients = []
        for _ in range(3):
            client = NXClient(self.gateway.port)
            self.addCleanup(client.close)
            client.greet()
            clients.append((client, client.login(self.user.name, self.user.password)))
        (first, one), (_, two), (third, three) = clients
        self.assertIn(b"NX> 103 ", one)
        self.assertIn(b"NX> 103 ", two)
        self.assertIn(f"NX> 503 ERROR: User {self.user.name} has 2 connections to this server open already, the"
                      f" most one user may have at once; close one and try again.".encode(), three)
        self.assertNotIn(b"NX> 103 ", three)
        first.prompt()
        self.assertIn(b"NX> 127", first.command('listsession --status="suspended,running"'))  # the first goes on
        clients[1][0].close()  # one ends: its place is free again
        wait_for(lambda: self.gateway.log().count("SSH connection from 127.0.0.1") >= 3
                 and "closed" in self.gateway.log(), 20, "the end of the second connection")
        third.prompt()
        self.assertIn(b"NX> 103 ", third.login(self.user.name, self.user.password))
        self.assertRegex(self.gateway.log(), rf"NX login of {self.user.name} from 127\.0\.0\.1 refused: user"
                                             rf" {self.user.name} has 2 connections")


class AccountsUnavailableTests(Round4Case):
    def test_a_command_whose_account_cannot_be_looked_up_is_a_temporary_failure(self):
        """The user logged in to SSH as himself: his NX ``login`` looks the account up at once; with the
        gateway out of files (its limit lowered under it, as root, from outside) the look-up cannot tell.
        The next command says so with the temporary failure's words; once files are back, it works."""
        client = NXClient(self.gateway.port, user=self.victim.name, key=None,
                          extra=["-o", "PreferredAuthentications=password", "-o", "NumberOfPasswordPrompts=1"],
                          env=askpass_env(self.victim.password))
        self.addCleanup(client.close)
        client.greet()
        pid = self.gateway.process.pid
        before = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        self.addCleanup(resource.prlimit, pid, resource.RLIMIT_NOFILE, before)
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (8, before[1]))
        answer = client.command("login", timeout=60)
        answer += client.command('listsession --status="suspended,running"', timeout=60)
        resource.prlimit(pid, resource.RLIMIT_NOFILE, before)
        print(f"\n    a command while the account cannot be looked up: {answer.strip().splitlines()[-3:]}")
        self.assertIn(b"NX> 503 ERROR: The server cannot check logins right now (it is out of open files); please"
                      b" try again in a minute.", answer)
        self.assertNotIn(b"Internal error", answer)
        self.assertIn(b"NX> 127", client.command('listsession --status="suspended,running"', timeout=60))
        log = self.new_log()
        self.assertNotIn("Traceback", log)
        self.assertRegex(log, rf"listsession for {self.victim.name} from \S+ refused: the user database could not be"
                              r" read: the gateway is out of open files")


class AdminStatusTests(Round4Case):
    def test_the_status_shows_the_file_limit_of_now(self):
        pid = self.gateway.process.pid
        before = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        self.addCleanup(resource.prlimit, pid, resource.RLIMIT_NOFILE, before)
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (200, before[1]))
        shown = json.loads(admin_cli("--state-dir", self.gateway.state_dir, "--json", "status").stdout)
        print(f"\n    nxgate-admin status after prlimit 200: {shown['result']['open_files']}")
        self.assertRegex(shown["result"]["open_files"], r"^\d+ of 200 ")
        self.assertRegex(shown["result"]["user_connections"], r"at most 32 each")


#: The session's own user: COUNT connections to its printers' tunnel (a Unix socket), held; then, once the
#: gateway has said what it will (no end seen for 5 s), how many are open and how many it closed.
TUNNEL_HOLDER = r"""
import json, select, socket, sys, time
path, count = sys.argv[1], int(sys.argv[2])
held = []
for _ in range(count):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)  # blocking: waits while the listener's backlog is full
    held.append(s)
open_, closed = set(held), 0
quiet_since, deadline = time.monotonic(), time.monotonic() + 120
while open_ and time.monotonic() < deadline and time.monotonic() - quiet_since < 5:
    ready, _, _ = select.select(list(open_), [], [], 0.5)
    for s in ready:
        try:
            data = s.recv(65536)
        except OSError:
            data = b""
        if not data:
            open_.discard(s)
            closed += 1
            quiet_since = time.monotonic()
print(json.dumps({"connected": len(held), "open": len(open_), "closed": closed}), flush=True)
sys.stdin.read()
"""


class ReverseChannelCapTests(ClientScreenTestCase):
    """alice's nxgate-client takes her printers back; her own session's programs hold 300 connections to
    the printers' tunnel."""

    options = {"sessions": {"display_base": "3500", "display_limit": "20", "connect_timeout": "60"},
               "types": CLIENT_TYPES}

    def setUp(self):
        super().setUp()
        self.printer, self.cups = client_printing(self, self.gateway.workdir)

    def test_one_client_connection_carries_at_most_32_reverse_channels_and_printing_goes_on(self):
        self.background(self.argv("--geometry", "800x600", "--print", "--print-server", self.cups.server, "--verbose"),
                        DISPLAY=self.screen.name)
        self.screen.wait_for_colour(RED, 20000, timeout=60)
        env = wait_for(lambda: _program_env(self.user.name, _only_session(self.user.name)), 20, "the session program")
        env = {key: env[key] for key in ("CUPS_SERVER", "HOME")}
        wait_for(lambda: QUEUE in as_user(self.user.name, env, "lpstat", "-a").stdout, 60,
                 "the client's queue in the session", interval=0.3)
        tunnel = re.search(r"the client takes its printing back \(listening at (\S+)\)", self.gateway.log())
        self.assertIsNotNone(tunnel, "the gateway's log says where the printers' tunnel listens")
        pid = self.gateway.process.pid
        files_before = open_files(pid)
        holder = subprocess.Popen(["runuser", "-u", self.user.name, "--", sys.executable, "-c", TUNNEL_HOLDER,
                                   tunnel.group(1), "300"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        self.addCleanup(release, holder)
        line = holder.stdout.readline()
        self.assertTrue(line, holder.stderr.read() if not line else "")
        got = json.loads(line)
        files_held = open_files(pid)
        print(f"\n    300 connections of the session's user to its printers' tunnel: {got}; the gateway's open files"
              f" {files_before} before, {files_held} while they are held")
        self.assertEqual(got["connected"], 300)
        self.assertLessEqual(got["open"], 32)  # nxgate.streams.reverse_channel.MAX_PER_CONNECTION
        self.assertEqual(got["closed"], 300 - got["open"])
        self.assertIn("dropped a printing connection: its nxgate-client's connection carries 32 such connections"
                      " already", self.gateway.log())
        # Their end frees the places: alice prints through the same client connection.
        release(holder)
        text = f"printed after the flood {os.urandom(8).hex()}"
        path = os.path.join(self.user.home, "after-flood.txt")
        as_user(self.user.name, env, "sh", "-c", f"printf '%s\\n' '{text}' > {path}")
        printed = as_user(self.user.name, env, "lp", "-d", QUEUE, path)
        self.assertEqual(printed.returncode, 0, printed.stderr)
        self.assertEqual(self.printer.wait_for_text(text.encode()).strip(), text.encode())
        self.assertNotIn("Traceback", self.gateway.log())
