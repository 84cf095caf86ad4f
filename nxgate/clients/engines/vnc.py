"""The VNC engine: an RFB client (vncdotool's Twisted protocol) drawing into
the session's nxagent display.  See :mod:`nxgate.clients.engines.common` for the
contract (command line, status line on fd 3, SIGUSR1, exit codes).

    python -m nxgate.clients.engines.vnc --host HOST --port 5900 [--password-stdin] [--encoding hextile|raw|zrle]

The server sends pixels in the X server's own layout (32-bit BGRX), so
nothing is converted.  Updates land in a numpy copy of the *remote*
framebuffer first: CopyRect may copy from parts of the remote screen the
window does not show, and Hextile arrives as thousands of small fills that
must not each become a PutImage.  When an update is complete its rectangles
go to :class:`~nxgate.clients.engines.common.XCanvas` (clipped: a larger remote
screen shows its top-left part, a smaller one leaves black around it), and
the next incremental update is asked for.

This leans on a few vncdotool 1.4.2 internals (``_handleSecurityTypes``,
``_doNextHextileSubrect``, ``_packet``, ``_challenge``); the tests cover
each of them.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
from twisted.internet import error, protocol
from twisted.python.failure import Failure
from vncdotool.const import AuthTypes, Encoding
from vncdotool.rfb import PixelFormat, RFBClient, RFBFactory, des_encrypt, reverse_bits

from nxgate.clients.engines import common
from nxgate.clients.engines.common import ViewerError

Rect = tuple[int, int, int, int]

#: BGRX little-endian: a depth-24 X server's ZPixmap layout.
PIXEL_FORMAT = PixelFormat(bpp=32, depth=24, bigendian=False, truecolor=True, redmax=255, greenmax=255,
                           bluemax=255, redshift=16, greenshift=8, blueshift=0)
#: One pixel for numpy: filling uint32s is ~40 times faster than 4-byte rows.
PIXEL = np.dtype("<u4")
#: The server sends in the first encoding of ours it knows (CopyRect only
#: serves moves).  ZRLE is pure Python in vncdotool: slow on real content.
PREFERRED = {"hextile": Encoding.HEXTILE, "raw": Encoding.RAW, "zrle": Encoding.ZRLE}
SECURITY_NAMES = {1: "None", 2: "VNC", 16: "Tight", 18: "TLS", 19: "VeNCrypt", 30: "Apple DH"}
MAX_RECTS = 16  # more rectangles than this in one update are drawn as their bounding box
KEYPAD = range(0xFF80, 0xFFBE)  # XK_KP_Space .. XK_KP_Equal
NUM_LOCK, ALTGR_KEYSYMS = 0xFF7F, {0xFE03, 0xFF7E}  # ISO_Level3_Shift, Mode_switch
PROGRAM = "nxgate-viewer-vnc"
HARD_EXIT_AFTER = 3.0  # seconds from deciding to exit to exiting, whatever hangs


def encodings(preferred: str) -> list[Encoding]:
    first = PREFERRED[preferred]
    rest = [e for e in (Encoding.HEXTILE, Encoding.RAW) if e != first]
    return [Encoding.COPY_RECTANGLE, first, *rest, Encoding.PSEUDO_DESKTOP_SIZE, Encoding.PSEUDO_LAST_RECT]


def clip(x: int, y: int, width: int, height: int, limit_w: int, limit_h: int) -> Rect | None:
    """The part of a rectangle inside (0, 0, limit_w, limit_h), or None."""
    right, bottom = min(x + width, limit_w), min(y + height, limit_h)
    x, y = max(x, 0), max(y, 0)
    if right <= x or bottom <= y:
        return None
    return x, y, right - x, bottom - y


def bounding_box(rects: list[Rect]) -> Rect:
    left, top = min(r[0] for r in rects), min(r[1] for r in rects)
    right, bottom = max(r[0] + r[2] for r in rects), max(r[1] + r[3] for r in rects)
    return left, top, right - left, bottom - top


def button_mask(mask: int, button: int, pressed: bool) -> int:
    """RFB's button mask after an X button event: X buttons 1-8 are RFB bits
    0-7 (4/5 are the wheel, 6/7 the horizontal wheel), others are ignored."""
    if not 1 <= button <= 8:
        return mask
    bit = 1 << (button - 1)
    return mask | bit if pressed else mask & ~bit


def choose_keysym(column: Callable[[int], int], state: int, numlock: int, altgr: int) -> int:
    """The keysym a key produces under the modifiers in ``state``, from its
    core keymap columns ``column(i)``: sending what the user sees lets the
    server find its own keys for it.  ``altgr`` is the modifier holding
    ISO_Level3_Shift or Mode_switch (Mod5 with XKB): a core client cannot
    tell them apart, so level 3 (columns 4/5, where XKB puts it) wins over
    group 2 (columns 2/3).  Caps Lock is left out on purpose: the Caps_Lock
    key itself is forwarded, so the remote side applies it."""
    base = 0
    if state & altgr:
        base = 4 if column(4) else 2 if column(2) else 0
    shifted = 1 if state & 1 else 0
    if state & numlock and column(base + 1) in KEYPAD:
        shifted ^= 1  # Num Lock swaps the keypad's levels
    return column(base + shifted) or column(base) or column(0)


class PressedKeys:
    """Which keysym each held key sent, so that its release sends the same
    one even if Shift changed in between (else the remote key sticks)."""

    def __init__(self) -> None:
        self.held: dict[int, int] = {}

    def press(self, keycode: int, keysym: int) -> int:
        self.held[keycode] = keysym
        return keysym

    def release(self, keycode: int, keysym: int) -> int:
        return self.held.pop(keycode, keysym)

    def release_all(self) -> list[int]:
        keysyms, self.held = list(self.held.values()), {}
        return keysyms


class Hextile:
    """A Hextile rectangle decoded straight into the framebuffer, as many
    tiles at a time as have arrived.  vncdotool's own decoder spends an
    ``expect()`` round and several enum operations on every 16x16 tile
    (40 ms for a plain 1024x768 frame); a run of plain tiles here is one fill."""

    RAW, BACKGROUND, FOREGROUND, ANY_SUBRECTS, COLOURED = 1, 2, 4, 8, 16

    def __init__(self, framebuffer: np.ndarray, x: int, y: int, width: int, height: int) -> None:
        self.fb, self.left, self.right, self.bottom = framebuffer, x, x + width, y + height
        self.tx, self.ty = x, y
        self.bg = self.fg = 0

    def feed(self, data: bytes) -> tuple[int, int]:
        """Decode the complete tiles at the start of ``data``.  Returns the
        bytes used and how many bytes from there the next tile needs at
        least (0: the rectangle is done)."""
        pos, end, fb = 0, len(data), self.fb
        while self.ty < self.bottom:
            tx, ty = self.tx, self.ty
            tw, th = min(16, self.right - tx), min(16, self.bottom - ty)
            if pos >= end:
                return pos, 1
            flags = data[pos]
            if flags & self.RAW:
                size = 1 + tw * th * 4
                if end - pos < size:
                    return pos, size
                fb[ty : ty + th, tx : tx + tw] = np.frombuffer(data, PIXEL, tw * th, pos + 1).reshape(th, tw)
                pos += size
            elif flags == 0:  # the background again, no subrects: fill the run of such tiles in this row
                chunk = data[pos : pos + (self.right - tx + 15) // 16]
                tiles = len(chunk) - len(chunk.lstrip(b"\0"))
                fb[ty : ty + th, tx : min(tx + 16 * tiles, self.right)] = self.bg
                pos += tiles
                self.tx += 16 * (tiles - 1)
            else:
                subrects = flags & self.ANY_SUBRECTS
                head = 1 + 4 * bool(flags & self.BACKGROUND) + 4 * bool(flags & self.FOREGROUND) + bool(subrects)
                if end - pos < head:
                    return pos, head
                count = data[pos + head - 1] if subrects else 0
                size = head + count * (6 if flags & self.COLOURED else 2)
                if end - pos < size:
                    return pos, size
                p = pos + 1
                if flags & self.BACKGROUND:
                    self.bg, p = int.from_bytes(data[p : p + 4], "little"), p + 4
                if flags & self.FOREGROUND:
                    self.fg = int.from_bytes(data[p : p + 4], "little")
                tile = fb[ty : ty + th, tx : tx + tw]
                tile[:] = self.bg
                p = pos + head
                for _ in range(count):
                    colour = self.fg
                    if flags & self.COLOURED:
                        colour, p = int.from_bytes(data[p : p + 4], "little"), p + 4
                    xy, wh = data[p], data[p + 1]
                    p += 2
                    tile[xy & 15 : (xy & 15) + (wh & 15) + 1, xy >> 4 : (xy >> 4) + (wh >> 4) + 1] = colour
                pos = p
            self.tx += 16
            if self.tx >= self.right:
                self.tx, self.ty = self.left, self.ty + 16
        return pos, 0


with warnings.catch_warnings():  # vncdotool warns that these two hooks may change
    warnings.simplefilter("ignore", FutureWarning)

    class Client(RFBClient):
        """The RFB side: handshake outcome to :class:`Viewer`, pixels into the framebuffer."""

        SUPPORTED_AUTHS = {AuthTypes.NONE, AuthTypes.VNC_AUTHENTICATION}  # not Apple DH: it prompts on stdin
        viewer: Viewer
        framebuffer: np.ndarray
        resized = False

        def connectionMade(self) -> None:
            super().connectionMade()
            self.viewer = self.factory.viewer
            self.viewer.client = self

        def dataReceived(self, data: bytes) -> None:
            try:
                super().dataReceived(data)
            except Exception as exc:  # vncdotool has no error path for malformed data
                self.viewer.fail(ViewerError("protocol", f"bad data from the server ({type(exc).__name__}: {exc})"))

        def connectionLost(self, reason: Failure = protocol.connectionDone) -> None:
            self.viewer.remote_closed(reason)

        def _handleSecurityTypes(self, block: bytes) -> None:
            """Prefer None over a password (vncdotool would take the highest number)."""
            self.viewer.stage = "auth"
            offered = set(block)
            if AuthTypes.NONE in offered:
                self.SUPPORTED_AUTHS = {AuthTypes.NONE}
            elif AuthTypes.VNC_AUTHENTICATION not in offered:
                names = ", ".join(SECURITY_NAMES.get(t, str(t)) for t in sorted(offered))
                self.viewer.fail(ViewerError("protocol", f"no supported security type (the server offers {names})"))
                return
            super()._handleSecurityTypes(block)

        def vncRequestPassword(self) -> None:
            """VNC authentication: DES of the challenge keyed by the first 8
            bytes of the password (UTF-8, as vncpasswd stores it)."""
            if not self.viewer.password:
                self.viewer.fail(ViewerError("auth", "the server requires a password"))
                return
            self.viewer.stage = "password"
            key = self.viewer.password.encode("utf-8", "surrogateescape")[:8].ljust(8, b"\0")
            with warnings.catch_warnings():  # cryptography calls TripleDES "decrepit"; RFB defines DES here
                warnings.simplefilter("ignore")
                response = des_encrypt(reverse_bits(key), self._challenge)
            self.transport.write(response)

        def vncAuthFailed(self, reason: Any) -> None:
            text = reason.decode("latin-1") if isinstance(reason, bytes) else str(reason)
            self.viewer.fail(ViewerError("auth", f"authentication failed ({text})"))

        def vncProtocolError(self, reason: str) -> None:
            self.viewer.fail(ViewerError("protocol", reason))

        def vncConnectionMade(self) -> None:
            """ServerInit: phase 1 is done."""
            self.setPixelFormat(PIXEL_FORMAT)
            self.setEncodings(encodings(self.viewer.args.encoding))
            self.framebuffer = np.zeros((self.height, self.width), PIXEL)
            self.viewer.connected(self.width, self.height)

        def updateRectangle(self, x: int, y: int, width: int, height: int, data: bytes) -> None:
            self.framebuffer[y : y + height, x : x + width] = np.frombuffer(data, PIXEL).reshape(height, width)

        def fillRectangle(self, x: int, y: int, width: int, height: int, color: bytes) -> None:
            self.framebuffer[y : y + height, x : x + width] = int.from_bytes(color, "little")

        def copyRectangle(self, srcx: int, srcy: int, x: int, y: int, width: int, height: int) -> None:
            source = self.framebuffer[srcy : srcy + height, srcx : srcx + width]
            self.framebuffer[y : y + height, x : x + width] = source.copy()

        def _doNextHextileSubrect(self, bg: Any, color: Any, x: int, y: int, width: int, height: int,
                                  tx: int | None, ty: int | None) -> None:
            """vncdotool calls this (tx None) when a Hextile rectangle starts; :class:`Hextile` does the rest."""
            self.hextile = Hextile(self.framebuffer, x, y, width, height)
            self.expect(self._hextileData, 1)

        def _hextileData(self, block: bytes) -> None:
            """``block`` (the bytes asked for) and whatever else has arrived."""
            used, needed = self.hextile.feed(block + bytes(self._packet))
            if used < len(block):
                self._packet[0:0] = block[used:]
            else:
                del self._packet[: used - len(block)]
            if needed:
                self.expect(self._hextileData, needed)  # more than has arrived: waits for data
            else:
                self._doConnection()

        def updateDesktopSize(self, width: int, height: int) -> None:
            """The remote screen changed size: start from black, ask for all of it."""
            self.width, self.height = width, height
            self.framebuffer = np.zeros((height, width), PIXEL)
            self.resized = True

        def commitUpdate(self, rectangles: list[Rect] | None = None) -> None:
            full, self.resized = self.resized, False
            self.viewer.draw([(0, 0, self.width, self.height)] if full else (rectangles or []), resized=full)
            self.framebufferUpdateRequest(incremental=not full)


class Factory(RFBFactory):
    protocol = Client

    def __init__(self, viewer: Viewer) -> None:
        super().__init__(password=None, shared=True)
        self.viewer = viewer

    def clientConnectionFailed(self, connector: Any, reason: Failure) -> None:
        if reason.check(error.TimeoutError):
            self.viewer.fail(ViewerError("timeout", f"no TCP connection within {self.viewer.args.timeout:g}s"))
        else:
            self.viewer.fail(ViewerError("unreachable", reason.getErrorMessage()))


class Viewer(common.ViewerRun):
    """The two phases: connect and authenticate, then draw and forward input."""

    program = PROGRAM
    what = "VNC server"

    def __init__(self, reactor: Any, args: Any, password: str, status: common.Status) -> None:
        super().__init__(reactor, args, password, status)
        self.client: Client | None = None
        self.stage = "version"  # how far the handshake got: version, auth, password, ready
        self.buttons = 0
        self.keys = PressedKeys()
        self.masks = (0, 0)  # Num Lock, AltGr

    def connection(self) -> Any:
        return self.client.transport if self.client is not None else None

    # -- phase 1 and the ways out
    def connected(self, width: int, height: int) -> None:
        self.ready(width, height)

    def remote_closed(self, reason: Failure) -> None:
        if self.exit_code is not None:
            return
        if self.stage == "ready":
            self.say(f"the VNC server closed the connection ({reason.getErrorMessage()})")
            self.finish(0)
        elif self.stage == "password":  # RFB 3.3 servers just hang up on a wrong password
            self.fail(ViewerError("auth", "the server closed the connection after the password"))
        else:
            self.fail(ViewerError("protocol", "the server closed the connection during the handshake"))

    # -- phase 2
    def attach(self) -> None:
        """SIGUSR1: open the display, ask for the whole remote screen."""
        self.attach_wanted = True
        if self.stage != "ready" or self.canvas is not None or self.exit_code is not None or self.client is None:
            return
        if not self.open_display():
            return
        self.client.framebufferUpdateRequest(incremental=False)
        self.reader.doRead()

    def display_opened(self) -> None:
        self.masks = self._modifier_masks()

    def _modifier_masks(self) -> tuple[int, int]:
        """The modifier bits of Num Lock and of AltGr on this display."""
        display, numlock, altgr = self.canvas.display, 0, 0
        for index, keycodes in enumerate(display.get_modifier_mapping()):
            keysyms = {display.keycode_to_keysym(keycode, 0) for keycode in keycodes if keycode}
            numlock |= (1 << index) if NUM_LOCK in keysyms else 0
            altgr |= (1 << index) if keysyms & ALTGR_KEYSYMS else 0
        return numlock, altgr

    def draw(self, rects: list[Rect], resized: bool = False) -> None:
        """Show a finished update's rectangles, clipped to the window."""
        canvas, client = self.canvas, self.client
        if canvas is None or client is None or not rects:
            return
        if len(rects) > MAX_RECTS:
            rects = [bounding_box(rects)]
        width, height = min(canvas.width, client.width), min(canvas.height, client.height)
        try:
            for rect in rects:
                visible = clip(*rect, width, height)
                if visible is not None:
                    x, y, w, h = visible
                    canvas.put(x, y, w, h, client.framebuffer[y : y + h, x : x + w].tobytes())
            if resized:  # a smaller remote screen leaves black around it
                for rect in ((width, 0, canvas.width, canvas.height), (0, height, canvas.width, canvas.height)):
                    visible = clip(*rect, canvas.width, canvas.height)
                    if visible is not None:
                        canvas.put(*visible, bytes(visible[2] * visible[3] * 4))
            self._push()
        except Exception:  # the display is gone (the session ended)
            self.x_lost()
            return
        self.reader.doRead()  # the round trip may have queued X events without waking the reactor

    def _push(self) -> None:
        """Get every request to the X server now.  python-xlib's flush() makes
        one non-blocking send attempt: whatever part of a big PutImage the
        socket does not take at once waits for the next request, which on a
        still screen may never come.  A round trip sends it all, and holds
        us back while the X server is busy drawing."""
        self.canvas.display.sync()

    def x_event(self, event: Any) -> None:
        X, client, display = self.canvas.X, self.client, self.canvas.display
        kind = event.type
        if kind in (X.KeyPress, X.KeyRelease):
            keysym = choose_keysym(lambda i: display.keycode_to_keysym(event.detail, i), event.state, *self.masks)
            if kind == X.KeyPress:
                client.keyEvent(self.keys.press(event.detail, keysym), down=True)
            else:
                client.keyEvent(self.keys.release(event.detail, keysym), down=False)
        elif kind in (X.ButtonPress, X.ButtonRelease, X.MotionNotify):
            if kind != X.MotionNotify:
                self.buttons = button_mask(self.buttons, event.detail, kind == X.ButtonPress)
            x = min(max(event.event_x, 0), client.width - 1)
            y = min(max(event.event_y, 0), client.height - 1)
            client.pointerEvent(x, y, self.buttons)
        elif kind == X.Expose:
            self.canvas.expose(event.x, event.y, event.width, event.height)
            if event.count == 0:  # the last of a series
                self._push()
        elif kind == X.FocusOut:
            for keysym in self.keys.release_all():
                client.keyEvent(keysym, down=False)



def main(argv: list[str] | None = None) -> int:
    parser = common.parser("Show a VNC desktop in this X display.")
    parser.add_argument("--encoding", choices=sorted(PREFERRED), default="hextile", help="the preferred encoding")
    args = parser.parse_args(argv)
    password = common.read_password(args)
    from twisted.internet import reactor
    from twisted.logger import (FilteringLogObserver, LogLevel, LogLevelFilterPredicate, globalLogBeginner,
                                textFileLogObserver)

    # vncdotool logs every rectangle at info level; only warnings and errors matter.
    quiet = FilteringLogObserver(textFileLogObserver(sys.stderr), [LogLevelFilterPredicate(LogLevel.warn)])
    globalLogBeginner.beginLoggingTo([quiet], redirectStandardIO=False)
    viewer = Viewer(reactor, args, password, common.Status())
    common.on_attach(reactor, viewer.attach, args.attach_now)

    def watchdog() -> None:
        """Reactor shutdown joins its threads, and a name lookup stuck in
        getaddrinfo() would hold us there: leave regardless after a while."""
        timer = threading.Timer(HARD_EXIT_AFTER, lambda: os._exit(viewer.exit_code or 0))
        timer.daemon = True
        timer.start()

    reactor.addSystemEventTrigger("before", "shutdown", watchdog)
    viewer.start(Factory(viewer))
    reactor.run()
    return viewer.exit_code or 0


if __name__ == "__main__":
    sys.exit(main())
