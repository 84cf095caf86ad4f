"""One gateway per state directory, and clear words when a place is taken.

A second ``twistd nxgate`` started by mistake must not disturb the running
one: it used to fail on the busy port and, on its way out, remove the live
gateway's ``admin.sock`` and ``shell.sock``.  So, before touching anything,
the gateway takes an exclusive lock on a file in its state directory and
keeps it for its whole life; its Unix sockets are replaced only when nobody
answers on them; and a busy TCP port is found before twistd starts, so that
each of these ends in one line on stderr and a non-zero exit, not a
traceback.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import stat

LOCK_NAME = "nxgate.lock"


class StartupError(Exception):
    """The gateway cannot start; the message is the one line the admin reads."""


def lock_state_dir(state_dir: str) -> int:
    """Lock ``state_dir`` for this process; returns the fd to keep open.

    ``flock`` rather than ``lockf``: its lock belongs to the open file, so
    it survives twistd's fork into the background, and the kernel drops it
    when the process dies however it dies (no stale lock to clean up).
    """
    path = os.path.join(state_dir, LOCK_NAME)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_pid(fd)
        os.close(fd)
        who = f"another nxgate (pid {holder})" if holder else "another nxgate"
        raise StartupError(f"{who} is already running with the state directory {state_dir}; "
                           "stop it first, or give this one its own state directory "
                           "([server] state_dir or --state-dir)") from None
    record_pid(fd)
    return fd


def record_pid(fd: int) -> None:
    """Write our pid into the lock file (again after twistd has forked)."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)


def _read_pid(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).decode().strip())
    except (OSError, ValueError):
        return None


def claim_unix_socket(path: str, setting: str) -> None:
    """Make ``path`` free for our listening socket, or say why it cannot be.

    A socket nobody answers on is left over from a gateway that died, and is
    removed; one that answers belongs to a live process and is left alone;
    anything that is not a socket is never deleted.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise StartupError(f"{path} exists and is not a socket; remove it or choose another path ({setting})")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2)
    try:
        probe.connect(path)
    except OSError as error:
        if error.errno not in (errno.ECONNREFUSED, errno.ENOENT):
            raise StartupError(f"cannot tell whether {path} is in use ({error.strerror}); "
                               f"check it, or choose another path ({setting})") from None
    else:
        raise StartupError(f"{path} is in use by another running process; stop it first, "
                           f"or choose another path ({setting})")
    finally:
        probe.close()
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def tcp_address(description: str) -> tuple[int, str, int] | None:
    """(address family, interface, port) of a ``tcp:``/``tcp6:`` endpoint
    string with a fixed port, else None (other endpoints are not checked).

    Follows Twisted's syntax: ``tcp:PORT[:BACKLOG[:INTERFACE]]`` with
    ``key=value`` arguments allowed, ``\\:`` an escaped colon.
    """
    parts, current, escaped = [], "", False
    for char in description:
        if escaped:
            current, escaped = current + char, False
        elif char == "\\":
            escaped = True
        elif char == ":":
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    kind = parts[0].strip().lower()
    if kind not in ("tcp", "tcp6"):
        return None
    positional = [part for part in parts[1:] if "=" not in part]
    keywords = dict(part.split("=", 1) for part in parts[1:] if "=" in part)
    port_text = keywords.get("port", positional[0] if positional else "")
    interface = keywords.get("interface", positional[2] if len(positional) > 2 else "")
    try:
        port = int(port_text)
    except ValueError:
        return None
    if port == 0:
        return None
    family = socket.AF_INET6 if kind == "tcp6" else socket.AF_INET
    return family, interface or ("::" if family == socket.AF_INET6 else "0.0.0.0"), port


def check_port_free(description: str, setting: str) -> None:
    """Raise :class:`StartupError` naming the port when it is taken.

    Bound the way Twisted binds a listening port (``SO_REUSEADDR``), so a
    port held only by connections in TIME_WAIT counts as free.
    """
    address = tcp_address(description)
    if address is None:
        return
    family, interface, port = address
    probe = socket.socket(family, socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((interface, port))
    except OSError as error:
        if error.errno == errno.EADDRINUSE:
            raise StartupError(f"port {port} on {interface} is already in use; stop what listens there, "
                               f"or choose another port ({setting})") from None
        if error.errno == errno.EACCES:
            raise StartupError(f"no permission to listen on port {port}; run as root, "
                               f"or choose a port above 1023 ({setting})") from None
        raise StartupError(f"cannot listen on {interface} port {port}: {error.strerror} ({setting})") from None
    finally:
        probe.close()
