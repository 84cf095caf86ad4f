"""``nxgate-client --sound``: the client's end of the NX media channel.

The session's programs are PulseAudio clients of this machine's sound
server (:mod:`nxgate.node.services.sound`): the client's ``nxproxy -S
media=PORT`` connects every channel connection to PORT here.  nxproxy cannot
connect to a Unix socket there (nx-libs 3.5.99.26 refuses ``media=unix:``),
so for the time of the session this loads a native-protocol TCP module into
the local sound server (``--sound-server``, default: the one libpulse finds,
e.g. $PULSE_SERVER or the user's PulseAudio / PipeWire-Pulse) on 127.0.0.1
and a free port, which demands the cookie both ends derive from the session
cookie (:func:`nxgate.protocols.service_channels.sound_cookie`): another local user who finds
the port cannot use it.  The module goes when the client ends.

``pactl`` runs as a child process of the reactor (never waited for on it):
a sound server that hangs must not freeze the NX stream of the session.
"""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Mapping
from typing import Any

from twisted.internet import defer, error, protocol
from twisted.python.failure import Failure

from nxgate.protocols import service_channels

PACTL_TIMEOUT = 15.0


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


class _Collect(protocol.ProcessProtocol):
    """A short-lived child's output and exit code."""

    def __init__(self, done: defer.Deferred[tuple[int | None, str, str]]) -> None:
        self.done = done
        self.out: list[bytes] = []
        self.err: list[bytes] = []

    def outReceived(self, data: bytes) -> None:
        self.out.append(data)

    def errReceived(self, data: bytes) -> None:
        self.err.append(data)

    def processEnded(self, reason: Failure) -> None:
        code = getattr(reason.value, "exitCode", None)
        self.done.callback((code, b"".join(self.out).decode(errors="replace"),
                            b"".join(self.err).decode(errors="replace")))


def run(reactor: Any, argv: list[str], env: Mapping[str, str],
        timeout: float | None = None) -> defer.Deferred[tuple[int | None, str, str]]:
    """Run ``argv`` (found on $PATH) without blocking: (exit code, stdout,
    stderr); the code is None when it was killed after ``timeout`` seconds
    (default: PACTL_TIMEOUT).  Raises OSError through the Deferred when it
    cannot be started."""
    done: defer.Deferred[tuple[int | None, str, str]] = defer.Deferred()
    path = next((os.path.join(directory, argv[0]) for directory in env.get("PATH", os.defpath).split(os.pathsep)
                 if directory and os.access(os.path.join(directory, argv[0]), os.X_OK)), None)
    if path is None:
        return defer.fail(OSError(f"{argv[0]} not found (the pulseaudio-utils package)"))
    try:
        process = reactor.spawnProcess(_Collect(done), path, argv, env=dict(env))
    except OSError as problem:
        return defer.fail(problem)

    def kill() -> None:
        try:
            process.signalProcess(signal.SIGKILL)
        except error.ProcessExitedAlready:
            pass

    killer = reactor.callLater(PACTL_TIMEOUT if timeout is None else timeout, kill)

    def ended(result: tuple[int | None, str, str]) -> tuple[int | None, str, str]:
        if killer.active():
            killer.cancel()
        return result

    return done.addCallback(ended)


class LocalSound:
    """The TCP module of one attachment in the local sound server."""

    def __init__(self, reactor: Any, server: str, directory: str, environ: Mapping[str, str]) -> None:
        self.reactor = reactor
        self.server = server  # empty: libpulse's own choice
        self.directory = directory  # private (0700): the cookie file goes here
        self.environ = environ  # how pactl finds the user's sound server ($PULSE_SERVER, $XDG_RUNTIME_DIR)
        self.module: str | None = None
        self.cookie_path = ""
        self._closed = False

    async def open(self, session_cookie: str) -> int:
        """Load the module for ``session_cookie``; the port for ``media=``."""
        port = free_port()
        # A file per port: PulseAudio shares a cookie loaded from one path.
        self.cookie_path = os.path.join(self.directory, f"sound-cookie-{port}")
        fd = os.open(self.cookie_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(service_channels.sound_cookie(session_cookie))
        try:
            code, out, err = await run(self.reactor, load_argv(self.server, port, self.cookie_path), self.environ)
        except OSError as problem:
            raise SoundError(f"cannot run pactl: {problem}") from None
        if code is None:
            raise SoundError(f"pactl did not answer within {PACTL_TIMEOUT:g} seconds (is the sound server hanging?)")
        if code != 0:
            raise SoundError(f"the local sound server refused the NX sound port: {err.strip()}")
        self.module = out.strip()
        if self._closed:  # the client ended while pactl was loading it
            await self.close()
        return port

    async def close(self) -> None:
        """Unload the module and remove the cookie (a failure is no matter:
        the module only serves the cookie of a session that is over)."""
        self._closed = True
        module, self.module = self.module, None
        if self.cookie_path:
            try:
                os.unlink(self.cookie_path)
            except FileNotFoundError:
                pass
        if module is not None:
            try:
                await run(self.reactor, [*pactl(self.server), "unload-module", module], self.environ)
            except OSError:
                pass
