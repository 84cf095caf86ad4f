"""Client screens for end-to-end tests: Xvfb displays and their pixels."""

from __future__ import annotations

import array
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.harness.process import stop, wait_for

#: Client screens live above every range the tests' gateways allocate sessions from (500-2800): a gateway
#: that has claimed a display starts its agent a moment later, and a client screen that took the number
#: meanwhile would make that session fail ("Server is already active").
FIRST_CLIENT_DISPLAY = 5000


def quiet_display_range(first: int, count: int) -> int:
    """The first number from ``first`` (in steps of ``count``) that starts
    ``count`` displays nobody holds: no lock file (not even a stale one an
    agent killed by an earlier run left), no socket file, no abstract X
    socket.  Tests that plant files over a display range check that it was
    empty; a fixed range collides with another module of a parallel
    ``make test`` or with an earlier run's leftovers."""
    with open("/proc/net/unix") as table:
        bound = {line.rsplit("@/tmp/.X11-unix/X", 1)[1].strip() for line in table if "@/tmp/.X11-unix/X" in line}

    def held(n: int) -> bool:
        return (str(n) in bound or os.path.lexists(f"/tmp/.X{n}-lock") or os.path.lexists(f"/tmp/.tX{n}-lock")
                or os.path.lexists(f"/tmp/.X11-unix/X{n}"))

    base = first
    while any(held(n) for n in range(base, base + count)):
        base += count
    return base


def _free_display(start: int) -> int:
    display = start
    while os.path.exists(f"/tmp/.X{display}-lock") or os.path.exists(f"/tmp/.X11-unix/X{display}"):
        display += 1
    return display


def start_x_server(argv: Callable[[int], list[str]], first: int, **popen: Any) -> tuple[int, subprocess.Popen]:
    """An X server on the first display from ``first`` that it can take.

    Looking for a free number and starting a server there is a race with
    every other test on the machine doing the same (make test runs modules
    side by side, and gateways start agents): the server's own lock file,
    which it creates exclusively with its pid in it, says who won.  A
    server that lost exits or is stopped, and the next number is tried."""
    display = first
    for _ in range(50):
        display = _free_display(display)
        process = subprocess.Popen(argv(display), **popen)
        lock = f"/tmp/.X{display}-lock"

        def holder() -> int | None:
            try:
                with open(lock) as handle:
                    return int(handle.read().strip() or 0) or None
            except (OSError, ValueError):
                return None

        def settled(process: subprocess.Popen = process) -> str | None:
            owner = holder()
            if owner == process.pid:
                return "ours"
            if process.poll() is not None or owner is not None:
                return "taken"
            return None

        if wait_for(settled, 15, f"an X server to take :{display}") == "ours":
            return display, process
        if process.poll() is None:
            process.kill()
        process.wait()
        display += 1
    raise AssertionError(f"no display free from :{first} on")


@dataclass
class Screenshot:
    width: int
    height: int
    rgba: bytes

    def _words(self) -> array.array:
        return array.array("I", self.rgba)

    def pixel(self, x: int, y: int) -> tuple[int, int, int]:
        offset = 4 * (y * self.width + x)
        return tuple(self.rgba[offset : offset + 3])  # type: ignore[return-value]

    def count(self, colour: tuple[int, int, int]) -> int:
        """Pixels of exactly this colour (NX over a LAN link is lossless)."""
        return self._words().count(int.from_bytes(bytes(colour) + b"\xff", sys.byteorder))

    def colours(self) -> int:
        """How many distinct colours the picture has (a blank screen has one)."""
        return len(set(self._words()))

    def region_colours(self, top: int, bottom: int) -> int:
        rows = self.rgba[4 * self.width * top : 4 * self.width * bottom]
        return len(set(array.array("I", rows)))

    def save(self, path: str) -> None:
        rgb = bytes(b for i, b in enumerate(self.rgba) if i % 4 != 3)
        with open(path, "wb") as handle:
            handle.write(f"P6 {self.width} {self.height} 255\n".encode() + rgb)


def session_screen_size(display: int, agent_pid: int) -> tuple[int, int]:
    """The size of nxagent's own screen, asked with the session's X authority
    (the ``XAUTHORITY`` the agent runs with)."""
    with open(f"/proc/{agent_pid}/environ", "rb") as handle:
        environ = dict(entry.split(b"=", 1) for entry in handle.read().split(b"\0") if b"=" in entry)
    env = {"PATH": "/usr/bin:/bin", "XAUTHORITY": environ[b"XAUTHORITY"].decode()}
    out = subprocess.run(["xdpyinfo", "-display", f":{display}"], env=env, capture_output=True, text=True).stdout
    match = re.search(r"dimensions:\s+(\d+)x(\d+) pixels", out)
    if match is None:
        raise AssertionError(f"xdpyinfo :{display} failed")
    return int(match.group(1)), int(match.group(2))


class ClientScreen:
    """An Xvfb standing in for the NX client's screen.

    With ``window_manager`` it runs xfwm4, as a client's desktop does: nxagent
    shows a windowed session in a window of the requested size only when a
    window manager runs there; on a bare X server it always goes full screen.
    """

    def __init__(self, width: int = 1024, height: int = 768, window_manager: bool = False) -> None:
        # -noreset: an X server resets when its last client leaves and drops
        # connections that arrive meanwhile; a screenshot is often that client.
        self.width, self.height = width, height
        self.display, self.process = start_x_server(
            lambda display: ["Xvfb", f":{display}", "-screen", "0", f"{width}x{height}x24", "-nolisten", "tcp",
                             "-ac", "-noreset"],
            FIRST_CLIENT_DISPLAY + (os.getpid() % 50) * 10, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.window_manager: subprocess.Popen | None = None
        wait_for(self._ready, 15, f"Xvfb :{self.display}")
        if window_manager:
            self.window_manager = subprocess.Popen(
                ["xfwm4", "--compositor=off", "--sm-client-disable"], env=self._env(),
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            )
            wait_for(self._managed, 15, f"a window manager on :{self.display}")

    def _env(self) -> dict[str, str]:
        return dict(os.environ, DISPLAY=self.name)

    def _managed(self) -> bool:
        if self.window_manager is not None and self.window_manager.poll() is not None:
            raise AssertionError(f"xfwm4 on :{self.display} exited")
        return "window id #" in subprocess.run(["xprop", "-root", "_NET_SUPPORTING_WM_CHECK"], env=self._env(),
                                               capture_output=True, text=True).stdout

    def agent_window(self) -> tuple[int, int, str] | None:
        """(width, height, window id) of nxagent's top-level window here, if any."""
        tree = subprocess.run(["xwininfo", "-root", "-tree"], env=self._env(), capture_output=True, text=True).stdout
        for line in tree.splitlines():
            match = re.search(r"^\s*(0x[0-9a-f]+) .*\(\"NXAgent\" \"NXAgent\"\)\s+(\d+)x(\d+)", line)
            if match:
                return int(match.group(2)), int(match.group(3)), match.group(1)
        return None

    @property
    def name(self) -> str:
        return f":{self.display}"

    def _ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"Xvfb :{self.display} exited")
        return subprocess.run(["xdpyinfo", "-display", self.name], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL).returncode == 0

    def shot(self) -> Screenshot:
        raw = subprocess.run(["import", "-display", self.name, "-window", "root", "-depth", "8", "rgba:-"],
                             capture_output=True, check=True).stdout
        return Screenshot(self.width, self.height, raw)

    def wait_for_colour(self, colour: tuple[int, int, int], minimum: int, timeout: float = 20.0) -> Screenshot:
        """The first screenshot with at least ``minimum`` pixels of ``colour``."""
        last: list[Screenshot] = []

        def seen() -> Screenshot | None:
            shot = self.shot()
            last[:] = [shot]
            return shot if shot.count(colour) >= minimum else None

        try:
            return wait_for(seen, timeout, f"{minimum} pixels of {colour} on {self.name}", interval=0.1)
        except AssertionError:
            if last:
                path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"nxgate-fail-{self.display}-{int(time.time())}.ppm")
                last[0].save(path)
                raise AssertionError(f"{colour} not seen on {self.name}; last picture saved as {path}") from None
            raise

    def xdotool(self, *args: str) -> None:
        subprocess.run(["xdotool", *args], env=dict(os.environ, DISPLAY=self.name), check=True)

    def close(self) -> None:
        if self.window_manager is not None:
            stop(self.window_manager)
        stop(self.process)
