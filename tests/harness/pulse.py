"""A real PulseAudio daemon on the client's side of a sound test, and the
analysis of what it heard (issue 14).

The daemon is private to the test: ``--system=false`` in a temporary home
and runtime directory, no default configuration (``-n``), a null sink whose
monitor is what the client's speakers would have played, and its own Unix
socket for the test's ``parec``/``paplay``.  The native-protocol TCP port
that the client's ``nxproxy -S media=PORT`` connects to is loaded later,
with the session's cookie, as ``nxgate-client --sound`` does
(:meth:`PulseServer.load_tcp`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import wave

import numpy

from tests.harness.net import free_port
from tests.harness.process import stop, wait_for

RATE = 44100
SINK = "nxsink"


class PulseServer:
    def __init__(self, workdir: str | None = None) -> None:
        self.dir = tempfile.mkdtemp(prefix="pulse-", dir=workdir)
        os.chmod(self.dir, 0o700)
        self.home = os.path.join(self.dir, "home")
        self.runtime = os.path.join(self.dir, "runtime")
        for path in (self.home, self.runtime):
            os.mkdir(path, 0o700)
        self.socket = os.path.join(self.dir, "native")
        self.log = os.path.join(self.dir, "pulseaudio.log")
        self.recorders: list[subprocess.Popen] = []
        self.process = subprocess.Popen(
            ["pulseaudio", "-n", "--daemonize=no", "--system=false", "--exit-idle-time=-1", "--use-pid-file=no",
             "--disable-shm=yes", "--log-target=stderr",
             "-L", f"module-null-sink sink_name={SINK} rate={RATE} channels=1",
             "-L", f"module-native-protocol-unix socket={self.socket} auth-anonymous=1"],
            env=self.env(daemon=True), stdin=subprocess.DEVNULL, stdout=open(self.log, "wb"), stderr=subprocess.STDOUT)
        wait_for(lambda: self.pactl("info").returncode == 0, 15, "PulseAudio to answer")
        # The session's microphone is this sink's monitor (what the test plays here).
        self.pactl("set-default-sink", SINK)
        self.pactl("set-default-source", f"{SINK}.monitor")

    def env(self, daemon: bool = False) -> dict[str, str]:
        env = {"HOME": self.home, "XDG_RUNTIME_DIR": self.runtime, "PATH": "/usr/bin:/bin"}
        return env if daemon else {**env, "PULSE_SERVER": f"unix:{self.socket}"}

    def pactl(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["pactl", *args], env=self.env(), capture_output=True, text=True, timeout=15)

    def load_tcp(self, cookie: bytes, port: int = 0) -> int:
        """A native-protocol TCP port on 127.0.0.1 (``port``, or a free one) that demands ``cookie``; its number."""
        port = port or free_port()
        # One file per module: PulseAudio shares a cookie loaded from the same
        # path between modules, so a second one would demand the first cookie.
        path = os.path.join(self.dir, f"session-cookie-{port}")
        with open(path, "wb") as handle:
            handle.write(cookie)
        result = self.pactl("load-module", "module-native-protocol-tcp", f"port={port}", "listen=127.0.0.1",
                            "auth-anonymous=0", "auth-cookie-enabled=1", f"auth-cookie={path}")
        if result.returncode != 0:
            raise AssertionError(f"cannot load the TCP module: {result.stderr}")
        return port

    def record(self, name: str = "heard.wav") -> str:
        """Start recording what the null sink plays; stop with :meth:`stop_recording`."""
        path = os.path.join(self.dir, name)
        self.recorders.append(subprocess.Popen(
            ["parec", "-d", f"{SINK}.monitor", "--rate", str(RATE), "--channels", "1", "--format", "s16le",
             "--latency-msec", "10", "--file-format=wav", path],
            env=self.env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        return path

    def stop_recording(self) -> None:
        while self.recorders:
            stop(self.recorders.pop(), grace=3)

    def play(self, path: str) -> subprocess.CompletedProcess:
        return subprocess.run(["paplay", "-d", SINK, path], env=self.env(), capture_output=True, timeout=30)

    def close(self) -> None:
        self.stop_recording()
        stop(self.process, grace=3)
        if not os.environ.get("NXGATE_KEEP_TEST_DIRS"):
            shutil.rmtree(self.dir, ignore_errors=True)


def tone(path: str, frequency: float, seconds: float) -> str:
    """A mono 16-bit WAV of a sine tone (sox), readable by any user."""
    subprocess.run(["sox", "-n", "-r", str(RATE), "-c", "1", "-b", "16", path, "synth", str(seconds), "sine",
                    str(frequency), "vol", "0.5"], check=True)
    os.chmod(path, 0o644)
    return path


def samples(path: str) -> numpy.ndarray:
    """The samples of a 16-bit WAV as floats in [-1, 1] (mono: the first channel)."""
    with wave.open(path, "rb") as handle:
        channels, width, rate = handle.getnchannels(), handle.getsampwidth(), handle.getframerate()
        data = handle.readframes(handle.getnframes())
    assert width == 2 and rate == RATE, (width, rate)
    values = numpy.frombuffer(data, dtype="<i2").astype(float) / 32768.0
    return values[::channels]


def analyse(path: str, threshold: float = 0.05) -> tuple[float, float]:
    """(frequency in Hz, seconds of sound) of what a recording heard: the
    sound is the span between the first and last sample louder than
    ``threshold``; its frequency the strongest FFT bin there (interpolated)."""
    values = samples(path)
    loud = numpy.flatnonzero(numpy.abs(values) > threshold)
    if loud.size == 0:
        return 0.0, 0.0
    part = values[loud[0]:loud[-1] + 1]
    spectrum = numpy.abs(numpy.fft.rfft(part * numpy.hanning(part.size)))
    peak = int(numpy.argmax(spectrum[1:])) + 1
    if 1 <= peak < spectrum.size - 1:  # parabolic interpolation between the neighbouring bins
        left, centre, right = spectrum[peak - 1], spectrum[peak], spectrum[peak + 1]
        peak += 0.5 * (left - right) / (left - 2 * centre + right)
    return peak * RATE / part.size, part.size / RATE


def onset(path: str, threshold: float = 0.05) -> float | None:
    """Seconds from the start of a recording to its first loud sample."""
    loud = numpy.flatnonzero(numpy.abs(samples(path)) > threshold)
    return None if loud.size == 0 else loud[0] / RATE
