"""Display numbers for new sessions: which are free on this node.

A number is free when no session or unknown agent of ours holds it, its
claim file could be taken (so a second gateway on the node never gets it
too), and nothing else holds the X display or its NX port.  The caller
says what it holds already (``in_use``), so the allocator keeps no copy of
the session table.  Running out is :class:`NoFreeDisplay`, which the life
cycle answers as a failed start.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import stat
from collections.abc import Callable, Iterable

from twisted.logger import Logger

from nxgate.backends import x11
from nxgate.node import files

log = Logger(namespace="nxgate.session")

#: Where gateways on one machine claim displays (root's: /run is not
#: world-writable, so no local user can hold a claim).
DISPLAY_CLAIMS = "/run/nxgate/displays"

#: An NX display's TCP port is 4000 + the display number.
NX_PORT_OFFSET = 4000


def ensure_x_socket_dir() -> None:
    """``/tmp/.X11-unix`` must exist, owned by root and sticky, before a
    user's agent starts; otherwise the first agent would create it as its own."""
    try:
        st = os.lstat(x11.X_SOCKET_DIR)
    except FileNotFoundError:
        os.mkdir(x11.X_SOCKET_DIR, 0o1777)
        os.chmod(x11.X_SOCKET_DIR, 0o1777)
        return
    if stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and stat.S_IMODE(st.st_mode) != 0o1777:
        os.chmod(x11.X_SOCKET_DIR, 0o1777)


def _lock_holder(display: int) -> int | None:
    """The pid in a display's lock file, 0 if unreadable, None if no lock.

    The lock lives in /tmp, where any user may put a FIFO or a link in its
    place: it is read with :func:`read_regular_file`, and anything but a
    regular file holding a pid counts as taken."""
    path = x11.X_LOCK.format(n=display)
    if not os.path.lexists(path):
        return None
    data = files.read_regular_file(path, 64)
    try:
        return int((data or b"").strip())
    except ValueError:
        log.debug("display :{display} taken: its lock {path} holds no pid", display=display, path=path)
        return 0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_missing_families: set[int] = set()


def _no_family(family: int, error: OSError) -> None:
    """Say once that an address family cannot be probed (no IPv6, say)."""
    if family not in _missing_families:
        _missing_families.add(family)
        log.debug("cannot probe ports of address family {family}: {error}", family=socket.AddressFamily(family).name,
                  error=str(error))


def _port_free(port: int) -> bool:
    for family, address in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            probe = socket.socket(family, socket.SOCK_STREAM)
        except OSError as error:
            _no_family(family, error)
            continue
        try:
            probe.bind((address, port))
        except OSError as error:
            if error.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
        finally:
            probe.close()
    return True


_claims: dict[int, int] = {}  # display -> the fd that holds its flock


def claim_display(display: int, directory: str = DISPLAY_CLAIMS) -> bool:
    """Claim display ``N`` for this process against other gateways on the
    machine, until :func:`release_display`.

    Between choosing a free display and its agent taking the X lock there is
    a window in which another gateway (a second node, a test) could choose
    it too; an flock on a file of our own closes it, and ends with the
    process that held it.  A claim this process already holds is granted
    again: within one gateway the session manager decides."""
    if display in _claims:
        return True
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        fd = os.open(os.path.join(directory, str(display)),
                     os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as error:
        log.warn("cannot claim display :{display} in {directory} ({error}); choosing it unclaimed",
                 display=display, directory=directory, error=str(error))
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    _claims[display] = fd
    return True


def release_display(display: int) -> None:
    """Give up this process's claim on display ``N`` (if it holds one)."""
    fd = _claims.pop(display, None)
    if fd is not None:
        os.close(fd)


def display_available(display: int) -> bool:
    """Whether display ``N`` (and the agent's port 4000+N) can be used now.

    A lock whose process is gone is stale: it and the socket are removed,
    so a crashed X server does not make its display unusable forever.
    """
    holder = _lock_holder(display)
    if holder is not None:
        if holder <= 0 or _pid_alive(holder):
            return False
        log.info("removing stale lock of display :{display} (pid {pid} is gone)", display=display, pid=holder)
        for path in (x11.X_LOCK.format(n=display), x11.X_SOCKET.format(n=display)):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
    elif os.path.lexists(x11.X_SOCKET.format(n=display)):
        return False
    return _port_free(4000 + display)


class NoFreeDisplay(Exception):
    """Every display number of the configured range is taken."""


class DisplayAllocator:
    """Hands out display numbers from ``first`` to ``first + count - 1``, where
    ``span()`` gives ``(first, count)`` (a callable: a reload may change it)."""

    def __init__(self, span: Callable[[], tuple[int, int]], in_use: Callable[[], Iterable[int]]) -> None:
        self.span = span
        self.in_use = in_use

    def allocate(self) -> int:
        """Reserve a free display number (its claim is held until :meth:`release`)."""
        taken = set(self.in_use())
        first, count = self.span()
        for display in range(first, first + count):
            if display in taken or display + NX_PORT_OFFSET >= 65536 or not claim_display(display):
                continue
            if display_available(display):
                return display
            release_display(display)
        raise NoFreeDisplay("no free display for a new session")

    @staticmethod
    def claim(display: int) -> bool:
        """Hold ``display`` for a session taken back after a restart."""
        return claim_display(display)

    @staticmethod
    def release(display: int) -> None:
        release_display(display)
