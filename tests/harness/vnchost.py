"""VNC test hosts with known content, and the VNC viewer engine as a child.

A host is an X display whose root window is a known colour, served by
x11vnc (over an Xvfb) or by Xtigervnc (an X server that is its own VNC
server), with or without a VNC password.  :func:`vnc_viewer` runs
``python -m nxgate.clients.engines.vnc`` the way the gateway does: password on
stdin, status line on fd 3.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile

from tests.harness.net import free_port, listening
from tests.harness.process import Pipe, stop, wait_for
from tests.harness.viewer import PYTHON, ViewerProcess
from tests.harness.x11 import ClientScreen, start_x_server

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ORANGE = (255, 128, 0)
BLUE = (0, 0, 255)
FIRST_HOST_DISPLAY = 6000  # above the gateways' ranges, as the client screens (tests.harness.x11)


def hex_colour(colour: tuple[int, int, int]) -> str:
    return "#%02x%02x%02x" % colour


class TigerScreen(ClientScreen):
    """An Xtigervnc display: an X server and a VNC server in one process."""

    def __init__(self, width: int, height: int, port: int, password_file: str | None, log: str) -> None:
        self.width, self.height = width, height
        self.window_manager = None  # none: a VNC host's desktop is drawn by the test itself
        security = ["-SecurityTypes", "VncAuth", "-PasswordFile", password_file] if password_file else \
            ["-SecurityTypes", "None"]
        with open(log, "ab") as out:
            self.display, self.process = start_x_server(
                lambda display: ["Xtigervnc", f":{display}", "-rfbport", str(port), "-localhost", "-AlwaysShared",
                                 "-geometry", f"{width}x{height}", "-depth", "24", "-nolisten", "tcp", "-ac",
                                 "-noreset", *security],
                FIRST_HOST_DISPLAY + (os.getpid() % 50) * 10, stdout=out, stderr=out)
        wait_for(self._ready, 15, f"Xtigervnc :{self.display}")


class VNCHost:
    """A display with a known background served over VNC on 127.0.0.1:``port``.

    ``server`` is "x11vnc" or "tigervnc"; ``password`` None means no VNC
    authentication."""

    def __init__(self, server: str = "x11vnc", password: str | None = None, width: int = 1024, height: int = 768,
                 background: tuple[int, int, int] = ORANGE) -> None:
        if server not in ("x11vnc", "tigervnc"):
            raise ValueError(server)
        self.kind, self.password = server, password
        self.dir = tempfile.mkdtemp(prefix="nxgate-vnchost-")
        self.log = os.path.join(self.dir, "server.log")
        self.children: list[subprocess.Popen] = []
        self.screen: ClientScreen | None = None
        self.server: subprocess.Popen | None = None
        self.password_file = None
        if password is not None:
            self.password_file = os.path.join(self.dir, "passwd")  # vncpasswd's format: both servers read it
            subprocess.run(["x11vnc", "-storepasswd", password, self.password_file], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for attempt in range(3):  # a port or display number may be taken by a parallel run meanwhile
            try:
                self._start(width, height, background)
                return
            except AssertionError:
                self._stop_servers()
                if attempt == 2:
                    self.close()
                    raise

    def _start(self, width: int, height: int, background: tuple[int, int, int]) -> None:
        self.port = free_port()
        if self.kind == "tigervnc":
            self.screen = TigerScreen(width, height, self.port, self.password_file, self.log)
            self.server = self.screen.process
        else:
            self.screen = ClientScreen(width, height)
            auth = ["-rfbauth", self.password_file] if self.password_file else ["-nopw"]
            with open(self.log, "ab") as out:
                self.server = subprocess.Popen(
                    ["x11vnc", "-display", self.screen.name, "-rfbport", str(self.port), "-localhost", "-forever",
                     "-shared", "-noxrecord", *auth], stdout=out, stderr=out)
        self.set_background(background)
        wait_for(self._listening, 20, f"{self.kind} on port {self.port}")

    def _listening(self) -> bool:
        if self.server.poll() is not None:
            raise AssertionError(f"{self.kind} exited: {self.server_log()[-2000:]}")
        return listening(self.port)

    @property
    def name(self) -> str:
        return self.screen.name

    def env(self) -> dict[str, str]:
        return dict(os.environ, DISPLAY=self.name)

    def server_log(self) -> str:
        with open(self.log, errors="replace") as handle:
            return handle.read()

    def set_background(self, colour: tuple[int, int, int]) -> None:
        subprocess.run(["xsetroot", "-solid", hex_colour(colour)], env=self.env(), check=True)

    def xterm_typing_into(self, path: str, background: tuple[int, int, int] = BLUE) -> subprocess.Popen:
        """An xterm at the top left writing what is typed into ``path``, with
        the keyboard focus (there is no window manager to give it)."""
        title = f"nxgate-typing-{os.getpid()}-{len(self.children)}"
        xterm = subprocess.Popen(
            ["xterm", "-T", title, "-bg", hex_colour(background), "-geometry", "80x24+0+0", "-e", "sh", "-c",
             'cat > "$0"', path], env=self.env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.children.append(xterm)
        window = wait_for(lambda: self._search(title), 15, "the xterm's window")
        wait_for(lambda: os.path.exists(path), 15, "cat to open its file")
        subprocess.run(["xdotool", "windowfocus", "--sync", window], env=self.env(), check=True)
        return xterm

    def _search(self, title: str) -> str | None:
        out = subprocess.run(["xdotool", "search", "--name", title], env=self.env(), capture_output=True, text=True)
        return out.stdout.split()[0] if out.stdout.split() else None

    def mouse_location(self) -> tuple[int, int]:
        out = subprocess.run(["xdotool", "getmouselocation"], env=self.env(), capture_output=True, text=True,
                             check=True).stdout
        match = re.search(r"x:(\d+) y:(\d+)", out)
        assert match, out
        return int(match.group(1)), int(match.group(2))

    def kill_server(self) -> None:
        """SIGKILL the VNC server (for tigervnc that is the X server too)."""
        if self.server.poll() is None:
            self.server.kill()
            self.server.wait(10)

    def _stop_servers(self) -> None:
        if self.server is not None:
            stop(self.server)
        if self.screen is not None:
            self.screen.close()
        self.server = self.screen = None

    def close(self) -> None:
        for child in self.children:
            stop(child)
        self._stop_servers()
        shutil.rmtree(self.dir, ignore_errors=True)


class ButtonRecorder:
    """A window on the host display that notes the mouse buttons it gets.

    It lives in a child process: python-xlib keeps extension event codes in
    class-wide tables, so one process cannot open Xvfb and Xtigervnc
    displays (different extension layouts) one after the other."""

    def __init__(self, display_name: str, x: int, y: int, width: int, height: int) -> None:
        self.process = subprocess.Popen(
            [PYTHON, "-m", "tests.harness.vnchost", "record-buttons", display_name, str(x), str(y), str(width),
             str(height)], stdout=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=REPO))
        self.output = Pipe(self.process.stdout)
        self.output.read_until(b"mapped\n", 15)
        self.events: list[tuple[str, int, int, int]] = []

    def poll(self) -> list[tuple[str, int, int, int]]:
        """("press"|"release", button, x, y) so far."""
        self.output.fill(0.05)
        while b"\n" in self.output.buffer:
            line, self.output.buffer = self.output.buffer.split(b"\n", 1)
            kind, button, x, y = line.decode().split()
            self.events.append((kind, int(button), int(x), int(y)))
        return self.events

    def close(self) -> None:
        stop(self.process)
        self.process.stdout.close()


def record_buttons(display_name: str, x: int, y: int, width: int, height: int) -> None:
    from Xlib import X, display

    conn = display.Display(display_name)
    screen = conn.screen()
    window = screen.root.create_window(x, y, width, height, 0, screen.root_depth, background_pixel=screen.white_pixel,
                                       event_mask=X.ButtonPressMask | X.ButtonReleaseMask)
    window.map()
    conn.sync()
    print("mapped", flush=True)
    while True:
        event = conn.next_event()
        if event.type in (X.ButtonPress, X.ButtonRelease):
            kind = "press" if event.type == X.ButtonPress else "release"
            print(kind, event.detail, event.event_x, event.event_y, flush=True)


def paint(display_name: str) -> None:
    """Set the root window to each colour read from stdin (RRGGBB lines),
    answering "ok" once the request is sent."""
    from Xlib import display

    conn = display.Display(display_name)
    root = conn.screen().root
    for line in sys.stdin:
        root.change_attributes(background_pixel=int(line, 16))
        root.clear_area(0, 0, 0, 0)
        conn.sync()
        sys.stdout.write("ok\n")
        sys.stdout.flush()


def vnc_viewer(port: int, display: str, password: str | None = None, timeout: float = 15.0,
               attach_now: bool = False, host: str = "127.0.0.1", extra: tuple[str, ...] = ()) -> ViewerProcess:
    """``python -m nxgate.clients.engines.vnc`` with the password on stdin."""
    args = ["--host", host, "--port", str(port), "--timeout", str(timeout),
            *(["--password-stdin"] if password is not None else []), *(["--attach-now"] if attach_now else []),
            *extra]
    stdin = password.encode() + b"\n" if password is not None else b""
    return ViewerProcess(args, display, stdin=stdin, module="nxgate.clients.engines.vnc")


if __name__ == "__main__":
    if sys.argv[1] == "record-buttons":
        record_buttons(sys.argv[2], *map(int, sys.argv[3:7]))
    elif sys.argv[1] == "paint":
        paint(sys.argv[2])
