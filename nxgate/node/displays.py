"""Display numbers for new sessions: which are free on this node, and
holding them while a session lives.

A number is free when no session or unknown agent of ours holds it, its
claim file could be taken (so a second gateway on the node never gets it
too), and no process on the machine holds its X display or its NX port.

**Held is what the kernel says, never what a file in /tmp says.**  Every
local user may write ``/tmp/.X650-lock`` naming pid 1 (which always
lives), put a file at ``/tmp/.X11-unix/X650``, or plant the X server's
temporary lock ``/tmp/.tX650-lock``; and bind the abstract socket
``@/tmp/.X11-unix/X650`` (it lives in the network namespace, not in
``/tmp``, so jailed users can too).  A display is held when a process has
one of its X sockets bound (the path or the abstract name, both listed in
``/proc/net/unix``) or its NX port is taken.  A lock is never enough, not
even one naming a live process: any user can name one of his (a fresh one
too, again and again); an X server makes its sockets milliseconds after
its lock, and one that starts on a display of our range in that very
moment costs one failed start at worst.  Anything else there is a
leftover or a plant (:func:`judge`): the lock and
the socket file are taken over for the new session's user (an atomic
rename puts a file of hers in their place, which her nxagent replaces and
the planter, another user, cannot touch in the sticky ``/tmp``), a
temporary lock is removed.  Displays held by others are passed over
without counting against the range, and with no limit on how many: a
squatter can neither use up ``display_limit`` nor stop the search, which
reads ``/proc`` and ``/tmp`` for as many numbers as it takes, so it runs
off the reactor (:class:`DisplayAllocator` takes a ``blocking``).
:func:`foreign_displays` names who holds which display (``nxgate-admin
status``).

**The abstract name is held by us.**  A claim binds the display's abstract
X name (without listening) and keeps it until the display is released;
every agent runs with ``-nolisten local`` (its X clients use the path
socket; libxcb tries the abstract name first and moves on) and gets a copy
of that socket as fd 3 (:func:`name_holder`), so the name stays taken for
as long as the agent lives, across a gateway restart, and across the
restart of a session started for later, whose nxagent gives up waiting for
a first client after 60 s: nobody can bind it in between, catch the
session's X clients there or make the fresh agent fail.  Before such a
restart the lock and socket file are taken over for the user again
(:func:`take_over_for_restart`).
"""

from __future__ import annotations

import errno
import fcntl
import os
import pwd
import secrets
import shutil
import socket
import stat
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from twisted.logger import Logger, LogLevel

from nxgate import local_peers
from nxgate.node import files, processes
from nxgate.node.agents import x11
from nxgate.threads import Blocking, inline

log = Logger()

#: Where gateways on one machine claim displays (root's: /run is not
#: world-writable, so no local user can hold a claim).
DISPLAY_CLAIMS = "/run/nxgate/displays"

#: An NX display's TCP port is 4000 + the display number.
NX_PORT_OFFSET = 4000

#: How far past the range ``nxgate-admin status`` looks for displays others
#: hold (the allocator itself goes as far as it must).
REPORT_BEYOND = 256

#: The pid a lock taken over for a session's user names: above the largest
#: pid_max (2**22), so never a live process; her nxagent sees a stale lock
#: of hers and replaces it.
NO_PROCESS = 4194305

#: The X server's temporary lock, linked to the lock's name once written.
X_TEMP_LOCK = "/tmp/.tX{n}-lock"

ABSTRACT_PREFIX = "@" + x11.X_SOCKET.format(n="")

#: nxagent's options for a display whose abstract name we hold: no abstract socket of its own.
AGENT_OPTIONS = ("-nolisten", "local")

#: At most this many display numbers are named in one log line.
LOGGED = 16

#: What stands in the way of a free display: the lock, the socket file, the temporary lock.
LOCK, SOCKET_FILE, TEMP_LOCK = "lock", "socket file", "temporary lock"


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


# ------------------------------------------------------------ the facts
@dataclass(frozen=True)
class XSockets:
    """The X sockets bound on this machine (``/proc/net/unix``): display ->
    the inodes bound to its abstract name, and to its path."""

    abstract: dict[int, set[int]] = field(default_factory=dict)
    path: dict[int, set[int]] = field(default_factory=dict)


def x_sockets(table: str) -> XSockets:
    """The X displays' sockets in the text of ``/proc/net/unix`` (pure)."""
    prefix = x11.X_SOCKET.format(n="")
    found = XSockets()
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 8 or not fields[6].isdigit():
            continue
        name, into = fields[7], found.path
        if name.startswith("@"):
            name, into = name[1:], found.abstract
        number = name[len(prefix):] if name.startswith(prefix) else ""
        if number.isdigit():
            into.setdefault(int(number), set()).add(int(fields[6]))
    return found


def read_x_sockets(table: str = "/proc/net/unix") -> tuple[XSockets, str]:
    """:func:`x_sockets` of this machine (blocking), and what went wrong reading it ("" if nothing)."""
    try:
        with open(table, "rb") as handle:
            return x_sockets(handle.read().decode("ascii", "replace")), ""
    except OSError as error:
        return XSockets(), f"cannot read {table} to see X sockets: {error}"


@dataclass(frozen=True)
class LockFile:
    """What is at a display's lock path: whose it is, the pid it names, and
    whether that process lives (for the words of the log and the status)."""

    regular: bool
    owner: int
    pid: int | None = None
    pid_lives: bool = False


def read_lock(path: str) -> LockFile | None:
    """The lock at ``path`` (blocking; None if there is none).  It lives in
    /tmp, where a user may put a FIFO or a link: nothing is followed or
    waited on (:func:`nxgate.node.files.read_regular_file`)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return LockFile(False, st.st_uid)
    try:
        pid = int((files.read_regular_file(path, 64) or b"").strip())
    except ValueError:
        return LockFile(True, st.st_uid)
    return LockFile(True, st.st_uid, pid, pid > 0 and processes.start_time(pid) is not None)


@dataclass(frozen=True)
class Facts:
    """What this machine says about display ``N``."""

    display: int
    abstract: bool  # its abstract X name is bound
    listening: bool  # its path socket is bound
    lock: LockFile | None
    socket_file: bool  # something is at /tmp/.X11-unix/XN
    temp_lock: bool  # something is at /tmp/.tXN-lock
    port_free: bool  # its NX port can be bound


def read_facts(display: int, sockets: XSockets) -> Facts:
    """The facts of display ``display`` (blocking: /tmp, /proc, a port probe)."""
    return Facts(display, display in sockets.abstract, display in sockets.path,
                 read_lock(x11.X_LOCK.format(n=display)), os.path.lexists(x11.X_SOCKET.format(n=display)),
                 os.path.lexists(X_TEMP_LOCK.format(n=display)), _port_free(NX_PORT_OFFSET + display))


@dataclass(frozen=True)
class Judgement:
    """Whether a display can be used, why (who holds it, or what is in the
    way), and what is in the way (to be taken over first)."""

    free: bool
    why: str = ""
    leftovers: tuple[str, ...] = ()


def judge(facts: Facts) -> Judgement:
    """Whether ``facts`` leave the display free (pure): held only by a bound
    X socket or a taken NX port, whatever a lock says."""
    if facts.abstract:
        return Judgement(False, "its abstract X socket is bound")
    if facts.listening:
        return Judgement(False, f"a process listens on {x11.X_SOCKET.format(n=facts.display)}")
    if not facts.port_free:
        return Judgement(False, f"TCP port {NX_PORT_OFFSET + facts.display} is taken")
    lock = facts.lock
    leftovers, words = [], []
    if lock is not None:
        leftovers.append(LOCK)
        if not lock.regular:
            words.append("a lock that is no file")
        elif lock.pid is None:
            words.append("a lock naming no pid")
        else:
            words.append(f"a lock naming pid {lock.pid}" + (", a live process that is no X server of this display"
                                                            if lock.pid_lives else ""))
    if facts.socket_file:
        leftovers.append(SOCKET_FILE)
        words.append("a socket file nothing listens on")
    if facts.temp_lock:
        leftovers.append(TEMP_LOCK)
        words.append("a temporary lock")
    return Judgement(True, ", ".join(words), tuple(leftovers))


# ---------------------------------------------------- taking over /tmp
def _replace(path: str, data: bytes, uid: int, gid: int) -> None:
    """Put a file of ``uid``'s holding ``data`` at ``path`` in one step (a
    rename over whatever is there; a planted directory is removed first)."""
    directory = os.path.dirname(path)
    temporary = os.path.join(directory, f".nxgate-{secrets.token_hex(8)}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o444)
    try:
        os.write(fd, data)
        os.fchown(fd, uid, gid)
    finally:
        os.close(fd)
    try:
        try:
            os.rename(temporary, path)
        except IsADirectoryError:
            _remove(path)
            os.rename(temporary, path)
    except OSError:
        _remove(temporary)
        raise


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except IsADirectoryError:
        shutil.rmtree(path)  # fd-based on Linux: a link planted inside is not followed


def take_over(display: int, leftovers: Iterable[str], uid: int, gid: int) -> None:
    """Clear the way on ``display`` for an agent of ``uid`` (blocking, as
    root; OSError if something cannot be cleared)."""
    for leftover in leftovers:
        if leftover == LOCK:
            _replace(x11.X_LOCK.format(n=display), f"{NO_PROCESS:10d}\n".encode(), uid, gid)
        elif leftover == SOCKET_FILE:
            _replace(x11.X_SOCKET.format(n=display), b"", uid, gid)
        elif leftover == TEMP_LOCK:
            _remove(X_TEMP_LOCK.format(n=display))


def take_over_for_restart(display: int, uid: int, gid: int) -> None:
    """Before a session's agent starts again on its display (a session
    started for later): whatever another user put at the lock, the socket
    file and the temporary lock while no agent ran is taken over, and the
    lock is hers from now on (blocking, as root)."""
    take_over(display, (LOCK, SOCKET_FILE, TEMP_LOCK), uid, gid)


# ---------------------------------------------------------------- claims
@dataclass
class _Claim:
    fd: int  # holds the flock of the claim file
    name: socket.socket | None = None  # bound to the abstract X name


_claims: dict[int, _Claim] = {}
_claims_lock = threading.Lock()  # the search claims in a thread, the reactor releases


def _abstract_name(display: int) -> str:
    return "\0" + x11.X_SOCKET.format(n=display)


def _bind_name(display: int) -> socket.socket:
    """A socket bound (never listening) to display ``N``'s abstract X name;
    OSError when somebody else has it."""
    holder = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        holder.bind(_abstract_name(display))
    except OSError:
        holder.close()
        raise
    return holder


def _flock(display: int, directory: str) -> int | None:
    """The fd holding ``display``'s claim file locked, None if another gateway holds it."""
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        fd = os.open(os.path.join(directory, str(display)), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                     0o600)
    except OSError as error:
        log.warn("cannot claim display :{display} in {directory} ({error}); choosing it unclaimed",
                 display=display, directory=directory, error=str(error))
        return -1
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def claim_display(display: int, directory: str = DISPLAY_CLAIMS) -> bool:
    """Claim display ``N`` for this process against other gateways on the
    machine, until :func:`release_display` (the abstract name is held by
    :func:`hold_name`).

    Between choosing a free display and its agent taking the X lock there is
    a window in which another gateway (a second node, a test) could choose
    it too; an flock on a file of our own closes it, and ends with the
    process that held it.  A claim this process already holds is granted
    again: within one gateway the session manager decides."""
    return _claim_new(display, directory) is not False


def _claim_new(display: int, directory: str) -> bool | None:
    """Claim ``display`` if nobody has it: None when this process has it
    already, False when another gateway does."""
    with _claims_lock:
        if display in _claims:
            return None
        fd = _flock(display, directory)
        if fd is None:
            return False
        _claims[display] = _Claim(fd)
        return True


def hold_name(display: int) -> bool:
    """Bind the abstract X name of ``display`` (which this process claims)
    for as long as the claim lasts; False when somebody else has it."""
    with _claims_lock:
        claim = _claims.get(display)
        if claim is None:
            return False
        if claim.name is None:
            try:
                claim.name = _bind_name(display)
            except OSError:
                return False
        return True


class DisplayTaken(OSError):
    """Somebody else holds the abstract X name of a session's display."""


def name_holder(display: int) -> int:
    """The fd of our socket on ``display``'s abstract X name, for its agent
    (fd 3): bound now if this process does not hold it yet (a session taken
    back after a restart, whose previous agent held it); DisplayTaken if
    somebody else has it."""
    claim_display(display)
    if not hold_name(display):
        raise DisplayTaken(errno.EADDRINUSE, f"display :{display} is taken: its abstract X socket is bound by "
                                             "another process")
    with _claims_lock:
        name = _claims[display].name
        assert name is not None
        return name.fileno()


def held_displays() -> set[int]:
    """The displays this process claims."""
    with _claims_lock:
        return set(_claims)


def release_display(display: int) -> None:
    """Give up this process's claim on display ``N`` and its abstract name (if it holds them)."""
    with _claims_lock:
        claim = _claims.pop(display, None)
    if claim is not None:
        if claim.name is not None:
            claim.name.close()
        if claim.fd >= 0:
            os.close(claim.fd)


# ---------------------------------------------------------------- search
_missing_families: set[int] = set()


def _port_free(port: int) -> bool:
    for family, address in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            probe = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            _missing_families.add(family)  # no IPv6 here, say: nothing to probe
            continue
        try:
            probe.bind((address, port))
        except OSError as error:
            if error.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
        finally:
            probe.close()
    return True


@dataclass
class Search:
    """What one search found: the display (None: none free), and what it
    passed over and took over on the way, for the log."""

    display: int | None = None
    passed_over: list[tuple[int, str]] = field(default_factory=list)
    taken_over: list[tuple[int, str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def find_free(first: int, count: int, taken: Iterable[int], uid: int, gid: int,
              directory: str = DISPLAY_CLAIMS, table: str = "/proc/net/unix") -> Search:
    """Claim the first free display from ``first`` on for an agent of
    ``uid``: numbers ours (``taken``, or claimed by this process) and other
    gateways' count against the ``count`` of the range, numbers others hold
    are passed over, however many (blocking: run it off the reactor)."""
    taken = set(taken)
    sockets, problem = read_x_sockets(table)
    found = Search(problems=[problem] if problem else [])
    display, budget = first - 1, count
    while budget > 0:
        display += 1
        if display + NX_PORT_OFFSET >= 65536:
            break
        if display in taken:
            budget -= 1
            continue
        verdict = judge(read_facts(display, sockets))
        if not verdict.free:
            found.passed_over.append((display, verdict.why))
            continue
        if not _claim_new(display, directory):
            budget -= 1  # ours already, or another gateway's
            continue
        if not hold_name(display):
            release_display(display)
            found.passed_over.append((display, "its abstract X socket was bound just now"))
            continue
        try:
            take_over(display, verdict.leftovers, uid, gid)
        except OSError as error:
            release_display(display)
            found.passed_over.append((display, f"{verdict.why}, which could not be cleared ({error})"))
            continue
        if verdict.leftovers:
            found.taken_over.append((display, verdict.why))
        found.display = display
        return found
    return found


def _numbers(found: list[tuple[int, str]]) -> str:
    names = " ".join(f":{display}" for display, _ in found[:LOGGED])
    return names + (f" and {len(found) - LOGGED} more" if len(found) > LOGGED else "")


class NoFreeDisplay(Exception):
    """Every display number of the configured range is taken."""


class DisplayAllocator:
    """Hands out display numbers from ``first`` to ``first + count - 1``, where
    ``span()`` gives ``(first, count)`` (a callable: a reload may change it),
    and past it by as many as others hold.  The search runs through
    ``blocking``; what it passed over and took over is logged here."""

    def __init__(self, span: Callable[[], tuple[int, int]], in_use: Callable[[], Iterable[int]],
                 blocking: Blocking = inline) -> None:
        self.span = span
        self.in_use = in_use
        self.blocking = blocking
        self._foreign_told: tuple[int, ...] = ()  # the displays of others the log last warned about

    async def allocate(self, uid: int, gid: int) -> int:
        """Reserve a free display number for an agent of ``uid`` (its claim
        and abstract name are held until :meth:`release`)."""
        first, count = self.span()
        found: Search = await self.blocking(find_free, first, count, list(self.in_use()), uid, gid)
        for problem in found.problems:
            log.warn("{problem}", problem=problem)
        if found.passed_over:  # a warning when they change, not at every start while the same ones stay
            told, self._foreign_told = self._foreign_told, tuple(number for number, _ in found.passed_over)
            log.emit(LogLevel.debug if told == self._foreign_told else LogLevel.warn,
                     "{count} display(s) in use by others passed over: {displays} (nxgate-admin status says who "
                     "holds them)", count=len(found.passed_over), displays=_numbers(found.passed_over))
        for display, why in found.taken_over:
            log.info("display :{display}: no X server held it ({why}); taken over for the new session",
                     display=display, why=why)
        if found.display is None:
            raise NoFreeDisplay("no free display for a new session")
        return found.display

    @staticmethod
    def claim(display: int) -> bool:
        """Hold ``display`` for a session taken back after a restart (its
        agent holds the abstract name, see :func:`name_holder`)."""
        return claim_display(display)

    @staticmethod
    def release(display: int) -> None:
        release_display(display)


# ---------------------------------------------------------------- status
@dataclass(frozen=True)
class ForeignDisplay:
    """A display number of (or just past) our range that somebody else holds."""

    display: int
    users: tuple[str, ...]  # who holds it (user names, or uids without a name)
    holds: tuple[str, ...]  # what: "abstract X socket ...", "X lock ... of pid 77", "NX port 4650"


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _socket_owners(inodes: set[int]) -> dict[int, set[int]]:
    """inode -> uids of the processes that hold the socket (a /proc scan)."""
    owners: dict[int, set[int]] = {}
    for inode, pids in local_peers.holders(inodes).items():
        for pid in pids:
            try:
                owners.setdefault(inode, set()).add(os.stat(f"/proc/{pid}").st_uid)
            except OSError:
                continue  # it ended meanwhile
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
    :data:`REPORT_BEYOND` past it) that is not ours: bound X sockets, NX
    ports, and what others left in /tmp that the next start there will take
    over.  Blocking (it scans ``/proc``): for the admin's status, never on
    the reactor thread."""
    ours = set(in_use) | held_displays()
    last = min(first + count + REPORT_BEYOND, 65536 - NX_PORT_OFFSET)
    numbers = [n for n in range(first, last) if n not in ours]
    sockets, _problem = read_x_sockets()
    wanted = {n for n in numbers if n in sockets.abstract or n in sockets.path}
    inodes = set().union(*(sockets.abstract.get(n, set()) | sockets.path.get(n, set()) for n in wanted))
    owners = _socket_owners(inodes) if inodes else {}
    ports = _tcp_port_owners({n + NX_PORT_OFFSET for n in numbers})
    found = []
    for display in numbers:
        facts = read_facts(display, sockets)
        users: set[int] = set()
        holds: list[str] = []
        for kind, bound, name in (("abstract X socket", sockets.abstract, ABSTRACT_PREFIX + str(display)),
                                  ("X socket", sockets.path, x11.X_SOCKET.format(n=display))):
            if display in bound:
                users |= set().union(*(owners.get(inode, set()) for inode in bound[display]))
                holds.append(f"{kind} {name}")
        if display + NX_PORT_OFFSET in ports:
            users |= ports[display + NX_PORT_OFFSET]
            holds.append(f"TCP port {display + NX_PORT_OFFSET}")
        if facts.lock is not None:
            users.add(facts.lock.owner)
            lock = x11.X_LOCK.format(n=display)
            verdict = judge(facts)
            holds.append(f"X lock {lock}" + (f" of pid {facts.lock.pid}" if facts.lock.pid else "")
                         + ("" if not verdict.free else " (no X server: the next start there takes it over)"))
        if holds:
            found.append(ForeignDisplay(display, tuple(sorted(_user(uid) for uid in users)) or ("unknown",),
                                        tuple(holds)))
    return found

