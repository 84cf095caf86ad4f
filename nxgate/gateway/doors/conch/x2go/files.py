"""Files X2Go clients push, confined to the user's ``~/.x2go`` (blocking: run in a thread).

python-x2go writes its PulseAudio cookie (and the sshfs key) over SFTP and
aborts a session start when it cannot; x2goclient copies them with scp.
Every step is taken the careful way: the path is checked as text first
(below ``~/.x2go``, no ``..``, plain names), then walked from the home
directory with ``openat(…, O_NOFOLLOW)`` so that no symbolic link is ever
followed, each directory must belong to the user, a new directory or file
is the user's (0700/0600), and an existing file is written only if it is
the user's own with a single link (no hard link to someone else's file).

The writing itself runs **as the user**, in a small process of its own
(:func:`write_as_user` runs this module): the user's disk quota and
permissions apply, and root never creates anything in a user's directory.
The uid, gid and groups are switched by :mod:`subprocess` in the child
before it executes the program (not in a thread of the gateway: a
threaded process cannot change its credentials for one thread safely);
it needs no PAM session, so the session launcher
(:mod:`nxgate.node.runas`) is not involved.  Stat and unlink stay root's
(nothing is created; the walk is the same).
"""

from __future__ import annotations

import os
import pwd
import re
import stat
import subprocess
import sys
from dataclasses import dataclass

_PART = re.compile(r"[A-Za-z0-9._@+-]{1,128}")
MAX_FILE_BYTES = 64 * 1024
MAX_DEPTH = 4


class PathRefused(ValueError):
    pass


#: Seconds the writer process may take (it writes at most 64 KiB).
WRITER_TIMEOUT = 30.0
#: Descriptors the gateway holds while a writer runs (its three pipes and
#: subprocess's exec-error pipe, both ends for a moment).
WRITER_FILES = 8


@dataclass(frozen=True)
class Owner:
    uid: int
    gid: int
    home: str
    user: str = ""


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


def write_file(path: str, data: bytes, owner: Owner) -> None:
    """Write ``data`` to the user's ``path`` (in the writer: as the user)."""
    fd = open_for_writing(path, owner)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except OSError as error:
        raise PathRefused(f"{parts(path, owner.home)[-1]}: {error.strerror}") from None
    finally:
        os.close(fd)


def write_as_user(path: str, data: bytes, owner: Owner) -> None:
    """Write ``data`` to ``path`` below the user's ``~/.x2go`` as the user
    (a process of this module with the user's uid, gid and groups); raises
    :class:`PathRefused` with the writer's reason."""
    parts(path, owner.home)  # refused before any process starts
    if len(data) > MAX_FILE_BYTES:
        raise PathRefused("file too large")
    name = owner.user or pwd.getpwuid(owner.uid).pw_name
    try:
        done = subprocess.run([sys.executable, "-m", __name__, owner.home, path], input=data,
                              capture_output=True, cwd="/", timeout=WRITER_TIMEOUT,
                              env={"PATH": os.defpath, "LANG": "C.UTF-8", "PYTHONPATH": os.pathsep.join(sys.path)},
                              user=owner.uid, group=owner.gid, extra_groups=os.getgrouplist(name, owner.gid))
    except subprocess.TimeoutExpired:
        raise PathRefused("the write as the user took too long") from None
    answer = done.stdout.decode("utf-8", "replace").strip()[:200]
    if done.returncode != 0 or answer != "ok":
        raise PathRefused(answer.removeprefix("error: ") or f"the write as the user failed ({done.returncode})")


def main(argv: list[str]) -> int:
    """The writer: ``python -m nxgate.gateway.doors.conch.x2go.files HOME PATH``
    with the data on stdin, run as the user; says ``ok`` or ``error: why``."""
    home, path = argv
    data = sys.stdin.buffer.read(MAX_FILE_BYTES + 1)
    try:
        if len(data) > MAX_FILE_BYTES:
            raise PathRefused("file too large")
        write_file(path, data, Owner(os.getuid(), os.getgid(), home))
    except (PathRefused, OSError) as error:
        print(f"error: {error}")
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
