"""RDP test hosts with a known picture, broken servers, and the RDP viewer
engine (or xfreerdp) as a child.

:class:`RDPHost` is a real xrdp on loopback.  xrdp draws its own login
screen without any session manager (xrdp-sesman is only needed once someone
logs in), so an RDP client sees a deterministic picture whose colours come
from xrdp.ini: the desktop behind the login box is ``blue=`` (and the box's
title bar ``ls_top_window_bg_color=``), the box itself ``grey=`` /
``ls_bg_color=``.  xrdp runs with ``fork=false`` in its own process group,
so that killing it really ends the connections it serves; as root it makes
its socket directory /var/run/xrdp/sockdir itself and, with ``--nodaemon``,
writes no pid file.

:class:`NLAHost` is FreeRDP's shadow server (package freerdp2-shadow-x11)
sharing an Xvfb of one colour, with NLA against a SAM file: xrdp has no NLA.

The broken servers (:func:`silent_listener`, :class:`ScriptedServer`) stand
in for hosts that never answer, close at once, answer something that is
not RDP, or accept TLS in the X.224 negotiation and then fail the handshake.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

from tests.harness.net import free_port, listening
from tests.harness.process import stop, wait_for
from tests.harness.viewer import ViewerProcess
from tests.harness.x11 import ClientScreen

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAGENTA = (255, 0, 128)      # the desktop behind the login box
GREEN = (32, 192, 64)        # the login box
CERTIFICATE = "/etc/ssl/certs/ssl-cert-snakeoil.pem"
KEY = "/etc/ssl/private/ssl-cert-snakeoil.key"
#: An X.224 Connection Confirm selecting TLS (PROTOCOL_SSL): TPKT header,
#: CC TPDU, RDP_NEG_RSP.
X224_CONFIRM_TLS = bytes.fromhex("03000013" "0ed000001234" "00" "0200080001000000")
#: Where xrdp puts the login box's input fields for 1024x768 and the stock
#: ls_* geometry (box 350x430 centred; fields at x 110, rows 26 px apart).
USERNAME_FIELD = (451, 417, 200, 17)   # x, y, width, height (inside the border)
PASSWORD_FIELD = (451, 443, 200, 17)


def hex_colour(colour: tuple[int, int, int]) -> str:
    return "%02x%02x%02x" % colour


class RDPHost:
    """xrdp on 127.0.0.1:``port`` showing its login screen in known colours.

    ``security`` is xrdp's ``security_layer``: tls, negotiate or rdp."""

    def __init__(self, security: str = "tls", desktop: tuple[int, int, int] = MAGENTA,
                 box: tuple[int, int, int] = GREEN) -> None:
        self.dir = tempfile.mkdtemp(prefix="nxgate-rdphost-")
        self.port = free_port()
        self.log = os.path.join(self.dir, "xrdp.log")
        self.config = os.path.join(self.dir, "xrdp.ini")
        settings = {"port": f"tcp://127.0.0.1:{self.port}", "security_layer": security, "fork": "false",
                    "certificate": CERTIFICATE, "key_file": KEY, "LogFile": self.log, "EnableSyslog": "false",
                    "LogLevel": "INFO", "blue": hex_colour(desktop), "ls_top_window_bg_color": hex_colour(desktop),
                    "grey": hex_colour(box), "ls_bg_color": hex_colour(box)}
        with open("/etc/xrdp/xrdp.ini") as handle:
            lines = handle.read().splitlines()
        with open(self.config, "w") as handle:
            for line in lines:
                key = line.split("=", 1)[0].strip()
                handle.write(f"{key}={settings.pop(key)}\n" if "=" in line and key in settings else line + "\n")
        with open(os.path.join(self.dir, "xrdp.out"), "wb") as out:
            self.process = subprocess.Popen(["xrdp", "--nodaemon", "--config", self.config], stdout=out,
                                            stderr=out, start_new_session=True)
        wait_for(self._listening, 20, f"xrdp on port {self.port}")

    def _listening(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"xrdp exited: {self.server_log()[-2000:]}")
        return listening(self.port)

    def server_log(self) -> str:
        try:
            with open(self.log, errors="replace") as handle:
                return handle.read()
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL xrdp (its process group: any helper it started goes too)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def close(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.kill()
        subprocess.run(["rm", "-rf", self.dir], check=False)


class NLAHost:
    """freerdp-shadow-cli on 127.0.0.1:``port`` sharing an Xvfb painted
    ``colour``; NLA only, ``user`` / ``password`` in its SAM file."""

    available = shutil.which("freerdp-shadow-cli") is not None

    def __init__(self, user: str, password: str, colour: tuple[int, int, int] = (0, 160, 255),
                 width: int = 1024, height: int = 768) -> None:
        from Crypto.Hash import MD4  # pycryptodome, an rdpyqt dependency

        self.dir = tempfile.mkdtemp(prefix="nxgate-nlahost-")
        self.port = free_port()
        self.log = os.path.join(self.dir, "shadow.log")
        sam = os.path.join(self.dir, "sam")
        with open(sam, "w") as handle:  # winpr's SAM format: user:domain:LM hash:NT hash:::
            handle.write(f"{user}:::{MD4.new(password.encode('utf-16-le')).hexdigest()}:::\n")
        self.screen = ClientScreen(width, height)
        subprocess.run(["xsetroot", "-solid", "#" + hex_colour(colour)], env=dict(os.environ, DISPLAY=self.screen.name),
                       check=True)
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                ["freerdp-shadow-cli", f"/port:{self.port}", "/bind-address:127.0.0.1", "/sec:nla",
                 f"/sam-file:{sam}", "+auth"], env=dict(os.environ, DISPLAY=self.screen.name, HOME=self.dir),
                stdout=out, stderr=out)
        wait_for(self._listening, 20, f"freerdp-shadow-cli on port {self.port}")

    def _listening(self) -> bool:
        if self.process.poll() is not None:
            with open(self.log, errors="replace") as handle:
                raise AssertionError(f"freerdp-shadow-cli exited: {handle.read()[-2000:]}")
        return listening(self.port)

    def close(self) -> None:
        stop(self.process)
        self.screen.close()
        subprocess.run(["rm", "-rf", self.dir], check=False)


def silent_listener() -> tuple[socket.socket, int]:
    """A socket that listens but never accepts: connects succeed (the
    kernel's backlog), then nothing is ever said.  Close it when done."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    return server, server.getsockname()[1]


class ScriptedServer:
    """A TCP server that reads the client's first packet, then sends
    ``replies`` (one after the other, a short pause between them) and
    closes, or holds the connection open for ``hold`` seconds."""

    def __init__(self, replies: list[bytes], hold: float = 0.0) -> None:
        self.replies, self.hold = replies, hold
        self.server = socket.socket()
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(8)
        self.server.settimeout(0.2)
        self.port = self.server.getsockname()[1]
        self.received: list[bytes] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.server.accept()
            except (socket.timeout, OSError):
                continue
            with conn:
                conn.settimeout(5)
                try:
                    self.received.append(conn.recv(4096))
                    for reply in self.replies:
                        conn.sendall(reply)
                        time.sleep(0.1)
                    deadline = time.monotonic() + self.hold
                    while time.monotonic() < deadline and not self.stopping.is_set():
                        time.sleep(0.05)
                except OSError:
                    pass

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(5)
        self.server.close()


def rdp_viewer(port: int, display: str, password: str | None = "", timeout: float = 15.0, attach_now: bool = False,
               extra: tuple[str, ...] = ()) -> ViewerProcess:
    """``python -m nxgate.clients.engines.rdp`` against 127.0.0.1:``port``."""
    args = ["--host", "127.0.0.1", "--port", str(port), "--timeout", str(timeout),
            *(["--password-stdin"] if password is not None else []), *(["--attach-now"] if attach_now else []), *extra]
    return ViewerProcess(args, display, stdin=(password or "").encode() + b"\n", module="nxgate.clients.engines.rdp")


def xfreerdp(port: int, display: str, password: str = "", user: str | None = None,
             extra: tuple[str, ...] = ()) -> ViewerProcess:
    """The native engine: xfreerdp full screen, the password on stdin.

    With ``/from-stdin:force`` and ``/u:`` it prompts "Password: " on stderr
    and reads one line.  The user (and domain, ``/d:``) must be in argv:
    without ``/u:`` it prompts for them on stdout through stdio, whose
    buffer swallows the password line too."""
    security = [] if any(arg.startswith("/sec:") for arg in extra) else ["/sec:tls"]
    args = [f"/v:127.0.0.1:{port}", "/cert:ignore", *security, "/f", "/from-stdin:force",
            *([f"/u:{user}"] if user else []), *extra]
    return ViewerProcess(args, display, stdin=password.encode() + b"\n", program="xfreerdp", module=None)
