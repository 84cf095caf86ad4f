"""What callers ask the session manager for (typed, already validated by
the door that parsed them: :mod:`nxgate.protocols.nx.requests` for NX clients)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RemoteRequest:
    """An RDP or VNC desktop asked for by a client (its agent_* values, raw:
    :func:`nxgate.node.agents.remote_desktop.remote_desktop` validates them)."""

    server: str
    user: str = ""
    domain: str = ""
    password: str = field(default="", repr=False)


@dataclass(frozen=True)
class DisplaySettings:
    """How the agent should present the session to this client.

    Kept with the session and replaced on every restore: the client may come
    back from another machine with another screen, keyboard and link.
    """

    geometry: str = "800x600"
    fullscreen: bool = False
    depth: int = 24
    render: bool = True
    keyboard: str = "pc105/us"
    link: str = "lan"
    cache: str = "16M"
    images: str = "64M"
    clipboard: str = "both"
    client: str = "unknown"
    backingstore: bool = True

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> DisplaySettings:
        known = {k: v for k, v in values.items() if k in cls.__dataclass_fields__}
        return cls(**known)


#: The session type of X2Go's published applications: a rootless agent kept
#: without a program of its own, its programs started one by one (``launch``).
PUBLISHED_TYPE = "unix-published"


@dataclass(frozen=True)
class StartRequest:
    type: str
    name: str
    display: DisplaySettings
    encrypted: bool
    rootless: bool
    application: tuple[str, ...] = ()
    # (key, value) of the parameters the server chooses itself that the client sent anyway.
    ignored: tuple[tuple[str, str], ...] = ()
    # For the remote desktop types (windows, vnc): what the client named.
    remote: RemoteRequest | None = None
    # What the client wants beside the screen: a subset of {"sound", "printing",
    # "sharing"}; the service grants what the admin left on ([services]).
    services: frozenset[str] = frozenset()


@dataclass(frozen=True)
class RestoreRequest:
    session_id: str
    display: DisplaySettings
    encrypted: bool
    # Asked for anew at each resume: the client may come back from another machine.
    services: frozenset[str] = frozenset()
    # The agent's cookie after the resume ("": a fresh one).  X2Go clients take the
    # cookie from the listing made before the resume (nxgate.gateway.doors.conch.x2go.names).
    cookie: str = field(default="", repr=False)


@dataclass(frozen=True)
class ShadowRequest:
    target_id: str
    display: DisplaySettings
    view_only: bool


@dataclass(frozen=True)
class ShareMount:
    """A folder the client shares with its session (``addmount``): its SMB
    share ``share`` on the client's SMB server, reached through the session's
    smb channel, to appear in the session as ``~/MyShares/<name>``.  The
    password travels only to the FUSE SMB client (never argv, logs or the
    store: ``repr=False``, and the service keeps no copy)."""

    share: str
    name: str
    username: str = ""
    password: str = field(default="", repr=False)
    computer: str = ""


#: The kinds of folder an X2Go client shares: a folder of its disk, a removable
#: medium, its print spool (jobs go there) and its MIME box.
FOLDER_KINDS = ("disk", "removable", "cdrom", "spool", "mimebox")


@dataclass(frozen=True)
class SharedFolder:
    """One folder of the client's machine, by its path there, and its kind (:data:`FOLDER_KINDS`)."""

    path: str
    kind: str = "disk"


@dataclass(frozen=True)
class FolderShares:
    """Folders an X2Go client shares with its session (``x2gomountdirs``): the
    session's machine mounts each with sshfs as the session's user, back
    through the client's own reverse forward of the session's folders port,
    logging in to the client's SFTP server as ``client_user`` with ``key``
    (a private key, PEM or OpenSSH; ``repr=False``: never a log, argv or the
    store) and trusting only ``host_key`` (``<type> <base64>``)."""

    folders: tuple[SharedFolder, ...]
    client_user: str
    key: bytes = field(default=b"", repr=False)
    host_key: str = ""
