"""Jailed sessions: which sessions run in namespaces of their own, and the
bubblewrap command line that puts an agent there (pure: no I/O).

The agent runs as ``bwrap [mounts] -- nxagent ...`` with new mount, PID and
IPC namespaces; the session program later joins those same namespaces
(:mod:`nxgate.node.runas`, ``join``), so the whole session shares one
private ``/tmp``, one ``/proc`` and one System V IPC space (MIT-SHM between
the X clients and nxagent keeps working).  The network namespace stays the
host's: unencrypted sessions listen on TCP, and programs need the network.
X clients on Linux also reach a display through its *abstract* socket,
which lives in the network namespace: every agent runs with ``-nolisten
local``, so a jailed display is only reachable through the socket in the
jail's own ``/tmp/.X11-unix``.  The abstract *name* must still be taken,
or anyone on the host could bind it and catch the session's X clients
(libxcb tries it before the path): the gateway holds it
(:mod:`nxgate.node.displays`) and hands its socket through bubblewrap to
nxagent, which keeps it as fd 3 for its lifetime.  X clients the gateway
itself runs for a jailed session (thumbnails) join its namespaces; a
shadow would run on the host, so jailed sessions are not shadowed.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Protocol

class JailSettings(Protocol):
    enabled: bool
    groups: tuple[str, ...]
    types: tuple[str, ...]
    bwrap: str


def applies(settings: JailSettings, session_type: str, user_groups: Iterable[str], shadow: bool) -> bool:
    """Whether a session of ``session_type`` whose user is in ``user_groups``
    runs jailed.  Only desktops and applications (``unix-*``) are jailed: a
    shadow agent must reach the watched display, which a jail would hide."""
    if not settings.enabled or shadow or not session_type.startswith("unix-"):
        return False
    if settings.types and session_type not in settings.types:
        return False
    return not settings.groups or bool(set(settings.groups) & set(user_groups))


#: The fd on which bubblewrap reads its own options (``--args``), so that
#: they -- the session directory, with the session's id -- stay out of its
#: argv, which every local user can read in ``ps``.
ARGS_FD = 4


def bwrap_options(*, home: str, session_dir: str, runtime_dir: str) -> list[str]:
    """bubblewrap's options: the jail's namespaces and mounts.

    The whole system is bound read-only, then what must differ is laid over
    it: a fresh ``/dev`` and ``/proc`` (of the new PID namespace: only the
    session's processes), empty tmpfs on ``/tmp``, ``/var/tmp`` and
    ``/home`` with only the user's home bound back (writable), the
    sessions directory emptied but for this session's own (the agent's
    socket, options and X authority, which the gateway reaches from
    outside), and the user's ``runtime_dir`` (``/run/user/UID``) if PAM
    made one by the time bubblewrap runs."""
    sessions = os.path.dirname(os.path.normpath(session_dir))
    return [
        "--unshare-pid", "--unshare-ipc",
        "--ro-bind", "/", "/",
        "--dev", "/dev",
        "--proc", "/proc",
        "--perms", "1777", "--tmpfs", "/tmp",
        "--perms", "1777", "--dir", "/tmp/.X11-unix",
        "--perms", "1777", "--tmpfs", "/var/tmp",
        "--tmpfs", "/home",
        "--tmpfs", sessions,
        "--bind", session_dir, session_dir,
        "--bind", home, home,
        "--bind-try", runtime_dir, runtime_dir,
        "--chdir", session_dir,
    ]


def user_command(*, uid: int, gid: int, command: list[str], setpriv: str = "setpriv") -> list[str]:
    """``command`` as the user, for good: bubblewrap runs as root, without a
    user namespace (nxagent insists that ``/tmp/.X11-unix`` is root's, which
    in a user namespace it never is).  Inside, ``setpriv`` becomes the user
    (uid, gid, her groups) with ``no_new_privs``, so no setuid program (su,
    sudo) works in a jail."""
    return [setpriv, f"--reuid={uid}", f"--regid={gid}", "--init-groups", "--no-new-privs", "--", *command]


def bwrap_argv(bwrap: str, *, uid: int, gid: int, home: str, session_dir: str, runtime_dir: str,
               command: list[str], setpriv: str = "setpriv") -> list[str]:
    """``command`` wrapped in bubblewrap, all in argv (see :func:`hidden_bwrap_argv`)."""
    return [bwrap, *bwrap_options(home=home, session_dir=session_dir, runtime_dir=runtime_dir), "--",
            *user_command(uid=uid, gid=gid, command=command, setpriv=setpriv)]


def hidden_bwrap_argv(bwrap: str, *, uid: int, gid: int, home: str, session_dir: str, runtime_dir: str,
                      command: list[str], setpriv: str = "setpriv") -> tuple[list[str], list[str]]:
    """``(argv, options)``: bubblewrap's argv names :data:`ARGS_FD`, on which
    the launcher hands it ``options`` (NUL-separated).  bubblewrap reads
    only options there, not the command, so argv keeps ``setpriv`` and the
    agent's command line (which names no session, see
    :func:`nxgate.node.agents.nxagent.agent_argv`)."""
    options = bwrap_options(home=home, session_dir=session_dir, runtime_dir=runtime_dir)
    return ([bwrap, "--args", str(ARGS_FD), "--", *user_command(uid=uid, gid=gid, command=command, setpriv=setpriv)],
            options)
