"""End to end: X2Go's shared folders, with Debian's pyhoca-cli (``-F DIR``) and x2goclient against the real
gateway, the session's sshfs (as the user, FUSE) reaching the client's own SFTP server back through the client's
reverse forward of the session's folders port (nxgate.node.services.x2go_folders on the reverse streams).

Files go both ways byte for byte; the folder is where x2goserver mounts it (``/tmp/.x2go-<user>/media/disk/<path
with _>``); it goes at suspend and terminate and comes back at resume (the client shares it again); another real
user reaches neither the mount nor the forward's listener on the session's machine; bad input (a key file that is
not one, a mount point that is a symbolic link, a forward to a port that is not the session's) is refused with
words in the log and at the client, and nothing is mounted.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
import socket
import subprocess
import tempfile

from twisted.trial.unittest import SkipTest

from tests.harness.process import stop, wait_for
from tests.harness.ssh import askpass_env
from tests.harness.x2goclient import X2GoClientMachine
from tests.test_e2e_sound import as_user
from tests.test_e2e_x2go import PASSWORD, X2GoCase

_LISTENING = re.compile(r"session (\S+) of \S+: the client takes its shared folders back \(listening on "
                        r"127\.0\.0\.1:(\d+)\)")


def mounted(point: str) -> bool:
    with open("/proc/self/mountinfo") as handle:
        return any(line.split(" ")[4] == point.replace(" ", "\\040") for line in handle)


def open_fuse(case) -> None:
    """The session's user opens /dev/fuse for sshfs (as for smbnetfs in tests.test_e2e_sharing)."""
    if not os.path.exists("/dev/fuse"):
        raise SkipTest("no /dev/fuse: FUSE mounts cannot be tested here")
    mode = os.stat("/dev/fuse").st_mode & 0o777
    if mode & 0o006 != 0o006:
        os.chmod("/dev/fuse", 0o666)
        case.addCleanup(os.chmod, "/dev/fuse", mode)


class FoldersCase(X2GoCase):
    def setUp(self) -> None:
        super().setUp()
        open_fuse(self)
        self.log_start = len(self.gateway.log())
        self.share = os.path.join(self.home, "my share")  # a blank, as users' folders have
        os.makedirs(self.share)
        self.from_client = secrets.token_bytes(3 * 1024 * 1024 + 17)
        with open(os.path.join(self.share, "from-client.bin"), "wb") as handle:
            handle.write(self.from_client)
        self.point = f"/tmp/.x2go-{self.user.name}/media/disk/{self.share.replace('/', '_').replace(' ', '_')}"
        self.addCleanup(shutil.rmtree, f"/tmp/.x2go-{self.user.name}", True)

    def new_log(self) -> str:
        return self.gateway.log()[self.log_start:]

    def pyhoca_folders(self, *args: str) -> tuple[subprocess.Popen, str]:
        return self.session_client("-c", "TERMINAL", "-g", "800x600", "-q", "lan", "--sound", "none", "-F",
                                   self.share, *args)

    def check_read(self, data: bytes, name: str) -> None:
        """The session's user reads ``name`` in the mount: ``data``, byte for byte."""
        read = as_user(self.user.name, {"HOME": self.user.home}, "sha256sum", f"{self.point}/{name}")
        self.assertEqual(read.returncode, 0, read.stderr)
        self.assertEqual(read.stdout.split()[0], hashlib.sha256(data).hexdigest())

    def write_through(self, data: bytes, name: str, folder: str) -> str:
        """The session's user copies ``data`` (a file of the test's, readable) to ``name`` in the mount; it
        arrives in the client's ``folder`` byte for byte.  The source's path."""
        source = os.path.join(tempfile.mkdtemp(dir="/tmp"), "payload")
        self.addCleanup(shutil.rmtree, os.path.dirname(source), True)
        with open(source, "wb") as handle:
            handle.write(data)
        os.chmod(os.path.dirname(source), 0o755)
        os.chmod(source, 0o644)
        wrote = as_user(self.user.name, {"HOME": self.user.home}, "cp", source, f"{self.point}/{name}")
        self.assertEqual(wrote.returncode, 0, wrote.stderr)
        with open(os.path.join(folder, name), "rb") as handle:
            self.assertEqual(handle.read(), data)
        return source

    def wait_mounted(self, what: str = "the client's folder mounted in the session") -> None:
        wait_for(lambda: mounted(self.point) and f"is mounted at {self.point}" in self.new_log(), 120, what)


class PyhocaFolderTests(FoldersCase):
    def test_a_folder_both_ways_gone_at_suspend_back_at_resume_gone_at_terminate(self):
        client, log = self.pyhoca_folders()
        name = self.started_name(client, log)
        self.wait_mounted()
        # The client's file in the session, byte for byte; the session's file on the client, byte for byte.
        self.check_read(self.from_client, "from-client.bin")
        source = self.write_through(secrets.token_bytes(2 * 1024 * 1024 + 5), "from-session.bin", self.share)
        # Where X2Go's users find it, and what x2golistmounts says.
        self.assertEqual(os.readlink(os.path.join(self.user.home, "media")), f"/tmp/.x2go-{self.user.name}/media")
        listed = self.ssh(f"x2golistmounts {name}")
        self.assertEqual(listed.stdout.strip(), f"127.0.0.1|{self.point}", listed.stderr)
        # The key bundle was on the session's machine for the mount only.
        session_dir = os.path.join(self.gateway.state_dir, "sessions", self.session_id(name))
        self.assertEqual([entry for entry in os.listdir(session_dir) if entry.startswith("x2go-sshfs")], [])
        self.assertNotIn("not allowed to share", self.read(log))
        self.assertRegex(self.read(log), r"x2gomountdirs stdout is: .*mount .*my share ok")

        suspended = self.cli("-S", name)
        self.assertEqual(suspended.returncode, 0, suspended.stderr)
        wait_for(lambda: not mounted(self.point), 60, "the folder unmounted at suspend")
        stop(client)

        resumed, log = self.pyhoca_folders("-R", name)
        self.assertEqual(self.started_name(resumed, log), name)
        self.log_start = len(self.gateway.log())
        self.wait_mounted("the folder mounted again at resume")
        again = as_user(self.user.name, {"HOME": self.user.home}, "cmp", f"{self.point}/from-session.bin", source)
        self.assertEqual(again.returncode, 0, again.stdout + again.stderr)
        # x2goumount-session of that folder, as python-x2go sends it: gone, and said so by x2golistmounts.
        unmounted = self.ssh(f"x2goumount-session {name} '{self.share}'")
        self.assertEqual((unmounted.returncode, unmounted.stderr), (0, ""))
        wait_for(lambda: not mounted(self.point), 30, "the folder unmounted at the client's request")
        self.assertEqual(self.ssh(f"x2golistmounts {name}").stdout.strip(), "")
        self.assertIn("unmounted at the client's request", self.new_log())

        self.assertEqual(self.cli("-T", name).returncode, 0)
        wait_for(lambda: not mounted(self.point), 60, "the folder unmounted at the end")
        self.assertFalse(os.path.exists(self.point))

    def test_another_user_reaches_neither_the_mount_nor_the_forward(self):
        """The attack: another real user lists the mount and connects to the folders' listener on the session's
        machine.  The mount refuses him (FUSE without allow_other); the listener closes his connection before a
        byte reaches the client (whose SFTP server would greet with its SSH banner), and the log says so.  The
        session's user, the same way, gets the client's banner: the path works."""
        client, log = self.pyhoca_folders()
        self.started_name(client, log)
        self.wait_mounted()
        listing = as_user(self.other.name, {"HOME": self.other.home}, "ls", self.point)
        self.assertNotEqual(listing.returncode, 0)
        self.assertRegex(listing.stderr, r"Permission denied")
        port = int(_LISTENING.findall(self.new_log())[-1][1])
        probe = ("import socket, sys\n"
                 "s = socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=5)\n"
                 "s.settimeout(5)\n"
                 "try:\n"
                 "    print(repr(s.recv(100)))\n"
                 "except OSError as error:\n"
                 "    print('error', error)\n")
        for _ in range(3):
            attack = as_user(self.other.name, {"HOME": self.other.home}, "python3", "-c", probe, str(port))
            self.assertEqual(attack.returncode, 0, attack.stderr)
            self.assertNotIn("SSH-", attack.stdout)
        wait_for(lambda: "refused a shared folders connection from uid" in self.new_log(), 20, "the refusal logged")
        mine = as_user(self.user.name, {"HOME": self.user.home}, "python3", "-c", probe, str(port))
        self.assertIn("SSH-2.0", mine.stdout)


class BadFolderInputTests(FoldersCase):
    def test_a_mount_point_that_is_a_symbolic_link_is_refused(self):
        """The session's mount point is a symbolic link (to another user's directory): refused, nothing mounted
        there or at the link's target, and the client hears why."""
        target = tempfile.mkdtemp(prefix="other-", dir="/tmp")
        self.addCleanup(shutil.rmtree, target, True)
        os.chown(target, self.other.entry.pw_uid, self.other.entry.pw_gid)
        os.chmod(target, 0o777)
        for path in (f"/tmp/.x2go-{self.user.name}", f"/tmp/.x2go-{self.user.name}/media",
                     f"/tmp/.x2go-{self.user.name}/media/disk"):
            os.makedirs(path, exist_ok=True)
            os.chown(path, self.user.entry.pw_uid, self.user.entry.pw_gid)
            os.chmod(path, 0o700)
        os.symlink(target, self.point)
        os.lchown(self.point, self.user.entry.pw_uid, self.user.entry.pw_gid)
        client, log = self.pyhoca_folders()
        self.started_name(client, log)
        wait_for(lambda: "is a symbolic link" in self.new_log(), 120, "the refusal of the mount point")
        self.assertRegex(self.new_log(), rf"the client's folder '{re.escape(self.share)}' refused: {re.escape(self.point)}"
                                         r" is a symbolic link")
        wait_for(lambda: "x2gomountdirs stderr is" in self.read(log), 30, "the client's words")
        self.assertRegex(self.read(log), r"mounting of .*my share failed: the mount point .* is a symbolic link")
        self.assertFalse(mounted(self.point))
        self.assertFalse(mounted(target))
        self.assertEqual(os.listdir(target), [])

    def test_a_key_file_that_is_not_one_is_refused_at_the_push(self):
        """A client pushes garbage as its key bundle (paramiko's SFTP, as python-x2go writes it): refused with
        words at the client and in the log; x2gomountdirs naming it then mounts nothing."""
        client, log = self.pyhoca_folders()
        name = self.started_name(client, log)
        self.wait_mounted()
        push = ("import paramiko, sys\n"
                "client = paramiko.SSHClient()\n"
                "client.set_missing_host_key_policy(paramiko.AutoAddPolicy())\n"
                "client.connect('127.0.0.1', port=int(sys.argv[1]), username=sys.argv[2], password=sys.argv[3],"
                " allow_agent=False, look_for_keys=False)\n"
                "client.exec_command('echo $HOME')[1].read()\n"  # python-x2go's first command
                "sftp = client.open_sftp()\n"
                "try:\n"
                "    with sftp.open(sys.argv[4], 'w') as handle:\n"
                "        handle.write(b'-----BEGIN RSA PRIVATE KEY-----\\nnot a key\\n-----END RSA PRIVATE KEY-----\\n'\n"
                "                     b'----BEGIN RSA IDENTITY----ssh-rsa AAAA')\n"
                "    print('written')\n"
                "except IOError as error:\n"
                "    print('refused:', error)\n")
        # Debian's python3 with python3-paramiko (APT_PACKAGES): what python-x2go pushes with.
        pushed = subprocess.run(["/usr/bin/python3", "-c", push, str(self.gateway.port), self.user.name, PASSWORD,
                                 f"{self.user.home}/.x2go/ssh/key.bad"], capture_output=True, text=True, timeout=60)
        # paramiko (python-x2go's) ignores what a close answers: the client hears it at x2gomountdirs (below).
        self.assertEqual(pushed.returncode, 0, pushed.stderr)
        self.assertRegex(self.new_log(), r"refused an SFTP write of \S+ to .*key\.bad.*not an X2Go key bundle for"
                                         r" shared folders: the private key is not one")
        fs_port = self.fs_port(name)
        command = (f"x2gomountdirs dir {name} root {self.user.home}/.x2go/ssh/key.bad "
                   f"/etc__REVERSESSH_PORT__{fs_port}")
        refused = self.ssh(command)
        self.assertIn("the key file", refused.stderr)
        self.assertIn("was not pushed", refused.stderr)
        self.assertNotIn("ok", refused.stdout)

    def test_a_forward_or_a_mount_through_a_port_not_the_sessions_is_refused(self):
        client, log = self.pyhoca_folders()
        name = self.started_name(client, log)
        self.wait_mounted()
        fs_port = self.fs_port(name)
        refused = self.ssh(f"x2gomountdirs dir {name} root {self.user.home}/.x2go/ssh/key.x "
                           f"/etc__REVERSESSH_PORT__{fs_port + 7}")
        self.assertIn(f"port {fs_port + 7} is not the folders port of session {name}", refused.stderr)
        self.assertRegex(self.new_log(), rf"which is not the session's folders port \({fs_port}\); refused")
        # A reverse forward of a port that is no session's: refused by the door (OpenSSH's -R says so).
        forward = subprocess.run(
            ["ssh", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o",
             "PubkeyAuthentication=no", "-o", "PreferredAuthentications=password", "-o", "ExitOnForwardFailure=yes",
             "-N", "-R", f"{fs_port + 7}:127.0.0.1:9", "-p", str(self.gateway.port), "-l", self.user.name,
             "127.0.0.1"], env=dict(os.environ, **askpass_env(PASSWORD)), stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=60, start_new_session=True)
        self.assertNotEqual(forward.returncode, 0)
        self.assertIn("remote port forwarding failed", forward.stderr)
        self.assertRegex(self.new_log(), rf"refused a reverse forward of {self.user.name}'s X2Go client to "
                                         rf"'?b?'?[^ ]*'?:{fs_port + 7}: not the sound or folders port")

    def fs_port(self, name: str) -> int:
        listed = self.ssh("x2golistsessions")
        line = next(line for line in listed.stdout.splitlines() if f"|{name}|" in line)
        return int(line.split("|")[13])


class SharingSwitchedOffTests(FoldersCase):
    """``[services] sharing = no``: ``which fusermount`` answers nothing, as on a server without sshfs, and
    python-x2go leaves the folders out; an ``x2gomountdirs`` sent all the same gets x2goserver's words for it."""
    gateway_options = {"services": {"sharing": "no"}}

    def test_folders_are_left_out_and_x2gomountdirs_says_why(self):
        client, log = self.pyhoca_folders()
        name = self.started_name(client, log)
        self.assertEqual(self.ssh("which fusermount").stdout, "")
        mountdirs = self.ssh(f"x2gomountdirs dir {name} root {self.user.home}/.x2go/ssh/key.x "
                             f"/etc__REVERSESSH_PORT__30000")
        self.assertIn("the sshfs command is not installed on this X2Go Server", mountdirs.stdout)
        self.assertIn(f"X2Go folder sharing asked by {self.user.name}: switched off ([services] sharing)",
                      self.new_log())
        self.assertFalse(mounted(self.point))
        self.assertNotIn("is mounted at", self.new_log())
        self.assertIsNone(client.poll(), self.read(log)[-2000:])


class JailedSessionFolderTests(FoldersCase):
    """A jailed session's /tmp is its own: a folder mounted where X2Go mounts it would be out of its programs'
    sight, so it is refused in words (at the client and in the log), and nothing is mounted."""
    gateway_options = {"jail": {"enabled": "yes"}}

    def test_a_jailed_session_refuses_folders_in_words(self):
        client, log = self.pyhoca_folders()
        self.started_name(client, log)
        wait_for(lambda: "not offered in jailed sessions" in self.new_log(), 120, "the refusal in the log")
        self.assertRegex(self.new_log(), r"1 X2Go shared folder\(s\) not mounted: shared folders and printing are not"
                                         r" offered in jailed sessions")
        wait_for(lambda: "x2gomountdirs stderr is" in self.read(log), 30, "the client's words")
        self.assertRegex(self.read(log), r"mounting of .*my share failed: shared folders and printing are not offered"
                                         r" in jailed sessions")
        self.assertFalse(mounted(self.point))
        self.assertNotIn("is mounted at", self.new_log())


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]



class X2GoClientFolderTests(FoldersCase):
    """x2goclient (libssh, Qt) sharing a folder of its profile, with its own sshd on the client's side."""

    def setUp(self) -> None:
        super().setUp()
        if shutil.which("x2goclient") is None:
            raise SkipTest("x2goclient is not installed (apt-get install x2goclient)")

    def started(self, machine: X2GoClientMachine, process: subprocess.Popen, before: int) -> str:
        """The name of the session x2goclient started."""
        from tests.test_e2e_x2go import _STARTED

        def name() -> str | None:
            if process.poll() is not None:
                raise AssertionError(f"x2goclient exited {process.returncode}: {machine.text()[-3000:]}")
            found = _STARTED.findall(self.gateway.log()[before:])
            return found[-1][0] if found else None

        try:
            return wait_for(name, 120, "x2goclient's session")
        except AssertionError:
            raise AssertionError(f"{machine.text()[-3000:]}\n{self.gateway.log()[before:][-3000:]}") from None

    def resumed(self, machine: X2GoClientMachine, process: subprocess.Popen, name: str, before: int) -> None:
        """x2goclient resumed session ``name`` (its graphics link to it opened)."""
        opened = f"to session {self.session_id(name)} opened"

        def done() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"x2goclient exited {process.returncode}: {machine.text()[-3000:]}")
            return opened in self.gateway.log()[before:]

        try:
            wait_for(done, 120, "x2goclient's resume")
        except AssertionError:
            raise AssertionError(f"{machine.text()[-3000:]}\n{self.gateway.log()[before:][-3000:]}") from None

    def test_x2goclient_shares_a_folder_both_ways_gone_at_suspend_back_at_resume(self):
        data = secrets.token_bytes(1024 * 1024 + 3)
        machine = X2GoClientMachine(self, self.screen, self.gateway.port, self.user, X2GoClientMachine.TERMINAL)
        share = os.path.dirname(machine.write("my share/from-client.bin", data))
        with open(os.path.join(machine.home, ".x2goclient", "sessions"), "a") as handle:
            handle.write(f"export=\"{share}:1;\"\nfstunnel=true\nprint=false\n")
        self.point = f"/tmp/.x2go-{self.user.name}/media/disk/{share.replace('/', '_').replace(' ', '_')}"
        before = len(self.gateway.log())
        client = machine.start(close_disconnect=True)
        name = self.started(machine, client, before)
        self.wait_mounted()
        # x2goclient's own sshd (as the client's user, from ~/.x2go/etc) is what the session's sshfs logged in to.
        self.assertTrue([line for line in machine.sshd() if f"{machine.home}/.x2go/etc/sshd_config" in line],
                        machine.sshd())
        # (the key's line in ~/.x2go/.ssh/authorized_keys is x2goclient's for one mount: it takes it out after)
        self.assertRegex(self.new_log(), r"X2Go client of \S+ copied \.x2go/ssh/key\.\S+ \(\d+ bytes\)")
        self.assertFalse(os.path.exists(os.path.join(self.user.home, ".x2go", "ssh")) and
                         [entry for entry in os.listdir(os.path.join(self.user.home, ".x2go", "ssh"))
                          if entry.startswith("key.")], "the key bundle was written on the gateway's machine")
        # Both ways, byte for byte.
        self.check_read(data, "from-client.bin")
        source = self.write_through(secrets.token_bytes(512 * 1024 + 9), "from-session.bin", share)
        self.assertEqual(os.stat(os.path.join(share, "from-session.bin")).st_uid, machine.user.entry.pw_uid)
        listed = self.ssh(f"x2golistmounts {name}")
        self.assertEqual(listed.stdout.strip(), f"127.0.0.1|{self.point}", listed.stderr)

        # Suspended elsewhere: the folder goes; x2goclient (--close-disconnect) ends.
        self.assertEqual(self.cli("-S", name).returncode, 0)
        wait_for(lambda: not mounted(self.point), 60, "the folder unmounted at suspend")
        wait_for(lambda: client.poll() is not None, 60, "x2goclient to end with its session suspended")
        # x2goclient again resumes its one suspended session, and shares the folder again.
        self.log_start = before = len(self.gateway.log())
        client = machine.start(close_disconnect=True)
        self.resumed(machine, client, name, before)
        self.wait_mounted("the folder mounted again at resume")
        again = as_user(self.user.name, {"HOME": self.user.home}, "cmp", f"{self.point}/from-session.bin", source)
        self.assertEqual(again.returncode, 0, again.stdout + again.stderr)
        self.assertEqual(self.cli("-T", name).returncode, 0)
        wait_for(lambda: not mounted(self.point), 60, "the folder unmounted at the end")
        self.assertFalse(os.path.exists(self.point))
