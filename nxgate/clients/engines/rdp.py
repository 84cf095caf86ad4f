"""The RDP engine: rdpy (rdpyqt 2.1.6) in-process, drawing into the session's
nxagent display.  See :mod:`nxgate.clients.engines.common` for the contract (command
line, status line on fd 3, SIGUSR1, exit codes).

rdpy is a protocol stack without an error path: exceptions are logged and
swallowed, and the connection then just hangs.  :class:`Link` therefore
takes the place of rdpy's bottom layer (its CSSP proxy) to follow how far
the handshake got, to see the exceptions, and to turn a lost connection
into the right error kind.  Everything else uses rdpy's documented
client API (``RDPClientController``, ``RDPClientObserver``).

Bitmap updates land in a numpy BGRX copy of the remote screen; once the
client is attached, the rectangles of one network read are drawn together
(their bounding box if there are many).  Keys go out as scan codes taken
from the X keycode (keycode - 8 is the Linux evdev code), so the remote
side applies its own keyboard layout, which ``--keyboard`` selects.

    python -m nxgate.clients.engines.rdp --host HOST --port 3389 [--user U] [--password-stdin]
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
from OpenSSL import SSL
from rdpy.core import log as rdpy_log
from twisted.internet import error
from twisted.python.failure import Failure

from nxgate.clients.engines import common
from nxgate.clients.engines.common import ViewerError

rdpy_log.set_level(rdpy_log.Level.ERROR)  # rdpy prints to stdout, even on import ("PyAV not installed")
from rdpy.core import rle  # noqa: E402
from rdpy.core.error import RDPSecurityNegoFail  # noqa: E402
from rdpy.protocol.rdp import rdp  # noqa: E402
from rdpy.protocol.rdp.nla import cssp  # noqa: E402
from rdpy.protocol.rdp.pdu.caps import CapsType  # noqa: E402
from rdpy.protocol.rdp.t125 import gcc  # noqa: E402

#: XKB layout (the part after "/" in the NX client's ``pc105/de``) -> the
#: name rdpy knows (gcc.KeyboardLayout).  Anything else falls back to US.
LAYOUTS = {"us": "US", "de": "GERMAN", "fr": "FRENCH", "es": "SPANISH", "it": "ITALIAN", "dk": "DANISH",
           "fi": "FINNISH", "no": "NORWEGIAN", "nl": "DUTCH", "gr": "GREEK", "il": "HEBREW", "hu": "HUNGARIAN",
           "is": "ICELANDIC", "jp": "JAPANESE", "kr": "KOREAN", "cz": "CZECH", "bg": "BULGARIAN",
           "ara": "ARABIC", "tw": "CHINESE_US_KEYBOARD"}
#: evdev codes 1-88 *are* the XT set-1 scan codes; these are the others
#: (True: sent with the E0 "extended" prefix).
EXTENDED = {96: (0x1C, True), 97: (0x1D, True), 98: (0x35, True), 99: (0x37, True), 100: (0x38, True),
            102: (0x47, True), 103: (0x48, True), 104: (0x49, True), 105: (0x4B, True), 106: (0x4D, True),
            107: (0x4F, True), 108: (0x50, True), 109: (0x51, True), 110: (0x52, True), 111: (0x53, True),
            113: (0x20, True), 114: (0x2E, True), 115: (0x30, True), 117: (0x59, False), 121: (0x7E, False),
            124: (0x7D, False), 125: (0x5B, True), 126: (0x5C, True), 127: (0x5D, True), 89: (0x73, False),
            92: (0x79, False), 93: (0x70, False), 94: (0x7B, False)}
NEGOTIATION_FAILURES = {1: "the server requires TLS", 2: "the server does not allow TLS (standard RDP security only)",
                        3: "the server has no TLS certificate", 5: "the server requires NLA (--security nla)",
                        6: "the server requires TLS with user authentication"}
MAX_RECTS = 16        # more rectangles than this in one read are drawn as their bounding box
MAX_PENDING = 1024    # input events kept while rdpy still blocks input


def keyboard_layout(nx_keyboard: str) -> str:
    """``pc105/de``, ``de``, ``pc105/de(nodeadkeys)`` or ``de,us`` -> ``GERMAN``."""
    layout = nx_keyboard.rpartition("/")[2].split(",")[0].split("(")[0].strip().lower()
    return LAYOUTS.get(layout, "US")


def scancode(keycode: int) -> tuple[int, bool] | None:
    """The RDP scan code (and E0 flag) of an X keycode, or None (Pause and
    the like need sequences rdpy cannot send)."""
    evdev = keycode - 8
    if 1 <= evdev <= 88 and evdev != 84:
        return evdev, False
    return EXTENDED.get(evdev)


def decode(width: int, height: int, bpp: int, compressed: Any, data: bytes) -> np.ndarray:
    """A bitmap update as top-down BGRX pixels, shape (height, width, 4).

    RDP bitmaps are bottom-up, but rdpy's interleaved RLE decoder (15-24
    bpp) already flips them, and GFX surfaces arrive top-down."""
    if compressed == "gfx":
        return np.frombuffer(data, np.uint8, width * height * 4).reshape(height, width, 4)
    if bpp == 32:
        raw = rle.bitmap_decompress4(data, width, height) if compressed else data
        return np.frombuffer(raw, np.uint8, width * height * 4).reshape(height, width, 4)[::-1]
    size = 3 if bpp == 24 else 2
    if compressed:
        rows = np.frombuffer(rle.bitmap_decompress(data, width, height, size), np.uint8).reshape(height, width * size)
    else:
        stride = (width * size + 3) & ~3
        rows = np.frombuffer(data, np.uint8, stride * height).reshape(height, stride)[::-1, : width * size]
    out = np.zeros((height, width, 4), np.uint8)
    if bpp == 24:
        out[..., :3] = rows.reshape(height, width, 3)
        return out
    pixels = rows.copy().view("<u2").astype(np.uint32)
    green_bits = 6 if bpp == 16 else 5
    fields = ((pixels >> (5 + green_bits)) & 0x1F, (pixels >> 5) & ((1 << green_bits) - 1), pixels & 0x1F)
    for channel, (value, bits) in zip((2, 1, 0), zip(fields, (5, green_bits, 5))):
        out[..., channel] = (value << (8 - bits)) | (value >> (2 * bits - 8))
    return out


def lost_error(stage: str, reason: Failure) -> ViewerError:
    """What a connection lost before the session was ready means, from how far it got."""
    if reason.check(SSL.Error):
        return ViewerError("tls", f"TLS handshake failed ({ssl_text(reason.value)})")
    if stage == "tls":
        return ViewerError("tls", "the server closed the connection during the TLS handshake")
    if stage == "nla-auth":
        return ViewerError("auth", "the server rejected the credentials (NLA)")
    where = {"negotiate": "before negotiating security", "nla": "during NLA"}.get(stage, "during the RDP handshake")
    return ViewerError("protocol", f"the server closed the connection {where}")


def stack_error(exc: Exception) -> ViewerError:
    """What an exception inside rdpy during the handshake means."""
    if isinstance(exc, RDPSecurityNegoFail):
        code = int(str(exc).rsplit(" ", 1)[-1], 16) if re.search(r" [0-9a-f]+$", str(exc)) else 0
        return ViewerError("tls", NEGOTIATION_FAILURES.get(code, f"security negotiation failed ({exc})"))
    return ViewerError("protocol", f"bad data from the server ({type(exc).__name__}: {exc})")


def ssl_text(exc: BaseException) -> str:
    details = exc.args[0] if exc.args and isinstance(exc.args[0], list) else []
    return ", ".join(str(item[-1]) for item in details if isinstance(item, tuple)) or str(exc) or "no details"


class Link(cssp.CSSP):
    """rdpy's bottom layer (TCP, TLS, NLA), plus what rdpy leaves out:
    the handshake stage, and the exceptions its layers swallow."""

    def __init__(self, original: cssp.CSSP, viewer: Viewer) -> None:
        super().__init__(original._layer, original._authenticationProtocol)
        self.viewer = viewer
        self.answered = False
        tpkt = self._layer
        # TPKT.readData/readFastPath log and drop any exception; these report it.
        tpkt.readData = lambda data: self._guard(tpkt._presentation.recv, data, tpkt)
        tpkt.readFastPath = lambda data: self._guard(lambda d: tpkt._fastPathListener.recvFastPath(tpkt._secFlag, d), data, tpkt)

    def _guard(self, handler: Callable[[Any], None], data: Any, tpkt: Any) -> None:
        try:
            handler(data)
            if self.viewer.stage == "negotiate":  # X.224 confirmed, but neither TLS nor NLA started
                self.viewer.fail(ViewerError("tls", "the server chose standard RDP security (no TLS), "
                                                    "which this engine does not support"))
        except Exception as exc:
            self.viewer.stack_failed(exc)
        finally:
            tpkt.expect(2, tpkt.readHeader)

    def connectionMade(self) -> None:
        self.viewer.link, self.viewer.stage = self, "negotiate"
        super().connectionMade()

    def dataReceived(self, data: bytes) -> None:
        if not self.answered:
            self.answered = True
            if data[:1] != b"\x03":  # an X.224 connection confirm is a TPKT
                self.viewer.fail(ViewerError("protocol", f"not an RDP server (it answered {data[:16]!r})"))
                return
        if self.viewer.stage == "tls":  # decrypted data: the handshake went through
            self.viewer.stage = "rdp"
        super().dataReceived(data)

    def startTLS(self, context: Any) -> None:
        if self.viewer.stage == "negotiate":
            self.viewer.stage = "tls"
        super().startTLS(context)

    def startNLA(self, context: Any, callback: Callable[[], None] | None = None) -> None:
        self.viewer.stage = "nla"
        super().startNLA(context, callback)

    def _processChallenge(self, data: bytes) -> None:
        try:
            super()._processChallenge(data)
            self.viewer.stage = "nla-auth"
        except Exception as exc:
            self.viewer.fail(ViewerError("protocol", f"NLA failed ({type(exc).__name__}: {exc})"))

    def _processPubKeyInc(self, data: bytes) -> None:
        request = cssp.decodeDERTRequest(data)
        if request.getComponentByName("errorCode").isValue:
            code = int(request.getComponentByName("errorCode")) & 0xFFFFFFFF
            self.viewer.fail(ViewerError("auth", f"the server rejected the credentials (NLA, status 0x{code:08x})"))
            return
        try:
            super()._processPubKeyInc(data)
            self.viewer.stage = "rdp"
        except Exception as exc:
            self.viewer.fail(ViewerError("auth", f"NLA failed ({type(exc).__name__}: {exc})"))


class Factory(rdp.ClientFactory):
    """Builds rdpy's stack with a :class:`Link` at the bottom, and reports TCP failures."""

    def __init__(self, viewer: Viewer) -> None:
        self.viewer = viewer

    def buildProtocol(self, addr: Any) -> Link:
        link = Link(super().buildProtocol(addr), self.viewer)
        link.setFactory(self)
        return link

    def buildObserver(self, controller: rdp.RDPClientController, addr: Any) -> None:
        self.viewer.setup(controller)

    def connectionLost(self, link: Any, reason: Failure) -> None:
        super().connectionLost(link, reason)  # rdpy's own clean-up (observer.onClose)
        self.viewer.remote_closed(reason)

    def clientConnectionFailed(self, connector: Any, reason: Failure) -> None:
        if reason.check(error.TimeoutError):
            self.viewer.fail(ViewerError("timeout", f"no TCP connection within {self.viewer.args.timeout:g}s"))
        else:
            self.viewer.fail(ViewerError("unreachable", reason.getErrorMessage()))


class Viewer(common.ViewerRun, rdp.RDPClientObserver):
    """The two phases: connect (TCP, TLS/NLA, RDP handshake), then draw and forward input."""

    program = "nxgate-viewer-rdp"
    what = "RDP session"

    def __init__(self, reactor: Any, args: Any, password: str, status: common.Status) -> None:
        common.ViewerRun.__init__(self, reactor, args, password, status)
        self.width, self.height = common.geometry(args.geometry)
        self.framebuffer = np.zeros((self.height, self.width, 4), np.uint8)
        self.stage = "connect"  # connect, negotiate, tls | nla, nla-auth, rdp, ready
        self.controller: rdp.RDPClientController | None = None
        self.link: Link | None = None
        self.damage: list[tuple[int, int, int, int]] = []
        self.pending: list[tuple[str, tuple[Any, ...]]] = []
        self.pressed: set[tuple[int, bool]] = set()
        self.last_server_error = ""
        self.bad_packets = 0

    def connection(self) -> Any:
        return self.link.transport if self.link is not None else None

    def setup(self, controller: rdp.RDPClientController) -> None:
        """Register as rdpy's observer and configure its stack before it
        connects.  Credentials must be str, even empty (rdpy's defaults are
        bytes, on which its NTLM code crashes)."""
        rdp.RDPClientObserver.__init__(self, controller)
        self.controller = controller
        controller.setScreen(self.width, self.height)
        controller.setSecurityLevel(rdp.SecurityLevel.RDP_LEVEL_NLA if self.args.security == "nla"
                                    else rdp.SecurityLevel.RDP_LEVEL_SSL)
        controller.setKeyboardLayout(keyboard_layout(self.args.keyboard))
        controller.setDomain(self.args.domain)
        controller.setUsername(self.args.user)
        controller.setPassword(self.password)
        if self.args.bpp != 32:  # rdpy always asks for 32 bpp and has no setter for this
            core = controller._mcsLayer._clientSettings.CS_CORE
            core.highColorDepth.value = self.args.bpp
            core.earlyCapabilityFlags.value &= ~gcc.CapabilityFlags.RNS_UD_CS_WANT_32BPP_SESSION

    # -- phase 1
    def onReady(self) -> None:
        width, height = self._server_size()
        if (width, height) != (self.width, self.height):  # the server chose another size
            self.width, self.height = width, height
            self.framebuffer = np.zeros((height, width, 4), np.uint8)
            self._damage(0, 0, width, height)
        if self.stage == "ready":  # a reactivation (resize) of a running session
            return
        self.ready(self.width, self.height)

    def _server_size(self) -> tuple[int, int]:
        try:  # the size the server confirmed (rdpy keeps its capabilities privately)
            bitmap = self.controller._pduLayer._serverCapabilities[CapsType.CAPSTYPE_BITMAP].capability
            return bitmap.desktopWidth.value or self.width, bitmap.desktopHeight.value or self.height
        except (AttributeError, KeyError):
            return self.width, self.height

    def onSessionReady(self) -> None:
        pass

    def onClose(self) -> None:
        pass  # Factory.connectionLost has the reason

    def stack_failed(self, exc: Exception) -> None:
        """An exception inside rdpy: fatal in the handshake, logged (the first few) afterwards."""
        if self.stage != "ready":
            self.fail(stack_error(exc))
            return
        self.bad_packets += 1
        if self.bad_packets <= 5:
            self.say(f"ignored bad data from the server ({type(exc).__name__}: {exc})")

    def remote_closed(self, reason: Failure) -> None:
        if self.exit_code is not None:
            return
        if self.stage != "ready":
            problem = lost_error(self.stage, reason)
            why = f" ({self.last_server_error})" if self.last_server_error else ""
            self.fail(ViewerError(problem.kind, problem.message + why))
            return
        why = f": {self.last_server_error}" if self.last_server_error else ""
        self.say(f"the RDP server closed the connection{why}")
        self.finish(0)

    # -- pixels (both phases)
    def onUpdate(self, left: int, top: int, right: int, bottom: int, width: int, height: int, bpp: int,
                 compressed: Any, data: bytes) -> None:
        """Keep the update in the framebuffer; draw it once attached."""
        try:
            pixels = decode(width, height, bpp, compressed, data)
        except (ValueError, TypeError) as exc:
            self.say(f"undecodable {width}x{height} {bpp} bpp update ({exc})")
            return
        w = min(right - left + 1, width, self.width - left)
        h = min(bottom - top + 1, height, self.height - top)
        if w > 0 and h > 0 and left >= 0 and top >= 0:
            self.framebuffer[top : top + h, left : left + w] = pixels[:h, :w]
            self._damage(left, top, w, h)

    def _damage(self, x: int, y: int, w: int, h: int) -> None:
        if self.canvas is None:
            return
        if not self.damage:
            self.reactor.callLater(0, self.draw)
        self.damage.append((x, y, w, h))

    def draw(self) -> None:
        """Put this read's rectangles on the canvas (clipped to the window)."""
        rects, self.damage = self.damage, []
        canvas = self.canvas
        if canvas is None or not rects or self.exit_code is not None:
            return
        if len(rects) > MAX_RECTS:
            left, top = min(r[0] for r in rects), min(r[1] for r in rects)
            rects = [(left, top, max(r[0] + r[2] for r in rects) - left, max(r[1] + r[3] for r in rects) - top)]
        try:
            for x, y, w, h in rects:
                w, h = min(w, canvas.width - x), min(h, canvas.height - y)
                if w > 0 and h > 0:
                    canvas.put(x, y, w, h, self.framebuffer[y : y + h, x : x + w].tobytes())
        except Exception:  # the display is gone (session ended)
            self.x_lost()
            return
        self.reader.doRead()  # flushing may have queued X events without waking the reactor

    # -- phase 2
    def attach(self) -> None:
        """SIGUSR1: open the display and show what arrived so far."""
        self.attach_wanted = True
        if self.stage != "ready" or self.canvas is not None or self.exit_code is not None:
            return
        if not self.open_display():
            return
        self._damage(0, 0, self.width, self.height)

    def x_event(self, event: Any) -> None:
        X = self.canvas.X
        kind = event.type
        if kind in (X.KeyPress, X.KeyRelease):
            code = scancode(event.detail)
            if code is not None:
                (self.pressed.add if kind == X.KeyPress else self.pressed.discard)(code)
                self.send("key", code[0], kind == X.KeyPress, code[1])
        elif kind in (X.ButtonPress, X.ButtonRelease, X.MotionNotify):
            x = min(max(event.event_x, 0), self.width - 1)
            y = min(max(event.event_y, 0), self.height - 1)
            if kind == X.MotionNotify:
                self.send("pointer", x, y, 0, False)
            elif event.detail in (4, 5, 6, 7):  # wheel: one notch (120) per press
                if kind == X.ButtonPress:
                    self.send("wheel", x, y, 120 if event.detail in (4, 7) else -120, event.detail > 5)
            else:  # X: 1 left, 2 middle, 3 right, 8/9 back/forward -> rdpy: 1 left, 2 right, 3 middle, 4/5
                button = {1: 1, 2: 3, 3: 2, 8: 4, 9: 5}.get(event.detail)
                if button:
                    self.send("pointer", x, y, button, kind == X.ButtonPress)
        elif kind == X.Expose:
            self.canvas.expose(event.x, event.y, event.width, event.height)
        elif kind == X.FocusOut:
            for code in sorted(self.pressed):
                self.send("key", code[0], False, code[1])
            self.pressed.clear()

    def send(self, kind: str, *args: Any) -> None:
        """Forward an input event ("key", "pointer" or "wheel").  rdpy drops
        input for ~5 s after onReady (it waits for a GFX confirmation xrdp
        never sends), so until then events wait here, motion coalesced."""
        if not self.pending and not getattr(self.controller, "_gfxPending", False):
            self._send_now(kind, args)
            return
        motion = kind == "pointer" and not args[2]
        if motion and self.pending and self.pending[-1][0] == "pointer" and not self.pending[-1][1][2]:
            self.pending[-1] = (kind, args)
        elif len(self.pending) < MAX_PENDING:
            self.pending.append((kind, args))
        if len(self.pending) == 1:
            self.reactor.callLater(0.1, self._send_pending)

    def _send_pending(self) -> None:
        if getattr(self.controller, "_gfxPending", False) and self.exit_code is None:
            self.reactor.callLater(0.1, self._send_pending)
            return
        pending, self.pending = self.pending, []
        for kind, args in pending:
            self._send_now(kind, args)

    def _send_now(self, kind: str, args: tuple[Any, ...]) -> None:
        controller = self.controller
        {"key": controller.sendKeyEventScancode, "pointer": controller.sendPointerEvent,
         "wheel": controller.sendWheelEvent}[kind](*args)



def quiet_logging(password: str, viewer: Viewer) -> None:
    """rdpy prints to stdout at DEBUG level by default, credentials included:
    keep warnings only, on stderr, and never the password (nor in Twisted's log)."""
    from twisted.logger import (FilteringLogObserver, LogLevel, LogLevelFilterPredicate, formatEventAsClassicLogText,
                                globalLogBeginner)

    def scrub(text: str) -> str:
        return text.replace(password, "********") if password else text

    def rdpy_line(message: str) -> None:
        if "INFO PDU :" in message:  # the server's reason for a disconnect
            viewer.last_server_error = scrub(message.split("INFO PDU :", 1)[1].strip())
        print(f"nxgate-viewer-rdp: rdpy: {scrub(message)}", file=sys.stderr, flush=True)

    def twisted_line(event: dict[str, Any]) -> None:
        sys.stderr.write(scrub(formatEventAsClassicLogText(event) or ""))

    rdpy_log.set_level(rdpy_log.Level.WARNING)
    rdpy_log.log = rdpy_line
    globalLogBeginner.beginLoggingTo([FilteringLogObserver(twisted_line, [LogLevelFilterPredicate(LogLevel.warn)])],
                                     redirectStandardIO=False)


def main(argv: list[str] | None = None) -> int:
    parser = common.parser("Show an RDP desktop in this X display.")
    parser.add_argument("--user", default="")
    parser.add_argument("--domain", default="")
    parser.add_argument("--security", choices=("tls", "nla"), default="tls")
    parser.add_argument("--bpp", type=int, choices=(15, 16, 24, 32), default=32,
                        help="colour depth to ask for (rdpy decodes 15-24 bpp RLE imperfectly)")
    args = parser.parse_args(argv)
    password = common.read_password(args)
    from twisted.internet import reactor

    viewer = Viewer(reactor, args, password, common.Status())
    quiet_logging(password, viewer)
    common.on_attach(reactor, viewer.attach, args.attach_now)
    viewer.start(Factory(viewer))
    reactor.run()
    return viewer.exit_code or 0


if __name__ == "__main__":
    sys.exit(main())
