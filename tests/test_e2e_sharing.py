"""End to end: the client's folders in a real session, through the NX smb
channel (issue 14).

The client side is what ``nxgate-client --share`` sets up: a private Samba
``smbd`` on a loopback port serving one folder to one account with a
per-session password (:class:`nxgate.clients.nx.sharing.LocalShares`, the
client's own code), and the real ``nxproxy -S`` with ``smb=PORT``.  The
client asks with ``--samba="1"``, hears ``NX> 709``, sends ``addmount`` as
OpenNX does; the gateway mounts the share as the user with smbnetfs (FUSE)
at ``~/MyShares/<name>``.  What the user sees is checked: a file written in
the client's folder is read in the session, a file written in the session
appears in the client's folder, byte for byte; another user sees neither the
mount nor the share; the mount goes at suspend, at terminate, and after a
gateway SIGKILL at the next start; bad ``addmount`` input gets an NX error
and harms nothing; with sharing switched off the session runs without it.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time

from twisted.trial.unittest import SkipTest

from nxgate.clients.nx.sharing import LocalShares
from nxgate.protocols.nx import client_commands as commands
from tests.harness.gateway import Gateway
from tests.harness.process import descendants, wait_for
from tests.harness.samba import open_blocking
from tests.harness.users import create_user
from tests.harness.ssh import Attachment, NXClient, SessionInfo
from tests.test_e2e_client import TYPES as CLIENT_TYPES
from tests.test_e2e_client import ClientScreenTestCase, agent_processes
from tests.test_e2e_sessions import RED, START, TYPES, SessionTestCase

SHARE = "docs"
OPTIONS = {"sessions": {"display_base": "940", "display_limit": "40", "connect_timeout": "60"}}


def smbnetfs_mounts(session_id: str) -> list[str]:
    """The FUSE SMB mounts of a session (by its directory), from /proc/mounts."""
    with open("/proc/mounts") as handle:
        return [line.split()[1] for line in handle
                if line.split()[2] == "fuse.smbnetfs" and f"/{session_id}/" in line.split()[1]]


def user_mounts(uid: int) -> list[str]:
    """Every FUSE SMB mount of a user, whatever the session."""
    with open("/proc/mounts") as handle:
        return [line.split()[1] for line in handle
                if line.split()[2] == "fuse.smbnetfs" and f"user_id={uid}," in line.split()[3]]


def smbnetfs_processes(user: str) -> list[str]:
    return subprocess.run(["pgrep", "-u", user, "-x", "smbnetfs"], capture_output=True, text=True).stdout.split()


def as_user(user: str, *argv: str, data: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", user, "--", *argv], input=data, capture_output=True, timeout=60)


class SharingTestCase(SessionTestCase):
    options = OPTIONS

    def setUp(self):
        if not os.path.exists("/dev/fuse"):
            raise SkipTest("no /dev/fuse: FUSE mounts cannot be tested here")
        for program in ("smbnetfs", "smbd", "pdbedit", "fusermount3"):
            if shutil.which(program, path=os.defpath + ":/usr/sbin") is None:
                raise SkipTest(f"{program} is not installed (make deps: smbnetfs fuse3 samba)")
        super().setUp()
        mode = os.stat("/dev/fuse").st_mode & 0o777
        if mode & 0o006 != 0o006:  # the session's user opens /dev/fuse for smbnetfs
            os.chmod("/dev/fuse", 0o666)
            self.addCleanup(os.chmod, "/dev/fuse", mode)
        self.folder = tempfile.mkdtemp(prefix="nxgate-share-")
        self.addCleanup(shutil.rmtree, self.folder, True)
        self.client_dir = tempfile.mkdtemp(prefix="nxgate-client-")
        self.addCleanup(shutil.rmtree, self.client_dir, True)

    def end_all_sessions(self):
        """The agents end, and with them (the gateway sees it) every mount; a
        mount left after that would be a bug, and is removed so that the
        next test and the workdir's removal find none."""
        super().end_all_sessions()
        for user in (self.user, self.other):
            try:
                wait_for(lambda u=user: not user_mounts(u.entry.pw_uid), 20, "the gateway to unmount ended sessions")
            finally:
                for mount in user_mounts(user.entry.pw_uid):
                    subprocess.run(["umount", "-l", mount], capture_output=True)

    def start_sharing(self, client: NXClient, samba: str = "1") -> SessionInfo:
        reply = client.command(START.format(name="share", type="unix-console", extra=f'--samba="{samba}"'),
                               timeout=60)
        self.assertIn(b"NX> 710 Session status: running", reply, reply)
        return SessionInfo.parse(reply)

    def local_shares(self) -> LocalShares:
        shares = LocalShares({SHARE: self.folder}, self.client_dir)
        self.addCleanup(shares.close)
        open_blocking(shares)
        return shares

    def addmount(self, client: NXClient, info: SessionInfo, shares: LocalShares, **override: str) -> bytes:
        values = {"session_id": info.session_id, "share": SHARE, "password": shares.password}
        values.update(override)
        line = commands.addmount_command(values["session_id"], 3000 + info.display, values["share"], shares.user,
                                         values["password"], "clientbox")
        return client.command(line)

    def shared_session(self) -> tuple[NXClient, SessionInfo, LocalShares, Attachment]:
        """A console session of the first user with the client's folder mounted."""
        client = self.login()
        info = self.start_sharing(client)
        self.assertIn(b"NX> 709 File-sharing port: 445", info.lines)
        shares = self.local_shares()
        reply = self.addmount(client, info, shares)
        self.assertIn(b"NX> 719 SMB filesystem: running", reply)
        self.assertNotIn(shares.password.encode(), reply)  # the echo masks it
        attachment = Attachment(client, info, self.screen.name, self.gateway.workdir, options=f"smb={shares.port}")
        self.addCleanup(attachment.detach)
        self.screen.wait_for_colour(RED, 20000)
        link = os.path.join(self.user.home, "MyShares", SHARE)
        wait_for(lambda: as_user(self.user.name, "test", "-d", link + "/").returncode == 0, 60,
                 "the client's folder at ~/MyShares/docs")
        self.link = link
        return client, info, shares, attachment

    def gateway_options(self) -> dict[str, dict[str, str]]:
        options = {"sessions": {"display_base": "700", "display_limit": "100", "connect_timeout": "60"},
                   "types": dict(TYPES)}
        for section, values in self.options.items():
            options.setdefault(section, {}).update(values)
        return options


class SharingTests(SharingTestCase):
    def test_files_go_both_ways_between_the_clients_folder_and_the_session(self):
        client, info, shares, _ = self.shared_session()
        payload = os.urandom(200_000)
        with open(os.path.join(self.folder, "from-client.bin"), "wb") as handle:
            handle.write(payload)
        read = as_user(self.user.name, "cat", os.path.join(self.link, "from-client.bin"))
        self.assertEqual(read.returncode, 0, read.stderr)
        self.assertEqual(read.stdout, payload)
        text = "written in the session\n".encode() * 1000
        wrote = as_user(self.user.name, "dd", f"of={os.path.join(self.link, 'from-session.txt')}", "status=none",
                        data=text)
        self.assertEqual(wrote.returncode, 0, wrote.stderr)
        with open(os.path.join(self.folder, "from-session.txt"), "rb") as handle:
            self.assertEqual(handle.read(), text)
        # The password is nowhere on the server: not in the log, not on disk, not in argv.
        self.assertNotIn(shares.password, self.gateway.log())
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as handle:
                        self.assertNotIn(shares.password.encode(), handle.read())
                except OSError:
                    pass
        found = subprocess.run(["grep", "-rl", shares.password, self.gateway.state_dir], capture_output=True)
        self.assertEqual(found.stdout, b"", "the share password is in a file of the gateway")

    def test_another_user_cannot_see_the_mount_or_reach_the_share(self):
        client, info, shares, _ = self.shared_session()
        with open(os.path.join(self.folder, "secret.txt"), "w") as handle:
            handle.write("for the owner only\n")
        self.assertEqual(as_user(self.user.name, "cat", os.path.join(self.link, "secret.txt")).stdout,
                         b"for the owner only\n")
        stranger = self.other.name
        self.assertNotEqual(as_user(stranger, "cat", os.path.join(self.link, "secret.txt")).returncode, 0)
        for mount in smbnetfs_mounts(info.session_id):
            self.assertNotEqual(as_user(stranger, "ls", mount).returncode, 0)
        # In his own session the other user has no such folder.
        other_client = self.login(self.other)
        other_info = self.start_sharing(other_client)
        self.assertFalse(os.path.exists(os.path.join(self.other.home, "MyShares", SHARE)))
        self.assertEqual(smbnetfs_mounts(other_info.session_id), [])
        # ... nor may he mount the first user's share into the first user's session.
        reply = other_client.command(commands.addmount_command(info.session_id, 3000 + info.display, SHARE,
                                                               shares.user, "guess", "x"))
        self.assertIn(f"NX> 596 Error: Could not find session {info.session_id}.".encode(), reply)
        # The channel port is open to every local user: the client's Samba wants the password.
        guessed = as_user(stranger, "smbclient", "-p", str(3000 + info.display), f"//127.0.0.1/{SHARE}",
                          "-U", f"{shares.user}%wrong", "-c", "ls")
        self.assertNotEqual(guessed.returncode, 0)
        self.assertNotIn(b"secret.txt", guessed.stdout)

    def test_the_mount_goes_at_suspend_and_at_terminate(self):
        client, info, shares, attachment = self.shared_session()
        self.assertNotEqual(smbnetfs_mounts(info.session_id), [])
        attachment.detach()
        self.wait_status(info.session_id, "Suspended")
        wait_for(lambda: smbnetfs_mounts(info.session_id) == [], 20, "the mount to go at suspend")
        wait_for(lambda: not os.path.lexists(self.link), 10, "the link to go at suspend")
        wait_for(lambda: not smbnetfs_processes(self.user.name), 20, "smbnetfs to end with its mount")
        self.assertTrue(os.path.exists(self.folder))  # the client's folder itself is untouched
        # A second session, terminated while mounted.
        client, info, shares, attachment = self.shared_session()
        terminator = self.login()
        self.assertIn(b"NX> 900", terminator.command(f'terminate --sessionid="{info.session_id}"', timeout=30))
        wait_for(lambda: smbnetfs_mounts(info.session_id) == [], 20, "the mount to go at terminate")
        self.assertFalse(os.path.lexists(self.link))

    def test_the_folder_comes_back_when_the_client_resumes_and_shares_it_again(self):
        client, info, shares, attachment = self.shared_session()
        attachment.detach()
        self.wait_status(info.session_id, "Suspended")
        wait_for(lambda: smbnetfs_mounts(info.session_id) == [], 20, "the mount to go at suspend")
        with open(os.path.join(self.folder, "after.txt"), "w") as handle:
            handle.write("written while suspended\n")
        client = self.login()
        reply = client.command(START.format(name="x", type="unix-console", extra='--samba="1"').replace(
            "startsession", "restoresession") + f' --id="{info.session_id}"', timeout=60)
        self.assertIn(b"NX> 709 File-sharing port: 445", reply)
        resumed = SessionInfo.parse(reply)
        self.assertIn(b"NX> 719 SMB filesystem: running", self.addmount(client, resumed, shares))
        attachment = Attachment(client, resumed, self.screen.name, self.gateway.workdir,
                                options=f"smb={shares.port}")
        self.addCleanup(attachment.detach)
        wait_for(lambda: as_user(self.user.name, "cat", os.path.join(self.link, "after.txt")).stdout
                 == b"written while suspended\n", 60, "the folder back after the resume")
        self.assertEqual(len(smbnetfs_mounts(info.session_id)), 1)

    def test_bad_addmount_input_gets_an_nx_error_and_the_session_goes_on(self):
        client = self.login()
        info = self.start_sharing(client)
        shares = self.local_shares()
        for override, expected in (({"share": "../etc"}, b"NX> 597 "), ({"share": ""}, b"NX> 597 "),
                                   ({"password": 'a"b'}, b"NX> 597 "), ({"session_id": "nonsense"}, b"NX> 597 "),
                                   ({"session_id": "F" * 32}, b"NX> 596 ")):
            reply = self.addmount(client, info, shares, **override)
            self.assertIn(expected, reply)
            self.assertNotIn(b'a"b', reply)
        reply = client.command('addmount --share="docs"')
        self.assertIn(b"NX> 500 Error: No session id given.", reply)
        self.assertIn(b"NX> 719 SMB filesystem: running", self.addmount(client, info, shares))
        attachment = Attachment(client, info, self.screen.name, self.gateway.workdir, options=f"smb={shares.port}")
        self.addCleanup(attachment.detach)
        self.screen.wait_for_colour(RED, 20000)
        link = os.path.join(self.user.home, "MyShares", SHARE)
        wait_for(lambda: as_user(self.user.name, "test", "-d", link + "/").returncode == 0, 60, "the mount")


class SharingGatewayKillTests(SharingTestCase):
    """Alone in its class: it kills the class's gateway."""

    def test_no_stale_mount_after_a_gateway_sigkill(self):
        client, info, shares, attachment = self.shared_session()
        self.gateway.process.kill()
        self.gateway.process.wait()
        self.gateway.process.stderr.close()
        self.gateway.process = None
        time.sleep(1)
        self.assertNotEqual(smbnetfs_mounts(info.session_id), [], "the mount outlives the gateway")
        restarted = Gateway(state_dir=self.gateway.state_dir, options=self.gateway_options()).start()
        self.addCleanup(restarted.stop)
        self.gateway, old = restarted, self.gateway
        self.addCleanup(lambda: setattr(self, "gateway", old))
        wait_for(lambda: smbnetfs_mounts(info.session_id) == [], 60, "the stale mount to go after the restart")
        self.assertFalse(os.path.lexists(self.link))


class SharingSwitchedOffTests(SharingTestCase):
    options = {**OPTIONS, "services": {"sharing": "no"}}

    def test_a_client_asking_for_sharing_gets_a_working_session_without_it(self):
        client = self.login()
        info = self.start_sharing(client)
        self.assertNotIn(b"NX> 709", info.lines)
        shares = self.local_shares()
        reply = self.addmount(client, info, shares)
        self.assertIn(b"NX> 719 SMB filesystem: off", reply)
        self.assertNotIn(b"NX> 5", reply)
        attachment = Attachment(client, info, self.screen.name, self.gateway.workdir)
        self.addCleanup(attachment.detach)
        self.screen.wait_for_colour(RED, 20000)
        time.sleep(2)
        self.assertEqual(smbnetfs_mounts(info.session_id), [])
        self.assertFalse(os.path.lexists(os.path.join(self.user.home, "MyShares", SHARE)))


def client_share_set_up(case, set_up) -> str:
    """For tests of ``nxgate-client --share``: FUSE that users may use, the
    case's ``set_up`` run, and a fresh folder to share (removed at cleanup)."""
    if not os.path.exists("/dev/fuse") or shutil.which("smbnetfs") is None:
        raise SkipTest("no /dev/fuse or smbnetfs here")
    set_up()
    mode = os.stat("/dev/fuse").st_mode & 0o777
    if mode & 0o006 != 0o006:
        os.chmod("/dev/fuse", 0o666)
        case.addCleanup(os.chmod, "/dev/fuse", mode)
    folder = tempfile.mkdtemp(prefix="nxgate-share-")
    case.addCleanup(shutil.rmtree, folder, True)
    return folder


class ClientSharingTests(ClientScreenTestCase):
    """``nxgate-client --share`` against the real gateway: its own private
    Samba, its addmount, and the folder gone with the client."""

    options = {"sessions": {"display_base": "980", "display_limit": "15", "connect_timeout": "60"},
               "types": CLIENT_TYPES}

    def setUp(self):
        self.folder = client_share_set_up(self, super().setUp)

    def test_the_shared_folder_appears_in_the_session_and_goes_with_the_client(self):
        with open(os.path.join(self.folder, "hello.txt"), "w") as handle:
            handle.write("from the client's folder\n")
        client = self.background(self.argv("--geometry", "800x600", "--share", f"work={self.folder}", "--verbose"),
                                 DISPLAY=self.screen.name)
        self.screen.wait_for_colour(RED, 20000, timeout=60)
        link = os.path.join(self.user.home, "MyShares", "work")
        wait_for(lambda: as_user(self.user.name, "test", "-d", link + "/").returncode == 0, 60,
                 "the client's folder at ~/MyShares/work")
        self.assertEqual(as_user(self.user.name, "cat", os.path.join(link, "hello.txt")).stdout,
                         b"from the client's folder\n")
        wrote = as_user(self.user.name, "dd", f"of={os.path.join(link, 'back.txt')}", "status=none",
                        data=b"from the session\n")
        self.assertEqual(wrote.returncode, 0, wrote.stderr)
        with open(os.path.join(self.folder, "back.txt"), "rb") as handle:
            self.assertEqual(handle.read(), b"from the session\n")
        private_smbd = "smbd --foreground --no-process-group -s /tmp/nxgate-client-"
        found = subprocess.run(["pgrep", "-f", private_smbd], capture_output=True, text=True).stdout.split()
        smbd = [pid for pid in found if int(pid) in descendants(client.pid)]  # this client's, not another test's
        self.assertTrue(smbd, "the client's private smbd")
        client.send_signal(signal.SIGTERM)
        _code, output = self.finished(client)
        self.assertNotIn("Traceback", output)
        for pid in smbd:
            wait_for(lambda p=pid: not os.path.exists(f"/proc/{p}"), 20, "the client's smbd to end")
        wait_for(lambda: not os.path.lexists(link), 30, "the folder to go when the client went (suspend)")
        for pid in agent_processes(self.user.name):
            os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not agent_processes(self.user.name), 20, "the agents to end")

    def test_the_folder_travels_on_its_own_ssh_channel_that_only_its_user_may_use(self):
        """Issue 25: nxgate-client's folder goes beside the NX stream, on an SSH
        channel of its own; its port on the server lets in the session's user
        only (another user is cut off before the client's Samba sees him, even
        with the share's password), and the client's Samba still wants the password."""
        stranger = create_user()
        self.addCleanup(stranger.remove)
        client = self.background(self.argv("--geometry", "800x600", "--share", f"work={self.folder}", "--verbose"),
                                 DISPLAY=self.screen.name)
        self.screen.wait_for_colour(RED, 20000, timeout=60)
        link = os.path.join(self.user.home, "MyShares", "work")
        wait_for(lambda: as_user(self.user.name, "test", "-d", link + "/").returncode == 0, 60,
                 "the client's folder at ~/MyShares/work")
        tunnel = re.search(r"the client takes its folders back \(listening on 127\.0\.0\.1:(\d+)\)",
                           self.gateway.log())
        self.assertIsNotNone(tunnel, "the gateway's log says where the folder's tunnel listens")
        port = int(tunnel.group(1))
        self.assertIn(f"/127.0.0.1:{port}/work", os.readlink(link), "smbnetfs mounts through the tunnel")
        (display, *_), = self.sessions().values()
        self.assertNotEqual(port, 3000 + int(display), "not the NX smb channel's port")
        # Byte for byte, both ways, through the channel.
        payload = os.urandom(3_000_000)
        with open(os.path.join(self.folder, "down.bin"), "wb") as handle:
            handle.write(payload)
        read = as_user(self.user.name, "cat", os.path.join(link, "down.bin"))
        self.assertEqual(read.returncode, 0, read.stderr)
        self.assertEqual(read.stdout, payload)
        upload = os.urandom(2_000_000)
        wrote = as_user(self.user.name, "dd", f"of={os.path.join(link, 'up.bin')}", "bs=1M", "status=none",
                        data=upload)
        self.assertEqual(wrote.returncode, 0, wrote.stderr)
        with open(os.path.join(self.folder, "up.bin"), "rb") as handle:
            self.assertEqual(handle.read(), upload)
        # A wrong password is refused by the client's Samba (the owner's connection gets through to it).
        owner = as_user(self.user.name, "smbclient", "-p", str(port), "//127.0.0.1/work", "-U",
                        f"{self.user.name}%wrong", "-c", "ls")
        self.assertNotEqual(owner.returncode, 0)
        self.assertIn(b"NT_STATUS_LOGON_FAILURE", owner.stdout + owner.stderr)
        # Another user never reaches the client's Samba: cut off at the port.
        other = as_user(stranger.name, "smbclient", "-p", str(port), "//127.0.0.1/work", "-U",
                        f"{self.user.name}%wrong", "-c", "ls")
        self.assertNotEqual(other.returncode, 0)
        self.assertNotIn(b"NT_STATUS_LOGON_FAILURE", other.stdout + other.stderr, "reached the client's Samba")
        self.assertIn(f"refused a folders connection from uid {stranger.entry.pw_uid}",
                      self.gateway.log())
        self.assertNotEqual(as_user(stranger.name, "ls", link).returncode, 0)
        client.send_signal(signal.SIGTERM)
        _code, output = self.finished(client)
        self.assertNotIn("Traceback", output)
        wait_for(lambda: not os.path.lexists(link), 30, "the folder to go when the client went (suspend)")
        for pid in agent_processes(self.user.name):
            os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not agent_processes(self.user.name), 20, "the agents to end")
