"""This machine's node, in process: the node interface over its session service.

The router (:class:`nxgate.gateway.router.Router`) reaches the sessions of
this machine through a :class:`LocalNode`, and so does every other gateway
of a cluster, through :class:`nxgate.wire.node_listener.NodeAMP`, which
answers with the same object.  So the node's own rules hold whichever way
a call arrives, on one box and on many:

* **The node owns the user.**  Every call's caller is looked up again here
  by name (:meth:`nxgate.users.UserDirectory.here`): the uid, gid and
  groups a gateway resolved are never trusted, and an account this machine
  does not have is refused with words for the user.
* **Thumbnails** are drawn here, as the session's user, from its own agent
  (:mod:`nxgate.node.thumbnails`), after the owner check of ``show``.
* **Events**: whoever subscribes hears every state change of this node's
  sessions (the D-Bus door of any member, through the router).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from nxgate.node import thumbnails
from nxgate.node.thumbnails import ThumbnailError
from nxgate.vocabulary.caller import Caller
from nxgate.vocabulary.errors import Kind, SessionError
from nxgate.vocabulary.model import Session
from nxgate.vocabulary.requests import RestoreRequest, ShadowRequest, ShareMount, StartRequest
from nxgate.vocabulary.results import (DesktopEntry, Listing, ProgressCallback, Ready, ServiceStatus, SessionEvent, SessionView,
                                     ShadowTarget)

Blocking = Callable[..., Awaitable[Any]]


class LocalNode:
    """:class:`nxgate.vocabulary.api.NodeAPI` of this machine.

    ``service``: its :class:`nxgate.node.service.SessionService`;
    ``users``: its :class:`nxgate.users.UserDirectory`; ``machine``:
    its name for refusals; ``blocking``: runs a blocking call off the reactor."""

    def __init__(self, service: Any, users: Any, machine: Callable[[], str], blocking: Blocking) -> None:
        self.service = service
        self.users = users
        self.machine = machine
        self.blocking = blocking

    def __repr__(self) -> str:
        return f"LocalNode({self.machine()!r})"

    @property
    def name(self) -> str:
        """Its sessions' ``node`` in the store ("" on a single box)."""
        return str(self.service.node_name)

    def session(self, session_id: str) -> Session | None:
        """This node's own record of a session it runs (its memory is
        authoritative: the store may lag by a write), or None."""
        return self.service.sessions.get(session_id)

    async def _here(self, caller: Caller) -> Caller:
        return await self.users.here(caller, self.machine())

    # ----------------------------------------------------- SessionAPI
    async def start(self, caller: Caller, request: StartRequest) -> Ready:
        return await self.service.start(await self._here(caller), request)

    async def start_for_later(self, caller: Caller, session_type: str, name: str) -> SessionView:
        return await self.service.start_for_later(await self._here(caller), session_type, name)

    async def restore(self, caller: Caller, request: RestoreRequest) -> Ready:
        return await self.service.restore(await self._here(caller), request)

    async def attach_shadow(self, caller: Caller, request: ShadowRequest,
                            progress: ProgressCallback = lambda progress: None) -> Ready:
        return await self.service.attach_shadow(await self._here(caller), request, progress)

    async def suspend(self, caller: Caller, session_id: str) -> SessionView:
        return await self.service.suspend(await self._here(caller), session_id)

    async def terminate(self, caller: Caller, session_id: str, reason: str = "user request") -> SessionView:
        return await self.service.terminate(await self._here(caller), session_id, reason)

    async def rename(self, caller: Caller, session_id: str, name: str) -> SessionView:
        return await self.service.rename(await self._here(caller), session_id, name)

    async def add_mount(self, caller: Caller, session_id: str, mount: ShareMount) -> bool:
        return await self.service.add_mount(await self._here(caller), session_id, mount)

    async def applications(self, caller: Caller, session_id: str) -> tuple[DesktopEntry, ...]:
        return await self.service.applications(await self._here(caller), session_id)

    async def run_application(self, caller: Caller, session_id: str, argv: tuple[str, ...]) -> bool:
        return await self.service.run_application(await self._here(caller), session_id, argv)

    async def list(self, caller: Caller) -> Listing:
        return await self.service.list(await self._here(caller))

    async def show(self, caller: Caller, session_id: str) -> SessionView:
        return await self.service.show(await self._here(caller), session_id)

    async def shadow_targets(self, caller: Caller) -> tuple[ShadowTarget, ...]:
        return await self.service.shadow_targets(await self._here(caller))

    async def status(self, caller: Caller) -> ServiceStatus:
        return await self.service.status(await self._here(caller))

    async def set_draining(self, caller: Caller, on: bool) -> bool:
        return await self.service.set_draining(await self._here(caller), on)

    # ------------------------------------------------ beyond the API
    async def thumbnail(self, caller: Caller, session_id: str) -> bytes:
        """A PNG of the session's screen, taken here as its user from its own
        agent (the only X server the picture may come from)."""
        view = await self.show(caller, session_id)  # the owner check
        session = self.service.sessions.get(view.id)
        if session is None or not session.agent_pid:
            raise SessionError(Kind.NOT_FOUND, f"Session {session_id} has no screen now.", session_id=session_id)
        try:
            entry = await self.users.lookup(session.user)
        except KeyError:
            raise SessionError(Kind.NOT_FOUND, f"Session {session_id} has no screen now.",
                               session_id=session_id) from None
        authority = self.service.layout.agent_files(view.id).authority
        try:
            return bytes(await self.blocking(thumbnails.thumbnail, session.display, authority, entry.pw_uid,
                                             entry.pw_gid, agent=(session.agent_pid, session.agent_started)))
        except (ThumbnailError, OSError) as error:
            raise SessionError(Kind.NOT_FOUND, f"No picture of session {session_id}: {error}",
                               session_id=session_id) from None

    def subscribe(self, observer: Callable[[SessionEvent], None]) -> Callable[[], None]:
        """``observer`` hears this node's session changes until the result is called."""
        self.service.observers.append(observer)

        def stop() -> None:
            if observer in self.service.observers:
                self.service.observers.remove(observer)
        return stop
