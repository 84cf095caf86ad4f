"""Session processes seen from the gateway: noticing when they exit, even
after a gateway restart (they are started by :mod:`nxgate.node.launcher`).

A process started by this gateway is also our child, but after a restart it
is not; a Linux pidfd works for both, so exits are always observed the same
way: the pidfd becomes readable.  A process is identified by its pid *and*
its start time (from /proc), so a recycled pid is never mistaken for it,
and signals go through :func:`send_signal` (a pidfd), never ``os.kill``.

The /proc scans (:func:`named_children`, :func:`agents_in`,
:func:`tagged_processes`, :func:`listens`) read every process's files:
they are thread-safe, and callers on the reactor run them through their
``blocking`` (:mod:`nxgate.threads`).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from twisted.internet import defer
from twisted.logger import Logger
from twisted.internet.interfaces import IReadDescriptor
from zope.interface import implementer

log = Logger()


class LaunchError(Exception):
    """The launcher could not start the program; the text says why."""


@dataclass(frozen=True)
class ProcessId:
    pid: int
    started: int  # clock ticks after boot, field 22 of /proc/PID/stat

    @classmethod
    def of(cls, pid: int) -> ProcessId | None:
        started = start_time(pid)
        return None if started is None else cls(pid, started)

    def alive(self) -> bool:
        return self.pid > 0 and start_time(self.pid) == self.started


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


def send_signal(process: ProcessId, signum: int) -> bool:
    """Send ``signum`` to ``process`` if it still is that process; whether
    it was sent.

    A pid alone is not enough: between a check and ``kill()`` the process
    can exit and its pid go to another (root's SIGKILL would then hit an
    innocent process).  A pidfd refers to one process, not to a number: the
    start-time check made after opening it proves it is the process we
    mean, and a signal sent through it reaches that process or nobody
    (ESRCH once it has exited, even if its pid is in use again)."""
    if process.pid <= 0:
        return False
    name = _signal_name(signum)
    fd = -1
    try:
        fd = os.pidfd_open(process.pid)
        if not process.alive():
            log.debug("not sending {signal} to pid {pid}: the process has ended (the pid is free or "
                      "another process's now)", signal=name, pid=process.pid)
            return False
        signal.pidfd_send_signal(fd, signum)
        return True
    except ProcessLookupError:
        log.debug("not sending {signal} to pid {pid}: it has exited", signal=name, pid=process.pid)
        return False
    except OSError as error:
        log.warn("cannot send {signal} to pid {pid}: {error}", signal=name, pid=process.pid, error=str(error))
        return False
    finally:
        if fd >= 0:
            os.close(fd)


def signal_group(leader: ProcessId, signum: int) -> bool:
    """Send ``signum`` to the process group that ``leader`` leads, if the
    leader still is that process; whether it was sent.

    There is no pidfd for a group: the start-time check and ``killpg`` leave
    a small window, which is why only a group whose leader we started (a
    session program, in its own group) is signalled this way."""
    if leader.pid <= 0 or not leader.alive():
        return False
    try:
        os.killpg(leader.pid, signum)
        return True
    except ProcessLookupError:
        log.debug("not sending {signal} to process group {pid}: it has ended", signal=_signal_name(signum),
                  pid=leader.pid)
    except OSError as error:
        log.warn("cannot send {signal} to process group {pid}: {error}", signal=_signal_name(signum),
                 pid=leader.pid, error=str(error))
    return False


def _stat(pid: int) -> list[bytes] | None:
    """Fields 3 and up of /proc/PID/stat (the name, field 2, may hold spaces)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return None  # gone (a /proc race: it ended meanwhile): no log, this is routine
    return stat[stat.rindex(b")") + 2 :].split()


def start_time(pid: int) -> int | None:
    fields = _stat(pid)
    if fields is None or fields[0] == b"Z":
        return None  # gone, or a zombie that has exited already
    return int(fields[19])


def children_named(pid: int, name: str) -> list[int]:
    """Live direct children of ``pid`` whose command name is ``name``.

    A scan of /proc: it runs about once per suspend, and unlike a pid kept
    from a log line it also works after a gateway restart."""
    return [child.pid for child in named_children(pid, name)]


def named_children(pid: int, name: str) -> list[ProcessId]:
    """:func:`children_named` with each child's start time, as the scan saw
    it: what :func:`send_signal` needs to be sure it signals that child."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat(int(entry))
        if fields is None or fields[0] == b"Z" or int(fields[1]) != pid:
            continue
        try:
            with open(f"/proc/{entry}/comm", "rb") as handle:
                if handle.read().rstrip(b"\n") == name.encode():
                    found.append(ProcessId(int(entry), int(fields[19])))
        except OSError:
            continue  # it ended meanwhile (a /proc race), routine in a scan
    return found


def jailed_child(outer: int, name: str) -> ProcessId | None:
    """The ``name`` process that bubblewrap ``outer`` started in a new PID
    namespace, with its host pid: bwrap forks the namespace's init (also
    ``bwrap``), which forks the command.  None while it is not there yet."""
    for init in named_children(outer, "bwrap"):
        found = named_children(init.pid, name)
        if found:
            return found[0]
    return None


def same_pid_namespace(pid: int) -> bool:
    """Whether ``pid`` lives in our own PID namespace (False: in a jail)."""
    try:
        return os.readlink(f"/proc/{pid}/ns/pid") == os.readlink("/proc/self/ns/pid")
    except OSError:
        return True  # gone: nothing to join


def agents_in(directory: str, name: str = "nxagent") -> dict[str, ProcessId]:
    """Live ``name`` processes working in a subdirectory of ``directory``,
    by that subdirectory's name (a session id); the first of a family (an
    agent, not its forked watchdog).

    Agents run in their session directory, so this finds them without the
    session store: what the life cycle's reconcile needs when the
    store lost them."""
    family: dict[str, dict[int, tuple[int, int]]] = {}  # id -> pid -> (parent, started)
    prefix = os.path.join(os.path.abspath(directory), "")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd").removesuffix(" (deleted)")
            with open(f"/proc/{entry}/comm", "rb") as handle:
                comm = handle.read().rstrip(b"\n")
        except OSError:
            continue  # ended meanwhile, or a kernel thread without cwd: routine in a scan
        fields = _stat(int(entry))
        session_id = cwd[len(prefix):]
        if comm != name.encode() or not cwd.startswith(prefix) or "/" in session_id or fields is None \
                or fields[0] == b"Z":
            continue
        family.setdefault(session_id, {})[int(entry)] = (int(fields[1]), int(fields[19]))
    found = {}
    for session_id, members in family.items():
        roots = [pid for pid, (parent, _) in members.items() if parent not in members] or list(members)
        eldest = min(roots)
        found[session_id] = ProcessId(eldest, members[eldest][1])
    return found


def display_argument(pid: int) -> int | None:
    """The X display number on a process's command line (``:N``)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = handle.read().split(b"\0")
    except OSError:
        return None  # ended meanwhile (a /proc race)
    for arg in reversed(argv):
        if arg.startswith(b":") and arg[1:].isdigit():
            return int(arg[1:])
    return None


#: In the environment of everything a session starts (its agent, its
#: program, and whatever they start in turn): the session's id.  When the
#: session ends, whatever still carries it is ended too (see
#: :func:`tagged_processes`).
SESSION_MARKER = "NXGATE_SESSION"

#: The same id under the name session tools read (``nxgate-session``, menus):
#: NXGATE_SESSION is the marker the gateway hunts leftovers by.
SESSION_ID_VARIABLE = "NXGATE_SESSION_ID"


def tagged_processes(session_id: str, uid: int) -> list[ProcessId]:
    """The live processes of ``uid`` that carry ``session_id`` as their
    :data:`SESSION_MARKER`: daemons a session started (gpg-agent, dbus)
    that left its process group and session with setsid and double forks.

    /proc/PID/environ is the environment the process was started with;
    only a program started with a cleaned environment (``env -i``, su,
    sudo) loses the marker.  Other users' and root's processes are never
    listed, whatever their environment says."""
    needle = f"\0{SESSION_MARKER}={session_id}\0".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            if _uids(pid) != {uid}:
                continue  # not the user's, or setuid to someone else
            with open(f"/proc/{pid}/environ", "rb") as handle:
                environ = b"\0" + handle.read()
        except OSError:
            continue  # ended meanwhile (a /proc race), routine in a scan
        if needle in environ:
            process = ProcessId.of(pid)
            if process is not None:
                found.append(process)
    return found


def _uids(pid: int) -> set[int]:
    """Real, effective, saved and filesystem uid of ``pid`` (from status:
    the owner of /proc/PID is root for a non-dumpable process such as
    ssh-agent)."""
    with open(f"/proc/{pid}/status", "rb") as handle:
        for line in handle:
            if line.startswith(b"Uid:"):
                return {int(field) for field in line.split()[1:]}
    return set()


@implementer(IReadDescriptor)
class ExitWatch:
    """Calls ``on_exit`` once when the process ends (pidfd readable)."""

    def __init__(self, reactor: Any, process: ProcessId, on_exit: Callable[[], None]) -> None:
        self.reactor = reactor
        self.process = process
        self.on_exit = on_exit
        self.fd = -1
        try:
            self.fd = os.pidfd_open(process.pid)
        except ProcessLookupError:
            pass
        if self.fd >= 0 and process.alive():
            reactor.addReader(self)
        else:
            self._close()
            reactor.callLater(0, on_exit)

    def fileno(self) -> int:
        return self.fd

    def doRead(self) -> None:
        self.stop()
        self.on_exit()

    def stop(self) -> None:
        if self.fd >= 0:
            self.reactor.removeReader(self)
        self._close()

    def _close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def connectionLost(self, reason: Any) -> None:
        self.stop()

    def logPrefix(self) -> str:
        return f"pidfd-{self.process.pid}"


def exited(reactor: Any, process: ProcessId, timeout: float) -> defer.Deferred[bool]:
    """Fires True when ``process`` has ended (its pidfd, no polling), False
    if it still runs after ``timeout`` seconds."""
    done: defer.Deferred[bool] = defer.Deferred()
    watch = ExitWatch(reactor, process, lambda: done.called or done.callback(True))
    timer = reactor.callLater(timeout, lambda: done.called or done.callback(False))

    def settled(result: bool) -> bool:
        watch.stop()
        if timer.active():
            timer.cancel()
        return result

    return done.addBoth(settled)


def listening_inodes(port: int) -> set[int]:
    """The socket inodes listening on TCP ``port`` (any address, v4 or v6)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as handle:
                next(handle)
                for line in handle:
                    fields = line.split()
                    if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(int(fields[9]))
        except (OSError, StopIteration, ValueError, IndexError):
            continue  # no IPv6 (no tcp6 table), or a line changing under us: the other table still counts
    return inodes


def listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds the socket listening on ``port``.

    Between a suspend and a resume an agent's port is closed; a local user
    could take it and catch the next client's stream (and its cookie).  The
    gateway relays only to a port the session's own agent holds."""
    inodes = listening_inodes(port)
    if not inodes:
        return False
    try:
        descriptors = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False  # the agent ended meanwhile: then it holds no port
    for fd in descriptors:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # the descriptor closed meanwhile (a /proc race)
        if target.startswith("socket:[") and int(target[8:-1]) in inodes:
            return True
    return False
