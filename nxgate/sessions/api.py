"""The session service as front doors see it."""

from __future__ import annotations

from typing import Protocol

from nxgate.sessions.caller import Caller
from nxgate.sessions.requests import RestoreRequest, ShadowRequest, ShareMount, StartRequest
from nxgate.sessions.results import Listing, ProgressCallback, Ready, ServiceStatus, SessionView, ShadowTarget


class SessionAPI(Protocol):
    """Every call checks the caller may do it and raises
    :class:`nxgate.sessions.errors.SessionError` when not (a session of
    someone else is NOT_YOURS, with NOT_FOUND's words).  Implemented, for
    now, by :class:`nxgate.sessions.service.SessionService`."""

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

    async def list(self, caller: Caller) -> Listing: ...  # live sessions, oldest first; an admin's: everyone's

    async def show(self, caller: Caller, session_id: str) -> SessionView: ...

    async def shadow_targets(self, caller: Caller) -> tuple[ShadowTarget, ...]: ...

    async def status(self, caller: Caller) -> ServiceStatus: ...  # admin only

    async def set_draining(self, caller: Caller, on: bool) -> bool: ...  # admin only
