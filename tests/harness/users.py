"""Real Unix users for PAM, created and removed by the tests (needs root)."""

from __future__ import annotations

import os
import pwd
import secrets
import subprocess
from dataclasses import dataclass

NEED_ROOT = "end-to-end tests create Unix users and must run as root (CI does)"


def is_root() -> bool:
    return os.geteuid() == 0


@dataclass
class TestUser:
    name: str
    password: str

    @property
    def entry(self) -> pwd.struct_passwd:
        return pwd.getpwnam(self.name)

    @property
    def home(self) -> str:
        return self.entry.pw_dir

    def set_password(self, password: str) -> None:
        subprocess.run(["chpasswd"], input=f"{self.name}:{password}\n".encode(), check=True)
        self.password = password

    def remove(self) -> None:
        subprocess.run(["pkill", "-KILL", "-u", self.name], check=False)
        subprocess.run(["userdel", "--remove", "--force", self.name], check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def create_user(password: str | None = None, prefix: str = "nxt") -> TestUser:
    name = f"{prefix}{secrets.token_hex(4)}"
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", name], check=True)
    user = TestUser(name, "")
    user.set_password(password if password is not None else "pw-" + secrets.token_urlsafe(12))
    return user
