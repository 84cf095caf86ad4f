#!/usr/bin/env python3
"""How fast the RDP viewer engine starts and draws, against xrdp on loopback.

xrdp (see tests/harness/rdphost.py) shows its login screen at 1024x768; the
viewer draws into an Xvfb of the same size.  Rows:

* start -> ready: the viewer process spawned until its ``ready WxH`` status
  line (Python start-up, imports, TCP, TLS, RDP handshake), median of --runs;
* SIGUSR1 -> picture: SIGUSR1 sent as soon as ``ready`` came, until the
  viewer's screen matches the login screen at every probe point (a grid of
  pixels taken from a settled picture);
* xfreerdp start -> picture: the same picture check for
  ``xfreerdp /sec:tls /f`` (no ready/attach phases: spawn to picture);
* refresh frames/s: in-process, the engine asks xrdp to repaint the whole
  screen (an RDP Refresh Rect PDU) and waits until the repaint is decoded
  and drawn, --frames times: xrdp's encoding, loopback TLS, rdpy's parsing,
  decoding and drawing, one full frame at a time;
* replay frames/s: the bitmap updates of one full login screen (captured
  above) decoded and drawn again --frames times through the engine's own
  path (Viewer.onUpdate + Viewer.draw into an XCanvas), and decoded only.

xfreerdp has no equivalent of the last two: nothing outside it can make it
repaint, and xrdp's login screen never changes by itself.

    .venv/bin/python bench/viewer_rdp.py [--runs 5] [--frames 50] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from Xlib import X, display  # noqa: E402

from tests.harness.rdphost import MAGENTA, RDPHost, rdp_viewer, xfreerdp  # noqa: E402
from tests.harness.x11 import ClientScreen  # noqa: E402

WIDTH, HEIGHT = 1024, 768


class Probe:
    """Compares a grid of pixels of an X screen with a reference picture."""

    def __init__(self, name: str) -> None:
        self.display = display.Display(name)
        self.root = self.display.screen().root
        self.points: list[tuple[int, int, bytes]] = []

    def pixel(self, x: int, y: int) -> bytes:
        return self.root.get_image(x, y, 1, 1, X.ZPixmap, 0xFFFFFFFF).data[:3]

    def learn(self) -> None:
        """Take the reference from what the screen shows now (an 8x6 grid,
        plus points in the login box's logo and fields: 68 round trips, ~7 ms)."""
        points = [(x * WIDTH // 8 + 40, y * HEIGHT // 6 + 40) for x in range(8) for y in range(6)]
        points += [(x, y) for x in range(400, 640, 48) for y in range(230, 460, 58)]
        self.points = [(x, y, self.pixel(x, y)) for x, y in points]

    def matches(self) -> bool:
        return all(self.pixel(x, y) == want for x, y, want in self.points)

    def wait(self, timeout: float = 20.0) -> float:
        """Seconds until the screen matches (polled every 2 ms)."""
        start = time.monotonic()
        while not self.matches():
            if time.monotonic() - start > timeout:
                raise RuntimeError("the picture never appeared")
            time.sleep(0.002)
        return time.monotonic()

    def close(self) -> None:
        self.display.close()


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def startup(host: RDPHost, screen: ClientScreen, probe: Probe, runs: int) -> dict[str, Any]:
    ready, picture, native = [], [], []
    for _ in range(runs):
        viewer = rdp_viewer(host.port, screen.name)
        try:
            if viewer.status_line(30) != f"ready {WIDTH}x{HEIGHT}":
                raise RuntimeError(viewer.output())
            at_ready = time.monotonic()
            viewer.attach()
            done = probe.wait()
            ready.append(at_ready - viewer.started)
            picture.append(done - at_ready)
        finally:
            viewer.close()
        clear(screen)
        process = xfreerdp(host.port, screen.name)
        try:
            native.append(probe.wait() - process.started)
        finally:
            process.close()
        clear(screen)
    return {"start_to_ready_s": median(ready), "sigusr1_to_picture_s": median(picture),
            "start_to_picture_s": median([a + b for a, b in zip(ready, picture)]),
            "xfreerdp_start_to_picture_s": median(native), "runs": runs}


def clear(screen: ClientScreen) -> None:
    """Paint the root window black, so the next run starts from nothing."""
    conn = display.Display(screen.name)
    root = conn.screen().root
    root.change_attributes(background_pixel=0)
    root.clear_area(0, 0, 0, 0)
    conn.sync()
    conn.close()


def in_process(host: RDPHost, screen: ClientScreen, frames: int) -> dict[str, Any]:
    """Refresh-driven frames over the network, then the offline replay."""
    from twisted.internet import reactor
    from twisted.internet.task import Clock

    from nxgate.clients.engines import common, rdp

    os.environ["DISPLAY"] = screen.name
    args = argparse.Namespace(host="127.0.0.1", port=host.port, geometry=f"{WIDTH}x{HEIGHT}", keyboard="pc105/us",
                              timeout=15.0, user="", domain="", security="tls", bpp=32, title="bench")

    class Silent:
        def ready(self, width: int, height: int) -> None:
            pass

        def error(self, problem: Any) -> None:
            raise SystemExit(f"viewer failed: {problem}")

    class Timed(rdp.Viewer):
        """Keeps the updates of the first screen; then asks xrdp to repaint
        everything, learns how much area one repaint covers, and times
        repaints until they are decoded and drawn."""

        def __init__(self, *a: Any) -> None:
            super().__init__(*a)
            self.captured: list[tuple] = []
            self.times: list[float] = []
            self.area, self.full, self.asked = 0, 0, 0.0

        def onUpdate(self, *update: Any) -> None:
            if not self.asked:
                self.captured.append(update)
            self.area += (update[2] - update[0] + 1) * (update[3] - update[1] + 1)
            super().onUpdate(*update)

        def draw(self) -> None:
            super().draw()
            if not self.asked and self.area >= WIDTH * HEIGHT:  # the login screen is complete
                self.refresh()
                reactor.callLater(1.0, self.learned)
            elif self.full and self.area >= self.full:
                self.times.append(time.monotonic() - self.asked)
                if len(self.times) >= frames:
                    reactor.stop()
                else:
                    self.refresh()

        def learned(self) -> None:
            self.full = self.area
            self.refresh()

        def refresh(self) -> None:
            self.area, self.asked = 0, time.monotonic()
            self.controller.sendRefreshOrder(0, 0, WIDTH - 1, HEIGHT - 1)

    viewer = Timed(reactor, args, "", Silent())
    viewer.attach_wanted = True
    reactor.callLater(60, reactor.stop)
    viewer.start()
    reactor.run()
    canvas = viewer.canvas
    if canvas is None or len(viewer.times) < frames:
        raise SystemExit("the in-process viewer did not get its frames")
    updates = viewer.captured
    size = sum(len(u[8]) for u in updates)

    replay = Timed(Clock(), args, "", Silent())  # a fake reactor: nothing runs by itself
    replay.canvas, replay.stage = canvas, "ready"
    replay.reader = common.XReader(canvas, lambda event: None, lambda: None)

    def run(draw: bool) -> float:
        start = time.monotonic()
        for _ in range(frames):
            for update in updates:
                rdp.Viewer.onUpdate(replay, *update)
            if draw:
                rdp.Viewer.draw(replay)
            replay.damage = []
        return frames / (time.monotonic() - start)

    decode_fps, replay_fps = run(False), run(True)
    start = time.monotonic()
    for _ in range(frames):
        canvas.put(0, 0, WIDTH, HEIGHT, replay.framebuffer.tobytes())
    put_fps = frames / (time.monotonic() - start)
    frame_times = sorted(viewer.times)
    return {"refresh_fps": 1 / median(frame_times), "refresh_p90_ms": 1000 * frame_times[int(0.9 * (len(frame_times) - 1))],
            "replay_fps": replay_fps, "decode_only_fps": decode_fps, "full_put_fps": put_fps,
            "rects_per_screen": len(updates), "bytes_per_screen": size, "frames": frames}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--frames", type=int, default=50)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    host, screen = RDPHost(), ClientScreen(WIDTH, HEIGHT)
    probe = Probe(screen.name)
    try:
        process = xfreerdp(host.port, screen.name)  # the reference picture, drawn by FreeRDP
        try:
            deadline = time.monotonic() + 20
            while screen.shot().count(MAGENTA) < WIDTH * HEIGHT // 2 and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(1)
            probe.learn()
        finally:
            process.close()
        clear(screen)
        load = os.getloadavg()[0]
        result = startup(host, screen, probe, args.runs)
        result.update(in_process(host, screen, args.frames))
        result.update(cpus=os.cpu_count(), load_before=load, load_after=os.getloadavg()[0])
    finally:
        probe.close()
        screen.close()
        host.close()
    rows = [("start -> ready", f"{1000 * result['start_to_ready_s']:.0f} ms"),
            ("SIGUSR1 -> picture", f"{1000 * result['sigusr1_to_picture_s']:.0f} ms"),
            ("start -> picture", f"{1000 * result['start_to_picture_s']:.0f} ms"),
            ("xfreerdp start -> picture", f"{1000 * result['xfreerdp_start_to_picture_s']:.0f} ms"),
            ("refresh frames/s (xrdp -> screen)", f"{result['refresh_fps']:.1f} (p90 {result['refresh_p90_ms']:.0f} ms)"),
            ("replay decode+draw frames/s", f"{result['replay_fps']:.1f}"),
            ("replay decode-only frames/s", f"{result['decode_only_fps']:.1f}"),
            ("full-screen PutImage frames/s", f"{result['full_put_fps']:.1f}"),
            ("one login screen", f"{result['rects_per_screen']} rects, {result['bytes_per_screen'] / 1024:.0f} KiB")]
    print(f"RDP viewer engine (rdpy) vs xrdp on loopback, {WIDTH}x{HEIGHT}, {args.runs} runs / {args.frames} frames"
          f" ({result['cpus']} CPUs, load {result['load_before']:.1f} -> {result['load_after']:.1f})")
    for name, value in rows:
        print(f"  {name:<36} {value}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"width": WIDTH, "height": HEIGHT, **result}, handle, indent=2)
        print(f"(JSON: {args.json})")


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    main()
