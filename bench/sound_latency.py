#!/usr/bin/env python3
"""Sound through NX: latency of a click from the session to the client's
speakers, and the bandwidth of a playing stream (issue 14).

A real gateway, a console session attached by the real ``nxproxy -S`` with
``media=PORT`` onto a private PulseAudio (tests/harness/pulse.py), as in
tests/test_e2e_sound.py.  The null sink's monitor is read with ``parec
--raw --latency-msec 5`` and every chunk is time-stamped as it arrives, so
the first loud sample of a click has a wall-clock time.

* latency: from just before ``paplay`` of a 20 ms click starts in the
  session (as the user, with the session's PULSE_SERVER/PULSE_COOKIE) to the
  click's arrival in the client's null sink; median and p90 of --runs.  The
  same click played straight into the client's PulseAudio (no NX) is the
  baseline: the difference is what the NX media channel adds.  Both include
  starting paplay (and, in the session, runuser).
* bandwidth: a 5 s 44.1 kHz stereo 16-bit tone (1411 kbit/s of PCM) played
  in the session; the client nxproxy's bytes read (the NX link) and written
  (to PulseAudio) per second, from /proc/PID/io.

    .venv/bin/python bench/sound_latency.py [--runs 10] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from nxgate.protocols import service_channels  # noqa: E402
from tests.harness.gateway import Gateway  # noqa: E402
from tests.harness.pulse import RATE, SINK, PulseServer  # noqa: E402
from tests.harness.ssh import Attachment, NXClient, SessionInfo  # noqa: E402
from tests.harness.users import create_user  # noqa: E402
from tests.harness.x11 import ClientScreen  # noqa: E402
from tests.test_e2e_sessions import RED, START, proc_environ  # noqa: E402
from tests.test_e2e_sound import session_program  # noqa: E402

TARGET_MS = 150
THRESHOLD = 0.2


class Monitor:
    """parec on the null sink's monitor; (arrival time, samples) per chunk."""

    def __init__(self, pulse: PulseServer) -> None:
        self.process = subprocess.Popen(
            ["parec", "--raw", "-d", f"{SINK}.monitor", "--rate", str(RATE), "--channels", "1", "--format",
             "s16le", "--latency-msec", "5"], env=pulse.env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.chunks: list[tuple[float, numpy.ndarray]] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        stream = self.process.stdout
        while data := os.read(stream.fileno(), 4096):
            now = time.monotonic()
            if len(data) % 2:
                data += os.read(stream.fileno(), 1)
            with self.lock:
                self.chunks.append((now, numpy.frombuffer(data, dtype="<i2").astype(float) / 32768.0))

    def first_loud_after(self, since: float) -> float | None:
        """Arrival time of the first chunk after ``since`` holding a loud sample."""
        with self.lock:
            chunks = list(self.chunks)
        for arrived, values in chunks:
            if arrived >= since and numpy.any(numpy.abs(values) > THRESHOLD):
                return arrived
        return None

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(5)


def io_bytes(pid: int) -> tuple[int, int]:
    with open(f"/proc/{pid}/io") as handle:
        fields = dict(line.split(": ") for line in handle.read().splitlines())
    return int(fields["rchar"]), int(fields["wchar"])


def sox(path: str, *effect: str, channels_: int = 1) -> str:
    subprocess.run(["sox", "-n", "-r", str(RATE), "-c", str(channels_), "-b", "16", path, "synth", *effect],
                   check=True)
    os.chmod(path, 0o644)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--json", default=os.path.join(REPO, "bench", "results", "sound.json"))
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench/sound_latency.py needs root (it creates a Unix user)", file=sys.stderr)
        return 2
    user = create_user()
    gateway = Gateway({"sessions": {"display_base": "1500", "display_limit": "20"},
                       "types": {"unix-console": "xterm -bg #ff0000 -geometry 60x15+10+10"}}).start()
    screen = ClientScreen(800, 600)
    workdir = tempfile.mkdtemp(prefix="sound-bench-")
    os.chmod(workdir, 0o711)
    pulse = PulseServer(workdir)
    monitor = None
    try:
        click = sox(os.path.join(workdir, "click.wav"), "0.02", "sine", "1000")
        stream = sox(os.path.join(workdir, "stream.wav"), "5", "sine", "440", channels_=2)
        client = NXClient(gateway.port)
        client.greet()
        client.login(user.name, user.password)
        client.prompt()
        reply = client.command(START.format(name="bench", type="unix-console", extra="").replace(
            '--media="0"', '--media="1"'), timeout=60)
        info = SessionInfo.parse(reply)
        port = pulse.load_tcp(service_channels.sound_cookie(info.cookie))
        attachment = Attachment(client, info, screen.name, workdir, options=f"media={port}")
        screen.wait_for_colour(RED, 20000)
        environ = proc_environ(session_program(user.name))
        env = [f"{key}={environ[key]}" for key in ("PULSE_SERVER", "PULSE_COOKIE", "HOME")]
        in_session = ["runuser", "-u", user.name, "--", "env", "-i", "PATH=/usr/bin:/bin", *env, "paplay"]
        locally = ["env", *(f"{k}={v}" for k, v in pulse.env().items()), "paplay", "-d", SINK]
        monitor = Monitor(pulse)
        time.sleep(1)

        def latency(argv: list[str]) -> float:
            started = time.monotonic()
            subprocess.run([*argv, click], check=True, capture_output=True, timeout=30)
            deadline = time.monotonic() + 5
            while (arrived := monitor.first_loud_after(started)) is None and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.3)
            if arrived is None:
                raise RuntimeError("the click never arrived")
            return (arrived - started) * 1000

        latency(in_session)  # warm-up: first connection, caches
        session_ms = [latency(in_session) for _ in range(args.runs)]
        local_ms = [latency(locally) for _ in range(args.runs)]
        proxy_pid = attachment.proxy.pid
        before, started = io_bytes(proxy_pid), time.monotonic()
        subprocess.run([*in_session, stream], check=True, capture_output=True, timeout=60)
        after, seconds = io_bytes(proxy_pid), time.monotonic() - started
        link_kbps = (after[0] - before[0]) * 8 / seconds / 1000
        pulse_kbps = (after[1] - before[1]) * 8 / seconds / 1000
        attachment.detach()
        client.close()
    finally:
        if monitor is not None:
            monitor.close()
        pulse.close()
        screen.close()
        gateway.stop()
        user.remove()

    def p90(values: list[float]) -> float:
        return sorted(values)[max(0, int(round(0.9 * len(values))) - 1)]

    result = {
        "latency_ms_median": statistics.median(session_ms), "latency_ms_p90": p90(session_ms),
        "local_ms_median": statistics.median(local_ms), "local_ms_p90": p90(local_ms),
        "nx_adds_ms": statistics.median(session_ms) - statistics.median(local_ms),
        "target_ms": TARGET_MS, "stream_pcm_kbps": RATE * 2 * 16 / 1000,
        "link_kbps": link_kbps, "to_pulse_kbps": pulse_kbps, "runs": {"session": session_ms, "local": local_ms},
    }
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as handle:
        json.dump(result, handle, indent=2)
    print(f"click latency session -> client: median {result['latency_ms_median']:.0f} ms, "
          f"p90 {result['latency_ms_p90']:.0f} ms (target < {TARGET_MS} ms)")
    print(f"same click played locally:       median {result['local_ms_median']:.0f} ms, "
          f"p90 {result['local_ms_p90']:.0f} ms (NX adds {result['nx_adds_ms']:.0f} ms)")
    print(f"stream of {result['stream_pcm_kbps']:.0f} kbit/s PCM: NX link {link_kbps:.0f} kbit/s, "
          f"to PulseAudio {pulse_kbps:.0f} kbit/s")
    print(f"(JSON: {args.json})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
