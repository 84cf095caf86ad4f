"""nxagent's options line, command line and environment (pure).

nxagent reads its session options from a file named with ``-options`` and
in ``DISPLAY=nx/nx,options=FILE:N``; on SIGHUP it reads the file again,
which is how a suspended session gets a new cookie before a resume
(nxagent-recipe.md).  Every value here was validated by the door that
parsed the request (the NX one's ``requests`` module), so none can carry a
``,`` or ``:`` of its own.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Protocol

from nxgate.vocabulary.requests import DisplaySettings

#: The agent's Unix socket in the session directory.  It is named here,
#: where the agent is told to listen, and the stream's connector imports it
#: (backends know nothing of the stream that connects to them).
SOCKET_NAME = "agent.sock"

PRODUCT = "nxgate"


class AgentSession(Protocol):
    """What the agent's options, argv and environment need of a session.

    A Protocol rather than the session model, so that the backend does not
    depend on the session layer's record: any object with these fields
    (the stored session, a test's stand-in) will do."""

    @property
    def type(self) -> str: ...

    @property
    def display(self) -> int: ...

    @property
    def cookie(self) -> str: ...

    @property
    def rootless(self) -> bool: ...

    @property
    def server_name(self) -> str: ...

    @property
    def full_id(self) -> str: ...

#: sun_path holds 108 bytes with the terminating NUL.
MAX_SOCKET_PATH = 107


@dataclass(frozen=True)
class AgentPlan:
    """How a session's agent runs; kept with the session (as a dict).

    Desktops run ``-D`` (or ``-R`` rootless) and start ``program`` once a
    client is attached; a shadow runs ``-S`` with the shadowed display in
    ``extra_options``, its cookie in ``extra_cookies``, as that display's
    owner (``run_as``), and without persistence: when its viewer leaves it
    ends.  ``pam`` opens a PAM session for the agent.
    """

    mode: str = "-D"
    program: tuple[str, ...] = ()
    extra_options: tuple[tuple[str, str], ...] = ()
    extra_cookies: tuple[tuple[int, str], ...] = ()
    run_as: str = ""
    persistent: bool = True
    pam: bool = True
    # A viewer starts as soon as the agent listens and reports on fd 3
    # before the client is answered; it draws after attach_signal.
    program_early: bool = False
    attach_signal: int = 0
    program_env: tuple[tuple[str, str], ...] = ()
    # Rootless with no program of its own (published applications): -norootlessexit.
    keep_without_windows: bool = False

    def as_dict(self) -> dict[str, object]:
        return {
            "mode": self.mode, "program": list(self.program), "extra_options": [list(o) for o in self.extra_options],
            "extra_cookies": [list(c) for c in self.extra_cookies], "run_as": self.run_as,
            "persistent": self.persistent, "pam": self.pam, "program_early": self.program_early,
            "attach_signal": self.attach_signal, "program_env": [list(e) for e in self.program_env],
            "keep_without_windows": self.keep_without_windows,
        }

    @classmethod
    def from_dict(cls, values: dict[str, object]) -> AgentPlan:
        def pairs(key: str) -> tuple[tuple[str, str], ...]:
            return tuple((str(a), str(b)) for a, b in values.get(key, ()))  # type: ignore[union-attr]

        return cls(
            mode=str(values.get("mode", "-D")),
            program=tuple(values.get("program", ())),  # type: ignore[arg-type]
            extra_options=pairs("extra_options"),
            extra_cookies=tuple((int(d), str(c)) for d, c in values.get("extra_cookies", ())),  # type: ignore[union-attr]
            run_as=str(values.get("run_as", "")),
            persistent=bool(values.get("persistent", True)),
            pam=bool(values.get("pam", True)),
            program_early=bool(values.get("program_early", False)),
            attach_signal=int(values.get("attach_signal", 0)),  # type: ignore[call-overload]
            program_env=pairs("program_env"),
            keep_without_windows=bool(values.get("keep_without_windows", False)),
        )


@dataclass(frozen=True)
class AgentFiles:
    """Where a session's agent keeps its files.

    ``directory`` belongs to the user (the agent writes there); the log
    lives in a root-only directory so that the gateway reads only what the
    agent wrote, never a file the user put in its place.
    """

    directory: str
    log: str
    app_log: str

    @property
    def options(self) -> str:
        return os.path.join(self.directory, "options")

    @property
    def authority(self) -> str:
        return os.path.join(self.directory, "authority")

    @property
    def socket(self) -> str:
        """Where the agent listens for the client's proxy (see
        :mod:`nxgate.wire.agentsocket`)."""
        return os.path.join(self.directory, SOCKET_NAME)


def session_kind(session_type: str) -> str:
    """The session type as nxcomp knows it (it warns about others)."""
    return {"unix-console": "console", "unix-application": "application", "unix-default": "default",
            "shadow": "shadow"}.get(session_type, "desktop")


#: A message cache nxcomp saved when a link ended (``C-``/``S-`` and 32 hex digits).
_SAVED_CACHE = re.compile(r"[CS]-[0-9A-F]{32}")
#: How many names of a cache directory are looked at (nxcomp keeps a few).
MAX_CACHE_NAMES = 256


def cache_directory(session: AgentSession, files: AgentFiles) -> str:
    """Where nxcomp keeps the caches it saves when a link ends: below the
    agent's ``NX_ROOT`` (its session directory), per session kind.

    On any link but ``lan`` the agent saves its message caches when its
    client leaves, and at the next resume it loads the one the client offers
    again.  With a loaded cache, nx-libs 3.5.99.26's reconnection gets the
    font list as a cache hit and then waits in ``NXTransContinue`` for
    nxcomp's ping timeout (5 s) or the first signal (its cache keeper ends
    about 3.5 s after the link opens) before it goes on: every such resume
    took 3.6 s longer (X2Go's clients ask for ``adsl`` by default;
    x2goserver's resumes pay it too).  Without a saved cache the link starts
    with empty caches, its compression unchanged, and resumes in 0.2 s."""
    return os.path.join(files.directory, f"cache-{session_kind(session.type)}")


def is_saved_cache(name: str) -> bool:
    return _SAVED_CACHE.fullmatch(name) is not None


def listen_unix(path: str) -> tuple[str, str]:
    """The agent listens on a Unix socket only (no TCP port at all)."""
    return ("listen", f"unix:{path}")


def listen_tcp(client_address: str) -> tuple[str, str]:
    """The agent listens on TCP 4000+N for one client address (unencrypted
    sessions, whose client connects to the agent directly)."""
    return ("accept", client_address)


def geometry_options(settings: DisplaySettings) -> list[tuple[str, str]]:
    """The size options of a desktop (nx-libs 3.5.99.26, measured; README
    "Session size"; tests/test_e2e_geometry.py).

    ``geometry=WxH`` sizes the window on the client, provided a window
    manager runs there (without one nxagent forces full screen, Screen.c),
    and nxagent reads it only once per agent: at a resume the first size
    stays (the client's window manager then fits it into the new screen).
    ``fullscreen=1`` is ignored at a resume; ``geometry=fullscreen`` is not,
    so a full-screen request says both.  ``resize=1`` makes the desktop
    follow the window whenever the client (or its window manager) resizes
    it."""
    if settings.fullscreen:
        return [("geometry", "fullscreen"), ("fullscreen", "1"), ("resize", "1")]
    return [("geometry", settings.geometry), ("resize", "1")]


def options_line(session: AgentSession, settings: DisplaySettings, listen: tuple[str, str],
                 extra: tuple[tuple[str, str], ...] = ()) -> str:
    """The one-line options file: ``nx/nx,key=value,...:display``."""
    items: list[tuple[str, str]] = [
        ("link", settings.link),
        ("cache", settings.cache),
        ("images", settings.images),
        listen,
        ("cookie", session.cookie),
        ("id", session.full_id),
        ("keyboard", settings.keyboard),
        ("clipboard", settings.clipboard),
        ("client", settings.client),
        ("backingstore", "1" if settings.backingstore else "0"),
        ("composite", "1"),
        ("render", "1"),
        ("shmem", "1"),
        ("shpix", "1"),
        ("strict", "0"),
        # Lossless image compression on every link: by default nxcomp packs
        # a desktop session's images "adaptive" (JPEG at quality 9 on a LAN,
        # 3 on a modem), which makes text that reaches the agent as an image
        # (browsers, many toolkits) blocky and faint on the client.
        ("pack", "lossless"),
        # No cleanup timeout: a suspend or terminate takes 0.6 s instead of
        # 1.1 s.  nxagent then waits for its watchdog instead, which the
        # session manager ends (see _end_watchdog).
        ("cleanup", "0"),
        # A suspended agent keeps drawing at full speed (its default sleeps
        # 50 ms per round while suspended): browser tabs show a suspended
        # session's own framebuffer through x11vnc (nxgate.node.browser_viewer),
        # and with the sleep their key echo and frame rate fell to ~20/s.
        ("sleep", "0"),
        ("product", PRODUCT),
        ("type", session_kind(session.type)),
        *extra,
    ]
    if session.rootless:
        items.append(("menu", "1"))
    else:
        items.extend(geometry_options(settings))
    for key, value in items:
        if key == "shadow" and value.startswith(":") and value[1:].isdigit():
            continue  # the one option whose value is a display
        if key == "listen" and value.startswith("unix:/"):
            value = value[len("unix:"):]  # and the one with a colon of its own
            if len(value.encode()) > MAX_SOCKET_PATH:
                raise ValueError(f"agent socket path too long ({len(value.encode())} > {MAX_SOCKET_PATH} bytes): {value}")
        if any(ch in value for ch in ",:=\n") or not value:
            raise ValueError(f"unsafe value for agent option {key}: {value!r}")
    body = ",".join(f"{key}={value}" for key, value in items)
    return f"nx/nx,{body}:{session.display}\n"


def caption(session: AgentSession) -> str:
    """The window title on the client (``-name``).

    It is in the agent's argv, which every local user sees in ``ps``, so it
    names neither the user nor the session (nxagent reads no title from its
    options file); the display number is in argv anyway."""
    return f"NX - {session.server_name}:{session.display}"


#: X extensions the agent must not offer.  XFCE's window manager composites
#: by default (xfwm4 use_compositing=true), and on nxagent that goes wrong:
#: the agent's framebuffer -- what shadows and screenshots read -- shows the
#: wallpaper where a terminal is, and a window that was covered comes back
#: on the client with its text missing or grey and the cursor a pale box.
#: Compositing managers need XFIXES; without it xfwm4 runs uncomposited and
#: the picture is exact (tests/test_e2e_text.py).  Switching compositing off
#: in xfwm4's own settings fixed it as well, but only for XFCE, and a user
#: can switch it back on; this holds for any desktop.
DISABLED_EXTENSIONS = ("XFIXES",)


def agent_argv(executable: str, session: AgentSession, files: AgentFiles, plan: AgentPlan,
               extra: tuple[str, ...] = ()) -> list[str]:
    """nxagent's command line, which every local user can read in ``ps``.

    It holds no session id: the agent runs in its session directory (the
    launcher's ``cwd``, bubblewrap's ``--chdir``), so its options and X
    authority files are named relative to it, and the options reach
    nxagent in ``DISPLAY`` (``nx/nx,options=FILE:N``, see
    :func:`agent_environment`: the environment is readable by the user and
    root only) instead of ``-display``.  The display number stays: the X
    server takes it only as an argument (and ``/tmp/.X11-unix`` and
    ``/proc/net/unix`` show it to everyone anyway)."""
    return [
        executable,
        "-options", os.path.basename(files.options),
        "-name", caption(session),
        plan.mode,
        *(() if plan.persistent else ("-nopersistent",)),
        *(("-norootlessexit",) if plan.keep_without_windows else ()),
        "-nolisten", "tcp",
        "-auth", os.path.basename(files.authority),
        *(arg for name in DISABLED_EXTENSIONS for arg in ("-extension", name)),
        *extra,
        f":{session.display}",
    ]


def agent_environment(session: AgentSession, files: AgentFiles, base: dict[str, str]) -> dict[str, str]:
    """The agent's environment: the user's login environment plus NX's own."""
    env = dict(base)
    env.update(
        DISPLAY=f"nx/nx,options={files.options}:{session.display}",
        XAUTHORITY=files.authority,
        NX_HOME=files.directory,
        NX_TEMP=files.directory,
        NX_ROOT=files.directory,
    )
    return env


def x11_environment(session: AgentSession, files: AgentFiles, base: dict[str, str]) -> dict[str, str]:
    """The environment of programs that run inside the session."""
    env = dict(base)
    env.update(DISPLAY=f":{session.display}", XAUTHORITY=files.authority)
    return env
