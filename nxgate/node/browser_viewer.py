"""Browser viewers: ``x11vnc`` serving a session's screen to the page.

Two kinds.  A *live* viewer (:meth:`BrowserViewers.open_live`, every
session that a client drew before) is one x11vnc run as the session's user
on the session's own display, the agent's framebuffer, next to the agent
(in a jailed agent's namespaces): opening costs an x11vnc start, not an NX
resume, and nothing but x11vnc runs per tab.  It is the node's ``view``
stream (:meth:`nxgate.node.local.LocalNode.open_stream`, which checks the
owner and hands this module the node's own record of the session): doors
reach it through the node interface only, on one box and on a cluster.
The agent stays suspended while the page shows it (``sleep=0`` in its
options keeps a suspended agent drawing at full speed), so any NX client
may resume it; a resume ends the live viewers of that session
(:meth:`BrowserViewers.session_changed`, which hears the node's sessions).

x11vnc runs with ``no_network`` (a new, empty network namespace: it can
open no TCP port whatever its options say, and reaches the display by its
path socket only, as thumbnails do, :mod:`nxgate.node.thumbnails`), with
the session's X authority, and listens on a Unix socket in the session's
0700 directory (``view-<id>.sock``), which the gateway reaches as root
without following links (:mod:`nxgate.wire.agentsocket`).

The other kind, kept for what a live viewer cannot show (a session started
for later that never had a client, whose agent has no screen yet, and an
admin's shadow, which is a session of its own): a private Xvfb, the system
``nxproxy`` drawing the session into it, and ``x11vnc`` serving that
display, all three run as the session's user on the machine of the door
(the browser's side, as an NX client's machine would be).  It reaches the
session's agent as every client does: the door relays ``open_stream``'s
``agent`` stream.

A browser cannot speak NX, so the gateway does for it what an NX client's
machine does: ``nxproxy -S`` decodes the session's stream into an X display
(here an Xvfb of the browser window's size, which exists for this one
viewer), and x11vnc turns that display into RFB for noVNC.  The browser's
door (:mod:`nxgate.gateway.doors.web`) takes the session over with the session
service's ``restore`` (exactly an NX resume) and relays the stream, as the
other doors do after ``bye``; this module only runs and stops the programs.

Nothing listens where another user could reach it:

* Xvfb listens on no TCP port and accepts only the per-viewer MIT cookie
  (``auth``, 0600, the user's, in a 0700 directory of the user's);
* nxproxy connects to a Unix socket the door listens on (``nx.sock``,
  0600, the user's) and reads its options, with the session cookie, from a
  0600 file, never argv;
* x11vnc listens only on a Unix socket in the viewer's 0700 directory
  (``vnc.sock``): no TCP, no IPv6.  ``-rfbport 0 -no6 -noipv6`` is not
  enough: x11vnc 0.9.16 still opens ``[::]:5900`` with no password unless
  ``-rfbportv6 0`` says otherwise, so both are given (``-localhost`` is
  no help: it makes x11vnc refuse its Unix-socket clients too, whose
  address is not 127.0.0.1).  Only the
  user and root can connect, and only the door does (as root, without
  following links: :mod:`nxgate.wire.agentsocket`).

Each viewer has a directory ``<state>/viewers/<random id>`` (the parent
0711), removed with the viewer.  :class:`BrowserViewers` counts viewers
per user and in all and refuses more than the configured limits.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import secrets
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from twisted.logger import Logger

from nxgate.node.agents import x11
from nxgate.node import files, processes
from nxgate.node.processes import LaunchError, ProcessId
from nxgate.threads import Blocking, inline
from nxgate.vocabulary.errors import Kind, SessionError
from nxgate.vocabulary.model import Session, State

log = Logger()

_SAFE = re.compile(r"[^A-Za-z0-9._-]")
_COOKIE = re.compile(r"[0-9A-Za-z]{1,128}")
#: The browser's window decides the size, within what Xvfb and nxagent take.
MIN_SIZE, MAX_SIZE = (320, 200), (7680, 4320)
#: A Unix socket's path fits in sun_path (108 bytes with its NUL).
MAX_SOCKET_PATH = 108


class ViewerRefused(SessionError):
    """Too many viewers (of this user, or in all); the text says which."""

    def __init__(self, message: str) -> None:
        super().__init__(Kind.LIMIT_REACHED, message)


@dataclass(frozen=True)
class ViewerLimits:
    per_user: int = 2
    total: int = 20


@dataclass(frozen=True)
class ViewerPrograms:
    xvfb: str = "Xvfb"
    nxproxy: str = "nxproxy"
    x11vnc: str = "x11vnc"
    xprop: str = "xprop"
    setxkbmap: str = "setxkbmap"
    path: str = "/usr/local/bin:/usr/bin:/bin"
    lang: str = "C.UTF-8"
    #: Viewer displays come from here, away from consoles (:0) and the sessions' range.
    first_display: int = 3000
    displays: int = 1000


def clamp_size(width: int, height: int) -> tuple[int, int]:
    """The browser's window size as a screen Xvfb and nxagent accept (even widths: some X drivers want them)."""
    width = max(MIN_SIZE[0], min(MAX_SIZE[0], int(width)))
    height = max(MIN_SIZE[1], min(MAX_SIZE[1], int(height)))
    return width - width % 2, height


def xvfb_argv(program: str, display: int, width: int, height: int, auth: str) -> list[str]:
    """Xvfb for one viewer: it says on fd 3 when it accepts clients
    (``-displayfd``); no TCP; the cookie file; RandR for resizes.  No GLX:
    its only clients are nxproxy and x11vnc, and without it Xvfb does not
    load Mesa (about 10 MB of PSS instead of 60, measured by
    bench/web_viewer.py)."""
    return [program, f":{int(display)}", "-displayfd", "3", "-nolisten", "tcp", "-auth", auth, "-noreset",
            "-screen", "0", f"{width}x{height}x24", "+extension", "RANDR", "-extension", "GLX"]


def nxproxy_options(cookie: str, full_id: str, session_name: str, socket_path: str, agent_display: int) -> str:
    """nxproxy's option line (the file it reads, never argv: the cookie is a
    credential).  Values are checked: a comma or colon would add options."""
    if not _COOKIE.fullmatch(cookie):
        raise ValueError("the session cookie has unexpected characters")
    if "," in socket_path or ":" in socket_path:
        raise ValueError("the viewer's socket path has a comma or a colon")
    name = _SAFE.sub("_", session_name) or "session"
    session_id = _SAFE.sub("_", full_id)
    return (f"nx/nx,session={name},cookie={cookie},id={session_id},"
            f"connect=unix:{socket_path}:{int(agent_display)}")


#: How every viewer's x11vnc polls the screen, and what it leaves out at start.
#:
#: ``-wait 10 -wait_ui 3.33``: between polls of an unchanged screen x11vnc
#: sleeps 10 ms, and 3 ms while the page's keys or pointer moved within the
#: last moments (``-wait_ui`` divides ``-wait`` then), so a key's echo is
#: drawn as soon as with ``-wait 3`` while a tab showing an idle session
#: costs about half the CPU (measured on an xterm's screen with a client
#: asking for updates all along: 1.2-1.5 % of a CPU at ``-wait 3`` against
#: 0.6-0.8 %).  ``-defer 3``: a change goes out 3 ms after it was seen.
#: X DAMAGE hints (x11vnc's default) are kept: without them an idle screen
#: is scanned whole (2 % of a CPU).
#:
#: ``-noxrecord -noxinerama -nodpms -nofbpm``: no RECORD-based scroll
#: detection (copy rectangles save bandwidth a loopback WebSocket does not
#: need) and no probing for extensions a viewer of one screen does not use:
#: x11vnc listens 15-25 ms sooner (50 -> 27-36 ms, median of 7 starts each),
#: time every opening waits.
POLLING = ["-defer", "3", "-wait", "10", "-wait_ui", "3.33", "-noxrecord", "-noxinerama", "-nodpms", "-nofbpm"]


def x11vnc_argv(program: str, display: int, socket_path: str) -> list[str]:
    """x11vnc on the viewer's display, on a Unix socket only, for one client
    (it exits when the browser leaves); the browser's key events mapped
    with XKB; RandR followed.  Its polling: :data:`POLLING` (short delays
    with X DAMAGE hints: measured by bench/web_viewer.py against ``-defer
    10 -wait 10 -noxdamage``, the echo of a key in the page went from
    56/101 to 31/68 ms (p50/p99) and a 60/s full-screen change from 34 to
    57 frames/s).

    ``-skip_keycodes 187,188``: the evdev keymap has "(" and ")" twice, on
    Shift+9/Shift+0 and alone on two multimedia keys (``<I187>``,
    ``<I188>``), which x11vnc preferred (no Shift needed).  A session that
    maps those keycodes otherwise never saw a parenthesis typed in the page
    (issue 25: ``$((6*7))`` arrived as ``$6*7``).

    ``-rfbportv6 0`` matters: without it x11vnc listens on ``[::]:5900``
    despite ``-rfbport 0 -no6 -noipv6`` (and ``-nopw`` would leave that
    port open to anyone).  ``-sb 0``: x11vnc's default slows its polling
    to ~1.5 s after a minute without change, and a tab left idle that long
    drew its next change late."""
    return [program, "-display", f":{int(display)}", "-unixsock", socket_path, "-rfbport", "0",
            "-rfbportv6", "0", "-no6", "-noipv6", "-nopw", "-norc", "-once", "-xkb", "-xrandr", "resize", "-shared",
            "-nevershared", "-skip_keycodes", "187,188", *POLLING, "-sb", "0", "-nowf", "-quiet"]


#: The viewer display's keyboard: US with AltGr for Latin-1 and the euro sign (see :func:`keymap_argv`).
VIEWER_LAYOUT, VIEWER_VARIANT = "us", "altgr-intl"


def keymap_argv(program: str) -> list[str]:
    """``setxkbmap`` giving the viewer's Xvfb a keymap that has a key for
    every Latin-1 character and the euro sign (US, AltGr international).

    noVNC sends keysyms, and x11vnc presses the keys of the Xvfb's keymap
    that make them; nxagent reads the keys with the keymap it took from that
    same display at the resume (``keyboard=clone``).  A keysym the keymap
    lacks, x11vnc adds on a spare keycode that the session never learns of:
    with the plain US map "é", "ß" and "€" became nothing, or another key."""
    return [program, "-layout", VIEWER_LAYOUT, "-variant", VIEWER_VARIANT, "-option", ""]


def live_x11vnc_argv(program: str, display: int, socket_path: str) -> list[str]:
    """x11vnc on a session's own display (a live viewer): as
    :func:`x11vnc_argv` (the same keys left alone: the session's own
    keymap has "(" and ")" on Shift+9/0), plus ``-sb 0`` (x11vnc's default throttles its
    polling to ~1.5 s after a minute without change: a tab left idle would
    then draw its first change late) and ``-timeout 20`` (it exits if the
    gateway never connects).  No ``-xrandr``: the page scales the session's
    screen, which a browser cannot resize (a suspended nxagent keeps its
    size: its RandR changes the root window, never the framebuffer)."""
    return [program, "-display", f":{int(display)}", "-unixsock", socket_path, "-rfbport", "0",
            "-rfbportv6", "0", "-no6", "-noipv6", "-nopw", "-norc", "-once", "-timeout", "20", "-xkb", "-shared",
            "-nevershared", "-skip_keycodes", "187,188", *POLLING, "-sb", "0", "-nowf", "-quiet"]


def selection_nudge_argv(program: str) -> list[str]:
    """``xprop`` emptying the root window's CUT_BUFFER0.  x11vnc sends a
    client no selection in its first 15 seconds unless that property
    changed meanwhile; changed right after the browser connected, the
    session's clipboard reaches the page at once instead of 15 s later."""
    return [program, "-root", "-f", "CUT_BUFFER0", "8s", "-set", "CUT_BUFFER0", ""]


@dataclass
class BrowserViewer:
    """One browser's viewer: its directory, its display and its programs."""

    viewers: BrowserViewers
    id: str
    user: str
    uid: int
    gid: int
    directory: str
    home: str
    width: int = 1024
    height: int = 768
    display: int = -1
    processes: dict[str, ProcessId] = field(default_factory=dict)
    closed: bool = False

    @property
    def nx_socket(self) -> str:
        """Where the door listens for this viewer's nxproxy."""
        return os.path.join(self.directory, "nx.sock")

    vnc_path: str = ""

    @property
    def vnc_socket(self) -> str:
        return self.vnc_path or os.path.join(self.directory, "vnc.sock")

    @property
    def auth(self) -> str:
        return os.path.join(self.directory, "auth")

    def _log(self, name: str) -> str:
        return os.path.join(self.viewers.log_dir, f"viewer-{self.id}.{name}.log")

    def _request(self, argv: list[str], name: str, env: dict[str, str] | None = None,
                 status_fd: bool = False) -> dict[str, Any]:
        programs = self.viewers.programs
        return {"user": self.user, "argv": argv, "log": self._log(name), "cwd": self.directory,
                "env": {"HOME": self.home, "USER": self.user, "LOGNAME": self.user, "PATH": programs.path,
                        "LANG": programs.lang},
                "env_fixed": env or {}, "status_fd": status_fd, "pam": None}

    async def start_display(self) -> int:
        """Start the Xvfb; its display number once it accepts clients."""
        cookie = secrets.token_hex(16)
        programs = self.viewers.programs
        for _attempt in range(5):
            display = self.viewers.free_display()
            files.write_user_file(self.auth, x11.xauthority(display, cookie), self.uid, self.gid)
            argv = xvfb_argv(programs.xvfb, display, self.width, self.height, self.auth)
            process, status = await self.viewers.launcher.start_reporting(self._request(argv, "xvfb", status_fd=True))
            try:
                line = await status
            except LaunchError:  # taken meanwhile: Xvfb ends without a word
                continue
            if line.strip() != str(display):
                processes.send_signal(process, signal.SIGTERM)
                raise LaunchError(f"Xvfb said {line!r} instead of its display")
            self.processes["xvfb"] = process
            self.display = display
            await self.set_keymap()
            return display
        raise LaunchError("no free display for the browser viewer's Xvfb")

    def _x_env(self) -> dict[str, str]:
        return {"DISPLAY": f":{self.display}", "XAUTHORITY": self.auth}

    async def set_keymap(self) -> None:
        """The display's keymap (:func:`keymap_argv`), before nxproxy connects: the session takes it at
        the resume.  Without ``setxkbmap`` the page still types ASCII; the log says why é does not."""
        argv = keymap_argv(self.viewers.programs.setxkbmap)
        try:
            code = await self.viewers.launcher.run(self._request(argv, "setxkbmap", self._x_env()), 10.0)
        except LaunchError as error:
            code, why = None, str(error)
        else:
            why = f"exit code {code}"
        if code != 0:
            log.warn("browser viewer {id}: setxkbmap failed ({why}): only the keys of a US keyboard reach the "
                     "session", id=self.id, why=why)

    async def start_proxy(self, cookie: str, full_id: str, session_name: str, agent_display: int) -> None:
        """Start nxproxy, the NX client half: it connects to :attr:`nx_socket`
        (the door must listen there already) and draws into the Xvfb."""
        home = os.path.join(self.directory, "nx")
        files.make_session_dir(home, self.uid, self.gid)
        options = os.path.join(self.directory, "options")
        line = nxproxy_options(cookie, full_id, session_name, self.nx_socket, agent_display)
        files.write_user_file(options, (line + "\n").encode(), self.uid, self.gid)
        argv = [self.viewers.programs.nxproxy, "-S", f"nx/nx,options={options}:{int(agent_display)}"]
        self.processes["nxproxy"] = await self.viewers.launcher.start(
            self._request(argv, "nxproxy", {**self._x_env(), "NX_HOME": home}))

    async def start_vnc(self) -> None:
        """Start x11vnc on the Xvfb; it listens on :attr:`vnc_socket` soon after."""
        argv = x11vnc_argv(self.viewers.programs.x11vnc, self.display, self.vnc_socket)
        # x11vnc would wait 45 s (a display manager's grace) before it makes its window and asks XFIXES:
        # no clipboard until then.  This display has no display manager.
        env = {**self._x_env(), "X11VNC_AVOID_WINDOWS": "never"}
        self.processes["x11vnc"] = await self.viewers.launcher.start(self._request(argv, "x11vnc", env))

    async def nudge_selection(self) -> None:
        """Lift x11vnc's first 15 seconds without clipboard (:func:`selection_nudge_argv`)."""
        argv = selection_nudge_argv(self.viewers.programs.xprop)
        request = self._live_request(argv, "xprop", {}) if self.live else self._request(argv, "xprop", self._x_env())
        try:
            await self.viewers.launcher.start(request)
        except LaunchError:  # xprop is done before the launcher saw it run: that is all it had to do
            pass

    def alive(self) -> dict[str, bool]:
        return {name: process.alive() for name, process in self.processes.items()}

    #: Set on a live viewer: the session it shows (its agent's display), its X authority and its agent.
    session_id: str = ""
    live_authority: str = ""
    agent: tuple[int, int] = (0, 0)
    #: Why the viewer was closed by the node (a resume elsewhere), for the page.
    ended: str = ""
    #: Called once when the node closes the viewer (the door ends the tab).
    on_close: Callable[[str], None] | None = None

    @property
    def live(self) -> bool:
        return bool(self.session_id)

    async def start_live(self, display: int, authority: str, agent: tuple[int, int], socket_path: str) -> None:
        """Start x11vnc on the session's own display (see the module's docstring)."""
        self.display = display
        self.vnc_path = socket_path
        self.live_authority, self.agent = authority, agent
        argv = live_x11vnc_argv(self.viewers.programs.x11vnc, display, socket_path)
        self.processes["x11vnc"] = await self.viewers.launcher.start(
            self._live_request(argv, "x11vnc", {"X11VNC_AVOID_WINDOWS": "never"}))

    def _live_request(self, argv: list[str], name: str, env: dict[str, str]) -> dict[str, Any]:
        """A program of a live viewer: as the user, on the session's display with its X authority,
        in the agent's namespaces, with no network (see the module's docstring)."""
        request = self._request(argv, name, {"DISPLAY": f":{int(self.display)}", "XAUTHORITY": self.live_authority,
                                             **env})
        request.update(cwd="/", no_network=True, join=list(self.agent))
        return request

    def close(self) -> None:
        """Stop the programs (x11vnc and nxproxy first, then the display) and
        remove the directory.  The session itself is not touched: the agent
        suspends when its proxy goes (or the door suspends it)."""
        if self.closed:
            return
        self.closed = True
        if self.live:
            process = self.processes.get("x11vnc")
            if process is not None:
                processes.send_signal(process, signal.SIGTERM)
            self.viewers.reactor.callLater(3.0, self._kill_leftovers)
            self.viewers.forget(self)
            log.debug("browser viewer {id} of {user} (session {session}) closed", id=self.id, user=self.user,
                     session=self.session_id)
            return
        for name in ("x11vnc", "nxproxy", "xvfb"):
            process = self.processes.get(name)
            if process is not None:
                processes.send_signal(process, signal.SIGTERM)
        self.viewers.reactor.callLater(3.0, self._kill_leftovers)
        self.viewers.forget(self)
        log.debug("browser viewer {id} of {user} closed", id=self.id, user=self.user)

    def _kill_leftovers(self) -> None:
        for process in self.processes.values():
            if process.alive():
                processes.send_signal(process, signal.SIGKILL)
        if self.live:
            with contextlib.suppress(OSError):
                os.unlink(self.vnc_socket)  # x11vnc's, in the session's directory; gone with a TERM already
            return
        files.remove_tree(self.directory)

    def end(self, why: str) -> None:
        """The node ends this viewer (a resume elsewhere, the session ended): the tab hears ``why``."""
        if self.closed:
            return
        self.ended = why
        callback, self.on_close = self.on_close, None
        self.close()
        if callback is not None:
            callback(why)


def shows_live(session: Session) -> bool:
    """Whether a live viewer can show ``session`` (the node's record): its
    agent runs and had a client before (a screen to show)."""
    return (session.ever_attached and bool(session.agent_pid)
            and session.state in (State.RUNNING, State.SUSPENDED, State.SUSPENDING))


class BrowserViewers:
    """All browser viewers of this machine, and their limits."""

    def __init__(self, reactor: Any, launcher: Any, root: str, log_dir: str,
                 limits: ViewerLimits = ViewerLimits(), programs: ViewerPrograms = ViewerPrograms(),
                 blocking: Blocking = inline) -> None:
        """``blocking`` runs the account look-up (NSS: maybe LDAP) and the
        directory's creation off the reactor (the gateway passes a thread)."""
        self.reactor = reactor
        self.blocking = blocking
        self.launcher = launcher
        self.root = root
        self.log_dir = log_dir
        self.limits = limits
        self.programs = programs
        self.open_viewers: dict[str, BrowserViewer] = {}

    async def open_live(self, session: Session, directory: str, authority: str) -> BrowserViewer:
        """A live viewer of ``session`` (the node's own record; the node
        checked the caller owns it), its x11vnc started in the session's
        ``directory`` with its X ``authority`` (it listens soon after), or
        :class:`ViewerRefused` past the limits."""
        if not shows_live(session):
            raise SessionError(Kind.WRONG_STATE, f"Session {session.id} cannot be shown in a browser now.",
                               session_id=session.id)
        user = session.user
        self._check_limits(user)
        viewer_id = secrets.token_hex(12)
        viewer = BrowserViewer(self, viewer_id, user, session.uid, session.gid, directory, "/")
        viewer.session_id = session.id
        self.open_viewers[viewer_id] = viewer
        # Short: a session directory's path is long already, and x11vnc copies it without a check into
        # sun_path's 108 bytes (a longer one aborts it: "buffer overflow detected").
        socket_path = os.path.join(directory, f"view-{viewer_id[:8]}")
        if len(socket_path.encode()) >= MAX_SOCKET_PATH:
            self.open_viewers.pop(viewer_id, None)
            raise SessionError(Kind.INTERNAL, f"The viewer's socket path is too long ({socket_path}).")
        try:
            await viewer.start_live(session.display, authority, (session.agent_pid, session.agent_started),
                                    socket_path)
        except BaseException:
            viewer.close()
            raise
        log.info("browser viewer {id} for {user}: x11vnc on session {session}'s display", id=viewer_id, user=user,
                 session=session.id)
        return viewer

    def session_changed(self, event: Any) -> None:
        """A session observer: an NX client resuming a session takes it, as
        it would from another client, so the session's live viewers end (the
        tab says why); so do they when it ends."""
        new = event.view.state
        if new in (State.RESUMING, State.WAITING, State.RUNNING):
            why = "The session was resumed elsewhere."
        elif not new.live:
            why = "The session ended."
        else:
            return
        for viewer in list(self.open_viewers.values()):
            if viewer.session_id == event.view.id:
                log.info("browser viewer {id} ends: session {session} is {state}", id=viewer.id,
                         session=viewer.session_id, state=new.value)
                viewer.end(why)

    def _check_limits(self, user: str) -> None:
        if self.count(user) >= self.limits.per_user:
            raise ViewerRefused(f"{user} already has {self.limits.per_user} sessions open in a browser")
        if self.count() >= self.limits.total:
            raise ViewerRefused(f"the server already shows {self.limits.total} sessions in browsers")

    def prepare(self) -> None:
        os.makedirs(self.root, mode=0o711, exist_ok=True)
        os.chmod(self.root, 0o711)

    def free_display(self) -> int:
        """A display number of the viewers' range with no X server's lock file (a random one:
        two viewers starting at once rarely pick the same, and Xvfb refuses a taken one)."""
        first, count = self.programs.first_display, self.programs.displays
        for _ in range(50):
            display = first + secrets.randbelow(count)
            if not os.path.exists(f"/tmp/.X{display}-lock") and not os.path.exists(f"/tmp/.X11-unix/X{display}"):
                return display
        return first + secrets.randbelow(count)

    def count(self, user: str | None = None) -> int:
        return sum(1 for viewer in self.open_viewers.values() if user is None or viewer.user == user)

    async def open(self, user: str, width: int, height: int) -> BrowserViewer:
        """A new viewer for ``user`` (programs not started yet), or
        :class:`ViewerRefused` past the limits."""
        self._check_limits(user)
        viewer_id = secrets.token_hex(12)
        directory = os.path.join(self.root, viewer_id)
        # Counted from now, while the look-up and the directory take their thread.
        viewer = BrowserViewer(self, viewer_id, user, -1, -1, directory, "/", *clamp_size(width, height))
        self.open_viewers[viewer_id] = viewer
        try:
            entry = await self.blocking(self._make_directory, user, directory)
        except BaseException:
            self.open_viewers.pop(viewer_id, None)
            raise
        viewer.uid, viewer.gid, viewer.home = entry.pw_uid, entry.pw_gid, entry.pw_dir
        log.info("browser viewer {id} for {user} ({width}x{height})", id=viewer_id, user=user, width=width,
                 height=height)
        return viewer

    def _make_directory(self, user: str, directory: str) -> pwd.struct_passwd:
        entry = pwd.getpwnam(user)
        self.prepare()
        files.make_session_dir(directory, entry.pw_uid, entry.pw_gid)
        return entry

    def forget(self, viewer: BrowserViewer) -> None:
        self.open_viewers.pop(viewer.id, None)

    def close_all(self) -> None:
        for viewer in list(self.open_viewers.values()):
            viewer.close()
