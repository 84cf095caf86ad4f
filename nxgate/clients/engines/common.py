"""What every viewer engine shares: its command line, the two-phase start,
the status line, and the X window it draws into.

A viewer is one process per RDP/VNC session, run as the session's user
inside the session's nxagent display.  It starts in two phases:

1. **connect** (before the gateway answers ``startsession``): reach the
   remote host and authenticate, then write one status line to fd 3 —
   ``ready WxH`` or ``error KIND: message`` — and close it.  KIND is one of
   :data:`ERROR_KINDS`; the gateway turns it into the NX error the client
   sees.  Nothing touches X in this phase: nxagent's display is not usable
   before the NX client has connected.
2. **draw** (after SIGUSR1 from the gateway, or at once with
   ``--attach-now``): open ``$DISPLAY``, show the remote screen in a window
   that covers the agent's root window, and send keyboard and mouse events
   back.

The password, if any, is the first line on stdin (``--password-stdin``):
never in argv or the environment.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

import numpy

ERROR_KINDS = ("unreachable", "auth", "tls", "protocol", "timeout")
EXIT_CODES = {"ok": 0, "unreachable": 3, "auth": 4, "tls": 5, "protocol": 6, "timeout": 7, "usage": 2}
STATUS_FD = 3


class ViewerError(Exception):
    """A failure with its kind (see :data:`ERROR_KINDS`)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--geometry", default="1024x768", help="remote screen size WxH (RDP)")
    p.add_argument("--keyboard", default="pc105/us", help="the NX client's keyboard, e.g. pc105/de")
    p.add_argument("--timeout", type=float, default=15.0, help="seconds to connect and authenticate")
    p.add_argument("--password-stdin", action="store_true", help="read the password from the first line of stdin")
    p.add_argument("--attach-now", action="store_true", help="draw at once instead of waiting for SIGUSR1")
    p.add_argument("--title", default="nxgate viewer")
    return p


def read_password(args: argparse.Namespace) -> str:
    if not args.password_stdin:
        return ""
    line = sys.stdin.buffer.readline(4096)
    return line.rstrip(b"\r\n").decode("utf-8", "surrogateescape")


def geometry(text: str) -> tuple[int, int]:
    width, _, height = text.lower().partition("x")
    return int(width), int(height)


class Status:
    """The one status line on fd 3 (absent when run by hand)."""

    def __init__(self) -> None:
        try:
            self.stream: Any = os.fdopen(STATUS_FD, "w", buffering=1)
        except OSError:
            self.stream = None

    def _say(self, line: str) -> None:
        if self.stream is not None:
            self.stream.write(line.replace("\n", " ") + "\n")
            self.stream.close()
            self.stream = None

    def ready(self, width: int, height: int) -> None:
        self._say(f"ready {width}x{height}")

    def error(self, error: ViewerError) -> None:
        self._say(f"error {error.kind}: {error.message}")


def on_attach(reactor: Any, callback: Callable[[], None], now: bool) -> None:
    """Call ``callback`` in the reactor once the gateway says the client is
    attached (SIGUSR1), or right away."""
    if now:
        reactor.callWhenRunning(callback)
        return
    fired = []

    def handler(_signum: int, _frame: Any) -> None:
        if not fired:
            fired.append(True)
            reactor.callFromThread(callback)

    signal.signal(signal.SIGUSR1, handler)


class XCanvas:
    """A window over nxagent's whole root window, drawn from a framebuffer.

    Pixels are 32-bit BGRX (what a depth-24 TrueColor X server takes in a
    ZPixmap).  Updates go out as PutImage strips small enough for
    python-xlib (it does not use BIG-REQUESTS) and end with a sync:
    python-xlib's flush() tries one non-blocking send and may leave part of
    a large image queued until some later request, which on a still screen
    never comes.
    """

    def __init__(self, title: str, display_name: str | None = None) -> None:
        from Xlib import X, display

        self.X = X
        self.display = display.Display(display_name)
        screen = self.display.screen()
        root = screen.root
        size = root.get_geometry()
        self.width, self.height = size.width, size.height
        self.depth = screen.root_depth
        self.window = root.create_window(
            0, 0, self.width, self.height, 0, self.depth, X.InputOutput, X.CopyFromParent,
            background_pixel=screen.black_pixel,
            event_mask=(X.ExposureMask | X.KeyPressMask | X.KeyReleaseMask | X.ButtonPressMask
                        | X.ButtonReleaseMask | X.PointerMotionMask | X.StructureNotifyMask | X.FocusChangeMask),
        )
        self.window.set_wm_name(title)
        self.gc = self.window.create_gc(foreground=screen.white_pixel, background=screen.black_pixel)
        self.framebuffer = numpy.zeros((self.height, self.width), numpy.uint32)
        self.window.map()
        self.window.set_input_focus(X.RevertToParent, X.CurrentTime)
        self.display.flush()

    def fileno(self) -> int:
        return self.display.fileno()

    def events(self) -> list[Any]:
        """The events that have arrived (non-blocking)."""
        events = []
        while self.display.pending_events():
            events.append(self.display.next_event())
        return events

    def put(self, x: int, y: int, width: int, height: int, bgrx: bytes) -> None:
        """Draw a rectangle of BGRX pixels at (x, y), clipped to the window."""
        if x >= self.width or y >= self.height or width <= 0 or height <= 0:
            return
        visible_w = min(width, self.width - x)
        visible_h = min(height, self.height - y)
        pixels = numpy.frombuffer(bgrx, numpy.uint32, count=width * height).reshape(height, width)
        self.framebuffer[y : y + visible_h, x : x + visible_w] = pixels[:visible_h, :visible_w]
        self._send(x, y, visible_w, visible_h)
        self.display.sync()

    def _send(self, x: int, y: int, width: int, height: int) -> None:
        rows_per_strip = max(1, 262000 // (width * 4))
        for top in range(y, y + height, rows_per_strip):
            rows = min(rows_per_strip, y + height - top)
            data = self.framebuffer[top : top + rows, x : x + width].tobytes()
            self.window.put_image(self.gc, x, top, width, rows, self.X.ZPixmap, self.depth, 0, data)

    def expose(self, x: int, y: int, width: int, height: int) -> None:
        self._send(x, y, min(width, self.width - x), min(height, self.height - y))
        self.display.sync()

    def message(self, text: str) -> None:
        """Show a line of text (errors after the session is up)."""
        self.window.clear_area(0, 0, self.width, self.height)
        for number, line in enumerate(text.splitlines()):
            self.window.image_text(self.gc, 20, 40 + 18 * number, line)
        self.display.flush()

    def keysym(self, keycode: int, state: int) -> int:
        shifted = 1 if state & self.X.ShiftMask else 0
        return self.display.keycode_to_keysym(keycode, shifted) or self.display.keycode_to_keysym(keycode, 0)


class XReader:
    """Feeds the canvas's X events to ``handle`` from the reactor (IReadDescriptor)."""

    def __init__(self, canvas: XCanvas, handle: Callable[[Any], None], lost: Callable[[], None]) -> None:
        self.canvas = canvas
        self.handle = handle
        self.lost = lost

    def fileno(self) -> int:
        return self.canvas.fileno()

    def doRead(self) -> None:
        try:
            events = self.canvas.events()
        except Exception:  # the X connection is gone (the session ended)
            self.lost()
            return
        for event in events:
            self.handle(event)

    def connectionLost(self, reason: Any) -> None:
        self.lost()

    def logPrefix(self) -> str:
        return "x11"


class ViewerRun:
    """The life of one viewer process, shared by the engines.

    Phase one ends in :meth:`ready` (the status line, then drawing if the
    gateway already asked for it) or :meth:`fail`; every way out goes
    through :meth:`finish`, once.  Engines provide ``attach`` and
    ``connection`` (the transport to abort) and set ``stage``.
    """

    program = "nxgate-viewer"
    what = "remote desktop"

    def __init__(self, reactor: Any, args: argparse.Namespace, password: str, status: Status) -> None:
        self.reactor, self.args, self.password, self.status = reactor, args, password, status
        self.stage = "connect"
        self.attach_wanted = False
        self.exit_code: int | None = None
        self.canvas: XCanvas | None = None  # phase two: see open_display
        self.reader: XReader | None = None
        self.timer = reactor.callLater(args.timeout, self.fail, ViewerError(
            "timeout", f"the {self.what} was not ready within {args.timeout:g}s"))

    def connection(self) -> Any:
        """The transport to the remote host, if any (aborted on the way out)."""
        return None

    def attach(self) -> None:
        raise NotImplementedError

    def start(self, factory: Any) -> None:
        # SIGTERM stops the reactor, which then closes the remote and X
        # connections: no news worth an error message.
        self.reactor.addSystemEventTrigger("before", "shutdown", self._shutting_down)
        self.reactor.connectTCP(self.args.host, self.args.port, factory, timeout=self.args.timeout)

    def ready(self, width: int, height: int) -> None:
        """Phase one is over: say so on the status line."""
        self.stage = "ready"
        if self.timer.active():
            self.timer.cancel()
        try:
            self.status.ready(width, height)
        except OSError as exc:  # nobody reads fd 3 any more: the gateway gave up on us
            self.say(f"cannot report ready: {exc}")
            self.finish(1)
            return
        if self.attach_wanted:
            self.attach()

    def fail(self, problem: ViewerError) -> None:
        """Report a failure on the status line (phase one) or stderr, then exit."""
        if self.exit_code is not None:
            return
        if self.stage == "ready":  # the status line is written: stderr, for the gateway's log
            self.say(str(problem))
        else:
            try:
                self.status.error(problem)
            except OSError:
                self.say(str(problem))
        self.finish(EXIT_CODES[problem.kind])

    def finish(self, code: int) -> None:
        if self.exit_code is None:
            self.exit_code = code
            if self.timer.active():
                self.timer.cancel()
            transport = self.connection()
            if transport is not None:
                transport.abortConnection()
            self.reactor.callLater(0, self.reactor.stop)

    def _shutting_down(self) -> None:
        if self.exit_code is None:
            self.exit_code = 0

    def say(self, text: str) -> None:
        print(f"{self.program}: {text}", file=sys.stderr, flush=True)

    def open_display(self) -> bool:
        """Phase two: the window on the session's display, and its events
        read by the reactor.  False (and the viewer ends) without a display."""
        try:
            self.canvas = XCanvas(self.args.title)
            self.display_opened()
            window = self.canvas.window  # FocusOut: release held keys, or they stick on the remote side
            mask = window.get_attributes().your_event_mask | self.canvas.X.FocusChangeMask
            window.change_attributes(event_mask=mask)
        except Exception as exc:
            self.say(f"cannot draw on the display: {exc}")
            self.finish(1)
            return False
        self.reader = XReader(self.canvas, self.x_event, self.x_lost)
        self.reactor.addReader(self.reader)
        return True

    def display_opened(self) -> None:
        """Engines read what they need of the new display here."""

    def x_event(self, event: Any) -> None:
        raise NotImplementedError

    def x_lost(self) -> None:
        if self.exit_code is None:
            self.say("the X display closed")
            self.finish(0)
