"""The machine's own display (the "console"), as a shadowing target.

Its owner is the user running the X server, or, for a server started as
root by a display manager, the user logged in on that display (utmp).
Its cookie comes from the server's ``-auth`` file or the owner's
``~/.Xauthority``; an X server without authorization needs none.

:func:`find_console` blocks (user database look-ups, /proc, utmp, files in
the owner's home and in /tmp): callers on the reactor run it in a thread,
``blocking(find_console, spec)`` (see :mod:`nxgate.threads`), or call
:func:`find_console_with`.  The files a user controls are read with
:func:`nxgate.node.files.read_regular_file`, so a FIFO or a link put in
their place neither hangs the thread nor makes root read elsewhere.
"""

from __future__ import annotations

import os
import pwd
import struct
from dataclasses import dataclass

from twisted.internet.defer import Deferred
from twisted.logger import Logger

from nxgate.node.agents import x11
from nxgate.node import files
from nxgate.node.processes import ProcessId
from nxgate.threads import Blocking

UTMP = "/var/run/utmp"
UTMP_RECORD = struct.Struct("hi32s4s32s256shhiii4i20s")
USER_PROCESS = 7
#: utmp holds one 384-byte record per login; more than this is not a utmp.
MAX_UTMP_BYTES = 4 << 20
#: An X authority file holds a few entries of ~50 bytes each.
MAX_XAUTHORITY_BYTES = 1 << 20

log = Logger()


@dataclass(frozen=True)
class Console:
    display: int
    owner: str
    uid: int
    gid: int
    cookie: str | None
    server: ProcessId
    home: str = ""  # the owner's home directory (where ~/.Xauthority is)


def parse_display(spec: str) -> int | None:
    spec = spec.strip()
    if not spec:
        return None
    try:
        return int(spec.lstrip(":").split(".")[0])
    except ValueError:
        return None


def _server_pid(display: int) -> int | None:
    """The pid in the display's lock file (in /tmp: any user may plant one)."""
    data = files.read_regular_file(x11.X_LOCK.format(n=display), 64)
    try:
        return int((data or b"").strip()) or None
    except ValueError:
        log.debug("the lock of display :{display} holds no pid", display=display)
        return None


def _uid_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except OSError as error:
        log.debug("no owner for X server pid {pid}: {error}", pid=pid, error=str(error))
        return None
    return None


def _utmp_user(display: int) -> str | None:
    """The user logged in on display ``:N`` according to utmp."""
    wanted = f":{display}".encode()
    data = files.read_regular_file(UTMP, MAX_UTMP_BYTES)
    if data is None:
        log.debug("no user for display :{display}: {utmp} cannot be read", display=display, utmp=UTMP)
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
    except OSError as error:
        log.debug("no -auth file for X server pid {pid}: {error}", pid=pid, error=str(error))
        return None
    for index, arg in enumerate(args[:-1]):
        if arg == b"-auth":
            return args[index + 1].decode("utf-8", "surrogateescape")
    return None


def _read_cookie(path: str | None, display: int, owners: tuple[int, ...] | None = None) -> str | None:
    """The display's cookie in the X authority file ``path``: a regular file
    (no FIFO, no link), belonging to one of ``owners`` if given, read bounded."""
    if not path:
        return None
    data = files.read_regular_file(path, MAX_XAUTHORITY_BYTES, owners)
    if data is None:
        return None
    return x11.cookie_in_xauthority(data, display)


def find_console(spec: str) -> Console | None:
    """The console display if one is configured, running and owned by a user.

    Blocking (NSS, /proc, utmp, the owner's files): run it in a thread."""
    display = parse_display(spec)
    if display is None:
        return None
    pid = _server_pid(display)
    server = ProcessId.of(pid) if pid else None
    if server is None:
        return None
    uid = _uid_of(pid)
    name = None
    try:
        if uid:
            name = pwd.getpwuid(uid).pw_name
        else:
            name = _utmp_user(display)
        if not name:
            return None
        owner = pwd.getpwnam(name)
    except (KeyError, UnicodeEncodeError):
        log.debug("the console :{display} has no known owner (uid {uid}, user {user!r})", display=display, uid=uid,
                  user=name)
        return None
    # The -auth file is named on the X server's command line (by root or by
    # the owner); the file in the home directory must be the owner's or root's.
    cookie = _read_cookie(_auth_file(pid), display) or _read_cookie(
        os.path.join(owner.pw_dir, ".Xauthority"), display, (owner.pw_uid, 0))
    return Console(display, owner.pw_name, owner.pw_uid, owner.pw_gid, cookie, server, owner.pw_dir)


def find_console_with(blocking: Blocking, spec: str) -> Deferred[Console | None]:
    """:func:`find_console` run through ``blocking`` (a
    :data:`nxgate.threads.Blocking`): a Deferred of the Console or None."""
    return blocking(find_console, spec)
