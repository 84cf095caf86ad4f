"""End to end: sound from a real session to a real PulseAudio on the client's
side, through the NX media channel (issue 14).

The client side is what ``nxgate-client --sound`` sets up: a private
PulseAudio daemon (tests/harness/pulse.py) with a null sink, a native-protocol
TCP port that demands the cookie derived from the session cookie, and the
real ``nxproxy -S`` with ``media=PORT``.  A program in the session plays a
known tone with ``paplay`` in the session's own environment (read from the
session program's /proc/PID/environ), and the null sink's monitor, recorded
with ``parec``, must hear it: frequency within 2 %, duration within 10 %.
Also: the microphone the other way, the sound after a resume (new cookie),
a stranger on the server who connects to the channel's loopback port, sound
switched off in ``[services]`` (a working session without it), and
``nxgate-client --sound`` itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

from nxgate.protocols import service_channels
from tests.harness.process import wait_for
from tests.test_e2e_client import TYPES as CLIENT_TYPES
from tests.test_e2e_client import ClientScreenTestCase, agent_processes
from tests.harness.pulse import PulseServer, analyse, tone
from tests.harness.ssh import Attachment, NXClient, SessionInfo
from tests.test_e2e_sessions import RED, START, SessionTestCase, proc_environ

FREQUENCY = 440.0
SECONDS = 1.0


def session_program(user: str) -> int:
    """The pid of the user's session program (the console's xterm)."""
    result = subprocess.run(["pgrep", "-u", user, "-x", "xterm"], capture_output=True, text=True)
    pids = [int(pid) for pid in result.stdout.split()]
    if not pids:
        raise AssertionError(f"no xterm of {user}")
    return pids[0]


def as_user(user: str, env: dict[str, str], *argv: str, timeout: float = 30) -> subprocess.CompletedProcess:
    """Run ``argv`` as ``user`` with exactly ``env`` (plus PATH/HOME)."""
    fixed = ["env", "-i", "PATH=/usr/bin:/bin", *(f"{key}={value}" for key, value in env.items())]
    return subprocess.run(["runuser", "-u", user, "--", *fixed, *argv], capture_output=True, text=True,
                          timeout=timeout)


class SoundTestCase(SessionTestCase):
    def setUp(self):
        super().setUp()
        self.pulse = PulseServer(self.gateway.workdir)
        self.addCleanup(self.pulse.close)
        self.tone = tone(os.path.join(self.pulse.dir, "tone.wav"), FREQUENCY, SECONDS)
        os.chmod(self.pulse.dir, 0o711)  # the session's user reads the tone file, nothing else

    def start_with_sound(self, client: NXClient, media: str = "1") -> SessionInfo:
        reply = client.command(START.format(name="sound", type="unix-console", extra="").replace(
            '--media="0"', f'--media="{media}"'), timeout=60)
        self.assertIn(b"NX> 710 Session status: running", reply, reply)
        return SessionInfo.parse(reply)

    def attach_with_sound(self, client: NXClient, info: SessionInfo) -> Attachment:
        port = self.pulse.load_tcp(service_channels.sound_cookie(info.cookie))
        attachment = Attachment(client, info, self.screen.name, self.gateway.workdir, options=f"media={port}")
        self.addCleanup(attachment.detach)
        self.screen.wait_for_colour(RED, 20000)
        return attachment

    def session_sound_env(self) -> dict[str, str]:
        env = proc_environ(session_program(self.user.name))
        return {key: env[key] for key in ("PULSE_SERVER", "PULSE_COOKIE", "HOME") if key in env}

    def assert_tone(self, recording: str) -> None:
        """The recording holds the tone: frequency within 2 %, duration within 10 %."""
        frequency, seconds = analyse(recording)
        self.assertTrue(abs(frequency - FREQUENCY) <= FREQUENCY * 0.02, f"heard {frequency:.1f} Hz")
        self.assertTrue(abs(seconds - SECONDS) <= SECONDS * 0.10, f"heard {seconds:.3f} s")

    def play_in_session(self, env: dict[str, str], user=None) -> subprocess.CompletedProcess:
        heard = self.pulse.record()
        time.sleep(0.5)
        played = as_user((user or self.user).name, env, "paplay", self.tone)
        time.sleep(0.8)
        self.pulse.stop_recording()
        self.heard = heard
        return played


class SoundTests(SoundTestCase):
    def test_a_tone_played_in_the_session_comes_out_of_the_clients_sound_server(self):
        client = self.login()
        info = self.start_with_sound(client)
        self.attach_with_sound(client, info)
        env = self.session_sound_env()
        self.assertEqual(env.get("PULSE_SERVER"), f"tcp:127.0.0.1:{7000 + info.display}")
        played = self.play_in_session(env)
        self.assertEqual(played.returncode, 0, played.stderr)
        self.assert_tone(self.heard)

    def test_sound_comes_back_after_a_resume_with_the_new_cookie(self):
        client = self.login()
        info = self.start_with_sound(client)
        attachment = self.attach_with_sound(client, info)
        cookie_file = self.session_sound_env()["PULSE_COOKIE"]
        self.assertTrue(os.path.exists(cookie_file))
        attachment.detach()
        self.wait_status(info.session_id, "Suspended")
        wait_for(lambda: not os.path.exists(cookie_file), 10, "the sound cookie to go at suspend")
        client = self.login()
        reply = client.command(START.format(name="x", type="unix-console", extra="").replace(
            "startsession", "restoresession").replace('--media="0"', '--media="1"') + f' --id="{info.session_id}"',
            timeout=60)
        resumed = SessionInfo.parse(reply)
        self.assertNotEqual(resumed.cookie, info.cookie)
        self.attach_with_sound(client, resumed)
        self.wait_status(info.session_id, "Running")  # the screen still shows the first attachment's picture
        with open(cookie_file, "rb") as handle:
            self.assertEqual(handle.read(), service_channels.sound_cookie(resumed.cookie))
        played = self.play_in_session(self.session_sound_env())
        self.assertEqual(played.returncode, 0, played.stderr)
        self.assert_tone(self.heard)

    def test_the_microphone_reaches_the_session(self):
        """The session records from the client's default source (here the
        null sink's monitor, into which the client side plays the tone)."""
        client = self.login()
        info = self.start_with_sound(client)
        self.attach_with_sound(client, info)
        env = self.session_sound_env()
        recording = os.path.join(self.user.home, "mic.wav")
        recorder = subprocess.Popen(
            ["runuser", "-u", self.user.name, "--", "env", "-i", "PATH=/usr/bin:/bin",
             *(f"{key}={value}" for key, value in env.items()),
             "parec", "--rate", "44100", "--channels", "1", "--format", "s16le", "--latency-msec", "20",
             "--file-format=wav", recording],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(1.0)
        self.assertEqual(self.pulse.play(self.tone).returncode, 0)
        time.sleep(2.0)
        recorder.terminate()
        recorder.wait(10)
        self.assert_tone(recording)

    def test_another_user_cannot_play_through_the_channel(self):
        client = self.login()
        info = self.start_with_sound(client)
        self.attach_with_sound(client, info)
        env = self.session_sound_env()
        cookie = env["PULSE_COOKIE"]
        stranger = as_user(self.other.name, {"HOME": self.other.home}, "cat", cookie)
        self.assertNotEqual(stranger.returncode, 0, "the stranger read the session's sound cookie")
        # The port itself is on loopback for every local user: the client's
        # sound server refuses him for want of the cookie.
        played = self.play_in_session({"PULSE_SERVER": env["PULSE_SERVER"], "HOME": self.other.home},
                                      user=self.other)
        self.assertNotEqual(played.returncode, 0, played.stderr)
        self.assertEqual(analyse(self.heard), (0.0, 0.0))

    def test_without_media_the_session_has_no_sound_channel(self):
        client = self.login()
        info = self.start_with_sound(client, media="0")
        self.attach_with_sound(client, info)
        self.assertNotIn("PULSE_SERVER", self.session_sound_env())


class SoundSwitchedOffTests(SoundTestCase):
    options = {"services": {"sound": "no"}}

    def test_a_client_asking_for_sound_gets_a_working_session_without_it(self):
        client = self.login()
        info = self.start_with_sound(client)  # asks for --media="1"
        self.attach_with_sound(client, info)  # the session draws: it works
        env = self.session_sound_env()
        self.assertNotIn("PULSE_SERVER", env)
        port = 7000 + info.display
        played = self.play_in_session({"PULSE_SERVER": f"tcp:127.0.0.1:{port}", "HOME": self.user.home})
        self.assertNotEqual(played.returncode, 0)
        self.assertEqual(analyse(self.heard), (0.0, 0.0))


class ClientSoundTests(ClientScreenTestCase):
    """``nxgate-client --sound`` against the real gateway, with the private
    PulseAudio standing in for the user's sound server."""

    options = {"sessions": {"display_base": "860", "display_limit": "100", "connect_timeout": "60"},
               "types": CLIENT_TYPES}

    def setUp(self):
        super().setUp()
        self.pulse = PulseServer(self.gateway.workdir)
        self.addCleanup(self.pulse.close)
        self.tone = tone(os.path.join(self.pulse.dir, "tone.wav"), FREQUENCY, SECONDS)
        os.chmod(self.pulse.dir, 0o711)

    def tcp_modules(self) -> list[str]:
        return [line for line in self.pulse.pactl("list", "short", "modules").stdout.splitlines()
                if "module-native-protocol-tcp" in line]

    def test_sound_plays_on_the_clients_sound_server_and_its_port_goes_with_the_client(self):
        client = self.background(self.argv("--geometry", "800x600", "--sound", "--sound-server",
                                           f"unix:{self.pulse.socket}"), DISPLAY=self.screen.name)
        self.screen.wait_for_colour(RED, 20000, timeout=60)
        self.assertEqual(len(self.tcp_modules()), 1)
        env = proc_environ(session_program(self.user.name))
        env = {key: env[key] for key in ("PULSE_SERVER", "PULSE_COOKIE", "HOME")}
        heard = self.pulse.record()
        time.sleep(0.5)
        played = as_user(self.user.name, env, "paplay", self.tone)
        time.sleep(0.8)
        self.pulse.stop_recording()
        self.assertEqual(played.returncode, 0, played.stderr)
        frequency, seconds = analyse(heard)
        self.assertTrue(abs(frequency - FREQUENCY) <= FREQUENCY * 0.02, f"heard {frequency:.1f} Hz")
        self.assertTrue(abs(seconds - SECONDS) <= SECONDS * 0.10, f"heard {seconds:.3f} s")
        client.send_signal(signal.SIGTERM)
        client.wait(30)
        self.assertEqual(self.tcp_modules(), [])
        for pid in agent_processes(self.user.name):
            os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not agent_processes(self.user.name), 20, "the agents to end")
