"""``nxgate-client --share NAME=PATH``: the client's end of the NX smb channel.

The server mounts each shared folder in the session through the smb channel
(:mod:`nxgate.node.extras.sharing`); the client's ``nxproxy -S smb=PORT``
connects every channel connection to an SMB server on this machine.  For
the time of the session this starts a private Samba ``smbd`` as the user
(no root needed) on 127.0.0.1 and a free port, in a private (0700)
directory, serving exactly the folders given, to exactly one account: the
local user, with a random password made for this session.  That password
goes to smbd's database through ``pdbedit``'s stdin (both run as processes
of the reactor: nothing here blocks it) and to the server in
``addmount`` (inside the encrypted SSH channel; the server masks it in its
logs); never argv.  smbd ends with the client.

It starts only once the server said ``NX> 709 File-sharing port`` (the
server offers folder sharing for this session): without it the folders stay
here and the session goes on.
"""

from __future__ import annotations

import os
import pwd
import re
import secrets
import shutil
import signal
import tempfile
from dataclasses import dataclass, field
from typing import Any

from twisted.internet import defer, protocol, task, threads
from twisted.python.failure import Failure

from nxgate.clients.nx.sound import free_port

#: A share name: a word the SMB server and the server's path checks accept.
SHARE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
START_TIMEOUT = 15.0


class SharingError(Exception):
    pass


def smb_conf(directory: str, port: int, user: str, shares: dict[str, str]) -> str:
    """The private smbd's configuration (pure): loopback only, one port, no
    NetBIOS, no printers, its state in ``directory``, one account."""
    state = {name: os.path.join(directory, name) for name in ("lock", "state", "cache", "private", "pid", "ncalrpc")}
    lines = [
        "[global]",
        "  server role = standalone server",
        "  interfaces = 127.0.0.1",
        "  bind interfaces only = yes",
        f"  smb ports = {port}",
        "  disable netbios = yes",
        "  server min protocol = SMB2",
        "  map to guest = never",
        "  load printers = no",
        "  printcap name = /dev/null",
        "  disable spoolss = yes",
        f"  lock directory = {state['lock']}",
        f"  state directory = {state['state']}",
        f"  cache directory = {state['cache']}",
        f"  private dir = {state['private']}",
        f"  pid directory = {state['pid']}",
        f"  ncalrpc dir = {state['ncalrpc']}",
        f"  passdb backend = tdbsam:{os.path.join(state['private'], 'passdb.tdb')}",
        f"  log file = {os.path.join(directory, 'smbd.log')}",
        "  log level = 0",
    ]
    for name, path in sorted(shares.items()):
        lines += [f"[{name}]", f"  path = {path}", "  read only = no", f"  valid users = {user}",
                  "  create mask = 0644", "  directory mask = 0755"]
    return "\n".join(lines) + "\n"


def parse_share(text: str) -> tuple[str, str]:
    """``NAME=PATH`` of ``--share`` -> (name, absolute path); ValueError says why."""
    name, sep, path = text.partition("=")
    if not sep or not path:
        raise ValueError(f"expected NAME=PATH, got {text!r}")
    if not SHARE_NAME.fullmatch(name):
        raise ValueError(f"share name {name!r}: 1 to 64 letters, digits, '.', '_' or '-'")
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isdir(path):
        raise ValueError(f"{path}: no such folder")
    if any(char in path for char in "\n\r"):
        raise ValueError(f"{path!r}: a folder path with a line break cannot be shared")
    return name, path


@dataclass(frozen=True)
class SambaPlan:
    """What starting the private smbd takes: ``pdbedit`` adds the account
    (its password twice on stdin, never argv), then ``smbd`` serves."""

    pdbedit: list[str]
    password_input: bytes = field(repr=False)
    smbd: list[str]
    log: str


class _Collect(protocol.ProcessProtocol):
    """A short process: ``stdin`` written and closed, its output kept (bounded)."""

    def __init__(self, stdin: bytes, done: defer.Deferred[tuple[int | None, bytes]]) -> None:
        self.stdin = stdin
        self.done = done
        self.output = b""

    def connectionMade(self) -> None:
        self.transport.write(self.stdin)
        self.transport.closeStdin()

    def outReceived(self, data: bytes) -> None:
        self.output = (self.output + data)[-4096:]

    errReceived = outReceived

    def processEnded(self, reason: Failure) -> None:
        self.done.callback((reason.value.exitCode, self.output))


class _Smbd(protocol.ProcessProtocol):
    def __init__(self) -> None:
        self.ended: int | None = None

    def processEnded(self, reason: Failure) -> None:
        self.ended = reason.value.exitCode if reason.value.exitCode is not None else -1


class LocalShares:
    """The private smbd of one attachment."""

    def __init__(self, shares: dict[str, str], directory: str) -> None:
        self.shares = shares
        self.parent = directory  # the client's private (0700) directory
        self.directory = ""
        self.user = ""
        self.password = secrets.token_hex(16)
        self.port = 0
        self.pid: int | None = None
        self._smbd: _Smbd | None = None

    def prepare(self) -> SambaPlan:
        """The configuration and state directories (blocking file work and a
        user look-up: run it in a thread), and the commands to run."""
        smbd, pdbedit = shutil.which("smbd", path=os.defpath + ":/usr/sbin"), shutil.which("pdbedit")
        if smbd is None or pdbedit is None:
            raise SharingError("Samba is not installed here (smbd, pdbedit: the samba package)")
        self.user = pwd.getpwuid(os.getuid()).pw_name
        self.directory = tempfile.mkdtemp(prefix="smb-", dir=self.parent)
        self.port = free_port()
        conf = os.path.join(self.directory, "smb.conf")
        with open(conf, "w", encoding="utf-8") as handle:
            handle.write(smb_conf(self.directory, self.port, self.user, self.shares))
        for name in ("lock", "state", "cache", "private", "pid", "ncalrpc"):
            os.makedirs(os.path.join(self.directory, name), mode=0o700, exist_ok=True)
        # setsid: smbd signals its whole process group when it ends; ours must not be it.
        return SambaPlan(pdbedit=[pdbedit, "-s", conf, "-a", "-t", "-u", self.user],
                         password_input=f"{self.password}\n{self.password}\n".encode(),
                         smbd=[shutil.which("setsid") or "/usr/bin/setsid", smbd, "--foreground",
                               "--no-process-group", "-s", conf],
                         log=os.path.join(self.directory, "smbd.out"))

    async def open(self, reactor: Any) -> int:
        """Start smbd without blocking the reactor; the port for nxproxy's
        ``smb=`` and the folders' tunnel."""
        plan = await threads.deferToThreadPool(reactor, reactor.getThreadPool(), self.prepare)
        done: defer.Deferred[tuple[int | None, bytes]] = defer.Deferred()
        reactor.spawnProcess(_Collect(plan.password_input, done), plan.pdbedit[0], plan.pdbedit,
                             env={"PATH": os.defpath, "LANG": "C"})
        code, output = await done
        if code != 0:
            raise SharingError(f"pdbedit refused the share account: {output.decode(errors='replace').strip()}")
        log = os.open(plan.log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            self._smbd = _Smbd()
            process = reactor.spawnProcess(self._smbd, plan.smbd[0], plan.smbd, env={"PATH": os.defpath},
                                           childFDs={0: "w", 1: log, 2: log})
            self.pid = process.pid
        finally:
            os.close(log)
        # Imported here: the endpoints module pulls in TLS and HTTP modules,
        # ~30 ms of every client start that shares no folder.
        from twisted.internet.endpoints import TCP4ClientEndpoint

        deadline = reactor.seconds() + START_TIMEOUT
        while reactor.seconds() < deadline:
            if self._smbd.ended is not None:
                raise SharingError(f"smbd ended at once (exit {self._smbd.ended}); see {self.directory}")
            try:
                connection = await TCP4ClientEndpoint(reactor, "127.0.0.1", self.port, timeout=1).connect(
                    protocol.Factory.forProtocol(protocol.Protocol))
            except Exception:
                await task.deferLater(reactor, 0.1, lambda: None)
                continue
            connection.transport.loseConnection()
            return self.port
        raise SharingError(f"smbd did not listen on 127.0.0.1:{self.port} within {START_TIMEOUT:g} seconds")

    def close(self) -> None:
        """smbd (and the children it forked, its process group) gets SIGTERM;
        its directory goes."""
        if self.pid is not None and (self._smbd is None or self._smbd.ended is None):
            try:
                os.killpg(self.pid, signal.SIGTERM)
            except OSError:
                pass
        self.pid = None
        if self.directory:
            shutil.rmtree(self.directory, ignore_errors=True)
