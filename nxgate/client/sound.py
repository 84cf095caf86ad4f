"""``nxgate-client --sound``: the client's end of the NX media channel.

The session's programs are PulseAudio clients of this machine's sound
server (:mod:`nxgate.node.extras.sound`): the client's ``nxproxy -S
media=PORT`` connects every channel connection to PORT here.  nxproxy cannot
connect to a Unix socket there (nx-libs 3.5.99.26 refuses ``media=unix:``),
so for the time of the session this loads a native-protocol TCP module into
the local sound server (``--sound-server``, default: the one libpulse finds,
e.g. $PULSE_SERVER or the user's PulseAudio / PipeWire-Pulse) on 127.0.0.1
and a free port, which demands the cookie both ends derive from the session
cookie (:func:`nxgate.channels.sound_cookie`): another local user who finds
the port cannot use it.  The module goes when the client ends.

``pactl`` runs synchronously: it answers in milliseconds and is run once at
attach and once at the end.
"""

from __future__ import annotations

import os
import socket
import subprocess

from nxgate import channels


class SoundError(Exception):
    pass


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def load_argv(server: str, port: int, cookie_path: str) -> list[str]:
    """``pactl load-module`` of the TCP module for one session (pure)."""
    return [*pactl(server), "load-module", "module-native-protocol-tcp", f"port={port}", "listen=127.0.0.1",
            "auth-anonymous=0", "auth-cookie-enabled=1", f"auth-cookie={cookie_path}"]


def pactl(server: str) -> list[str]:
    return ["pactl", *(("--server", server) if server else ())]


class LocalSound:
    """The TCP module of one attachment in the local sound server."""

    def __init__(self, server: str, directory: str) -> None:
        self.server = server  # empty: libpulse's own choice
        self.directory = directory  # private (0700): the cookie file goes here
        self.module: str | None = None
        self.cookie_path = ""

    def open(self, session_cookie: str) -> int:
        """Load the module for ``session_cookie``; the port for ``media=``."""
        port = free_port()
        # A file per port: PulseAudio shares a cookie loaded from one path.
        self.cookie_path = os.path.join(self.directory, f"sound-cookie-{port}")
        fd = os.open(self.cookie_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(channels.sound_cookie(session_cookie))
        try:
            result = subprocess.run(load_argv(self.server, port, self.cookie_path), capture_output=True,
                                    text=True, timeout=15)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise SoundError(f"cannot run pactl: {error}") from None
        if result.returncode != 0:
            raise SoundError(f"the local sound server refused the NX sound port: {result.stderr.strip()}")
        self.module = result.stdout.strip()
        return port

    def close(self) -> None:
        if self.module is not None:
            subprocess.run([*pactl(self.server), "unload-module", self.module], capture_output=True, timeout=15)
            self.module = None
        if self.cookie_path:
            try:
                os.unlink(self.cookie_path)
            except FileNotFoundError:
                pass
