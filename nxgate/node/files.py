"""Session files on disk: the state directory layout, safe writes into
user-owned directories, bounded reads of files users may have replaced.

The gateway runs as root and writes into directories that belong to the
session's user.  Every such write creates a fresh file (``O_EXCL``, no
symlinks followed) and renames it into place, so a user who swaps a file
for a symlink cannot make root write elsewhere.  Likewise root changes
the owner and mode of what it makes there only through a descriptor
opened without following links (``fchown``/``fchmod``), and reaches paths
below a user's directory one name at a time from a directory of its own
(:func:`open_parent_beneath`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from dataclasses import dataclass
from typing import Any

from twisted.logger import Logger

from nxgate.node.agents.nxagent import MAX_SOCKET_PATH, AgentFiles

log = Logger()



@dataclass(frozen=True)
class StateLayout:
    """Where the gateway keeps things under ``--state-dir``.

    The state directory is 0711: users' agents must reach their own session
    directory (whose random name they know) but may not list the others.
    """

    root: str

    @property
    def hostkeys(self) -> str:
        return os.path.join(self.root, "hostkeys")

    @property
    def database(self) -> str:
        return os.path.join(self.root, "nxgate.sqlite")

    @property
    def logs(self) -> str:
        return os.path.join(self.root, "logs")

    @property
    def sessions(self) -> str:
        return os.path.join(self.root, "sessions")

    @property
    def reverse(self) -> str:
        """The Unix sockets of sessions' reverse listeners (:mod:`nxgate.node.reverse`)."""
        return os.path.join(self.root, "reverse")

    def prepare(self) -> None:
        socket_path = self.agent_files("0" * 32).socket
        if len(socket_path.encode()) > MAX_SOCKET_PATH:
            raise RuntimeError(f"state directory {self.root} is too long: agents' sockets ({socket_path}) may "
                               f"have at most {MAX_SOCKET_PATH} bytes; choose a shorter state_dir")
        for path, mode in ((self.root, 0o711), (self.logs, 0o700), (self.sessions, 0o711), (self.reverse, 0o711)):
            os.makedirs(path, mode=mode, exist_ok=True)
            st = os.lstat(path)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
                raise RuntimeError(f"{path} must be a directory owned by the gateway's user")
            if stat.S_IMODE(st.st_mode) != mode:
                os.chmod(path, mode)
        # A reverse listener lives as long as its route, which ends with this
        # process: what is left there is a killed gateway's.
        for name in os.listdir(self.reverse):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.reverse, name))

    def agent_files(self, session_id: str) -> AgentFiles:
        return AgentFiles(
            directory=os.path.join(self.sessions, session_id),
            log=os.path.join(self.logs, f"{session_id}.agent.log"),
            app_log=os.path.join(self.logs, f"{session_id}.session.log"),
        )


DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def make_session_dir(path: str, uid: int, gid: int) -> None:
    """A fresh directory owned by the user, mode 0700 (``FileExistsError``
    if there is one already).

    The parent may be the user's (printing's ``cups/`` and the browser
    viewer's ``nx/`` are made in session directories): between ``mkdir``
    and the ``chown``/``chmod`` the user could rename the new directory
    and put a symlink in its place, and a path-based ``chmod`` would then
    change the link's target (say, take the setuid bit off a program).  So
    the directory is made and opened through the parent's descriptor, with
    no link followed, checked to be root's (the one just made: a user
    cannot make a root-owned directory), and changed through its own
    descriptor."""
    parent, name = os.path.split(path)
    parent_fd = os.open(parent or ".", DIRECTORY_FLAGS)
    try:
        os.mkdir(name, 0o700, dir_fd=parent_fd)
        fd = os.open(name, DIRECTORY_FLAGS, dir_fd=parent_fd)
        try:
            if os.fstat(fd).st_uid != os.geteuid():
                raise OSError(errno.EPERM, "replaced by another directory while being made", path)
            os.fchown(fd, uid, gid)
            os.fchmod(fd, 0o700)
        finally:
            os.close(fd)
    finally:
        os.close(parent_fd)


def open_parent_beneath(trusted: str, path: str) -> tuple[int, str]:
    """``(descriptor, name)``: an ``O_PATH`` descriptor of the directory
    that holds ``path``, and ``path``'s last name, for calls that take a
    path (``umount2`` through ``/proc/self/fd/N/name``, ``*at`` calls).

    ``trusted`` is a directory no user can change (the state's
    ``sessions/``); every name between it and ``path`` is looked up from
    its parent's descriptor without following links, so a user who turns
    one of their directories into a symlink gets ``ELOOP``/``ENOTDIR``, not
    root acting elsewhere.  The caller closes the descriptor."""
    relative = os.path.relpath(os.path.normpath(path), os.path.normpath(trusted))
    parts = relative.split(os.sep)
    if relative in (".", "") or any(part in ("", ".", "..") for part in parts):
        raise OSError(errno.EXDEV, f"not below {trusted}", path)
    fd = os.open(trusted, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            following = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = following
    except BaseException:
        os.close(fd)
        raise
    return fd, parts[-1]


def write_user_file(path: str, data: bytes, uid: int, gid: int, mode: int = 0o600) -> None:
    """Atomically replace ``path`` (in a user-owned directory) with ``data``."""
    directory, name = os.path.split(path)
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        temporary = f".{name}.{os.getpid()}.tmp"
        try:
            os.unlink(temporary, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=dir_fd)
        try:
            os.fchown(fd, uid, gid)
            os.fchmod(fd, mode)
            os.write(fd, data)
        finally:
            os.close(fd)
        os.rename(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


def remove_in_dir(directory: str, *names: str) -> None:
    """Unlink ``names`` in a user's ``directory`` (reached without following
    a link; unlink never follows one), those that are there; a directory
    that is gone, or a link in its place, is left alone."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        for name in names:
            try:
                os.unlink(name, dir_fd=fd)
            except FileNotFoundError:
                pass
    finally:
        os.close(fd)


def names_in_dir(directory: str, limit: int) -> list[str]:
    """At most ``limit`` names in a user's ``directory`` (reached without
    following a link: a link or nothing in its place gives none), so that a
    directory the user filled costs no more than ``limit`` entries."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        with os.scandir(fd) as entries:
            return [entry.name for _, entry in zip(range(limit), entries)]
    finally:
        os.close(fd)


def remove_tree(path: str) -> None:
    """Remove a session directory without following links inside it.

    The user can fill the directory (millions of files), so this may take
    long: callers on the reactor run it through their ``blocking`` (a
    thread); it is thread-safe, and what it cannot remove is logged, not
    raised."""

    def failed(function: Any, name: str, error: Any) -> None:
        exc = error[1] if isinstance(error, tuple) else error
        if isinstance(exc, FileNotFoundError):
            return  # gone already, or removed meanwhile
        log.warn("cannot remove {path} ({error}) while removing {top}", path=name, error=str(exc), top=path)

    shutil.rmtree(path, onerror=failed)


def read_regular_file(path: str, limit: int, owners: tuple[int, ...] | None = None) -> bytes | None:
    """At most ``limit`` bytes of ``path`` if it is a regular file, else None.

    For files in places a user controls (a home directory, /tmp): a FIFO
    planted there must not block the gateway (``O_NONBLOCK``; its opening
    then succeeds and ``S_ISREG`` refuses it), a link must not make root
    read elsewhere (``O_NOFOLLOW``), and a huge file costs at most
    ``limit`` bytes.  ``owners``: the uids the file may belong to.  Why a
    file is refused goes to the debug log (a missing one says nothing)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError:
        return None
    except OSError as error:
        log.debug("cannot read {path}: {error}", path=path, error=str(error))
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            log.debug("not reading {path}: not a regular file", path=path)
            return None
        if owners is not None and st.st_uid not in owners:
            log.debug("not reading {path}: it belongs to uid {uid}", path=path, uid=st.st_uid)
            return None
        chunks: list[bytes] = []
        left = limit
        while left > 0:
            chunk = os.read(fd, min(left, 65536))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError as error:
        log.debug("cannot read {path}: {error}", path=path, error=str(error))
        return None
    finally:
        os.close(fd)
