"""nxproxy, the program that draws the session, and its local end of the tunnel.

After the session is ready (reference §2.7, "client side") the client does
what Remmina does: it listens on 127.0.0.1, starts ``nxproxy -S`` pointed at
that port, and once nxproxy is connected, asks the server for the stream
(``bye``) and relays bytes between the local socket and the SSH channel.

nxproxy gets a private ``NX_HOME`` (mode 0700, removed at exit) for its
``.nx`` files and log, and reads its options from a file there rather than
from argv: the session cookie is a credential, and argv is visible to every
local user in ``ps``.  Its environment is the caller's display and locale
only; in particular ``NXGATE_PASSWORD`` is not passed on.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import signal
import tempfile
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from twisted.internet import defer, error, protocol
from twisted.python.failure import Failure

from nxgate.protocols.nx.client_dialogue import SessionInfo
from nxgate.streams.tcp import no_delay

# What nxproxy may inherit: how to reach and authorise on the X display, locale.
_PASSED_ENV = ("DISPLAY", "XAUTHORITY", "HOME", "PATH", "USER", "LOGNAME", "LANG", "LANGUAGE", "TMPDIR",
               "XDG_RUNTIME_DIR")
_SAFE = re.compile(r"[^A-Za-z0-9._-]")
_COOKIE = re.compile(r"[0-9A-Za-z]{1,128}")


class ProxyHandler(Protocol):
    def proxy_connected(self, connection: LocalConnection) -> None: ...

    def proxy_data(self, data: bytes) -> None: ...

    def proxy_disconnected(self) -> None: ...

    def proxy_exited(self, status: str) -> None: ...


def proxy_environment(environ: dict[str, str], nx_home: str) -> dict[str, str]:
    env = {name: value for name, value in environ.items() if name in _PASSED_ENV or name.startswith("LC_")}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    if "XAUTHORITY" not in env and env.get("HOME"):
        # nxproxy would look for the display's cookie under NX_HOME instead.
        env["XAUTHORITY"] = os.path.join(env["HOME"], ".Xauthority")
    env["NX_HOME"] = nx_home
    return env


def proxy_options(info: SessionInfo, session_name: str, port: int, channels: Mapping[str, int] | None = None) -> str:
    """The ``nx/nx,...:display`` line.  Values come from the server; a comma or
    colon in them would add options of their own, so they are checked.
    ``channels`` maps an nxcomp service channel (``media``, ``cups``, ``smb``)
    to the local port nxproxy connects it to; a port of 0 leaves it out."""
    if not _COOKIE.fullmatch(info.cookie):
        raise ValueError("the server's session cookie has unexpected characters")
    name = _SAFE.sub("_", session_name) or "session"
    session_id = _SAFE.sub("_", info.full_id)
    extra = "".join(f"{channel}={int(local)}," for channel, local in sorted((channels or {}).items()) if local)
    return (f"nx/nx,session={name},cookie={info.cookie},id={session_id},{extra}"
            f"connect=127.0.0.1,port={port}:{info.display}")


class LocalConnection(protocol.Protocol):
    """nxproxy's connection to our listener."""

    factory: _ListenerFactory

    def connectionMade(self) -> None:
        if self.factory.connection is not None:
            self.transport.loseConnection()  # one proxy, one connection
            return
        self.factory.connection = self
        no_delay(self.transport)  # the NX stream's small messages must not wait (nxgate.streams.tcp)
        self.factory.stop_listening()
        self.factory.handler.proxy_connected(self)

    def dataReceived(self, data: bytes) -> None:
        self.factory.handler.proxy_data(data)

    def connectionLost(self, reason: Failure = protocol.connectionDone) -> None:
        if self.factory.connection is self:
            self.factory.handler.proxy_disconnected()


class _ListenerFactory(protocol.ServerFactory):
    protocol = LocalConnection

    def __init__(self, handler: ProxyHandler) -> None:
        self.handler = handler
        self.connection: LocalConnection | None = None
        self.port: Any = None

    def stop_listening(self) -> None:
        if self.port is not None:
            port, self.port = self.port, None
            port.stopListening()


class _ProcessProtocol(protocol.ProcessProtocol):
    def __init__(self, handler: ProxyHandler, ended: defer.Deferred[None]) -> None:
        self.handler = handler
        self.ended = ended

    def processEnded(self, reason: Failure) -> None:
        value = reason.value
        if isinstance(value, error.ProcessDone):
            status = "exited with status 0"
        elif getattr(value, "signal", None):
            status = f"was killed by signal {value.signal}"
        else:
            status = f"exited with status {getattr(value, 'exitCode', '?')}"
        self.ended.callback(None)
        self.handler.proxy_exited(status)


class NXProxy:
    """One nxproxy child, its private home and its one-shot listener."""

    def __init__(self, reactor: Any, executable: str, handler: ProxyHandler, environ: dict[str, str]) -> None:
        self.reactor = reactor
        self.executable = executable
        self.handler = handler
        self.environ = environ
        self.home = tempfile.mkdtemp(prefix="nxgate-client-")  # mode 0700
        self.log_path = os.path.join(self.home, "nxproxy.log")
        self.options_path = os.path.join(self.home, "options")
        self._factory = _ListenerFactory(handler)
        self._process: Any = None
        self._ended: defer.Deferred[None] = defer.Deferred()

    @property
    def running(self) -> bool:
        return self._process is not None and not self._ended.called

    def listen(self) -> int:
        port = self.reactor.listenTCP(0, self._factory, backlog=1, interface="127.0.0.1")
        self._factory.port = port
        return port.getHost().port

    def start(self, info: SessionInfo, session_name: str, port: int,
              channels: Mapping[str, int] | None = None) -> list[str]:
        """Write the options and start nxproxy; returns its argv."""
        fd = os.open(self.options_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(proxy_options(info, session_name, port, channels) + "\n")
        argv = [self.executable, "-S", f"nx/nx,options={self.options_path}:{info.display}"]
        log_fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        null_fd = os.open(os.devnull, os.O_RDONLY)
        try:
            self._process = self.reactor.spawnProcess(
                _ProcessProtocol(self.handler, self._ended), self.executable, argv,
                env=proxy_environment(self.environ, self.home), path=self.home,
                childFDs={0: null_fd, 1: log_fd, 2: log_fd},
            )
        finally:
            os.close(log_fd)
            os.close(null_fd)
        return argv

    def log_files(self) -> list[str]:
        """nxproxy's output, then the logs nxcomp keeps in ``.nx/S-<id>/``
        (``errors`` and one named after the session; ``stats`` is noise)."""
        paths = [self.log_path]
        for directory in sorted(glob.glob(os.path.join(self.home, ".nx", "S-*"))):
            paths += sorted(path for path in glob.glob(os.path.join(directory, "*"))
                            if os.path.basename(path) != "stats" and os.path.isfile(path))
        return paths

    def log_tail(self, lines: int = 20) -> list[str]:
        out: list[str] = []
        for path in self.log_files():
            try:
                with open(path, encoding="utf-8", errors="replace") as handle:
                    out += [line for line in handle.read().splitlines() if line.strip()]
            except OSError:
                continue
        return out[-lines:]

    def errors(self) -> list[str]:
        """The ``Error:`` lines nxproxy logged (it exits 0 even after them)."""
        return [line for line in self.log_tail(200) if line.startswith("Error:")]

    def stop(self, grace: float = 5.0) -> defer.Deferred[None]:
        """Let nxproxy end by itself for ``grace`` seconds (it does once its
        connection is gone), then SIGTERM, then SIGKILL."""
        self._factory.stop_listening()
        waiter: defer.Deferred[None] = defer.Deferred()
        if not self.running:
            waiter.callback(None)
            return waiter
        calls = [
            self.reactor.callLater(grace, self._signal, signal.SIGTERM),
            self.reactor.callLater(grace + 3.0, self._signal, signal.SIGKILL),
        ]

        def ended(result: object) -> object:
            for call in calls:
                if call.active():
                    call.cancel()
            if not waiter.called:
                waiter.callback(None)
            return result

        self._ended.addBoth(ended)
        return waiter

    def _signal(self, signum: int) -> None:
        if self.running:
            try:
                self._process.signalProcess(signum)
            except error.ProcessExitedAlready:
                pass

    def stop_listening(self) -> None:
        self._factory.stop_listening()

    def cleanup(self) -> None:
        self._factory.stop_listening()
        shutil.rmtree(self.home, ignore_errors=True)

    def wrap_up(self) -> tuple[list[str], list[str]]:
        """Once nxproxy is gone, in a thread (file work): its ``Error:``
        lines and the end of its logs, then its private home removed."""
        lines = self.log_tail(200)
        shutil.rmtree(self.home, ignore_errors=True)
        return [line for line in lines if line.startswith("Error:")], lines[-20:]


def last_lines(lines: Iterable[str]) -> str:
    return "\n".join(f"  {line}" for line in lines)
