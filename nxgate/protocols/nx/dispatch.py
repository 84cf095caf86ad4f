"""The NX commands of a logged-in client, carried out by the session manager.

This is the one place where the session layer's vocabulary becomes NX: it
parses a command's parameters into typed requests (:mod:`nxgate.protocols.nx.requests`),
calls the service (:class:`nxgate.vocabulary.api.SessionAPI`), and turns what
comes back into reply lines: a :class:`~nxgate.vocabulary.results.Ready` into
the 700..1006 block, a :class:`~nxgate.vocabulary.results.Listing` into the
``listsession`` table, a :class:`~nxgate.vocabulary.errors.SessionError` into an
``NX> 596``/``599`` error and a :class:`~nxgate.vocabulary.results.Progress`
into a status line.  The session layer never sees an NX code.
"""

from __future__ import annotations

from collections.abc import Callable

from nxgate.protocols.nx import errors, replies
from nxgate.protocols.nx.errors import NXError
from nxgate.protocols.nx.listing import DASHES, HEADER, ListingRow, format_session_list, session_options
from nxgate.protocols.nx.mounts import parse_addmount
from nxgate.protocols.nx.params import Params
from nxgate.protocols.nx.requests import restore_request, session_id, shadow_request, start_request
from nxgate.protocols.nx.server_dialogue import Reply
from nxgate.vocabulary.api import SessionAPI
from nxgate.vocabulary.caller import Caller
from nxgate.vocabulary.errors import ErrorKind, SessionError
from nxgate.vocabulary.results import Listing, Progress, Ready, ShadowTarget

#: The status line each kind of progress becomes.
PROGRESS_LINES = {
    Progress.ASKING_OWNER: "NX> 726 Asking user for authorization to attach to session",
}

#: Kinds whose message goes out without FreeNX's "Error: " in front (the
#: texts clients have always seen for them).
_BARE = frozenset({ErrorKind.LIMIT_REACHED, ErrorKind.ENCRYPTION_REQUIRED})


def as_nx(error: SessionError) -> NXError:
    """The NX error a client sees for ``error``: 599 for a reached limit,
    596 for everything else, always with the "Last operation failed" line."""
    code = errors.LIMIT_REACHED if error.kind is ErrorKind.LIMIT_REACHED else errors.SESSION_FAILED
    text = error.message if error.kind in _BARE else f"Error: {error.message}"
    return NXError(code, text, last_operation_failed=True)


def ready_reply(ready: Ready, caller: Caller) -> Reply:
    """The reply block that sends the client to its session."""
    view = ready.view
    lines = replies.session_ready(
        full_id=view.full_id, display=view.display, session_type=view.type, cookie=ready.cookie,
        proxy_ip="127.0.0.1" if view.encrypted else caller.local_address, encrypted=view.encrypted,
        status="resuming" if ready.resumed else "starting",
        services=tuple(view.options.get("services", ())),
    )
    return Reply(lines, ready.stream)


def _wanted(params: Params, name: str) -> set[str]:
    return {word.strip().lower() for word in params.get(name, "").split(",") if word.strip()}


def listing_reply(listing: Listing, caller: Caller, params: Params) -> Reply:
    """The ``listsession`` table, filtered by ``--status`` and ``--type``."""
    wanted_status, wanted_types = _wanted(params, "status"), _wanted(params, "type")
    rows = []
    for view in listing.sessions:
        status = view.status
        if status is None or (wanted_status and status.lower() not in wanted_status):
            continue
        if wanted_types and view.type not in wanted_types:
            continue
        rows.append(ListingRow(
            display=view.display, session_type=view.type, session_id=view.id,
            options=session_options(fullscreen=view.fullscreen, render=view.render, virtual_desktop=not view.rootless),
            depth=view.depth, screen=view.geometry, status=view.shown_status or status, name=view.name,
        ))
    return Reply(tuple(format_session_list(caller.user, rows, capacity_reached=listing.capacity_reached)))


def shadow_listing_reply(targets: tuple[ShadowTarget, ...], caller: Caller) -> Reply:
    """The shadowable displays, ending at the prompt (no 147/148 line)."""
    lines = [f"NX> {errors.SESSION_LIST} Session list of user '{caller.user}':", HEADER, DASHES]
    for target in targets:
        # OpenNX takes the last word of the name as the owner's name.
        lines.append(ListingRow(
            display=target.display, session_type=target.type, session_id=target.id,
            options=session_options(fullscreen=False, render=True, virtual_desktop=True),
            depth=24, screen="800x600", status="Running", name=f"{target.name} {target.owner}",
        ).row())
    lines.append("")
    return Reply(tuple(lines))


class NXDispatcher:
    """Carries out one NX command for a logged-in caller."""

    def __init__(self, router: SessionAPI) -> None:
        self.router = router

    async def execute(self, caller: Caller, command: str, params: Params,
                      progress: Callable[[str], None] = lambda line: None) -> Reply:
        """The reply to ``command``; raises NXError for what the client did wrong
        or what the service refused."""
        try:
            return await self._execute(caller, command, params, progress)
        except SessionError as error:
            raise as_nx(error) from None

    async def _execute(self, caller: Caller, command: str, params: Params,
                       progress: Callable[[str], None]) -> Reply:
        router = self.router
        if command == "listsession":
            if params.get("type", "").strip().lower().startswith("shadow"):
                return shadow_listing_reply(await router.shadow_targets(caller), caller)
            return listing_reply(await router.list(caller), caller, params)
        if command == "attachsession":
            request = shadow_request(params)
            return ready_reply(await router.attach_shadow(
                caller, request, lambda step: progress(PROGRESS_LINES[step])), caller)
        if command == "startsession":
            return ready_reply(await router.start(caller, start_request(params)), caller)
        if command == "restoresession":
            return ready_reply(await router.restore(caller, restore_request(params)), caller)
        if command == "terminate":
            view = await router.terminate(caller, session_id(params, "sessionid", "id"))
            return Reply(replies.terminated(view.id))
        if command == "suspend":
            view = await router.suspend(caller, session_id(params, "sessionid", "id"))
            return Reply(replies.suspended(view.id))
        if command == "addmount":
            sid, mount = parse_addmount(params)
            return Reply(replies.mount_added(await router.add_mount(caller, sid, mount)))
        raise NXError(errors.GENERIC_ERROR, f"ERROR: {command} is not available on this server",
                      last_operation_failed=True)
