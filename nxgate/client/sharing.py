"""``nxgate-client --share NAME=PATH``: the client's end of the NX smb channel.

The server mounts each shared folder in the session through the smb channel
(:mod:`nxgate.node.extras.sharing`); the client's ``nxproxy -S smb=PORT``
connects every channel connection to an SMB server on this machine.  For
the time of the session this starts a private Samba ``smbd`` as the user
(no root needed) on 127.0.0.1 and a free port, in a private (0700)
directory, serving exactly the folders given, to exactly one account: the
local user, with a random password made for this session.  That password
goes to smbd's database through ``pdbedit``'s stdin and to the server in
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
import socket
import subprocess
import tempfile
import time

from nxgate.client.sound import free_port

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


class LocalShares:
    """The private smbd of one attachment."""

    def __init__(self, shares: dict[str, str], directory: str) -> None:
        self.shares = shares
        self.parent = directory  # the client's private (0700) directory
        self.directory = ""
        self.user = pwd.getpwuid(os.getuid()).pw_name
        self.password = secrets.token_hex(16)
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0

    def open(self) -> int:
        """Start smbd; the port for nxproxy's ``smb=``."""
        smbd, pdbedit = shutil.which("smbd", path=os.defpath + ":/usr/sbin"), shutil.which("pdbedit")
        if smbd is None or pdbedit is None:
            raise SharingError("Samba is not installed here (smbd, pdbedit: the samba package)")
        self.directory = tempfile.mkdtemp(prefix="smb-", dir=self.parent)
        self.port = free_port()
        conf = os.path.join(self.directory, "smb.conf")
        with open(conf, "w", encoding="utf-8") as handle:
            handle.write(smb_conf(self.directory, self.port, self.user, self.shares))
        for name in ("lock", "state", "cache", "private", "pid", "ncalrpc"):
            os.makedirs(os.path.join(self.directory, name), mode=0o700, exist_ok=True)
        added = subprocess.run([pdbedit, "-s", conf, "-a", "-t", "-u", self.user],
                               input=f"{self.password}\n{self.password}\n".encode(), capture_output=True, timeout=30)
        if added.returncode != 0:
            raise SharingError(f"pdbedit refused the share account: {added.stderr.decode(errors='replace').strip()}")
        log = open(os.path.join(self.directory, "smbd.out"), "wb")
        with log:
            # A session of its own: smbd signals its whole process group when it ends.
            self.process = subprocess.Popen([smbd, "--foreground", "--no-process-group", "-s", conf],
                                            stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                            start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SharingError(f"smbd ended at once (exit {self.process.returncode}); see {self.directory}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self.port
            except OSError:
                time.sleep(0.1)
        raise SharingError(f"smbd did not listen on 127.0.0.1:{self.port} within {START_TIMEOUT:g} seconds")

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        if self.directory:
            shutil.rmtree(self.directory, ignore_errors=True)
