#!/usr/bin/env python3
"""X2Go's sound through reverse streams: latency of a click from the session to the client's speakers.

A real gateway, a console session started by Debian's pyhoca-cli with ``--sound pulse``, whose forwarded
channels reach a private PulseAudio's native TCP port 4713 with the client's cookie (as in
tests/test_e2e_x2go_sound.py).  A 20 ms click is played with ``paplay`` in the session (as the user, with
the session program's PULSE_SERVER/PULSE_COOKIE: a new PulseAudio connection each time, so each run
includes the whole reverse path: the node's listener, the route's announcement, ``open_stream`` of the
connection, the ``forwarded-tcpip`` channel, pyhoca-cli's own forward to port 4713) and, alternating with
it, straight into the client's PulseAudio (the baseline); the null sink's monitor times its arrival
(bench/sound_latency.py's Monitor).  Median and p90 of --runs each.

    .venv/bin/python bench/x2go_sound.py [--runs 10] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
sys.path.insert(0, HERE)

from sound_latency import Monitor, sox  # noqa: E402
from tests.harness.gateway import Gateway  # noqa: E402
from tests.harness.process import stop, wait_for  # noqa: E402
from tests.harness.pulse import SINK, PulseServer  # noqa: E402
from tests.harness.users import create_user  # noqa: E402
from tests.harness.x11 import ClientScreen  # noqa: E402
from tests.test_e2e_sessions import proc_environ  # noqa: E402


def xterm_of(user: str) -> int:
    def found() -> int | None:
        pids = subprocess.run(["pgrep", "-u", user, "-x", "xterm"], capture_output=True, text=True).stdout.split()
        return int(pids[0]) if pids else None
    return wait_for(found, 90, "the session program")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--json", default=os.path.join(REPO, "bench", "results", "x2go_sound.json"))
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench/x2go_sound.py needs root (it creates a Unix user)", file=sys.stderr)
        return 2
    user = create_user()
    gateway = Gateway({"sessions": {"display_base": "1540", "display_limit": "20"},
                       "types": {"unix-console": "xterm -bg #ff0000 -geometry 60x15+10+10"}}).start()
    screen = ClientScreen(800, 600, window_manager=True)
    workdir = tempfile.mkdtemp(prefix="x2go-sound-bench-")
    os.chmod(workdir, 0o711)
    home = tempfile.mkdtemp(prefix="x2go-sound-bench-home-")
    os.makedirs(os.path.join(home, ".config", "pulse"))
    cookie = secrets.token_bytes(256)
    with open(os.path.join(home, ".config", "pulse", "cookie"), "wb") as handle:
        handle.write(cookie)
    pulse = PulseServer(workdir)
    pulse.load_tcp(cookie, 4713)
    monitor = client = None
    try:
        click = sox(os.path.join(workdir, "click.wav"), "0.02", "sine", "1000")
        client = subprocess.Popen(
            ["pyhoca-cli", "--server", "127.0.0.1", "-p", str(gateway.port), "-l", user.name, "--password",
             user.password, "--add-to-known-hosts", "-c", "TERMINAL", "-g", "800x600", "-q", "lan", "--sound",
             "pulse"], env=dict(os.environ, DISPLAY=screen.name, HOME=home), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: "the client's PulseAudio cookie is in place" in gateway.log(), 120, "the client's cookie")
        environ = proc_environ(xterm_of(user.name))
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

        latency(in_session)  # warm-up
        session_ms, local_ms = [], []
        for _ in range(args.runs):  # the two ways alternate: the machine's load meets both alike
            session_ms.append(latency(in_session))
            local_ms.append(latency(locally))
        load = os.getloadavg()[0]
    finally:
        if monitor is not None:
            monitor.close()
        if client is not None:
            stop(client)
        pulse.close()
        screen.close()
        gateway.stop()
        user.remove()

    def p90(values: list[float]) -> float:
        return sorted(values)[max(0, int(round(0.9 * len(values))) - 1)]

    result = {"latency_ms_median": statistics.median(session_ms), "latency_ms_p90": p90(session_ms),
              "local_ms_median": statistics.median(local_ms), "local_ms_p90": p90(local_ms),
              "reverse_adds_ms": statistics.median(session_ms) - statistics.median(local_ms),
              "load_1min": load, "runs": {"session": session_ms, "local": local_ms}}
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as handle:
        json.dump(result, handle, indent=2)
    print(f"click latency session -> X2Go client: median {result['latency_ms_median']:.0f} ms, "
          f"p90 {result['latency_ms_p90']:.0f} ms")
    print(f"same click played locally:           median {result['local_ms_median']:.0f} ms, "
          f"p90 {result['local_ms_p90']:.0f} ms (the reverse path adds {result['reverse_adds_ms']:.0f} ms;"
          f" load {load:.1f})")
    print(f"(JSON: {args.json})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
