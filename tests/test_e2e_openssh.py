"""End to end: the OpenSSH deployment mode, with a real sshd on a loopback port.

The nx account's login shell is nxgate-shell: it carries the NX dialogue to
the gateway's local socket and, after bye, execs nxcopy for the stream.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile

from twisted.trial.unittest import SkipTest

from tests.harness.gateway import REPO, Gateway, nx_key
from tests.harness.net import free_port
from tests.harness.process import Pipe, stop, wait_for
from tests.harness.shared import class_fixture
from tests.harness.ssh import Attachment, NXClient, SessionInfo
from tests.harness.users import NEED_ROOT, create_user, is_root
from tests.harness.x11 import ClientScreen
from tests.test_e2e_sessions import RED, START, TYPES, SessionTestCase

NXGATE_SHELL = os.path.join(os.path.dirname(sys.executable), "nxgate-shell")
# nxgate-shell is the venv's (made by make install in the main checkout): it
# must run this checkout's code and nxcopy, as the gateway does.
THIS_CHECKOUT = f"PYTHONPATH={REPO} NXGATE_NXCOPY={os.path.join(REPO, 'helpers', 'nxcopy')}"
SSHD_CONFIG = """\
ListenAddress 127.0.0.1
Port {port}
HostKey {dir}/host_key
PidFile none
UsePAM yes
StrictModes no
PasswordAuthentication no
KbdInteractiveAuthentication no
AuthorizedKeysFile {dir}/keys/%u
LogLevel VERBOSE
# What a Debian machine's sshd does for everybody: a site banner before
# authentication, the message of the day and the last login after it.
Banner {dir}/banner
PrintMotd yes
PrintLastLog yes
Match User {nx}
    PubkeyAcceptedAlgorithms +ssh-dss
    Banner none
    AllowTcpForwarding no
    AllowAgentForwarding no
    X11Forwarding no
    PermitTunnel no
    SetEnv NXGATE_SOCKET={socket} {this_checkout}
Match User {user}
    ForceCommand {shell}
    SetEnv NXGATE_SOCKET={socket} {this_checkout}
"""
SITE_BANNER = "Authorized users only. Activity is monitored (site banner)."


class OpenSSHModeTests(SessionTestCase):
    """A real sshd; the gateway's own SSH server is not used here."""

    def setUp(self):
        if not is_root():
            raise SkipTest(NEED_ROOT)
        if not os.access(NXGATE_SHELL, os.X_OK):
            raise SkipTest(f"{NXGATE_SHELL} is missing: run make install")
        (self.user, self.other, self.gateway, self.screen, self.nx, self.sshd_port, self.sshd_dir,
         self.socket) = class_fixture(type(self), self.make_fixture)
        self.addCleanup(self.end_all_sessions)

    def make_fixture(self):
        directory = tempfile.mkdtemp(prefix="nxgate-sshd-")
        os.chmod(directory, 0o755)
        socket_path = os.path.join(directory, "shell.sock")
        nx, user, other = create_user(prefix="nxs"), create_user(), create_user()
        subprocess.run(["usermod", "--shell", NXGATE_SHELL, nx.name], check=True)
        # As the README says: no motd, last login or PAM messages for nx.
        nx_home = pwd.getpwnam(nx.name).pw_dir
        subprocess.run(["install", "-m", "644", "-o", nx.name, "/dev/null", os.path.join(nx_home, ".hushlogin")],
                       check=True)
        gateway = Gateway({"server": {"shell_socket": socket_path}, "ssh": {"nx_user": nx.name},
                           "sessions": {"display_base": "700", "display_limit": "100"}, "types": dict(TYPES)}).start()
        screen = ClientScreen(800, 600)
        keys = os.path.join(directory, "keys")
        os.makedirs(keys)
        os.makedirs("/run/sshd", exist_ok=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", os.path.join(directory, "host_key")],
                       check=True)
        user_key = os.path.join(directory, "user_key")
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", user_key], check=True)
        shutil.copy(os.path.join(REPO, "conf", "nx_authorized_keys"), os.path.join(keys, nx.name))
        shutil.copy(user_key + ".pub", os.path.join(keys, user.name))
        port = free_port()
        with open(os.path.join(directory, "banner"), "w") as handle:
            handle.write(SITE_BANNER + "\n")
        config = os.path.join(directory, "sshd_config")
        with open(config, "w") as handle:
            handle.write(SSHD_CONFIG.format(port=port, dir=directory, nx=nx.name, user=user.name,
                                            shell=NXGATE_SHELL, socket=socket_path, this_checkout=THIS_CHECKOUT))
        sshd = subprocess.Popen(["/usr/sbin/sshd", "-D", "-f", config, "-E", os.path.join(directory, "sshd.log")])
        wait_for(lambda: subprocess.run(["ssh-keyscan", "-p", str(port), "127.0.0.1"], capture_output=True).stdout,
                 15, "sshd to listen")

        def teardown():
            stop(sshd)
            screen.close()
            gateway.stop()
            for account in (nx, user, other):
                account.remove()
            shutil.rmtree(directory, ignore_errors=True)

        return (user, other, gateway, screen, nx, port, directory, socket_path), teardown

    def nx_client(self, user: str | None = None, **kwargs) -> NXClient:
        client = NXClient(self.sshd_port, user=user or self.nx.name, **kwargs)
        self.addCleanup(client.close)
        return client

    def login(self, user=None) -> NXClient:
        """Through sshd, like everything in this class."""
        user = user or self.user
        client = self.nx_client()
        client.greet()
        self.assertIn(b"NX> 103 ", client.login(user.name, user.password))
        client.prompt()
        return client

    def test_login_session_and_stream_through_nxcopy(self):
        client = self.nx_client()
        self.assertIn(b"HELLO NXSERVER - Version 3.5.0 - GPL", client.greet())
        self.assertIn(b"NX> 103 Welcome to: nxgate.test", client.login(self.user.name, self.user.password))
        client.prompt()
        reply = client.command(START.format(name="openssh", type="unix-console", extra=""), timeout=60)
        info = SessionInfo.parse(reply)
        attachment = Attachment(client, info, self.screen.name, self.gateway.workdir)
        self.addCleanup(attachment.detach)
        self.screen.wait_for_colour(RED, 20000)
        # The bulk stream runs through nxcopy as the nx account, with no Python in the path.
        relays = subprocess.run(["pgrep", "-u", self.nx.name, "-a", "nxcopy"], capture_output=True, text=True).stdout
        self.assertIn("--fd", relays)
        self.assertNotIn("python", subprocess.run(["pgrep", "-u", self.nx.name, "-a", "."], capture_output=True,
                                                 text=True).stdout)
        self.assertIn(f"NX conversation through sshd for uid {pwd.getpwnam(self.nx.name).pw_uid} (nx account), "
                      "client address 127.0.0.1 as nxgate-shell reports it", self.gateway.log())
        attachment.detach()
        self.wait_status(info.session_id, "Suspended")

    def test_nxgate_client_through_sshd_with_aes_gcm(self):
        """nxgate-client prefers AES-GCM (nxgate.wire.ssh_etm's framing, both
        ways), and OpenSSH's sshd has it: the client's list arrives through it."""
        env = dict(os.environ, PYTHONPATH=REPO, NXGATE_PASSWORD=self.user.password, TMPDIR=self.sshd_dir)
        result = subprocess.run([sys.executable, "-m", "nxgate.clients.nx", "--accept-any-host-key", "--list",
                                 "--verbose", "--ssh-user", self.nx.name, "--identity", nx_key(),
                                 f"{self.user.name}@127.0.0.1:{self.sshd_port}"],
                                env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertRegex(result.stderr, r"nxgate-client: SSH: keys exchanged \([\w@.-]+, aes256-gcm@openssh\.com\)")
        self.assertIn("S: HELLO NXSERVER", result.stderr)

    def test_greeting_is_the_first_thing_a_client_reads(self):
        """Strict clients expect ``HELLO NXSERVER`` first: no site banner,
        motd or last-login line on either stream, even for a client that
        asks for a terminal (the settings documented in the README)."""
        for attempt in range(2):  # the second login has a "last login" to print
            process = subprocess.Popen(
                ["ssh", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-tt",
                 "-i", nx_key(), "-o", "IdentitiesOnly=yes", "-o", "PubkeyAcceptedAlgorithms=+ssh-dss",
                 "-p", str(self.sshd_port), f"{self.nx.name}@127.0.0.1"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            out = Pipe(process.stdout)
            try:
                first = out.read_until(b"NX> 105 ", 15)
            finally:
                process.stdin.close()
                stop(process)
                errors = process.stderr.read().decode(errors="replace")
                process.stdout.close()
                process.stderr.close()
            self.assertTrue(first.startswith(b"HELLO NXSERVER - Version 3.5.0 - GPL"), (first, errors))
            self.assertNotIn(SITE_BANNER, errors)

    def test_wrong_password_through_sshd(self):
        client = self.nx_client()
        client.greet()
        self.assertIn(b"NX> 404 ERROR: wrong password or login", client.login(self.user.name, "wrong"))

    def test_commands_are_refused(self):
        result = subprocess.run(
            ["ssh", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
             "-i", nx_key(), "-o", "PubkeyAcceptedAlgorithms=+ssh-dss", "-p", str(self.sshd_port),
             f"{self.nx.name}@127.0.0.1", "id"], capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
        self.assertNotEqual(result.returncode, 0)
        self.assertNotIn(b"uid=", result.stdout)
        self.assertIn(b"only speaks NX", result.stderr)

    def test_user_logging_in_as_himself_is_already_authenticated(self):
        client = self.nx_client(user=self.user.name, key=os.path.join(self.sshd_dir, "user_key"))
        client.greet()
        client.send("login")
        self.assertIn(f"NX> 103 Welcome to: nxgate.test user: {self.user.name}".encode(), client.prompt())

    def test_gateway_down(self):
        os.rename(self.socket, self.socket + ".away")
        self.addCleanup(os.rename, self.socket + ".away", self.socket)
        client = self.nx_client()
        self.assertIn(b"NX> 500 ERROR: The NX service is not running on this server.", client.out.read_to_eof())
        self.assertEqual(pwd.getpwnam(self.nx.name).pw_shell, NXGATE_SHELL)
