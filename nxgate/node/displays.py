"""Display numbers for new sessions: which are free on this node.

A number is free when no session or unknown agent of ours holds it, its
claim file could be taken (so a second gateway on the node never gets it
too), and nothing else holds the X display or its NX port.  The caller
says what it holds already (``in_use``), so the allocator keeps no copy of
the session table.  Running out is :class:`NoFreeDisplay`, which the life
cycle answers as a failed start.

"Anything else" is anyone on the machine: every local user may write
``/tmp/.X650-lock`` with a live pid, and bind the abstract socket
``@/tmp/.X11-unix/X650`` (it lives in the network namespace, not in
``/tmp``, so jailed users can too; an agent on a display whose abstract
name is taken dies with "Cannot establish any listening sockets", and a
jailed session's X clients would connect there).  The allocator sees both
(:func:`abstract_x_displays` reads ``/proc/net/unix``) and passes over
displays held by others *without counting them* against the range: a
squatter cannot use up ``display_limit``.  Passing over is bounded
(:data:`MAX_FOREIGN`, beyond the end of the range), so that somebody who
holds thousands of names makes a start fail with a clear log instead of a
long scan.  :func:`foreign_displays` names who holds which display
(``nxgate-admin status``).
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import pwd
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from twisted.logger import Logger, LogLevel

from nxgate.node.agents import x11
from nxgate.node import files

log = Logger()

#: Where gateways on one machine claim displays (root's: /run is not
#: world-writable, so no local user can hold a claim).
DISPLAY_CLAIMS = "/run/nxgate/displays"

#: An NX display's TCP port is 4000 + the display number.
NX_PORT_OFFSET = 4000

#: How many displays held by others one allocation passes over (beyond
#: the configured range) before it gives up.
MAX_FOREIGN = 256

ABSTRACT_PREFIX = "@" + x11.X_SOCKET.format(n="")


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


def abstract_x_displays(table: str = "/proc/net/unix") -> dict[int, set[int]]:
    """The displays whose abstract X socket name is bound in our network
    namespace, with the socket inodes (a listening socket and the
    connections it accepted share the name)."""
    found: dict[int, set[int]] = {}
    try:
        with open(table, "rb") as handle:
            lines = handle.read().decode("ascii", "replace").splitlines()[1:]
    except OSError as error:
        log.warn("cannot read {table} to see abstract X sockets: {error}", table=table, error=str(error))
        return found
    for line in lines:
        fields = line.split()
        if len(fields) < 8 or not fields[7].startswith(ABSTRACT_PREFIX):
            continue
        number = fields[7][len(ABSTRACT_PREFIX):]
        if number.isdigit() and fields[6].isdigit():
            found.setdefault(int(number), set()).add(int(fields[6]))
    return found


def display_available(display: int, abstract: Iterable[int] = ()) -> bool:
    """Whether display ``N`` (and the agent's port 4000+N) can be used now;
    ``abstract``: the displays whose abstract socket is bound.

    A lock whose process is gone is stale: it and the socket are removed,
    so a crashed X server does not make its display unusable forever.
    """
    if display in abstract:
        return False
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
    ``span()`` gives ``(first, count)`` (a callable: a reload may change it),
    and past it by as many as others hold (at most :data:`MAX_FOREIGN`)."""

    def __init__(self, span: Callable[[], tuple[int, int]], in_use: Callable[[], Iterable[int]]) -> None:
        self.span = span
        self.in_use = in_use
        self._foreign_told: tuple[int, ...] = ()  # the displays of others the log last warned about

    def allocate(self) -> int:
        """Reserve a free display number (its claim is held until :meth:`release`).

        Numbers that our sessions or another gateway's hold count against
        the range; numbers held by anything else are passed over without
        counting, up to :data:`MAX_FOREIGN` of them."""
        taken = set(self.in_use())
        first, count = self.span()
        abstract = abstract_x_displays()
        foreign: list[int] = []
        display, budget = first - 1, count
        try:
            while budget > 0 and len(foreign) < MAX_FOREIGN:
                display += 1
                if display + NX_PORT_OFFSET >= 65536:
                    break
                if display in taken or not claim_display(display):
                    budget -= 1  # ours, or another gateway's
                    continue
                if display_available(display, abstract):
                    return display
                release_display(display)
                foreign.append(display)
        finally:
            if foreign:  # a warning when they change, not at every start while the same ones stay
                told, self._foreign_told = self._foreign_told, tuple(foreign)
                log.emit(LogLevel.debug if told == self._foreign_told else LogLevel.warn,
                         "{count} display(s) in use by others passed over: {displays} (nxgate-admin status "
                         "says who holds them)", count=len(foreign), displays=" ".join(f":{n}" for n in foreign))
        raise NoFreeDisplay("no free display for a new session")

    @staticmethod
    def claim(display: int) -> bool:
        """Hold ``display`` for a session taken back after a restart."""
        return claim_display(display)

    @staticmethod
    def release(display: int) -> None:
        release_display(display)


@dataclass(frozen=True)
class ForeignDisplay:
    """A display number of (or just past) our range that somebody else holds."""

    display: int
    users: tuple[str, ...]  # who holds it (user names, or uids without a name)
    holds: tuple[str, ...]  # what: "X lock of pid 77", "abstract X socket", "NX port 4650"


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _socket_owners(inodes: set[int]) -> dict[int, set[int]]:
    """inode -> uids of the processes that hold the socket (a /proc scan)."""
    owners: dict[int, set[int]] = {}
    wanted = {f"socket:[{inode}]": inode for inode in inodes}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            uid = os.stat(f"/proc/{entry}").st_uid
            for fd in os.listdir(f"/proc/{entry}/fd"):
                inode = wanted.get(os.readlink(f"/proc/{entry}/fd/{fd}"))
                if inode is not None:
                    owners.setdefault(inode, set()).add(uid)
        except OSError:
            continue  # it ended meanwhile: routine in a scan
    return owners


def _tcp_port_owners(ports: set[int]) -> dict[int, set[int]]:
    """port -> uids of the listening TCP sockets on those ports."""
    owners: dict[int, set[int]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as handle:
                lines = handle.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 7 and fields[3] == "0A":  # LISTEN
                port = int(fields[1].rsplit(":", 1)[1], 16)
                if port in ports:
                    owners.setdefault(port, set()).add(int(fields[7]))
    return owners


def foreign_displays(first: int, count: int, in_use: Iterable[int]) -> list[ForeignDisplay]:
    """Who holds which display of ``first`` .. ``first + count - 1`` (and
    the :data:`MAX_FOREIGN` past it, where the allocator may go) that is
    not ours: X locks, abstract X sockets, NX ports.  Blocking (it scans
    ``/proc``): for the admin's status, never on the reactor thread."""
    ours = set(in_use) | set(_claims)
    last = min(first + count + MAX_FOREIGN, 65536 - NX_PORT_OFFSET)
    numbers = [n for n in range(first, last) if n not in ours]
    abstract = {n: inodes for n, inodes in abstract_x_displays().items() if n in numbers}
    sockets = _socket_owners(set().union(*abstract.values())) if abstract else {}
    ports = _tcp_port_owners({n + NX_PORT_OFFSET for n in numbers})
    found = []
    for display in numbers:
        users: set[int] = set()
        holds: list[str] = []
        lock = x11.X_LOCK.format(n=display)
        try:
            lock_owner = os.lstat(lock).st_uid
        except OSError:
            lock_owner = None
        if lock_owner is not None:
            pid = _lock_holder(display)
            if pid is None or pid <= 0 or _pid_alive(pid):
                users.add(lock_owner)
                holds.append(f"X lock {lock}" + (f" of pid {pid}" if pid else ""))
        path = x11.X_SOCKET.format(n=display)
        try:
            users.add(os.lstat(path).st_uid)
            holds.append(f"X socket {path}")
        except OSError:
            pass
        if display in abstract:
            owners = set().union(*(sockets.get(inode, set()) for inode in abstract[display]))
            users |= owners
            holds.append(f"abstract X socket {ABSTRACT_PREFIX}{display}")
        port = display + NX_PORT_OFFSET
        if port in ports:
            users |= ports[port]
            holds.append(f"TCP port {port}")
        if holds:
            found.append(ForeignDisplay(display, tuple(sorted(_user(uid) for uid in users)) or ("unknown",),
                                        tuple(holds)))
    return found
