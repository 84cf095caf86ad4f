#!/usr/bin/env python3
"""How fast the VNC viewer engine starts and draws, against local VNC servers.

For each server/encoding row: an Xvfb host of 1024x768 (orange root window)
served by x11vnc (or Xtigervnc with --servers), the viewer drawing into a
second Xvfb of the same size, both on this machine (no network cost).

* start -> ready: the viewer process spawned until its ``ready WxH`` status
  line (Python start-up, imports, TCP, RFB handshake), median of --runs;
* start -> picture: same start until the viewer's screen shows the remote
  colour at all probe points, SIGUSR1 being sent as soon as ``ready`` came;
* frames/s for full-screen changes: the host's root window alternates
  between two colours as fast as the viewer shows them (change, wait until
  every probe point on the viewer's screen has the new colour, repeat);
  reported as 1 / median frame time over --frames frames, with p90.

Screens are read with python-xlib GetImage on a few pixels, not screenshots,
so polling costs well under a millisecond.

    .venv/bin/python bench/viewer_vnc.py [--runs 5] [--frames 30] [--servers x11vnc,tigervnc] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from Xlib import X, display  # noqa: E402

from tests.harness.vnchost import ORANGE, PYTHON, VNCHost, ViewerProcess  # noqa: E402
from tests.harness.x11 import ClientScreen  # noqa: E402

WIDTH, HEIGHT = 1024, 768
# Away from the centre, where the host's pointer (and x11vnc's drawn cursor) is.
PROBES = [(5, 5), (WIDTH - 6, 5), (5, HEIGHT - 6), (WIDTH - 6, HEIGHT - 6), (300, 200), (700, 600)]
COLOURS = [(0, 128, 255), (40, 200, 40)]


def pixel(colour: tuple[int, int, int]) -> int:
    return colour[0] << 16 | colour[1] << 8 | colour[2]


class Probe:
    """Reads a few pixels of an X screen."""

    def __init__(self, name: str) -> None:
        self.display = display.Display(name)
        self.root = self.display.screen().root

    def shows(self, colour: tuple[int, int, int]) -> bool:
        want = bytes((colour[2], colour[1], colour[0]))
        for x, y in PROBES:
            data = self.root.get_image(x, y, 1, 1, X.ZPixmap, 0xFFFFFFFF).data
            if data[:3] != want:
                return False
        return True

    def wait(self, colour: tuple[int, int, int], timeout: float = 20.0) -> float:
        deadline = time.monotonic() + timeout
        while not self.shows(colour):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{colour} not shown within {timeout}s")
            time.sleep(0.0005)
        return time.monotonic()


class Painter:
    """Changes the host's root window colour (a child process: python-xlib
    cannot hold Xvfb and Xtigervnc displays in one process)."""

    def __init__(self, name: str) -> None:
        self.process = subprocess.Popen([PYTHON, "-m", "tests.harness.vnchost", "paint", name], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=REPO))

    def paint(self, colour: tuple[int, int, int]) -> None:
        self.process.stdin.write(b"%06x\n" % pixel(colour))
        self.process.stdin.flush()
        assert self.process.stdout.readline() == b"ok\n"

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(10)


def run_row(server: str, encoding: str, runs: int, frames: int) -> dict:
    host = VNCHost(server, None, WIDTH, HEIGHT, ORANGE)
    screen = ClientScreen(WIDTH, HEIGHT)
    probe, painter = Probe(screen.name), Painter(host.name)
    ready, picture, frame_times = [], [], []
    try:
        for _ in range(runs):
            painter.paint(ORANGE)
            screen.xdotool("mousemove", str(WIDTH // 2), str(HEIGHT // 2))
            viewer = ViewerProcess(host.port, screen.name, None, extra=("--encoding", encoding))
            try:
                line = viewer.status_line()
                ready.append(time.monotonic() - viewer.started)
                assert line == f"ready {WIDTH}x{HEIGHT}", line
                viewer.attach()
                picture.append(probe.wait(ORANGE) - viewer.started)
                if not frame_times:  # the frame rate from the first run's viewer
                    for number in range(frames + 2):
                        colour = COLOURS[number % 2]
                        started = time.monotonic()
                        painter.paint(colour)
                        frame_times.append(probe.wait(colour) - started)
                    del frame_times[:2]  # warm-up
            finally:
                viewer.close()
            # A black screen again for the next run's first picture.
            blank = display.Display(screen.name)
            blank.screen().root.clear_area(0, 0, 0, 0)
            blank.close()
    finally:
        painter.close()
        probe.display.close()
        host.close()
        screen.close()
    frame = statistics.median(frame_times)
    return {
        "server": server, "encoding": encoding, "runs": runs, "frames": len(frame_times),
        "start_to_ready_s": statistics.median(ready), "start_to_picture_s": statistics.median(picture),
        "frame_median_s": frame, "frame_p90_s": sorted(frame_times)[int(0.9 * (len(frame_times) - 1))],
        "fps": 1 / frame, "ready_all_s": ready, "picture_all_s": picture,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--frames", type=int, default=30)
    parser.add_argument("--servers", default="x11vnc")
    parser.add_argument("--encodings", default="hextile,raw,zrle")
    parser.add_argument("--json", default=os.path.join(REPO, "bench", "results", "viewer_vnc.json"))
    args = parser.parse_args()
    rows = [run_row(server, encoding, args.runs, args.frames)
            for server in args.servers.split(",") for encoding in args.encodings.split(",")]
    print(f"VNC viewer engine, {WIDTH}x{HEIGHT}, loopback; medians of {args.runs} starts / {args.frames} frames")
    print(f"{'server':<9} {'encoding':<8} {'start->ready':>13} {'start->picture':>15} {'frame':>9} {'p90':>9} "
          f"{'fps':>7}")
    for r in rows:
        print(f"{r['server']:<9} {r['encoding']:<8} {r['start_to_ready_s'] * 1000:>10.0f} ms "
              f"{r['start_to_picture_s'] * 1000:>12.0f} ms {r['frame_median_s'] * 1000:>6.1f} ms "
              f"{r['frame_p90_s'] * 1000:>6.1f} ms {r['fps']:>7.1f}")
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as handle:
        json.dump({"width": WIDTH, "height": HEIGHT, "rows": rows}, handle, indent=2)
    print(f"(JSON: {args.json})")


if __name__ == "__main__":
    main()
