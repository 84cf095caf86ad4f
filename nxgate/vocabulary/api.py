"""The session API every door uses, and the node interface beneath it.

A door holds one :class:`SessionAPI`: the router
(:class:`nxgate.gateway.router.Router`), on a single box too, where it
routes over a cluster of one.  The router reaches each machine's sessions
through a :class:`NodeAPI`: this machine's in process
(:class:`nxgate.node.local.LocalNode`), another member's over the wire
(:class:`nxgate.wire.remote_node.RemoteNode`).  Both do the same checks in
the same place, the node, so one box and a cluster behave alike.

That holds for a session's bytes too: a door reaches them only with
:meth:`NodeAPI.open_stream` (the router has it as well, and routes it as it
routes every call about a session), never by a socket path of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from nxgate.vocabulary.caller import Caller
from nxgate.vocabulary.requests import FolderShares, RestoreRequest, ShadowRequest, ShareMount, StartRequest
from nxgate.vocabulary.results import (DesktopEntry, FolderMount, Listing, ProgressCallback, Ready, ServiceStatus, SessionEvent, SessionView,
                                     ShadowTarget)
from nxgate.vocabulary.streams import Stream, StreamKind


class SessionAPI(Protocol):
    """Every call checks the caller may do it and raises
    :class:`nxgate.vocabulary.errors.SessionError` when not (a session of
    someone else is NOT_YOURS, with NOT_FOUND's words).  Implemented, for
    the router, by every node, and by the node's session manager."""

    async def start(self, caller: Caller, request: StartRequest) -> Ready: ...

    async def start_for_later(self, caller: Caller, session_type: str, name: str) -> SessionView: ...

    async def restore(self, caller: Caller, request: RestoreRequest) -> Ready: ...

    async def attach_shadow(self, caller: Caller, request: ShadowRequest,
                            progress: ProgressCallback = lambda progress: None) -> Ready: ...

    async def suspend(self, caller: Caller, session_id: str) -> SessionView: ...  # a suspended one: no-op

    async def terminate(self, caller: Caller, session_id: str, reason: str = "user request") -> SessionView: ...

    async def rename(self, caller: Caller, session_id: str, name: str) -> SessionView: ...

    # A folder the client shares, mounted in the caller's session; False: sharing is off there.
    async def add_mount(self, caller: Caller, session_id: str, mount: ShareMount) -> bool: ...

    # X2Go's shared folders: mounted in the caller's session with sshfs back to its client (one result a folder),
    # unmounted (all, or the one of a client path; those that went), and those mounted now.
    async def mount_folders(self, caller: Caller, session_id: str, shares: FolderShares) -> tuple[FolderMount, ...]: ...

    async def unmount_folders(self, caller: Caller, session_id: str, path: str = "") -> tuple[FolderMount, ...]: ...

    async def folders(self, caller: Caller, session_id: str) -> tuple[FolderMount, ...]: ...

    # The applications the session's node publishes (its .desktop files), for the session's owner.
    async def applications(self, caller: Caller, session_id: str) -> tuple[DesktopEntry, ...]: ...

    # Start one of those applications (its Exec argv) in the caller's published-applications session.
    async def run_application(self, caller: Caller, session_id: str, argv: tuple[str, ...]) -> bool: ...

    async def list(self, caller: Caller) -> Listing: ...  # live sessions, oldest first; an admin's: everyone's

    async def show(self, caller: Caller, session_id: str) -> SessionView: ...

    async def shadow_targets(self, caller: Caller) -> tuple[ShadowTarget, ...]: ...

    async def status(self, caller: Caller) -> ServiceStatus: ...  # admin only

    async def set_draining(self, caller: Caller, on: bool) -> bool: ...  # admin only


class NodeAPI(SessionAPI, Protocol):
    """What a node answers beyond the session API: the things doors need
    that live on the machine running the session.  The coroutine methods
    travel over the members' wire (:mod:`nxgate.wire.protocol` reads
    them from here); :meth:`subscribe` is a push, carried by its own box,
    and :meth:`open_stream` by a connection of its own (its result is a
    connection, not a value)."""

    # One end of the session, connected (nxgate.vocabulary.streams): the owner checked, as for any call
    # (the ``view`` kind: the session's own user only); an unknown kind, a session that is not running,
    # or one whose end cannot be reached is a SessionError with words for the user.
    async def open_stream(self, caller: Caller, session_id: str, kind: StreamKind) -> Stream: ...

    # A PNG of the session's screen, drawn on its node as its user (owner or admin only).
    async def thumbnail(self, caller: Caller, session_id: str) -> bytes: ...

    # ``observer`` hears every state change of this node's sessions; the result stops it.
    def subscribe(self, observer: Callable[[SessionEvent], None]) -> Callable[[], None]: ...
