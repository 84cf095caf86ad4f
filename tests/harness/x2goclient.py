"""The user's own machine with Debian's x2goclient, for the end-to-end tests and the benchmarks."""

from __future__ import annotations

import os
import shutil
import subprocess

from tests.harness.process import stop
from tests.harness.users import create_user


class X2GoClientMachine:
    """The user's own machine for x2goclient: a Unix user of its own (x2goclient runs as that user, as people run
    it), its home, an SSH key the session's user accepts, and x2goclient's profile "gw" with ``settings``.

    x2goclient shares folders and its print spool through an sshd of its own: as its user, with
    ``~/.x2go/etc/sshd_config`` and host keys there, on a free port from 7022; it puts the public half of a new
    key into ``~/.x2go/.ssh/authorized_keys``, copies the key bundle (that private key and the sshd's host key)
    to ``~/.x2go/ssh/key.*`` on the server with scp, forwards the session's folders port back to its sshd and
    runs ``x2gomountdirs`` naming the key as ``~<user>/.x2go/ssh/key.*``."""

    #: A session of its own, as the folder and printing tests use it (their ``settings`` start with it).
    TERMINAL = "command=TERMINAL\nrootless=false\nwidth=800\nheight=600\nsound=false\n"

    def __init__(self, case, screen, gateway_port: int, session_user, settings: str) -> None:
        """``case``: what cleans up (its addCleanup); ``settings``: the profile's lines past the login's."""
        self.case = case
        self.screen = screen
        self.user = create_user(prefix="x2c")
        case.addCleanup(self.user.remove)
        self.home = self.user.home
        self.key = os.path.join(self.home, "id")
        self.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", self.key])
        entry = session_user.entry
        ssh_dir = os.path.join(entry.pw_dir, ".ssh")
        os.makedirs(ssh_dir, exist_ok=True)
        with open(self.key + ".pub") as public, open(os.path.join(ssh_dir, "authorized_keys"), "w") as keys:
            keys.write(public.read())
        for path, mode in ((ssh_dir, 0o700), (os.path.join(ssh_dir, "authorized_keys"), 0o600)):
            os.chown(path, entry.pw_uid, entry.pw_gid)
            os.chmod(path, mode)
        case.addCleanup(shutil.rmtree, ssh_dir, True)
        self.write(".x2goclient/sessions",
                   f"[gw]\nname=gw\nhost=127.0.0.1\nsshport={gateway_port}\nuser={session_user.name}\n"
                   f"key={self.key}\nautologin=false\nspeed=4\npack=16m-jpeg\nquality=9\nfullscreen=false\n"
                   f"usekbd=false\nsetdpi=false\n{settings}")
        self.log = os.path.join(self.home, "x2goclient.log")

    def env(self, lang: str = "C") -> dict[str, str]:
        return {"HOME": self.home, "USER": self.user.name, "LOGNAME": self.user.name, "LANG": lang,
                "PATH": "/usr/local/bin:/usr/bin:/bin", "DISPLAY": self.screen.name, "XDG_RUNTIME_DIR": self.home}

    def run(self, argv: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run(argv, check=True, user=self.user.name, group=self.user.entry.pw_gid, env=self.env(),
                              cwd=self.home, stdin=subprocess.DEVNULL, capture_output=True, timeout=60)

    def write(self, name: str, data: str | bytes) -> str:
        """A file of the client's user below his home (its directories made as him)."""
        path = os.path.join(self.home, name)
        self.run(["mkdir", "-p", os.path.dirname(path)])
        with open(path, "wb") as handle:
            handle.write(data.encode() if isinstance(data, str) else data)
        os.chown(path, self.user.entry.pw_uid, self.user.entry.pw_gid)
        return path

    def start(self, lang: str = "C", close_disconnect: bool = False) -> subprocess.Popen:
        """x2goclient --debug on the profile (--bypass-cleanup-helper: its helper would outlive it by design);
        ``close_disconnect``: it ends when its session is suspended."""
        with open(self.log, "ab") as handle:
            process = subprocess.Popen(
                ["x2goclient", "--session=gw", "--add-to-known-hosts", "--no-menu", "--bypass-cleanup-helper",
                 *(["--close-disconnect"] if close_disconnect else []), "--debug"], env=self.env(lang),
                cwd=self.home, user=self.user.name,
                group=self.user.entry.pw_gid, stdin=subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT)
        self.case.addCleanup(stop, process)
        return process

    def text(self) -> str:
        with open(self.log, errors="replace") as handle:
            return "".join(line for line in handle if "Searching" not in line)

    def sshd(self) -> list[str]:
        """The command lines of the sshd processes of the client's user."""
        found = subprocess.run(["pgrep", "-a", "-u", self.user.name, "-x", "sshd"], capture_output=True, text=True)
        return found.stdout.splitlines()
