"""The machine's own display (the "console"), as a shadowing target.

Its owner is the user running the X server, or, for a server started as
root by a display manager, the user logged in on that display (utmp).
Its cookie comes from the server's ``-auth`` file or the owner's
``~/.Xauthority``; an X server without authorization needs none.
"""

from __future__ import annotations

import os
import pwd
import struct
from dataclasses import dataclass

from nxgate.session import files
from nxgate.session.processes import ProcessId

UTMP = "/var/run/utmp"
UTMP_RECORD = struct.Struct("hi32s4s32s256shhiii4i20s")
USER_PROCESS = 7


@dataclass(frozen=True)
class Console:
    display: int
    owner: str
    uid: int
    gid: int
    cookie: str | None
    server: ProcessId


def parse_display(spec: str) -> int | None:
    spec = spec.strip()
    if not spec:
        return None
    try:
        return int(spec.lstrip(":").split(".")[0])
    except ValueError:
        return None


def _server_pid(display: int) -> int | None:
    try:
        with open(files.X_LOCK.format(n=display), "rb") as handle:
            return int(handle.read(64).strip())
    except (OSError, ValueError):
        return None


def _uid_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _utmp_user(display: int) -> str | None:
    """The user logged in on display ``:N`` according to utmp."""
    wanted = f":{display}".encode()
    try:
        with open(UTMP, "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    user = None
    for offset in range(0, len(data) - UTMP_RECORD.size + 1, UTMP_RECORD.size):
        record = UTMP_RECORD.unpack_from(data, offset)
        line, name, host = (field.rstrip(b"\0") for field in (record[2], record[4], record[5]))
        if record[0] == USER_PROCESS and wanted in (line, host):
            user = name.decode("utf-8", "replace")
    return user


def _auth_file(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            args = handle.read().split(b"\0")
    except OSError:
        return None
    for index, arg in enumerate(args[:-1]):
        if arg == b"-auth":
            return args[index + 1].decode()
    return None


def _read_cookie(path: str | None, display: int) -> str | None:
    if not path:
        return None
    try:
        with open(path, "rb") as handle:
            return files.cookie_in_xauthority(handle.read(1 << 20), display)
    except OSError:
        return None


def find_console(spec: str) -> Console | None:
    """The console display if one is configured, running and owned by a user."""
    display = parse_display(spec)
    if display is None:
        return None
    pid = _server_pid(display)
    server = ProcessId.of(pid) if pid else None
    if server is None:
        return None
    uid = _uid_of(pid)
    name = None
    if uid:
        name = pwd.getpwuid(uid).pw_name
    else:
        name = _utmp_user(display)
    if not name:
        return None
    try:
        owner = pwd.getpwnam(name)
    except KeyError:
        return None
    cookie = _read_cookie(_auth_file(pid), display) or _read_cookie(os.path.join(owner.pw_dir, ".Xauthority"), display)
    return Console(display, owner.pw_name, owner.pw_uid, owner.pw_gid, cookie, server)
