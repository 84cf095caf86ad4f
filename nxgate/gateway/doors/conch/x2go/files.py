"""Files X2Go clients push, confined to the user's ``~/.x2go`` (blocking: run in a thread).

python-x2go writes its PulseAudio cookie (and the sshfs key) over SFTP and
aborts a session start when it cannot.  The gateway runs as root, so every
step is taken the careful way: the path is checked as text first (below
``~/.x2go``, no ``..``, plain names), then walked from the home directory
with ``openat(…, O_NOFOLLOW)`` so that no symbolic link is ever followed,
each directory must belong to the user, a new directory or file is handed
to the user (0700/0600), and an existing file is written only if it is the
user's own with a single link (no hard link to someone else's file).
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass

_PART = re.compile(r"[A-Za-z0-9._@+-]{1,128}")
MAX_FILE_BYTES = 64 * 1024
MAX_DEPTH = 4


class PathRefused(ValueError):
    pass


@dataclass(frozen=True)
class Owner:
    uid: int
    gid: int
    home: str


def parts(path: str, home: str) -> list[str]:
    """The components below the home directory of ``path`` (absolute or
    relative to home), which must start with ``.x2go``."""
    if len(path) > 512:
        raise PathRefused("a path that long")
    base = home.rstrip("/") + "/"
    if path.startswith("/"):
        if not path.startswith(base):
            raise PathRefused("outside the home directory")
        path = path[len(base):]
    names = [name for name in path.split("/") if name not in ("", ".")]
    if not names or names[0] != ".x2go" or len(names) < 2 or len(names) > MAX_DEPTH + 1:
        raise PathRefused("outside ~/.x2go")
    for name in names:
        if name == ".." or not _PART.fullmatch(name):
            raise PathRefused(f"the name {name[:40]!r}")
    return names


def _open_dir(parent: int, name: str, owner: Owner, create: bool) -> int:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
    except FileNotFoundError:
        if not create:
            raise
        os.mkdir(name, 0o700, dir_fd=parent)
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
        os.fchown(fd, owner.uid, owner.gid)
    except OSError as error:
        raise PathRefused(f"{name}: {error.strerror}") from None
    if os.fstat(fd).st_uid != owner.uid:
        os.close(fd)
        raise PathRefused(f"{name} is not the user's")
    return fd


def _walk(names: list[str], owner: Owner, create: bool) -> int:
    """A descriptor of the directory that holds the last of ``names``."""
    fd = os.open(owner.home, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        if os.fstat(fd).st_uid != owner.uid:
            raise PathRefused("the home directory is not the user's")
        for name in names[:-1]:
            child = _open_dir(fd, name, owner, create)
            os.close(fd)
            fd = child
        return os.dup(fd)
    finally:
        os.close(fd)


def open_for_writing(path: str, owner: Owner) -> int:
    """A write descriptor of the user's file ``path`` (created 0600, emptied)."""
    names = parts(path, owner.home)
    directory = _walk(names, owner, create=True)
    try:
        fd = os.open(names[-1], os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600, dir_fd=directory)
    except OSError as error:
        raise PathRefused(f"{names[-1]}: {error.strerror}") from None
    finally:
        os.close(directory)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1 or info.st_uid not in (owner.uid, 0):
        os.close(fd)
        raise PathRefused(f"{names[-1]} is not a plain file of the user's")
    os.fchown(fd, owner.uid, owner.gid)
    os.fchmod(fd, 0o600)
    os.ftruncate(fd, 0)
    return fd


def remove(path: str, owner: Owner) -> None:
    names = parts(path, owner.home)
    directory = _walk(names, owner, create=False)
    try:
        os.unlink(names[-1], dir_fd=directory)
    except OSError as error:
        raise PathRefused(f"{names[-1]}: {error.strerror}") from None
    finally:
        os.close(directory)


def size_of(path: str, owner: Owner) -> int:
    names = parts(path, owner.home)
    directory = _walk(names, owner, create=False)
    try:
        info = os.stat(names[-1], dir_fd=directory, follow_symlinks=False)
    except OSError as error:
        raise PathRefused(f"{names[-1]}: {error.strerror}") from None
    finally:
        os.close(directory)
    if not stat.S_ISREG(info.st_mode):
        raise PathRefused("not a plain file")
    return info.st_size
