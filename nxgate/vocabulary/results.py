"""What the session manager answers (never a cookie, except in Ready)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nxgate.vocabulary.model import FOR_LATER, Session, State, listed_status


@dataclass(frozen=True)
class StreamTarget:
    """Where the client's stream goes after the dialogue: the agent's Unix
    socket, owned by ``uid`` (see :mod:`nxgate.streams.agentsocket`).

    ``node`` and ``address`` are set when the session runs on another
    cluster member: the stream then goes over TLS to that member
    (:mod:`nxgate.wire.member_stream`), which checks ``path``/``uid`` itself
    (the gateway's copies are only for the log)."""

    session_id: str
    path: str
    uid: int
    node: str = ""
    address: str = ""


@dataclass(frozen=True)
class SessionView:
    """One session as callers may see it."""

    id: str
    full_id: str
    user: str
    type: str
    name: str
    display: int
    state: State
    geometry: str
    depth: int
    render: bool
    fullscreen: bool
    rootless: bool
    encrypted: bool
    client_address: str
    created: float
    changed: float
    attached_before: bool
    agent_pid: int
    failure: str
    node: str = ""
    program_pid: int = 0
    options: dict[str, Any] = field(default_factory=dict, compare=False)
    #: The session's cluster member is down: the view is the store's last
    #: record, and nothing can be done with the session until it is back.
    lost: bool = False

    @property
    def status(self) -> str | None:
        """The one word NX clients list (Running/Suspended), None if not listed."""
        return listed_status(self.state, bool(self.options.get(FOR_LATER)) and not self.attached_before)

    @property
    def shown_status(self) -> str | None:
        """:attr:`status` as listings show it: ``Lost`` on a member that is down."""
        status = self.status
        return LOST if status is not None and self.lost else status

    @property
    def shown_state(self) -> str:
        """The state as the admin and D-Bus see it: ``lost`` on a member that is down."""
        return LOST.lower() if self.lost else self.state.value

    @classmethod
    def of(cls, session: Session) -> SessionView:
        options = {key: value for key, value in session.options.items() if key not in ("plan",)}
        return cls(
            id=session.id, full_id=session.full_id, user=session.user, type=session.type, name=session.name,
            display=session.display, state=session.state, geometry=session.geometry, depth=session.depth,
            render=session.render, fullscreen=session.fullscreen, rootless=session.rootless,
            encrypted=session.encrypted, client_address=session.client_address, created=session.created,
            changed=session.changed, attached_before=session.ever_attached, agent_pid=session.agent_pid,
            failure=session.failure, node=session.node or session.server_name, program_pid=session.app_pid, options=options,
        )


#: What a listing says of a session whose cluster member is down.
LOST = "Lost"


@dataclass(frozen=True)
class Ready:
    """A session that waits for its client: what the client needs to connect."""

    view: SessionView
    cookie: str = field(repr=False)
    resumed: bool
    stream: StreamTarget | None  # None: an unencrypted session, the client connects itself


@dataclass(frozen=True)
class Listing:
    sessions: tuple[SessionView, ...]
    capacity_reached: bool


@dataclass(frozen=True)
class DesktopEntry:
    """One application a node publishes (a .desktop file): the lines X2Go's
    ``x2gogetapps`` passes on, in order, and its icon's bytes, which stood
    before ``lines[icon_at]`` (-1: no icon)."""

    path: str
    lines: tuple[str, ...]
    icon_at: int = -1
    icon: bytes = b""


@dataclass(frozen=True)
class FolderMount:
    """A client's folder in a session (X2Go's shared folders): where it is
    mounted on the session's machine, and whether it is; ``problem`` says why
    not, in words for the client and the log."""

    path: str
    kind: str
    mount_point: str
    mounted: bool
    problem: str = ""


@dataclass(frozen=True)
class ShadowTarget:
    """A display the caller may shadow (no cookie, no authority path)."""

    id: str
    owner: str
    display: int
    name: str
    type: str
    geometry: str = ""  # the watched screen's size (WxH) where known: a viewer may take it
    asks_owner: bool = False  # the policy has the owner asked first (a viewer's page says so while it waits)


@dataclass(frozen=True)
class UnknownSession:
    """A live agent in a session directory the store did not know at start."""

    id: str
    user: str
    display: int
    agent_pid: int


@dataclass(frozen=True)
class HeldDisplay:
    """A display number the node's sessions could use that somebody else
    holds (a squatter's X lock or abstract X socket, another X server)."""

    display: int
    users: tuple[str, ...]
    holds: tuple[str, ...]  # what they hold: "X lock /tmp/.X650-lock of pid 77", ...


@dataclass(frozen=True)
class ServiceStatus:
    """How the session manager stands (for the admin)."""

    draining: bool
    live: int
    unsaved_changes: int  # writes the store refused (a full disk), retried until it takes them
    unknown_sessions: tuple[UnknownSession, ...]
    held_displays: tuple[HeldDisplay, ...] = ()  # displays others hold (passed over by new sessions)


@dataclass(frozen=True)
class MemberView:
    """A cluster member as the admin sees it (``nxgate-admin nodes``):
    ``state`` by its last heartbeat and this gateway's link to it
    (:data:`nxgate.vocabulary.model.MEMBER_UP` and the others)."""

    name: str
    address: str
    roles: tuple[str, ...]
    state: str
    sessions: int
    load: float
    cpus: int
    free_memory: int
    started: float
    last_heartbeat: float
    drained: bool
    weight: float


@dataclass(frozen=True)
class SessionEvent:
    """A session changed state: what observers of the service hear
    (:attr:`nxgate.node.manager.SessionManager.observers`).  ``old`` is
    None when the session was just created; ``attached_before`` whether a
    client had been attached before this change (a RUNNING one is a resume)."""

    view: SessionView
    old: State | None
    attached_before: bool = False

    @property
    def new(self) -> State:
        return self.view.state


#: Called on the reactor after each change; it must not block or raise.
SessionObserver = Callable[[SessionEvent], None]


class Progress(str, enum.Enum):
    """Something a long operation wants the caller to know while it waits."""

    ASKING_OWNER = "asking_owner"


ProgressCallback = Callable[[Progress], None]
