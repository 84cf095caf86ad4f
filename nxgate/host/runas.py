"""Start one session process as its user: ``python -m nxgate.host.runas``.

The gateway (root) runs this small program for every nxagent and session
application instead of forking itself: a fork of a threaded Twisted process
must not run PAM, and the work below needs a process of its own anyway.
It reads a JSON request on stdin (never argv: nothing here may show up in
``ps``), then

1. opens the log file (in a root-only directory) that becomes stdout/stderr,
2. opens a PAM session for the user if asked (limits, environment, logind),
3. switches to the user's uid, gid and supplementary groups for good,
4. starts a new session (``setsid``) so the process outlives the gateway and
   ignores signals meant for it, sets umask 077, and
5. says ``ok`` on stdout and ``exec``s the program with the given argv.

``as_root`` skips step 3: the program is bubblewrap, which needs root to
build a jail and becomes the user in it (``setpriv``, see
:mod:`nxgate.node.agents.jail`).  ``cgroup`` is a ``cgroup.procs`` file we
join first (the session's resource limits).  ``stdin`` in the request is a
secret the program reads on stdin (a remote desktop's password); with
``status_fd`` the program gets our stdout, the pipe to the gateway, as fd 3
for a status line of its own.

The gateway sees ``ok`` (or an error line) and then the pid is the
program's.  With ``join`` (``[pid, start time]`` of a jailed agent) the
program enters that agent's mount, PID and IPC namespaces first; a new PID
namespace only takes the children of who enters it, so the program is then
a forked child, and the line says its pid: ``ok PID``.  A program that
joins a jail also gets ``no_new_privs`` (as the jailed agent has from
``setpriv``): no setuid program raises its rights inside a jail.

Three options serve the X clients the gateway itself runs for a session
(thumbnails, :mod:`nxgate.node.thumbnails`): ``no_network`` puts the
program in a new, empty network namespace, so that an X client reaches
the display by its *path* socket only (libxcb tries the abstract socket
``@/tmp/.X11-unix/XN`` first and then TCP 6000+N, both of which any local
user can bind); ``pipe_stdout`` leaves the program's stdout on the pipe
to the caller (after our ``ok`` line) instead of the log.
``abstract_holder`` says that the gateway handed us, on fd 3 (a socket
of the launcher, SCM_RIGHTS), its socket on the display's abstract X name
(bound, never listening; see :mod:`nxgate.node.displays`): the program
keeps it as fd 3 (a jail's bubblewrap passes it on to nxagent), so the name
stays taken for as long as the agent lives, and nobody else can bind it and
catch the X clients of the session (they get "connection refused" there
and use the path socket).  ``args_fd``
(``[fd, [arg, ...]]``) gives the program those arguments NUL-separated on
a pipe at ``fd`` (bubblewrap's ``--args``: out of ``ps``).
``{"mode": "close-pam", ...}`` closes a PAM session instead.

With ``--spare`` it is started before there is a request (see
:mod:`nxgate.host.launcher`): it loads libpam, then waits for one, and
ends quietly if its stdin closes without one.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import pwd
import shutil
import signal
import socket
import sys
from typing import Any

from nxgate.host import pamlib

MAX_REQUEST = 1 << 20
#: Where the gateway hands us a descriptor (nxgate.host.launcher): closed once read.
HANDOVER_FD = 3


def _fail(message: str) -> None:
    sys.stdout.write("error: " + message.replace("\n", " ") + "\n")
    sys.stdout.flush()
    os._exit(1)


def _drop_privileges(user: pwd.struct_passwd) -> None:
    os.initgroups(user.pw_name, user.pw_gid)
    os.setresgid(user.pw_gid, user.pw_gid, user.pw_gid)
    os.setresuid(user.pw_uid, user.pw_uid, user.pw_uid)
    if user.pw_uid != 0:
        try:
            os.setuid(0)
        except PermissionError:
            return
        _fail("could not give up root")


CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
PR_SET_NO_NEW_PRIVS = 38


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _no_new_privs() -> None:
    if _libc().prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        _fail(f"cannot set no_new_privs: {os.strerror(ctypes.get_errno())}")


def _no_network() -> None:
    """A new network namespace of our own: no abstract socket, no TCP port of anyone else."""
    if _libc().unshare(CLONE_NEWNET) != 0:
        _fail(f"cannot make an empty network namespace: {os.strerror(ctypes.get_errno())}")


def _handed_over() -> int:
    """The descriptor the gateway handed us on fd 3 (SCM_RIGHTS)."""
    handover = socket.socket(fileno=os.dup(HANDOVER_FD))
    try:
        handover.settimeout(10)
        _data, fds, _flags, _address = socket.recv_fds(handover, 1, 1)
    finally:
        handover.close()
    if not fds:
        _fail("the gateway handed over no descriptor")
    return fds[0]


def _join(pid: int, started: int) -> None:
    """Enter the mount, PID and IPC namespaces of ``pid`` (as root, before
    the privileges go), if it still is the process that started at
    ``started`` (a pidfd holds it while we check)."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError as error:
        _fail(f"the jailed agent {pid} is gone: {error}")
    with open(f"/proc/{pid}/stat", "rb") as handle:
        stat = handle.read()
    if int(stat[stat.rindex(b")") + 2:].split()[19]) != started:
        _fail(f"the jailed agent {pid} is gone")
    libc = _libc()
    if libc.setns(pidfd, CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC) != 0:
        error = ctypes.get_errno()
        _fail(f"cannot enter the jail of {pid}: {os.strerror(error)}")
    os.close(pidfd)


def _fork_into_jail() -> None:
    """Fork the child that lives in the joined PID namespace; this parent
    reports its pid and ends (the child is reparented to the jail's init).
    The child waits for that report so that its own first line on fd 3
    comes after it."""
    ready, go = os.pipe()
    child = os.fork()
    if child:
        os.close(ready)
        sys.stdout.write(f"ok {child}\n")
        sys.stdout.flush()
        os.write(go, b"x")
        os._exit(0)
    os.close(go)
    os.read(ready, 1)
    os.close(ready)


def execute(request: dict[str, Any]) -> None:
    user = pwd.getpwnam(request["user"])
    log_fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    env: dict[str, str] = dict(request.get("env", {}))
    pam = request.get("pam")
    if pam:
        try:
            session = pamlib.open_session(pam["service"], user.pw_name, pam.get("rhost"), pam.get("tty"))
        except OSError as error:
            _fail(f"PAM session refused: {error}")
        env.update(session.environment())
        # The session stays open; the gateway closes it when the session ends.
        session.end(pamlib.PAM_DATA_SILENT)
    env.update(request.get("env_fixed", {}))
    join = request.get("join")
    if join:
        _join(int(join[0]), int(join[1]))
    if request.get("no_network"):
        _no_network()
    holder = _handed_over() if request.get("abstract_holder") else None
    argv = [str(arg) for arg in request["argv"]]
    executable = shutil.which(argv[0], path=env.get("PATH", os.defpath))
    if executable is None:
        _fail(f"program not found: {argv[0]}")
    cgroup = request.get("cgroup")
    if cgroup:
        # The session's cgroup (resource limits): whatever runs next is in it.
        with open(cgroup, "w") as handle:
            handle.write(str(os.getpid()))
    if join:
        _fork_into_jail()
    if not request.get("as_root"):
        _drop_privileges(user)
    if join:
        _no_new_privs()
    os.setsid()
    os.umask(int(request.get("umask", 0o077)))
    try:
        os.chdir(request.get("cwd") or user.pw_dir)
    except OSError:
        os.chdir("/")
    if not join:
        sys.stdout.write("ok\n")
        sys.stdout.flush()
    # Python ignores SIGPIPE and SIGXFSZ; exec keeps ignored signals ignored.
    for signum in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    os.dup2(_stdin(request.get("stdin")), 0)
    # Out of the way of the fds shuffled into place below.
    log_fd = fcntl.fcntl(log_fd, fcntl.F_DUPFD, 10)
    holder = fcntl.fcntl(holder, fcntl.F_DUPFD, 10) if holder is not None else None
    args_fd = request.get("args_fd")
    args = fcntl.fcntl(_args_pipe([str(arg) for arg in args_fd[1]]), fcntl.F_DUPFD, 10) if args_fd else None
    if request.get("status_fd"):
        # The program reports on fd 3, which is our stdout: the gateway reads it.
        os.dup2(1, 3)
        os.set_inheritable(3, True)
    elif holder is not None:
        os.dup2(holder, 3)  # inheritable: bubblewrap passes it on to the jail
        os.set_inheritable(3, True)
    keep = {3} if request.get("status_fd") or holder is not None else set()
    if args is not None:
        at = int(args_fd[0])
        if not 3 <= at < 10 or at in keep:
            _fail(f"args_fd {at} is taken")
        os.dup2(args, at)
        keep.add(at)
    if not request.get("pipe_stdout"):
        os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    for fd in set(range(3, 10)) - keep:
        with contextlib.suppress(OSError):
            os.close(fd)
    os.closerange(10, max(os.sysconf("SC_OPEN_MAX"), 1024))
    try:
        os.execve(executable, argv, env)
    except OSError as error:
        os.write(2, f"nxgate launcher: cannot execute {executable}: {error}\n".encode())
        os._exit(127)


def _pipe_holding(data: bytes, what: str) -> int:
    """The read end of a pipe that already holds all of ``data`` (refused
    past 64 KiB, a pipe's buffer: the write then cannot block)."""
    if len(data) >= 65536:
        _fail(f"{what} too long")
    read_end, write_end = os.pipe()
    os.write(write_end, data)
    os.close(write_end)
    return read_end


def _args_pipe(args: list[str]) -> int:
    """A pipe holding ``args`` NUL-separated (bubblewrap's ``--args FD``)."""
    return _pipe_holding(b"".join(arg.encode("utf-8", "surrogateescape") + b"\0" for arg in args), "arguments")


def _stdin(secret: str | None) -> int:
    """The program's stdin: /dev/null, or a pipe holding ``secret`` (a
    password never goes into argv or the environment)."""
    if secret is None:
        return os.open(os.devnull, os.O_RDONLY)
    return _pipe_holding(secret.encode("utf-8", "surrogateescape"), "secret")


def close_pam(request: dict[str, Any]) -> None:
    pam = request["pam"]
    code, message = pamlib.close_session(pam["service"], request["user"], pam.get("rhost"), pam.get("tty"))
    sys.stdout.write(("ok\n" if code == pamlib.PAM_SUCCESS else f"error: {message} ({code})\n"))
    sys.stdout.flush()


def main() -> None:
    if os.geteuid() != 0:
        _fail("the launcher must run as root")
    spare = "--spare" in sys.argv[1:]
    if spare:
        # Started ahead of its request (nxgate.host.launcher): what every
        # start needs is loaded now, off the path of the start that uses us.
        with contextlib.suppress(OSError, AttributeError):
            pamlib.library()
    try:
        data = sys.stdin.buffer.read(MAX_REQUEST)
        if spare and not data:
            os._exit(0)  # the gateway went (or needs no spare): nothing to do
        request = json.loads(data)
        if request.get("mode") == "close-pam":
            close_pam(request)
        else:
            execute(request)
    except (KeyError, ValueError, TypeError, OSError) as error:
        _fail(f"{type(error).__name__}: {error}")


if __name__ == "__main__":
    main()
