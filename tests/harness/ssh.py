"""The real OpenSSH client, used the way NX clients use nxssh."""

from __future__ import annotations

import contextlib

import os
import re
import socket
import subprocess
import tempfile
import threading
from dataclasses import dataclass

from tests.harness.gateway import nx_key
from tests.harness.process import Pipe, stop

COMMON = [
    "-o", "StrictHostKeyChecking=no",
    "-o", "UserKnownHostsFile=/dev/null",
    "-o", "LogLevel=ERROR",
    "-o", "ConnectTimeout=10",
]
PROMPT = b"NX> 105 "
#: How long a test waits for the gateway's next NX line: a deadline, not a speed (a busy machine running
#: the suite side by side once took over 15 s to answer a hello; timings belong in bench/).
ANSWER_DEADLINE = 45.0


NX_KEY = "nx-key"  # stands for the NoMachine key in the arguments below


def ssh_argv(port: int, user: str = "nx", key: str | None = NX_KEY, extra: list[str] | None = None,
             command: list[str] | None = None) -> list[str]:
    argv = ["ssh", *COMMON, "-p", str(port)]
    key = nx_key() if key == NX_KEY else key
    if key is not None:
        argv += ["-i", key, "-o", "IdentitiesOnly=yes", "-o", "PubkeyAcceptedAlgorithms=+ssh-dss"]
    argv += extra or []
    argv.append(f"{user}@127.0.0.1")
    return argv + (command or [])


def askpass_env(password: str) -> dict[str, str]:
    """Makes ssh take a password from the test (SSH_ASKPASS, no terminal)."""
    helper = os.path.join(os.path.dirname(os.path.abspath(__file__)), "askpass.py")
    return dict(os.environ, SSH_ASKPASS=helper, SSH_ASKPASS_REQUIRE="force", NXGATE_TEST_PASSWORD=password,
                DISPLAY=os.environ.get("DISPLAY", ":0"))


class NXClient:
    """One NX conversation over ``ssh -T nx@host`` (as nxssh: no command),
    or over another client program given as ``argv`` that carries the
    dialogue on its stdin and stdout."""

    def __init__(self, port: int, user: str = "nx", key: str | None = NX_KEY, extra: list[str] | None = None,
                 env: dict[str, str] | None = None, argv: list[str] | None = None) -> None:
        self.process = subprocess.Popen(
            argv or ssh_argv(port, user, key, ["-T", *(extra or [])]),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        )
        self.out = Pipe(self.process.stdout)

    def send(self, line: bytes | str) -> None:
        data = line.encode() if isinstance(line, str) else line
        self.process.stdin.write(data + b"\n")
        self.process.stdin.flush()

    def expect(self, pattern: bytes | re.Pattern[bytes], timeout: float = ANSWER_DEADLINE) -> bytes:
        return self.out.read_until(pattern, timeout)

    def prompt(self, timeout: float = ANSWER_DEADLINE) -> bytes:
        """Everything up to the next ``NX> 105 `` prompt."""
        return self.expect(PROMPT, timeout)

    def command(self, line: bytes | str, timeout: float = ANSWER_DEADLINE) -> bytes:
        self.send(line)
        return self.prompt(timeout)

    def greet(self) -> bytes:
        out = self.prompt()
        out += self.command("hello NXCLIENT - Version 3.0.0")
        out += self.command("SET SHELL_MODE SHELL")
        out += self.command("SET AUTH_MODE PASSWORD")
        return out

    def login(self, user: str | bytes, password: str | bytes) -> bytes:
        """Answer the login prompts; returns the server's answer."""
        self.send("login")
        self.expect(b"NX> 101 User: ")
        self.send(user)
        self.expect(b"NX> 102 Password: ")
        self.send(password)
        return self.expect(re.compile(rb"NX> (103|404|503) [^\n]*\n"), timeout=30)

    def close(self) -> int | None:
        if self.process.poll() is None:
            try:
                self.process.stdin.close()
            except BrokenPipeError:
                pass
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                stop(self.process)
        for stream in (self.process.stdout, self.process.stderr):
            stream.close()
        return self.process.returncode

    def stderr(self) -> bytes:
        return self.process.stderr.read()


@dataclass(frozen=True)
class SessionInfo:
    """What the server said after startsession/restoresession."""

    full_id: str
    session_id: str
    display: int
    cookie: str
    agent_cookie: str
    lines: bytes

    @classmethod
    def parse(cls, reply: bytes) -> SessionInfo:
        def field(code: str) -> str:
            match = re.search(rf"NX> {code} [^:]+: (\S+)".encode(), reply)
            if match is None:
                raise AssertionError(f"no NX> {code} in {reply!r}")
            return match.group(1).decode()

        full_id = field("700")
        return cls(full_id, full_id[-32:], int(field("705")), field("701"), field("706"), reply)


def start_nxproxy(info: SessionInfo, screen_name: str, workdir: str, port: int,
                  options: str = "") -> tuple[subprocess.Popen, str]:
    """nxproxy drawing a session on ``screen_name``, its stream connected to
    127.0.0.1:``port`` (where a client relays it to the SSH channel); and its
    log.  ``options``: more nxproxy options (``media=PORT``...)."""
    home = tempfile.mkdtemp(prefix="nxproxy-", dir=workdir)
    log = os.path.join(home, "proxy.log")
    proxy = subprocess.Popen(
        ["nxproxy", "-S", f"nx/nx,connect=127.0.0.1,port={port},"
                          f"cookie={info.cookie},id={info.full_id}{',' + options if options else ''}:{info.display}"],
        env={"DISPLAY": screen_name, "NX_HOME": home, "PATH": "/usr/bin:/bin"},
        stdin=subprocess.DEVNULL, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
    )
    return proxy, log


class Attachment:
    """nxproxy drawing a session on a client screen, through this NX
    conversation's SSH channel: what nxssh-based clients do after ``bye``."""

    def __init__(self, client: NXClient, info: SessionInfo, screen_name: str, workdir: str,
                 options: str = "") -> None:
        self.client = client
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        self.proxy, self.proxy_log = start_nxproxy(info, screen_name, workdir, listener.getsockname()[1], options)
        listener.settimeout(20)
        self.conn, _ = listener.accept()
        listener.close()
        client.send("bye")
        client.expect(b"NX> 999 Bye.\n")
        threading.Thread(target=self._up, daemon=True).start()
        threading.Thread(target=self._down, daemon=True).start()

    def _up(self) -> None:
        try:
            while data := self.conn.recv(65536):
                self.client.process.stdin.write(data)
                self.client.process.stdin.flush()
        except (OSError, ValueError):
            pass
        self.upstream_ended()

    def upstream_ended(self) -> None:
        """nxproxy's connection ended: wait for nxproxy to exit, then end ssh
        (subclasses behave as other clients do, e.g. EOF on the channel at once)."""
        self.detach()

    def send_eof(self) -> None:
        """EOF on the channel (ssh's stdin closed), as nxgate-client and OpenSSH-based clients send."""
        with contextlib.suppress(OSError, ValueError):
            self.client.process.stdin.close()

    def _down(self) -> None:
        pipe = self.client.out
        try:
            if pipe.buffer:
                self.conn.sendall(pipe.buffer)
                pipe.buffer = b""
            while not pipe.eof:
                if pipe.fill(0.5):
                    self.conn.sendall(pipe.buffer)
                    pipe.buffer = b""
        except (OSError, ValueError):
            pass
        self.detach()

    def detach(self) -> None:
        """Drop the connection, as a client that goes away does."""
        try:
            self.conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.conn.close()
        stop(self.proxy, grace=3)
        if self.client.process.poll() is None:
            self.client.process.terminate()
