"""X2Go's shared folders: a client's folders mounted in its session with
sshfs, back through the client's own SSH connection.

An X2Go client shares a folder in three steps: it pushes a key bundle (a
private key it accepts, and the host key of its own SFTP server: python-x2go
serves SFTP itself, x2goclient starts a private sshd), it asks for a reverse
forward of the session's folders port, and it runs ``x2gomountdirs``.  The
X2Go door keeps the bundle (never written to disk on the gateway's machine),
opens the session's *route* for ``sshfs`` (:mod:`nxgate.streams.reverse`),
and asks the session's node, through the node interface, to mount the
folders (:meth:`X2GoFolders.mount`).  Here, on the session's machine:

* **Where.**  Where X2Go's own server mounts them (:func:`mount_point`):
  a folder of the client's disk at ``/tmp/.x2go-<user>/media/disk/<path
  with / as _>`` (``~/media`` links there, as x2goserver makes it), a
  removable medium under ``media/rm`` (``media/cd`` for a CD), the print
  spool at ``/tmp/.x2go-<user>/spool/C-<session>`` (where the session's
  X2Go printer puts its PDFs, :mod:`nxgate.node.services.printing`) and the
  MIME box at ``/tmp/.x2go-<user>/mimebox/C-<session>``.  ``/tmp`` is
  everybody's: ``/tmp/.x2go-<user>`` must be the user's own real directory,
  not writable by others, and every directory below it down to the mount
  point too (:func:`owned_chain`, walked without following a link); a
  symbolic link anywhere there, or a directory of someone else, refuses
  the folder with words for the client and the log.  Root makes nothing
  there: the directories are made by the user.
* **How.**  ``sshfs`` runs *as the user* (the launcher), an ordinary FUSE
  mount, not ``allow_other``: the kernel lets no other user, root
  included, into it.  Its ``ssh`` reaches the client's SFTP server through
  the session's reverse listener for ``sshfs`` (a loopback port that admits
  only the session user's processes, :mod:`nxgate.node.reverse`), logs in
  with the client's key and trusts only the client's host key (both
  written 0600 by root into the session's 0700 directory for the mount,
  and removed once it is done), from an ssh configuration of its own
  (:func:`ssh_config`: nothing of the user's) with no agent, password or
  prompt.  The mount's name
  in the kernel's table is ``nxgate-x2go:<session id>``
  (:data:`FSNAME_PREFIX`): the session's mounts are found there, by
  session, with nothing kept in memory, after a gateway restart too.
* **Until when.**  The mounts go when the session is suspended, ends or
  fails (and at the start of a gateway that finds them left behind), as
  x2goserver's ``x2goumount-session`` does: ``fusermount -u -z`` as the
  user, who owns them.  At a resume the client shares its folders again.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from twisted.internet import defer
from twisted.logger import Logger

from nxgate.host import files, processes
from nxgate.node.services import Context
from nxgate.node.services.sharing import mountinfo_path
from nxgate.vocabulary.requests import FolderShares, SharedFolder
from nxgate.vocabulary.results import FolderMount

log = Logger()

#: The reverse service whose listener sshfs connects to.
SERVICE = "sshfs"
#: The kernel's name of a session's mounts: this prefix, then the session's id.
FSNAME_PREFIX = "nxgate-x2go:"
#: Seconds sshfs may take to log in and mount (x2goserver gives it 30).
MOUNT_TIMEOUT = 30.0
RUN_TIMEOUT = 30.0
#: Longest client path taken, in bytes (a mount point's name is one directory entry).
MAX_PATH = 240
#: At most this many folders in one request (x2goclient sends its list in one).
MAX_FOLDERS = 16
KEY_NAME = "x2go-sshfs-key"
KNOWN_HOSTS_NAME = "x2go-sshfs-known-hosts"
CONFIG_NAME = "x2go-sshfs-config"
#: Why a jailed session gets no folders: its programs see a /tmp of their own, not the host's where they are mounted.
JAILED = ("shared folders and printing are not offered in jailed sessions (their /tmp, where X2Go mounts them, is"
          " their own)")
#: The name sshfs's ssh knows the client's host key by (the listener's port changes at each resume).
HOST_ALIAS = "x2go-client"


class FolderRefused(ValueError):
    """A folder that is not mounted, with words for the client and the log."""


# ------------------------------------------------------------------ pure
def x2go_base(user: str) -> str:
    """x2goserver's directory of a user's mounts and spools."""
    return f"/tmp/.x2go-{user}"


def mount_point(user: str, session_id: str, folder: SharedFolder) -> str:
    """Where x2goserver mounts ``folder`` (``x2gomountdirs``): the spool and
    MIME box per session, a folder by its client path with ``/`` and blanks as
    ``_`` (a removable medium without its ``/ramdrive/mnt/``)."""
    path = folder.path
    if not path.startswith("/") or len(path.encode("utf-8", "surrogateescape")) > MAX_PATH \
            or any(ord(char) < 32 or char == "\x7f" for char in path):
        raise FolderRefused(f"{path[:80]!r} is not a folder's full path")
    base = x2go_base(user)
    if folder.kind == "spool":
        return f"{base}/spool/C-{session_id}"
    if folder.kind == "mimebox":
        return f"{base}/mimebox/C-{session_id}"
    name = path
    if folder.kind in ("removable", "cdrom"):
        name = name.replace("/ramdrive/mnt/", "")
    name = name.replace("/", "_").replace(" ", "_").replace("~", "")
    if name in ("", ".", ".."):
        raise FolderRefused(f"{path[:80]!r} is not a folder's full path")
    place = {"disk": "disk", "removable": "rm", "cdrom": "cd"}.get(folder.kind)
    if place is None:
        raise FolderRefused(f"a folder of kind {folder.kind[:20]!r}")
    if folder.kind == "removable" and "CDROM" in path:
        place = "cd"
    return f"{base}/media/{place}/{name}"


def fsname(session_id: str) -> str:
    return FSNAME_PREFIX + session_id


def ssh_config(key: str, known_hosts: str) -> str:
    """The ssh configuration of sshfs's ssh (nothing of the user's own, ``-F``): the client's key only, the
    client's host key only, nothing that could ask.  python-x2go's SFTP server (paramiko) names no
    ``server-sig-algs``, so OpenSSH would offer an RSA key with no signature it accepts: ``ssh-rsa`` is allowed
    for this one connection, to the client's own server, whose host key is pinned, inside the client's SSH
    connection."""
    return "".join(f"{line}\n" for line in (
        "Host *", f"  IdentityFile {key}", "  IdentitiesOnly yes", "  PubkeyAcceptedAlgorithms +ssh-rsa",
        f"  UserKnownHostsFile {known_hosts}", "  GlobalKnownHostsFile /dev/null", f"  HostKeyAlias {HOST_ALIAS}",
        "  StrictHostKeyChecking yes", "  BatchMode yes", "  PasswordAuthentication no",
        "  KbdInteractiveAuthentication no", f"  ConnectTimeout {int(MOUNT_TIMEOUT)}", "  ServerAliveInterval 300",
        "  ForwardAgent no", "  ForwardX11 no", "  ClearAllForwardings yes"))


def sshfs_argv(port: int, client_user: str, folder: str, point: str, config: str, uid: int, gid: int,
               session_id: str) -> list[str]:
    """sshfs for one folder, as the user, with :func:`ssh_config`; mounted under the session's name."""
    options = ",".join(["idmap=user", f"uid={uid}", f"gid={gid}", "default_permissions",
                        f"fsname={fsname(session_id)}", "subtype=sshfs"])
    return ["sshfs", "-F", config, "-p", str(port), "-o", options, f"{client_user}@127.0.0.1:{folder}", point]


def session_mounts(mountinfo: str, session_id: str, user: str) -> list[str]:
    """The mount points of the session's folders (the kernel's table, pure):
    FUSE sshfs mounts named for the session below the user's X2Go directory."""
    found = []
    prefix = x2go_base(user) + "/"
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        if "-" not in fields:
            continue
        dash = fields.index("-")
        if len(fields) < dash + 3 or dash < 5:
            continue
        point, fstype, source = mountinfo_path(fields[4]), fields[dash + 1], mountinfo_path(fields[dash + 2])
        if fstype == "fuse.sshfs" and source == fsname(session_id) and point.startswith(prefix):
            found.append(point)
    return found


def mounted_by_whom(mountinfo: str, point: str) -> str | None:
    """The source (for ours: ``nxgate-x2go:<session>``) of a mount at ``point``, or None."""
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        if "-" in fields and len(fields) > 4 and mountinfo_path(fields[4]) == point:
            dash = fields.index("-")
            if len(fields) >= dash + 3:
                return mountinfo_path(fields[dash + 2])
    return None


# --------------------------------------------------------------- checks
def owned_chain(base: str, point: str, uid: int) -> str | None:
    """Why ``point`` may not be mounted on (None: it may): ``base`` and every
    directory from it to ``point`` must be a real directory of ``uid`` that
    nobody else may write; looked up from each parent's descriptor without
    following a link (blocking: run it in a thread)."""
    relative = os.path.relpath(point, base)
    if relative.startswith("..") or os.path.isabs(relative):
        return f"{point} is outside {base}"
    names = [] if relative == "." else relative.split("/")
    try:
        fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as error:
        return _why_not_directory(base, error)
    try:
        where = base
        problem = _not_own(fd, where, uid)
        if problem:
            return problem
        for name in names:
            where = f"{where}/{name}"
            try:
                child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as error:
                return _why_not_directory(where, error)
            os.close(fd)
            fd = child
            problem = _not_own(fd, where, uid)
            if problem:
                return problem
        return None
    finally:
        os.close(fd)


def _why_not_directory(path: str, error: OSError) -> str:
    try:
        if stat.S_ISLNK(os.lstat(path).st_mode):
            return f"{path} is a symbolic link"
    except OSError:
        pass
    return f"{path} is not a directory ({error.strerror})"


def _not_own(fd: int, path: str, uid: int) -> str | None:
    st = os.fstat(fd)
    if st.st_uid != uid:
        return f"{path} belongs to uid {st.st_uid}, not to the session's user"
    if st.st_mode & 0o022:
        return f"{path} may be written by others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _read_mountinfo() -> str:
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as handle:
        return handle.read()


def _symlink_or_missing(path: str) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except FileNotFoundError:
        return True


@dataclass
class _Locks:
    """One mount or unmount at a time per session (a client may send two at once)."""

    locks: dict[str, defer.DeferredLock]

    def of(self, session_id: str) -> defer.DeferredLock:
        return self.locks.setdefault(session_id, defer.DeferredLock())


# -------------------------------------------------------------- the extra
class X2GoFolders:
    """The X2Go folders of this machine's sessions (see the module's docstring).

    ``always``: stopped with every session (an X2Go client shares folders in
    a session that asked for no NX service)."""

    name = "x2go-folders"
    always = True

    def __init__(self, context: Context, sshfs: bool = True) -> None:
        self.context = context
        self.sshfs = sshfs
        self.locks = _Locks({})
        #: Told ``(session, mount point)`` of each print spool mounted, and ``(session)`` when it went (the
        #: session's X2Go printer, :mod:`nxgate.node.services.printing`).
        self.spool_mounted: list[Any] = []
        self.spool_gone: list[Any] = []

    def environment(self, session: Any) -> dict[str, str]:
        return {}

    async def start(self, session: Any) -> None:
        """Nothing: the client shares its folders after each start or resume."""

    async def stop(self, session: Any) -> None:
        gone = await self._unmount(session, None)
        if gone:
            log.info("session {id} of {user}: {count} X2Go shared folder(s) unmounted", id=session.id,
                     user=session.user, count=len(gone))

    # --------------------------------------------------------------- mount
    async def mount(self, session: Any, shares: FolderShares) -> tuple[FolderMount, ...]:
        """Mount the client's folders in ``session`` (see the module's docstring); one result a folder."""
        folders = shares.folders[:MAX_FOLDERS]
        reverse = getattr(self.context, "reverse", None)
        port = reverse.address(session.id, SERVICE) if reverse is not None else None
        refusal = None
        if not self.sshfs:
            refusal = "sshfs is not installed on the session's machine"
        elif not isinstance(port, int):
            refusal = ("the client does not forward the session's folders port (its reverse forward is missing, or"
                       " went with its connection)")
        if refusal is not None:
            log.warn("session {id} of {user}: {count} shared folder(s) not mounted: {why}", id=session.id,
                     user=session.user, count=len(folders), why=refusal)
            return tuple(self._refused(session, folder, refusal, logged=True) for folder in folders)
        if session.agent_pid and not await self.context.blocking(processes.same_pid_namespace, session.agent_pid):
            log.info("session {id} of {user}: {count} X2Go shared folder(s) not mounted: {why}", id=session.id,
                     user=session.user, count=len(folders), why=JAILED, audit="x2go_folder_refused")
            return tuple(self._refused(session, folder, JAILED, logged=True) for folder in folders)
        lock = self.locks.of(session.id)
        await lock.acquire()
        try:
            return await self._mount_all(session, shares, folders, port)
        finally:
            lock.release()

    async def _mount_all(self, session: Any, shares: FolderShares, folders: Iterable[SharedFolder],
                         port: int) -> tuple[FolderMount, ...]:
        user = await self.context.blocking(pwd.getpwnam, session.user)
        directory = self.context.session_dir(session)
        key, known = os.path.join(directory, KEY_NAME), os.path.join(directory, KNOWN_HOSTS_NAME)
        config = os.path.join(directory, CONFIG_NAME)
        results = []
        try:
            await self.context.blocking(self._write_keys, session, key, known, config, shares)
            base_problem = await self._base(session, user)
            for folder in folders:
                if base_problem is not None:
                    results.append(self._refused(session, folder, base_problem))
                    continue
                results.append(await self._mount_one(session, user, folder, port, shares.client_user, config))
        finally:
            await self.context.blocking(files.remove_in_dir, directory, KEY_NAME, KNOWN_HOSTS_NAME, CONFIG_NAME)
        if any(result.mounted and result.kind == "disk" for result in results):
            await self._link_media(session, user)
        for result in results:
            if result.mounted and result.kind == "spool":
                for told in self.spool_mounted:
                    try:
                        await told(session, result.mount_point)
                    except Exception:
                        log.failure("session {id}: the X2Go print spool could not be served", id=session.id)
        return tuple(results)

    @staticmethod
    def _write_keys(session: Any, key: str, known: str, config: str, shares: FolderShares) -> None:
        files.write_user_file(key, shares.key, session.uid, session.gid)
        files.write_user_file(known, f"{HOST_ALIAS} {shares.host_key}\n".encode(), session.uid, session.gid)
        files.write_user_file(config, ssh_config(key, known).encode(), session.uid, session.gid)

    async def _base(self, session: Any, user: Any) -> str | None:
        """``/tmp/.x2go-<user>``, made by the user if it is not there; why not, if it is not theirs."""
        base = x2go_base(session.user)
        if await self.context.blocking(os.path.lexists, base) is False:
            await self._run(session, user, ["mkdir", "-m", "0700", base])
        problem = await self.context.blocking(owned_chain, base, base, session.uid)
        if problem is not None:
            log.warn("session {id} of {user}: X2Go folders refused: {problem} (where x2goserver mounts a user's"
                     " folders; nothing was mounted)", id=session.id, user=session.user, problem=problem,
                     audit="x2go_folder_refused")
        return problem

    async def _mount_one(self, session: Any, user: Any, folder: SharedFolder, port: int, client_user: str,
                         config: str) -> FolderMount:
        try:
            point = mount_point(session.user, session.id, folder)
        except FolderRefused as refusal:
            return self._refused(session, folder, str(refusal))
        table = await self.context.blocking(_read_mountinfo)
        holder = mounted_by_whom(table, point)
        if holder == fsname(session.id):
            await self._release(session, user, point)
        elif holder is not None:
            other = holder[len(FSNAME_PREFIX):] if holder.startswith(FSNAME_PREFIX) else holder
            return self._refused(session, folder, f"{point} is in use already (by {other[:80]})", point)
        base = x2go_base(session.user)
        await self._run(session, user, ["mkdir", "-p", "-m", "0700", point])
        problem = await self.context.blocking(owned_chain, base, point, session.uid)
        if problem is not None:
            log.warn("session {id} of {user}: the client's folder {path!r} refused: {problem}", id=session.id,
                     user=session.user, path=folder.path[:120], problem=problem, audit="x2go_folder_refused")
            return self._refused(session, folder, f"the mount point {problem}", point, logged=True)
        argv = sshfs_argv(port, client_user, folder.path, point, config, session.uid, session.gid, session.id)
        code = await self._run(session, user, argv, MOUNT_TIMEOUT)
        table = await self.context.blocking(_read_mountinfo)
        if code != 0 or point not in session_mounts(table, session.id, session.user):
            why = ("sshfs did not log in to the client's SFTP server through its forward in time" if code is None
                   else f"sshfs ended with status {code} (the client's SFTP server refused the key, or did not"
                        " answer through its forward; the session's log has sshfs's words)")
            await self._release(session, user, point)
            return self._refused(session, folder, why, point)
        log.info("session {id} of {user}: the X2Go client's folder {path!r} is mounted at {point}", id=session.id,
                 user=session.user, path=folder.path[:160], point=point, audit="x2go_folder_mount")
        return FolderMount(folder.path, folder.kind, point, True)

    @staticmethod
    def _refused(session: Any, folder: SharedFolder, why: str, point: str = "", logged: bool = False) -> FolderMount:
        if not logged:
            log.warn("session {id} of {user}: the client's folder {path!r} is not mounted: {why}", id=session.id,
                     user=session.user, path=folder.path[:120], why=why)
        return FolderMount(folder.path, folder.kind, point, False, why)

    async def _link_media(self, session: Any, user: Any) -> None:
        """``~/media`` to the user's X2Go media directory, as x2goserver makes it (not over a real one)."""
        link = os.path.join(user.pw_dir, "media")
        if await self.context.blocking(_symlink_or_missing, link):
            await self._run(session, user, ["ln", "-sfnT", f"{x2go_base(session.user)}/media", link])

    # ------------------------------------------------------------- unmount
    async def unmount(self, session: Any, path: str = "") -> tuple[FolderMount, ...]:
        """Unmount the session's folders (``x2goumount-session``): all, or the one of client path ``path``."""
        point = None
        if path:
            try:
                point = mount_point(session.user, session.id, SharedFolder(path, "disk"))
            except FolderRefused:
                return ()
        gone = await self._unmount(session, point)
        if gone:
            log.info("session {id} of {user}: X2Go shared folder(s) unmounted at the client's request: {points}",
                     id=session.id, user=session.user, points=", ".join(gone))
        return tuple(FolderMount("", "", point, False) for point in gone)

    async def listing(self, session: Any) -> tuple[FolderMount, ...]:
        table = await self.context.blocking(_read_mountinfo)
        return tuple(FolderMount("", _kind_of(point), point, True)
                     for point in session_mounts(table, session.id, session.user))

    async def _unmount(self, session: Any, only: str | None) -> list[str]:
        lock = self.locks.of(session.id)
        await lock.acquire()
        try:
            table = await self.context.blocking(_read_mountinfo)
            points = [point for point in session_mounts(table, session.id, session.user)
                      if only is None or point == only]
            if not points:
                return []
            user = await self.context.blocking(pwd.getpwnam, session.user)
            for point in points:
                await self._release(session, user, point)
            if any(_kind_of(point) == "spool" for point in points):
                for told in self.spool_gone:
                    try:
                        await told(session)
                    except Exception:
                        log.failure("session {id}: the X2Go printer could not be stopped", id=session.id)
            return points
        finally:
            lock.release()
            if not getattr(getattr(session, "state", None), "live", True):
                self.locks.locks.pop(session.id, None)

    async def _release(self, session: Any, user: Any, point: str) -> None:
        """Unmount as the user (the mount is theirs; ``fusermount`` checks it), and take the empty directory away."""
        code = await self._run(session, user, ["fusermount3", "-u", "-z", point])
        if code not in (0, None):
            still = point in session_mounts(await self.context.blocking(_read_mountinfo), session.id, session.user)
            if still:
                log.warn("session {id} of {user}: {point} could not be unmounted (fusermount: status {code})",
                         id=session.id, user=session.user, point=point, code=code)
        await self._run(session, user, ["rmdir", point])

    async def _run(self, session: Any, user: Any, argv: list[str], timeout: float = RUN_TIMEOUT) -> int | None:
        request: dict[str, Any] = {
            "user": user.pw_name,
            "argv": argv,
            "env": {"HOME": user.pw_dir, "USER": user.pw_name, "LOGNAME": user.pw_name,
                    "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"},
            "cwd": "/",
            "log": self.context.layout.agent_files(session.id).app_log,
        }
        return await self.context.launcher.run(request, timeout)


def _kind_of(point: str) -> str:
    parts = point.split("/")
    if "spool" in parts[:4]:
        return "spool"
    if "mimebox" in parts[:4]:
        return "mimebox"
    return {"rm": "removable", "cd": "cdrom"}.get(parts[4] if len(parts) > 5 else "", "disk")


def make(context: Context) -> X2GoFolders:
    return X2GoFolders(context, shutil.which("sshfs", path="/usr/local/bin:/usr/bin:/bin") is not None)
