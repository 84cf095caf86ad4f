"""Folder sharing (``--samba="1"`` and ``addmount``): the client's shared
folders appear in the session as ``~/MyShares/<name>``, through the NX smb
channel.

The client runs an SMB server for its folders (``nxgate-client --share``
starts a private Samba on a loopback port; NoMachine's clients use the
machine's own), and its ``nxproxy -S smb=PORT`` connects every channel
connection there; the agent's side of the channel listens on
127.0.0.1:3000+display (:mod:`nxgate.protocols.service_channels`).  Kernel CIFS mounts are not
available in containers and need root, so the session mounts the share with
a FUSE SMB client *as the user*: ``smbnetfs``, which shows a share as
``<mountpoint>/<host>:<port>/<share>``; ``~/MyShares/<name>`` is a symbolic
link to it (FUSE mounts are private to their user: another user, even root,
cannot enter them, and the link's target lies in the 0700 session
directory).

One smbnetfs per share, under ``<session dir>/shares/<key>/`` (its HOME,
with the ``.smb`` directory it insists on).  The share's password reaches it
only in its configuration file, written by the user (``dd`` reading it from
a pipe), 0600 in that private directory, removed as
soon as the share answered (smbnetfs keeps it in memory; it re-reads nothing
with ``config_update_period 0``): never argv, the environment, a log or the
store.  The mounts go when the session is suspended or ends, and at the
next start after a killed gateway (the life cycle stops the services of the
sessions it finds suspended or gone): unmounting is by path, from
``/proc/self/mountinfo``, so it needs nothing the dead gateway knew.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import pwd
from typing import Any

from twisted.internet import task
from twisted.logger import Logger

from nxgate.protocols import service_channels
from nxgate.host import files
from nxgate.node.services import Context

log = Logger()

#: The folder in the user's home where shares appear (FreeNX's ``$(SHARES)``).
SHARES_DIR = "MyShares"
#: How often and how long to try a fresh mount before giving up.
TRIES = 20
PAUSE = 0.5
RUN_TIMEOUT = 30.0
MNT_DETACH = 2
UMOUNT_NOFOLLOW = 8


def mount_key(share: str) -> str:
    """A directory name for one share's mount (the share name itself may
    hold any printable character)."""
    return hashlib.sha256(share.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def smbnetfs_config(username: str, password: str) -> str:
    """smbnetfs's configuration for one share: the credentials, no network
    browsing, no keyring, no re-reading (the file goes once mounted).
    The values were checked to hold no quote or backslash
    (:mod:`nxgate.protocols.nx.mounts`)."""
    return ("smb_query_browsers \"false\"\n"
            "use_libsecret \"false\"\n"
            "config_update_period 0\n"
            f"auth \"{username}\" \"{password}\"\n")

#: FUSE options of the mount: smbnetfs is a FUSE 2 program, whose kernel side
#: splits writes into 4 KiB requests unless asked; each became an SMB write
#: and a round trip (5.7 MB/s through the folder's own SSH channel).
MOUNT_OPTIONS = "big_writes,max_write=131072"

#: libsmbclient's own configuration, in smbnetfs's HOME/.smb.
CLIENT_SMB_CONF = "[global]\n  client min protocol = SMB2\n  disable netbios = yes\n  name resolve order = host\n"


def share_path(mountpoint: str, port: int, share: str) -> str:
    """Where smbnetfs shows ``share`` of the SMB server at 127.0.0.1:``port``."""
    return os.path.join(mountpoint, f"127.0.0.1:{port}", share)


def mountinfo_path(field: str) -> str:
    """A path from /proc/self/mountinfo (space, tab, newline, backslash as \\ooo)."""
    out, index = [], 0
    while index < len(field):
        if field[index] == "\\" and field[index + 1:index + 4].isdigit():
            out.append(chr(int(field[index + 1:index + 4], 8)))
            index += 4
        else:
            out.append(field[index])
            index += 1
    return "".join(out)


def mounts_under(mountinfo: str, prefix: str) -> list[str]:
    """The mount points at or below ``prefix``, deepest first (pure)."""
    prefix = prefix.rstrip("/")
    found = []
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        if len(fields) < 5:
            continue
        point = mountinfo_path(fields[4])
        if point == prefix or point.startswith(prefix + "/"):
            found.append(point)
    return sorted(set(found), key=lambda path: (-path.count("/"), path))


@functools.cache
def _libc() -> ctypes.CDLL:
    """The C library, loaded once (``find_library`` runs ldconfig or a compiler each time)."""
    return ctypes.CDLL("libc.so.6", use_errno=True)


def _umount(path: str, trusted: str) -> None:
    """Detach the mount at ``path`` as root (FUSE mounts of a user included).

    ``path`` lies in the user's session directory, found in mountinfo a
    moment before: the user may meanwhile have unmounted their FUSE mount
    and turned the mount point, or a directory above it, into a symlink to
    another mount point (``/proc``, ``/run/user/N``, ...).  So the path is
    walked from ``trusted`` (the gateway's ``sessions/``) without following
    links (:func:`nxgate.host.files.open_parent_beneath`), and
    ``UMOUNT_NOFOLLOW`` keeps the kernel from following a link in the last
    place: such a swap makes the umount fail, it never moves it."""
    parent, name = files.open_parent_beneath(trusted, path)
    try:
        libc = _libc()
        target = os.fsencode(f"/proc/self/fd/{parent}/{name}")
        if libc.umount2(target, MNT_DETACH | UMOUNT_NOFOLLOW) != 0:
            error = ctypes.get_errno()
            raise OSError(error, os.strerror(error), path)
    finally:
        os.close(parent)


class Sharing:
    name = "sharing"

    def __init__(self, context: Context) -> None:
        self.context = context

    def root(self, session: Any) -> str:
        return os.path.join(self.context.session_dir(session), "shares")

    def environment(self, session: Any) -> dict[str, str]:
        return {}

    async def start(self, session: Any) -> None:
        """Nothing until the client shares a folder (``addmount``)."""

    async def mount(self, session: Any, mount: Any) -> None:
        """Mount ``mount`` (a :class:`nxgate.vocabulary.requests.ShareMount`)
        for the session's user and link it as ``~/MyShares/<name>``.  Failures
        are logged; the session goes on without the folder."""
        port = self.port(session)
        if port is None:
            log.warn("session {id}: display :{display} is too high for an smb channel port", id=session.id,
                     display=session.display)
            return
        user = await self.context.blocking(pwd.getpwnam, session.user)  # NSS: maybe LDAP
        base = os.path.join(self.root(session), mount_key(mount.share))
        mountpoint, smb = os.path.join(base, "mnt"), os.path.join(base, ".smb")
        await self.context.blocking(self._unmount, base)
        if await self._run(session, ["mkdir", "-p", smb, mountpoint]) != 0:
            log.warn("session {id}: cannot make the mount directory of {share!r}", id=session.id, share=mount.share)
            return
        config = os.path.join(smb, "smbnetfs.conf")
        # Written by the user (umask 077: 0600), the text on dd's stdin: root
        # writes nothing in a directory the user controls.
        for path, text in ((os.path.join(smb, "smb.conf"), CLIENT_SMB_CONF),
                           (config, smbnetfs_config(mount.username, mount.password))):
            if await self._run(session, ["dd", f"of={path}", "status=none"], stdin=text) != 0:
                log.warn("session {id}: cannot write the mount settings of {share!r}", id=session.id,
                         share=mount.share)
                await self._run(session, ["rm", "-f", config])
                return
        try:
            code = await self._run(session, ["smbnetfs", mountpoint, "-o", f"config={config},{MOUNT_OPTIONS}"],
                                   home=base)
            target = share_path(mountpoint, port, mount.share)
            if code != 0 or not await self._reachable(session, target):
                log.warn("session {id} of {user}: the shared folder {share!r} could not be mounted (the client's "
                         "SMB server did not answer through the smb channel, or refused the login)",
                         id=session.id, user=session.user, share=mount.share)
                await self.context.blocking(self._unmount, base)
                return
        finally:
            await self._run(session, ["rm", "-f", config])
        shares = os.path.join(user.pw_dir, SHARES_DIR)
        link = os.path.join(shares, mount.name)
        if (await self._run(session, ["mkdir", "-p", shares]) != 0
                or await self._run(session, ["ln", "-sfnT", target, link]) != 0):
            log.warn("session {id}: {link} could not be made (a folder of that name in the way?); the share is at "
                     "{target}", id=session.id, link=link, target=target)
        log.info("session {id} of {user}: the client's folder {share!r} is at {link}", id=session.id,
                 user=session.user, share=mount.share, link=link)

    def port(self, session: Any) -> int | None:
        """Where smbnetfs reaches the client's SMB server: the client's own
        SSH connection when its door opened a route for the session's folders
        (the session's reverse listener, :mod:`nxgate.node.reverse`, on
        loopback TCP, as libsmbclient reaches nothing else: not throttled by
        nxagent, only the session's user let through, on one box and for a
        client on another cluster member alike), else the NX smb channel."""
        listeners = self.context.reverse
        address = listeners.address(session.id, self.name) if listeners is not None else None
        return address if isinstance(address, int) else service_channels.channel_port("sharing", session.display)

    async def _reachable(self, session: Any, path: str) -> bool:
        """Whether the user sees the share (the channel may need a moment)."""
        for _ in range(TRIES):
            if await self._run(session, ["test", "-d", path]) == 0:
                return True
            await task.deferLater(self.context.reactor, PAUSE, lambda: None)
        return False

    async def _run(self, session: Any, argv: list[str], home: str | None = None,
                   stdin: str | None = None) -> int | None:
        user = await self.context.blocking(pwd.getpwnam, session.user)
        paths = self.context.layout.agent_files(session.id)
        request: dict[str, Any] = {
            "user": user.pw_name,
            "argv": argv,
            "env": {"HOME": home or user.pw_dir, "USER": user.pw_name, "PATH": "/usr/local/bin:/usr/bin:/bin",
                    "LANG": "C.UTF-8"},
            "cwd": home or user.pw_dir,
            "log": paths.app_log,
        }
        if stdin is not None:
            request["stdin"] = stdin  # a pipe (nxgate.host.runas): never argv or the environment
        return await self.context.launcher.run(request, RUN_TIMEOUT)

    def _unmount(self, prefix: str) -> list[str]:
        try:
            with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as handle:
                points = mounts_under(handle.read(), prefix)
        except OSError:
            return []
        for point in points:
            try:
                _umount(point, self.context.layout.sessions)
            except OSError as error:
                log.warn("cannot unmount {point}: {error}", point=point, error=error)
        return points

    def _take_down(self, session: Any) -> list[str]:
        """The ``~/MyShares`` links first, then the mounts they point into (one
        thread turn: nobody sees a link without its mount)."""
        self._unlink_links(session)
        return self._unmount(self.root(session))

    def _unlink_links(self, session: Any) -> None:
        """Remove the ``~/MyShares`` links into this session's mounts (as root,
        in the user's own directory: no link is followed)."""
        try:
            home = pwd.getpwnam(session.user).pw_dir
            fd = os.open(os.path.join(home, SHARES_DIR), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except (KeyError, OSError):
            return
        root = self.root(session) + "/"
        try:
            if os.fstat(fd).st_uid != session.uid:
                return
            for name in os.listdir(fd):
                try:
                    if os.readlink(name, dir_fd=fd).startswith(root):
                        os.unlink(name, dir_fd=fd)
                except OSError:
                    continue
        finally:
            os.close(fd)

    async def stop(self, session: Any) -> None:
        points = await self.context.blocking(self._take_down, session)
        if points:
            log.info("session {id} of {user}: {count} shared folder(s) unmounted", id=session.id,
                     user=session.user, count=len(points))


def make(context: Context) -> Sharing:
    return Sharing(context)
