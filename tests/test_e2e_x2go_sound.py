"""End to end: X2Go's sound, from a real session to a real PulseAudio on the client's side, through the
client's own reverse forward (reverse streams: nxgate.streams.reverse, nxgate.node.reverse).

The client side is what an X2Go user has: Debian's pyhoca-cli (or x2goclient) with its default
``--sound pulse``, which pushes the PulseAudio cookie of the user's machine over SFTP (scp for
x2goclient), asks for a ``tcpip-forward`` of the session's sound port and connects each forwarded
channel to its local PulseAudio's native TCP port 4713 (tests/harness/pulse.py: a private daemon with a
null sink, that port demanding that cookie).  A program in the session plays a 440 Hz tone with
``paplay`` in the session program's own environment, and the null sink's monitor must hear it (frequency
within 2 %), on one box and for a session on another cluster member.  The session's sound goes nowhere
else: its PULSE_SERVER is a Unix socket on the session's machine, its cookie the one the client pushed,
no TCP port listens for it; another real user who connects to that socket and sends gets nothing to the
client (a recorder stands in for the client's PulseAudio there, and hears only the session user's bytes).
"""

from __future__ import annotations

import os
import pwd
import re
import secrets
import shutil
import socket
import subprocess
import tempfile
import threading
import time

from twisted.trial.unittest import SkipTest

from tests.harness.process import stop, wait_for
from tests.harness.pulse import PulseServer, analyse, tone
from tests.test_e2e_cluster import ClusterTestCase
from tests.test_e2e_sessions import proc_environ
from tests.test_e2e_sound import as_user
from tests.test_e2e_x2go import X2GoCase

FREQUENCY = 440.0
#: Where X2Go's clients connect their sound forwards (python-x2go's default, x2goclient's too).
CLIENT_SOUND_PORT = 4713
_STARTED = re.compile(r"X2Go session (\S+) \(session ([0-9A-F]{32}),")


def port_free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as PulseAudio binds (TIME_WAIT is no owner)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def session_program(user: str) -> int:
    """The pid of the user's session program (the TERMINAL type's xterm), once it runs."""
    def found() -> int | None:
        result = subprocess.run(["pgrep", "-u", user, "-x", "xterm"], capture_output=True, text=True)
        pids = [int(pid) for pid in result.stdout.split()]
        return pids[0] if pids else None
    return wait_for(found, 60, f"the session program of {user}")


class ClientSide:
    """The user's machine: a home with a PulseAudio cookie, and a PulseAudio that demands it on port 4713."""

    def __init__(self, workdir: str) -> None:
        if not port_free(CLIENT_SOUND_PORT):
            raise AssertionError(f"port {CLIENT_SOUND_PORT}, where X2Go's clients send sound, is taken")
        self.home = tempfile.mkdtemp(prefix="x2go-sound-client-")
        os.makedirs(os.path.join(self.home, ".config", "pulse"))
        self.cookie = secrets.token_bytes(256)
        with open(os.path.join(self.home, ".config", "pulse", "cookie"), "wb") as handle:
            handle.write(self.cookie)
        self.pulse = PulseServer(workdir)
        self.pulse.load_tcp(self.cookie, CLIENT_SOUND_PORT)
        self.tone = tone(os.path.join(self.pulse.dir, "tone.wav"), FREQUENCY, 1.0)
        os.chmod(self.pulse.dir, 0o711)  # the session's user reads the tone, nothing else

    def close(self) -> None:
        self.pulse.close()
        shutil.rmtree(self.home, ignore_errors=True)


class Recorder:
    """A TCP listener on the client's sound port that keeps what arrives (instead of PulseAudio)."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", CLIENT_SOUND_PORT))
        self.received: list[bytes] = []
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(65536):
                self.received.append(data)

    def close(self) -> None:
        try:
            self.server.shutdown(socket.SHUT_RDWR)  # wakes the accept: a blocked accept keeps the port listening
        except OSError:
            pass
        self.server.close()


def play(user, env: dict[str, str], path: str) -> subprocess.CompletedProcess:
    return as_user(user.name, {**{key: env[key] for key in ("PULSE_SERVER", "PULSE_COOKIE") if key in env},
                               "HOME": user.home}, "paplay", path)


SEND = ("import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "s.connect(sys.argv[1])\n"
        "try:\n"
        "    s.sendall(sys.argv[2].encode())\n"
        "    s.settimeout(3)\n"
        "    print(repr(s.recv(100)))\n"
        "except OSError as error:\n"
        "    print(error)\n")


class SoundCase(X2GoCase):
    """The gateway of the X2Go tests, one box."""

    def setUp(self) -> None:
        super().setUp()
        self.log_start = len(self.gateway.log())

    def new_log(self) -> str:
        return self.gateway.log()[self.log_start:]

    def pyhoca(self, home: str, *args: str) -> tuple[subprocess.Popen, str]:
        log = tempfile.mktemp(prefix="pyhoca-", suffix=".log", dir=self.home)
        with open(log, "wb") as handle:
            process = subprocess.Popen(self.argv("-c", "TERMINAL", "-g", "800x600", "-q", "lan", "--sound", "pulse",
                                                 *args),
                                       env=dict(self.env(), HOME=home), stdin=subprocess.DEVNULL, stdout=handle,
                                       stderr=subprocess.STDOUT)
        self.clients.append(process)
        return process, log

    def sound_env(self) -> dict[str, str]:
        wait_for(lambda: "the client's PulseAudio cookie is in place" in self.new_log(), 60,
                 "the client's cookie on the session's machine")
        return proc_environ(session_program(self.user.name))


class X2GoSoundTests(SoundCase):
    """pyhoca-cli on one box."""

    def test_pyhoca_cli_hears_the_session(self):
        client = ClientSide(self.gateway.workdir)
        self.addCleanup(client.close)
        process, log = self.pyhoca(client.home)
        name = self.started_name(process, log)
        session_id = self.session_id(name)
        env = self.sound_env()
        listener = os.path.join(self.gateway.state_dir, "reverse", f"{session_id}.sound")
        self.assertEqual(env["PULSE_SERVER"], f"unix:{listener}")
        with open(env["PULSE_COOKIE"], "rb") as handle:
            self.assertEqual(handle.read(), client.cookie, "the session's cookie is not the one the client pushed")
        self.assertIn("PULSE_CLIENTCONFIG", env)
        display = int(re.search(r"-(\d+)-\d+_st", name).group(1))
        self.assertTrue(port_free(7000 + display), "an NX media port listens for an X2Go session")
        recording = client.pulse.record()
        time.sleep(1.0)
        played = play(self.user, env, client.tone)
        self.assertEqual(played.returncode, 0, played.stderr)
        time.sleep(2.0)
        client.pulse.stop_recording()
        frequency, seconds = analyse(recording)
        self.assertTrue(abs(frequency - FREQUENCY) <= FREQUENCY * 0.02, f"heard {frequency:.1f} Hz")
        self.assertGreater(seconds, 0.5)
        text = self.read(log)
        self.assertNotIn("not allowed to share SSHFS", text)
        self.assertNotIn("accepted, not used", self.new_log())

    def test_another_user_at_the_listener_reaches_nothing(self):
        """The attack: another real user connects to the session's sound listener and sends; nothing reaches
        the client.  The session's user, the same way, reaches it (the path works)."""
        home = tempfile.mkdtemp(prefix="x2go-sound-client-")
        self.addCleanup(shutil.rmtree, home, True)
        os.makedirs(os.path.join(home, ".config", "pulse"))
        with open(os.path.join(home, ".config", "pulse", "cookie"), "wb") as handle:
            handle.write(secrets.token_bytes(256))
        recorder = Recorder()
        self.addCleanup(recorder.close)
        process, log = self.pyhoca(home)
        session_id = self.session_id(self.started_name(process, log))
        wait_for(lambda: "the client takes its sound back" in self.new_log(), 60, "the sound route")
        listener = os.path.join(self.gateway.state_dir, "reverse", f"{session_id}.sound")
        for attempt in range(3):
            attack = as_user(self.other.name, {"HOME": self.other.home}, "python3", "-c", SEND, listener,
                             f"ATTACK-{attempt}")
            self.assertEqual(attack.returncode, 0, attack.stderr)
        wait_for(lambda: "refused a sound connection from uid" in self.new_log(), 20, "the refusal in the log")
        mine = as_user(self.user.name, {"HOME": self.user.home}, "python3", "-c", SEND, listener, "SESSION-USER")
        self.assertEqual(mine.returncode, 0, mine.stderr)
        wait_for(lambda: b"SESSION-USER" in b"".join(recorder.received), 20, "the session user's bytes at the client")
        time.sleep(1.0)
        self.assertNotIn(b"ATTACK", b"".join(recorder.received))
        self.assertEqual(recorder.connections, 1)
        self.assertRegex(self.new_log(), r"refused a sound connection from uid \d+: pid \d+ of another user")

    def test_a_cookie_that_is_not_one_is_refused(self):
        """A client pushes 1000 bytes as its PulseAudio cookie: refused at the push, with words, and nothing
        goes to the session's machine."""
        home = tempfile.mkdtemp(prefix="x2go-sound-client-")
        self.addCleanup(shutil.rmtree, home, True)
        os.makedirs(os.path.join(home, ".config", "pulse"))
        with open(os.path.join(home, ".config", "pulse", "cookie"), "wb") as handle:
            handle.write(b"x" * 1000)
        process, log = self.pyhoca(home)
        wait_for(lambda: "not a PulseAudio cookie" in self.new_log(), 90, "the refusal of the cookie")
        self.assertRegex(self.new_log(), r"refused an SFTP write of \S+ to .*\.pulse-cookie.*not a PulseAudio cookie"
                                         r" \(1000 bytes; a cookie has 256\)")
        self.assertNotIn("the client's PulseAudio cookie is in place", self.new_log())


class FoldersBesideSoundTests(SoundCase):
    def test_pyhoca_cli_with_sound_and_a_folder_gets_the_folder_and_hears_no_permission_problem(self):
        """Sound (the default) and a shared folder on one connection: two reverse forwards, the folder mounted in
        the session; no "Remote user ... is not allowed to share SSHFS resources"; the key bundle python-x2go
        pushed never lands on the gateway's disk (kept in memory; its ``rm -f KEY KEY.ident`` forgets it)."""
        from tests.test_e2e_x2go_folders import mounted, open_fuse
        open_fuse(self)
        home = tempfile.mkdtemp(prefix="x2go-sound-client-")
        self.addCleanup(shutil.rmtree, home, True)
        self.addCleanup(shutil.rmtree, f"/tmp/.x2go-{self.user.name}", True)
        os.makedirs(os.path.join(home, ".config", "pulse"))
        with open(os.path.join(home, ".config", "pulse", "cookie"), "wb") as handle:
            handle.write(secrets.token_bytes(256))  # python-x2go asks for the sound forward when it has a cookie
        folder = tempfile.mkdtemp(prefix="x2go-folder-", dir=home)
        with open(os.path.join(folder, "note.txt"), "w") as handle:
            handle.write("beside the sound\n")
        process, log = self.pyhoca(home, "-F", folder)
        self.started_name(process, log)
        point = f"/tmp/.x2go-{self.user.name}/media/disk/{folder.replace('/', '_')}"
        try:
            wait_for(lambda: mounted(point) and "the client takes its sound back" in self.new_log(), 120,
                     "the folder mounted and the sound route")
        except AssertionError:
            raise AssertionError(f"{self.read(log)[-3000:]}\n{self.new_log()[-3000:]}") from None
        read = as_user(self.user.name, {"HOME": self.user.home}, "cat", f"{point}/note.txt")
        self.assertEqual(read.stdout, "beside the sound\n", read.stderr)
        wait_for(lambda: re.search(r"x2gomountdirs stdout is: .*mount .* ok", self.read(log)), 60,
                 "pyhoca-cli's word that the folder is shared")
        text = self.read(log)
        self.assertNotIn("not allowed", text)
        self.assertIsNone(process.poll(), f"pyhoca-cli ended: {text[-2000:]}")
        keys = os.path.join(self.user.home, ".x2go", "ssh")
        self.assertEqual([name for name in (os.listdir(keys) if os.path.isdir(keys) else []) if name.startswith("key.")],
                         [])


class X2GoClientSoundTests(SoundCase):
    """x2goclient (libssh, Qt) with sound on, as its new profiles have it."""

    def test_x2goclient_hears_the_session(self):
        if shutil.which("x2goclient") is None:
            raise SkipTest("x2goclient is not installed (apt-get install x2goclient)")
        client = ClientSide(self.gateway.workdir)
        self.addCleanup(client.close)
        key = os.path.join(client.home, "id")
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key], check=True)
        entry = pwd.getpwnam(self.user.name)
        ssh_dir = os.path.join(entry.pw_dir, ".ssh")
        os.makedirs(ssh_dir, exist_ok=True)
        with open(key + ".pub") as public, open(os.path.join(ssh_dir, "authorized_keys"), "w") as keys:
            keys.write(public.read())
        for path, mode in ((ssh_dir, 0o700), (os.path.join(ssh_dir, "authorized_keys"), 0o600)):
            os.chown(path, entry.pw_uid, entry.pw_gid)
            os.chmod(path, mode)
        self.addCleanup(shutil.rmtree, ssh_dir, True)
        os.makedirs(os.path.join(client.home, ".x2goclient"))
        with open(os.path.join(client.home, ".x2goclient", "sessions"), "w") as handle:
            handle.write(f"[gw]\nname=gw\nhost=127.0.0.1\nsshport={self.gateway.port}\nuser={self.user.name}\n"
                         f"key={key}\nautologin=false\ncommand=TERMINAL\nrootless=false\nspeed=4\n"
                         "pack=16m-jpeg\nquality=9\nwidth=800\nheight=600\nfullscreen=false\nusekbd=false\n"
                         "setdpi=false\nsound=true\nsoundsystem=pulse\nstartsoundsystem=false\nsoundtunnel=true\n"
                         f"defsndport=false\nsndport={CLIENT_SOUND_PORT}\nprint=false\n")
        log = os.path.join(client.home, "x2goclient.log")
        with open(log, "wb") as handle:
            process = subprocess.Popen(["x2goclient", "--session=gw", "--add-to-known-hosts", "--no-menu",
                                        "--bypass-cleanup-helper", "--debug"],
                                       env=dict(self.env(), HOME=client.home, XDG_RUNTIME_DIR=client.home),
                                       stdin=subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT)
        self.clients.append(process)
        env = self.sound_env()
        with open(env["PULSE_COOKIE"], "rb") as handle:
            self.assertEqual(handle.read(), client.cookie)
        recording = client.pulse.record()
        time.sleep(1.0)
        played = play(self.user, env, client.tone)
        self.assertEqual(played.returncode, 0, played.stderr)
        time.sleep(2.0)
        client.pulse.stop_recording()
        frequency, _ = analyse(recording)
        self.assertTrue(abs(frequency - FREQUENCY) <= FREQUENCY * 0.02, f"heard {frequency:.1f} Hz")


class X2GoSoundThroughTheClusterTests(ClusterTestCase):
    """pyhoca-cli on gateway 1, the session on node 2: the sound comes back through the cluster's streams."""

    def test_pyhoca_on_gateway_1_hears_a_session_on_node_2(self):
        if shutil.which("pyhoca-cli") is None:
            raise SkipTest("pyhoca-cli is not installed (apt-get install pyhoca-cli python3-x2go)")
        gateway, node = self.members(("gw1", "gateway"), ("node2", "node"))
        from tests.harness.x11 import ClientScreen
        screen = ClientScreen(1024, 768, window_manager=True)
        self.addCleanup(screen.close)
        client = ClientSide(gateway.workdir)
        self.addCleanup(client.close)
        log = os.path.join(client.home, "pyhoca.log")
        with open(log, "wb") as handle:
            process = subprocess.Popen(
                ["pyhoca-cli", "--server", "127.0.0.1", "-p", str(gateway.port), "-l", self.user.name, "--password",
                 self.user.password, "--add-to-known-hosts", "-c", "TERMINAL", "-g", "800x600", "-q", "lan",
                 "--sound", "pulse"],
                env=dict(os.environ, DISPLAY=screen.name, HOME=client.home), stdin=subprocess.DEVNULL, stdout=handle,
                stderr=subprocess.STDOUT)
        self.addCleanup(stop, process)
        wait_for(lambda: "the client's PulseAudio cookie is in place" in node.log(), 120,
                 "the client's cookie on node 2")
        session_id = dict((name, sid) for name, sid in _STARTED.findall(gateway.log())).popitem()[1]
        self.assertEqual(self.sessions(gateway)[session_id]["node"], "node2")
        env = proc_environ(session_program(self.user.name))
        self.assertEqual(env["PULSE_SERVER"], f"unix:{os.path.join(node.state_dir, 'reverse', session_id)}.sound")
        with open(env["PULSE_COOKIE"], "rb") as handle:
            self.assertEqual(handle.read(), client.cookie)
        recording = client.pulse.record()
        time.sleep(1.0)
        played = play(self.user, env, client.tone)
        self.assertEqual(played.returncode, 0, played.stderr)
        time.sleep(2.0)
        client.pulse.stop_recording()
        frequency, _ = analyse(recording)
        self.assertTrue(abs(frequency - FREQUENCY) <= FREQUENCY * 0.02, f"heard {frequency:.1f} Hz")

