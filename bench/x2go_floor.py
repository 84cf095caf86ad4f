#!/usr/bin/env python3
"""pyhoca-cli's floor: an X2Go server that answers at once, for bench/x2go.py.

Measured against it, pyhoca-cli's time for an operation is what the client
itself costs (its Python start-up, its SSH, its own waits) plus the least any
server must do: so the time a real server adds is its time minus this floor,
in the same run.  The server is a small Conch SSH server:

* the password is checked with PAM, as any server must; then no store, no
  shell, no session service: each ``exec`` is
  answered from a table by its first X2Go word (``x2goversion``,
  ``x2golistsessions``...), inside the markers python-x2go wraps it in;
* the work that cannot be skipped is done with the same nx-libs agent, the
  same agent options as nxgate's (``nxgate.node.agents.nxagent``) and its
  program, as the bench user: ``x2gostartagent`` starts an nxagent and
  answers once it listens, ``x2goruncommand`` starts the program,
  ``x2gosuspend-session`` SIGHUPs it and answers when it says suspended (its
  watchdog ended as the gateway ends it), ``x2goresume-session`` rewrites its
  options (the client's link), drops its saved link caches and SIGHUPs it
  until it listens, ``x2goterminate-session`` ends it;
* a ``direct-tcpip`` to the session's graphics port is spliced into the
  agent's Unix socket.

It also notes when each SSH connection arrives (``CLOCK_MONOTONIC``, the same
clock as the bench's), so that pyhoca-cli's start-up alone (from its exec
to its first connection) is measured too.

    python bench/x2go_floor.py --user NAME --events FILE [--workdir DIR]   # prints "PORT <n>" when it listens
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from cryptography.hazmat.primitives.asymmetric import rsa  # noqa: E402
from twisted.conch import avatar  # noqa: E402
from twisted.conch.ssh import (channel, connection, factory, filetransfer, keys, session,  # noqa: E402
                               transport, userauth)
from twisted.cred.error import UnauthorizedLogin  # noqa: E402
from twisted.cred import checkers, credentials, portal  # noqa: E402
from twisted.internet import error as net_error, protocol, reactor, threads  # noqa: E402
from twisted.python import components, failure  # noqa: E402
from zope.interface import implementer  # noqa: E402

from nxgate.gateway.auth.pam import password_responder  # noqa: E402
from nxgate.node import pamlib  # noqa: E402
from nxgate.node.agents import nxagent  # noqa: E402
from nxgate.node.processes import named_children  # noqa: E402
from nxgate.node.supervisor import waits_in_select  # noqa: E402
from nxgate.vocabulary.requests import DisplaySettings  # noqa: E402
from nxgate.wire.tcp import no_delay, quick_ack  # noqa: E402

FIRST_DISPLAY = 1700
GRAPHICS_PORT = 41000
_WRAPPED = re.compile(r'^echo X2GODATABEGIN:(\S+); PATH=\S+ sh -c "(.*)"; echo X2GODATAEND:\S+$', re.S)


class Events:
    """Time-stamped notes for the bench (one JSON object a line)."""

    def __init__(self, path: str) -> None:
        self.handle = open(path, "a", buffering=1)
        self.lock = threading.Lock()

    def note(self, event: str, **fields: object) -> None:
        with self.lock:
            self.handle.write(json.dumps({"t": time.monotonic(), "event": event, **fields}) + "\n")


@dataclass
class FloorSession:
    """The one session of the floor (an nxagent run by hand) and what it needs."""

    user: pwd.struct_passwd
    display: int
    directory: str
    cookie: str
    link: str
    command: list[str]
    created: int = field(default_factory=lambda: int(time.time()))
    agent: subprocess.Popen | None = None
    program: subprocess.Popen | None = None
    status: str = "R"
    read_from: int = 0

    # the AgentSession protocol of nxgate.node.agents.nxagent
    type = "unix-application"
    rootless = True
    server_name = "floor"

    @property
    def full_id(self) -> str:
        return f"floor-{self.display}"

    @property
    def name(self) -> str:
        word = re.sub(r"[^A-Za-z0-9.-]", "", os.path.basename(self.command[0]))[:40] or "APPLICATION"
        return f"{self.user.pw_name}-{self.display}-{self.created}_stR{word}_dp24"

    @property
    def files(self) -> nxagent.AgentFiles:
        return nxagent.AgentFiles(self.directory, f"{self.directory}.agent.log", "")

    # --------------------------------------------------------------- agent
    def write_options(self) -> None:
        settings = DisplaySettings(geometry="1024x768", link=self.link, client="x2go")
        line = nxagent.options_line(self, settings, nxagent.listen_unix(self.files.socket))
        _write_as(self.user, self.files.options, line.encode())

    def start(self) -> None:
        os.makedirs(self.directory, mode=0o700)
        os.chown(self.directory, self.user.pw_uid, self.user.pw_gid)
        self.write_options()
        subprocess.run(["xauth", "-q", "-f", self.files.authority, "add", f":{self.display}", "MIT-MAGIC-COOKIE-1",
                        self.cookie], check=True, capture_output=True)
        os.chown(self.files.authority, self.user.pw_uid, self.user.pw_gid)
        argv = nxagent.agent_argv("nxagent", self, self.files, nxagent.AgentPlan(mode="-R"))
        env = nxagent.agent_environment(self, self.files, self._login_env())
        log = open(self.files.log, "wb")  # a display used again: its last session's log goes
        self.read_from = 0
        self.agent = subprocess.Popen(argv, cwd=self.directory, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                      stderr=subprocess.STDOUT, user=self.user.pw_uid, group=self.user.pw_gid,
                                      extra_groups=[], start_new_session=True)
        log.close()
        self.wait_line("Info: Waiting for connection", 30)

    def _login_env(self) -> dict[str, str]:
        return {"HOME": self.user.pw_dir, "USER": self.user.pw_name, "LOGNAME": self.user.pw_name,
                "SHELL": self.user.pw_shell, "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}

    def run_program(self) -> None:
        if self.program is None:
            env = nxagent.x11_environment(self, self.files, self._login_env())
            self.program = subprocess.Popen(self.command, cwd=self.user.pw_dir, env=env, stdin=subprocess.DEVNULL,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                            user=self.user.pw_uid, group=self.user.pw_gid, extra_groups=[],
                                            start_new_session=True)

    def lines(self) -> list[str]:
        with open(self.files.log, "rb") as handle:
            handle.seek(self.read_from)
            return handle.read().decode("utf-8", "replace").splitlines()

    def wait_line(self, text: str, timeout: float, each: object = None) -> None:
        """Until the agent's log says ``text`` (after the last mark); ``each()``
        is called at every look (the watchdog's end)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if any(text in line for line in self.lines()):
                return
            if self.agent.poll() is not None:
                raise RuntimeError(f"nxagent exited: {self.lines()[-5:]}")
            if callable(each):
                each()
            time.sleep(0.002)
        raise RuntimeError(f"nxagent did not say {text!r}: {self.lines()[-5:]}")

    def agent_suspended(self) -> bool:
        """Whether the agent's last word on its state is that it is suspended
        (it suspends itself when its client's link goes)."""
        with open(self.files.log, "rb") as handle:
            said = [line for line in handle.read().decode("utf-8", "replace").splitlines()
                    if line.startswith("Session: ")]
        return bool(said) and said[-1].startswith("Session: Session suspended")

    def mark(self) -> None:
        self.read_from = os.path.getsize(self.files.log)

    def end_watchdog(self) -> None:
        """As the gateway does: once the agent waits for its watchdog and
        sleeps in select(), the watchdog (its nxagent child) gets SIGKILL."""
        if any("Waiting the watchdog process" in line for line in self.lines()) and waits_in_select(self.agent.pid):
            for child in named_children(self.agent.pid, "nxagent"):
                try:
                    os.kill(child.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def suspend(self) -> None:
        if self.status != "R" or self.agent_suspended():
            self.status = "S"
            return
        self.mark()
        self.agent.send_signal(signal.SIGHUP)
        self.wait_line("Session: Session suspended", 30, self.end_watchdog)
        self.status = "S"

    def resume(self, link: str) -> None:
        self.suspend()
        self.link = link
        self.write_options()
        for name in os.listdir(nxagent.cache_directory(self, self.files)) if os.path.isdir(
                nxagent.cache_directory(self, self.files)) else ():
            if nxagent.is_saved_cache(name):
                os.unlink(os.path.join(nxagent.cache_directory(self, self.files), name))
        self.mark()
        for _ in range(100):  # nxagent takes no SIGHUP while it still tears the last link down
            self.agent.send_signal(signal.SIGHUP)
            try:
                self.wait_line("Session: Resuming session", 0.1)
                break
            except RuntimeError:
                continue
        self.wait_line("Info: Waiting for connection", 30)
        self.status = "R"

    def terminate(self) -> None:
        for process in (self.program, self.agent):
            if process is not None and process.poll() is None:
                process.terminate()
        if self.agent is not None:
            self.mark()
            end = time.monotonic() + 20
            while self.agent.poll() is None and time.monotonic() < end:
                self.end_watchdog()
                time.sleep(0.002)
            if self.agent.poll() is None:
                self.agent.kill()
                self.agent.wait()
        if self.program is not None:
            try:
                self.program.wait(5)
            except subprocess.TimeoutExpired:
                self.program.kill()
        self.status = "F"
        shutil.rmtree(self.directory, ignore_errors=True)


def _write_as(user: pwd.struct_passwd, path: str, data: bytes) -> None:
    temporary = f"{path}.tmp"
    with open(temporary, "wb") as handle:
        handle.write(data)
    os.chown(temporary, user.pw_uid, user.pw_gid)
    os.chmod(temporary, 0o600)
    os.replace(temporary, path)


def _free_display() -> int:
    display = FIRST_DISPLAY
    while os.path.exists(f"/tmp/.X11-unix/X{display}") or os.path.exists(f"/tmp/.X{display}-lock"):
        display += 1
    return display


class FloorServer:
    """The canned answers and the one session (commands run in threads, one at a time)."""

    def __init__(self, user: pwd.struct_passwd, workdir: str, events: Events) -> None:
        self.user = user
        self.workdir = workdir
        self.events = events
        self.session: FloorSession | None = None
        self.lock = threading.Lock()

    def answer(self, command: str) -> tuple[str, str]:
        """(stdout, stderr) for one X2Go command (python-x2go's ``sh -c`` text)."""
        with self.lock:
            words = shlex.split(command.replace("&&", " ; ").replace(";", " ; ").replace("{", " ").replace("}", " "))
            words = [word for word in words if "=" not in word or word.startswith("-")]
            out = []
            for verb, args in _commands(words):
                out.append(self._one(verb, args))
            return "".join(out), ""

    def _one(self, verb: str, args: list[str]) -> str:
        session = self.session
        if verb == "x2goversion":
            return "x2goserver: 4.1.0.3\nx2goserver-common: 4.1.0.3\n"
        if verb == "x2gofeaturelist":
            return "X2GO_LIST_DESKTOPS\n"
        if verb == "which":
            found = shutil.which(args[0]) if args else None
            return f"{found}\n" if found else ""
        if verb == "echo":
            return " ".join(self.user.pw_dir if arg == "$HOME" else arg for arg in args) + "\n"
        if verb == "stat":
            return f"{self.user.pw_dir} 4096 8 41ed {self.user.pw_uid} {self.user.pw_gid} 0 0 1 0 0 0 0 0 0 4096\n"
        if verb == "x2golistsessions":
            if session is None or session.status not in ("R", "S"):
                return ""
            if session.status == "R" and session.agent_suspended():
                session.status = "S"
            now = time.strftime("%Y-%m-%dT%H:%M:%S")
            return (f"{session.agent.pid}|{session.name}|{session.display}|floor|{session.status}|{now}|"
                    f"{session.cookie}|127.0.0.1|{GRAPHICS_PORT}|{GRAPHICS_PORT + 1}|{now}|{self.user.pw_name}|0|"
                    f"{GRAPHICS_PORT + 2}|-1|-1\n")
        if verb == "x2gostartagent":
            # geometry link pack cache-depth kblayout kbtype setkbd type command [clipboard]
            if session is not None:
                session.terminate()
            display = _free_display()
            self.session = session = FloorSession(
                self.user, display, os.path.join(self.workdir, f"session-{display}"), secrets.token_hex(16),
                args[1], args[8].replace("X2GO_SPACE_CHAR", " ").split())
            session.start()
            return (f"{display}\n{session.cookie}\n{session.agent.pid}\n{session.name}\n{GRAPHICS_PORT}\n"
                    f"{GRAPHICS_PORT + 1}\n{GRAPHICS_PORT + 2}\n")
        if verb == "x2goruncommand" and session is not None:
            # display agent_pid session_id sound_port command sound type: the command's blanks are X2GO_SPACE_CHAR
            session.command = args[4].replace("X2GO_SPACE_CHAR", " ").split() or session.command
            session.run_program()
            return ""
        if verb == "x2goresume-session" and session is not None:
            session.resume(args[2])
            return f"gr_port={GRAPHICS_PORT}\nsound_port={GRAPHICS_PORT + 1}\nfs_port={GRAPHICS_PORT + 2}\n"
        if verb == "x2gosuspend-session" and session is not None:
            session.suspend()
            return ""
        if verb == "x2goterminate-session" and session is not None:
            session.terminate()
            self.session = None
            return ""
        return ""  # which, x2goumount-session, x2golistmounts...: nothing to say

    def close(self) -> None:
        if self.session is not None:
            self.session.terminate()


def _commands(words: list[str]):
    """(verb, args) of each ``;``-separated command; ``which X`` and redirections are not verbs."""
    current: list[str] = []
    for word in [*words, ";"]:
        if word in (";", "&"):
            if current:
                verb, *args = current
                args = [arg for arg in args if not arg.startswith(("1>", "2>", ">"))]
                if verb not in ("export", "setsid", "exit") and not (verb == "which" and "/dev/null" in " ".join(current)):
                    yield verb, args
                elif verb == "setsid" and args:
                    yield args[0].rsplit("/", 1)[-1], args[1:]
            current = []
        else:
            current.append(word)


# ------------------------------------------------------------------ Conch
@implementer(checkers.ICredentialsChecker)
class PamPassword:
    """The password check every server makes (sshd's for x2goserver): PAM's
    ``nxgate`` service (``login`` without it), in a thread."""

    credentialInterfaces = (credentials.IUsernamePassword,)

    def __init__(self) -> None:
        self.service = pamlib.resolve_service("nxgate")

    def requestAvatarId(self, credentials_):
        user, password = credentials_.username.decode(), credentials_.password.decode()

        def check() -> bytes:
            code, message = pamlib.authenticate(self.service, user, password_responder(password), "127.0.0.1")
            if code != pamlib.PAM_SUCCESS:
                raise UnauthorizedLogin(message)
            return credentials_.username

        return threads.deferToThread(check)


class NoDelayTransport(transport.SSHServerTransport):
    """Small answers leave at once and small reads are acknowledged at once,
    as the gateway's are (nxgate.wire.tcp)."""

    def connectionMade(self) -> None:
        no_delay(self.transport)
        super().connectionMade()

    def dataReceived(self, data: bytes) -> None:
        quick_ack(self.transport, len(data))
        super().dataReceived(data)


class FloorAvatar(avatar.ConchUser):
    def __init__(self, server: FloorServer) -> None:
        super().__init__()
        self.server = server
        self.channelLookup.update({b"session": session.SSHSession, b"direct-tcpip": self._link})
        self.subsystemLookup[b"sftp"] = filetransfer.FileTransferServer  # python-x2go opens it at every start

    def _link(self, remoteWindow, remoteMaxPacket, data, avatar):
        """Any direct-tcpip goes to the one session's agent (its graphics port is the only one listed)."""
        return LinkChannel(self.server, remoteWindow=remoteWindow, remoteMaxPacket=remoteMaxPacket, avatar=avatar)


@implementer(session.ISession)
class FloorExec:
    def __init__(self, avatar_: FloorAvatar) -> None:
        self.avatar = avatar_

    def execCommand(self, proto, command: bytes) -> None:
        text = command.decode("utf-8", "replace")
        match = _WRAPPED.match(text)
        inner = match.group(2) if match else text
        started = time.monotonic()
        d = threads.deferToThread(self.avatar.server.answer, inner)

        def done(result):
            out, err = result
            self.avatar.server.events.note("exec", command=inner[:120], seconds=time.monotonic() - started)
            if match:
                out = f"X2GODATABEGIN:{match.group(1)}\n{out}"
                if not inner.rstrip().endswith("& exit"):
                    out += f"X2GODATAEND:{match.group(1)}\n"
            proto.write(out.encode())
            if err:
                proto.session.writeExtended(connection.EXTENDED_DATA_STDERR, err.encode())
            proto.processEnded(failure.Failure(net_error.ProcessDone(0)))

        def failed(reason):
            self.avatar.server.events.note("error", command=inner[:120], error=str(reason.value))
            proto.session.writeExtended(connection.EXTENDED_DATA_STDERR, f"floor: {reason.value}\n".encode())
            proto.processEnded(failure.Failure(net_error.ProcessTerminated(1)))

        d.addCallbacks(done, failed)

    def getPty(self, *args) -> None:
        pass

    def openShell(self, proto) -> None:
        raise RuntimeError("no shell here")

    def eofReceived(self) -> None:
        pass

    def closed(self) -> None:
        pass

    def windowChanged(self, size) -> None:
        pass


components.registerAdapter(FloorExec, FloorAvatar, session.ISession)


@implementer(filetransfer.ISFTPServer)
class NoFiles:
    """An SFTP server that opens (python-x2go checks that it can) and does
    nothing else: pyhoca-cli pushes files only for sound and folders."""

    def __init__(self, avatar_: FloorAvatar) -> None:
        self.avatar = avatar_

    def gotVersion(self, otherVersion, extData):
        return {}

    def __getattr__(self, name: str):
        def refused(*args, **kwargs):
            raise NotImplementedError(name)

        return refused


components.registerAdapter(NoFiles, FloorAvatar, filetransfer.ISFTPServer)


class LinkChannel(channel.SSHChannel):
    """The client's nxproxy <-> the session agent's Unix socket."""

    name = b"direct-tcpip"

    def __init__(self, server: FloorServer, **kwargs) -> None:
        super().__init__(**kwargs)
        self.server = server
        self.pending: list[bytes] = []
        self.peer = None

    def channelOpen(self, specificData: bytes) -> None:
        agent_socket = self.server.session.files.socket
        protocol.ClientCreator(reactor, _AgentSide, self).connectUNIX(agent_socket).addErrback(
            lambda reason: self.loseConnection())

    def dataReceived(self, data: bytes) -> None:
        if self.peer is None:
            self.pending.append(data)
        else:
            self.peer.transport.write(data)

    def eofReceived(self) -> None:
        self.loseConnection()

    def closed(self) -> None:
        if self.peer is not None:
            self.peer.transport.loseConnection()


class _AgentSide(protocol.Protocol):
    def __init__(self, link: LinkChannel) -> None:
        self.link = link

    def connectionMade(self) -> None:
        self.link.peer = self
        for data in self.link.pending:
            self.transport.write(data)
        self.link.pending = []

    def dataReceived(self, data: bytes) -> None:
        self.link.write(data)

    def connectionLost(self, reason=None) -> None:
        self.link.loseConnection()


@implementer(portal.IRealm)
class FloorRealm:
    def __init__(self, server: FloorServer) -> None:
        self.server = server

    def requestAvatar(self, avatarId, mind, *interfaces):
        return interfaces[0], FloorAvatar(self.server), lambda: None


class FloorFactory(factory.SSHFactory):
    protocol = NoDelayTransport

    def __init__(self, server: FloorServer) -> None:
        private = keys.Key(rsa.generate_private_key(public_exponent=65537, key_size=2048))
        self.publicKeys = {b"ssh-rsa": private.public()}
        self.privateKeys = {b"ssh-rsa": private}
        self.services = {b"ssh-userauth": userauth.SSHUserAuthServer, b"ssh-connection": connection.SSHConnection}
        self.portal = portal.Portal(FloorRealm(server), [PamPassword()])
        self.server = server

    def buildProtocol(self, addr):
        self.server.events.note("connect", port=addr.port)
        return super().buildProtocol(addr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--user", required=True, help="the Unix user the agent and program run as")
    parser.add_argument("--events", required=True, help="file for the time-stamped notes (JSON lines)")
    parser.add_argument("--workdir", help="an existing directory for the session directories and agent logs")
    args = parser.parse_args(argv)
    user = pwd.getpwnam(args.user)
    workdir = args.workdir or tempfile.mkdtemp(prefix="nxgate-bench-floor-")
    os.chmod(workdir, 0o755)
    server = FloorServer(user, workdir, Events(args.events))
    listening = reactor.listenTCP(0, FloorFactory(server), interface="127.0.0.1")
    print(f"PORT {listening.getHost().port}", flush=True)

    def stop(*_):
        reactor.callFromThread(reactor.stop)

    signal.signal(signal.SIGTERM, stop)
    reactor.suggestThreadPoolSize(2)
    try:
        reactor.run(installSignalHandlers=False)
    finally:
        server.close()
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
