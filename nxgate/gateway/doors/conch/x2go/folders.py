"""X2Go's shared folders at the door: the key bundles clients push, the
``x2gomountdirs`` words, and what the verbs print (pure but for parsing keys).

An X2Go client that shares a folder pushes a *key bundle* to
``~/.x2go/ssh/key.<something>`` (python-x2go over SFTP, x2goclient with scp):
a private key its own SFTP server accepts, ``----BEGIN RSA IDENTITY----``,
and that server's host key (``<type> <base64>``).  Then it runs
``x2gomountdirs dir|rem <session> <client user> <key file> <folders>`` where
``<folders>`` is ``<path>[__PRINT_SPOOL_|__MIMEBOX_SPOOL_]:<path>…`` followed
by ``__REVERSESSH_PORT__<the session's folders port>`` (the words x2goserver's
script reads).  The door keeps each bundle in memory (:class:`FolderKeys`,
a few per user, for a few minutes; never written on the gateway's machine)
until ``x2gomountdirs`` names it, and hands it to the session's node, which
mounts with it (:mod:`nxgate.node.services.x2go_folders`).

What the verbs print is x2goserver's, because the clients read it: python-x2go
takes a share as done when the sixth line of ``x2gomountdirs``' output ends
with ``ok`` (``dirs:``, ``ssh port:``, ``Host:``, ``User:``, ``inserted, …``,
``mount <path> ok``), and a refusal is a line on stderr.
"""

from __future__ import annotations

import binascii
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from twisted.conch.ssh import keys

from nxgate.vocabulary.requests import SharedFolder

#: x2goserver's separator between the private key and the host key.
IDENTITY_MARKER = b"----BEGIN RSA IDENTITY----"
#: Host key types an SFTP server of a client may have.
HOST_KEY_TYPES = frozenset({"ssh-rsa", "ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384",
                            "ecdsa-sha2-nistp521", "ssh-dss"})
#: A bundle is a private key and a public one: a few KiB at most.
MAX_BUNDLE = 16 * 1024
#: Bundles kept per user, and for how long (a client runs x2gomountdirs right after its push).
MAX_KEYS_PER_USER = 8
KEY_LIFETIME = 600.0
SPOOL_MARK = "__PRINT_SPOOL_"
MIMEBOX_MARK = "__MIMEBOX_SPOOL_"
REVERSE_MARK = "__REVERSESSH_PORT__"
DIRECT_MARK = "__SSH_PORT__"
MAX_FOLDERS = 16
MAX_FOLDER_PATH = 240
_CLIENT_USER = re.compile(r"[A-Za-z0-9._@$+-]{1,64}")


class NotABundle(ValueError):
    """A pushed key file that is not an X2Go key bundle (words for the client and the log)."""


class MountRefused(ValueError):
    """An ``x2gomountdirs`` this door does not carry out (words for the client and the log)."""


@dataclass(frozen=True)
class KeyBundle:
    private: bytes = field(repr=False)
    host_key: str


def parse_bundle(data: bytes) -> KeyBundle:
    """The private key and the host key of a key bundle; NotABundle with the reason."""
    if len(data) > MAX_BUNDLE:
        raise NotABundle(f"{len(data)} bytes, more than a key bundle has ({MAX_BUNDLE})")
    private, marker, host = data.partition(IDENTITY_MARKER)
    if not marker:
        raise NotABundle("no ----BEGIN RSA IDENTITY---- between a private key and a host key")
    try:
        key = keys.Key.fromString(private.strip() + b"\n")
    except (keys.BadKeyError, ValueError, TypeError, IndexError, binascii.Error) as error:
        raise NotABundle(f"the private key is not one ({error or 'unreadable'})") from None
    except Exception as error:  # a key library's own surprise: still not a key
        raise NotABundle(f"the private key is not one ({type(error).__name__})") from None
    if key.isPublic():
        raise NotABundle("a public key where the private key belongs")
    words = host.strip().split()
    if len(words) < 2 or words[0].decode("ascii", "replace") not in HOST_KEY_TYPES:
        raise NotABundle("the host key is not '<type> <base64>' of an SSH host key type")
    try:
        public = keys.Key.fromString(b" ".join(words[:2]))
    except Exception:
        raise NotABundle("the host key is not one") from None
    if not public.isPublic() or public.sshType().decode() != words[0].decode():
        raise NotABundle("the host key is not one")
    return KeyBundle(private.strip() + b"\n", b" ".join(words[:2]).decode("ascii"))


def key_name(names: list[str]) -> str | None:
    """The key's name if ``names`` (a path below home, :func:`files.parts`) is a key bundle's place."""
    if len(names) == 3 and names[0] == ".x2go" and names[1] == "ssh" and names[2].startswith("key."):
        return names[2]
    return None


class FolderKeys:
    """The key bundles clients pushed, by user and file name; one owner: the door."""

    def __init__(self, now: Callable[[], float]) -> None:
        self.now = now
        self.kept: dict[tuple[str, str], tuple[float, KeyBundle]] = {}

    def put(self, user: str, name: str, bundle: KeyBundle) -> None:
        self._expire()
        mine = [key for key in self.kept if key[0] == user and key[1] != name]
        for key in mine[:max(0, len(mine) - MAX_KEYS_PER_USER + 1)]:
            del self.kept[key]
        self.kept[(user, name)] = (self.now(), bundle)

    def get(self, user: str, name: str) -> KeyBundle | None:
        self._expire()
        found = self.kept.get((user, name))
        return found[1] if found is not None else None

    def drop(self, user: str, name: str) -> bool:
        return self.kept.pop((user, name), None) is not None

    def _expire(self) -> None:
        limit = self.now() - KEY_LIFETIME
        for key in [key for key, (when, _) in self.kept.items() if when < limit]:
            del self.kept[key]


@dataclass(frozen=True)
class MountDirs:
    """What an ``x2gomountdirs`` asks for."""

    removable: bool
    session: str
    client_user: str
    key_path: str
    folders: tuple[SharedFolder, ...]
    port: int
    listed: str  # the folder list as given (x2goserver echoes it)


def parse_mountdirs(args: tuple[str, ...]) -> MountDirs:
    """``dir|rem <session> <client user> <key file> <folders…>``: the folders'
    words are joined with blanks (a path with blanks arrives as several)."""
    if len(args) < 5 or args[0] not in ("dir", "rem"):
        raise MountRefused("x2gomountdirs needs dir or rem, a session, a user, a key file and folders")
    kind, session, client_user, key_path = args[:4]
    listed = " ".join(args[4:])
    if not client_user:
        raise MountRefused("the client named no user of its machine (x2goclient takes it from $USER)")
    if not _CLIENT_USER.fullmatch(client_user):
        raise MountRefused(f"the client's user name {client_user[:40]!r}")
    if DIRECT_MARK in listed or REVERSE_MARK not in listed:
        raise MountRefused("folders only through the client's reverse forward (__REVERSESSH_PORT__); nxgate does not"
                           " connect to a client's own SSH server")
    folder_list, _, port_text = listed.rpartition(REVERSE_MARK)
    if not re.fullmatch(r"\d{1,5}", port_text.strip()):
        raise MountRefused(f"the port {port_text[:20]!r}")
    folders = []
    for word in folder_list.split(":"):
        if not word:
            continue
        folder_kind = "removable" if kind == "rem" else "disk"
        if word.endswith(SPOOL_MARK):
            word, folder_kind = word[:-len(SPOOL_MARK)], "spool"
        elif word.endswith(MIMEBOX_MARK):
            word, folder_kind = word[:-len(MIMEBOX_MARK)], "mimebox"
        if not word.startswith("/") or len(word.encode()) > MAX_FOLDER_PATH \
                or any(ord(char) < 32 or char == "\x7f" for char in word):
            raise MountRefused(f"the folder {word[:80]!r} (a full path on the client, at most {MAX_FOLDER_PATH} bytes)")
        folders.append(SharedFolder(word, folder_kind))
    if not folders or len(folders) > MAX_FOLDERS:
        raise MountRefused(f"1 to {MAX_FOLDERS} folders")
    return MountDirs(kind == "rem", session, client_user, key_path, tuple(folders), int(port_text), folder_list)


# ------------------------------------------------------------------ output
def mountdirs_header(request: MountDirs, user: str) -> str:
    """x2gomountdirs' first lines (python-x2go counts them)."""
    return (f"dirs:{request.listed}\n"
            f"ssh port:{request.port}\n"
            "Host:127.0.0.1\n"
            f"User:{user}\n")


def mountdirs_folder(request: MountDirs, path: str, mount_point: str, mounted: bool) -> str:
    """x2gomountdirs' two lines for one folder (the second only when it is mounted)."""
    line = f"inserted, sshfs {request.client_user}@127.0.0.1:{path} {mount_point} through the client's forward\n"
    return line + (f"mount {path} ok\n" if mounted else "")


def listmounts_output(points: list[str]) -> str:
    """x2golistmounts: ``client|mount point`` lines (the client is the forward's end, 127.0.0.1)."""
    return "".join(f"127.0.0.1|{point}\n" for point in points)
