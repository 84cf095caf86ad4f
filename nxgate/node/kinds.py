"""Session kinds: what to start for a new session of a given type.

A kind looks at a start request and answers with a :class:`Launch` -- the
agent plan (mode, program, when the program starts), the options the
session record carries, and for a viewer its secret and the judge of its
first status line -- or refuses with a SessionError.  It never creates,
stores or starts anything itself: the session service allocates the
session (limits, display, id, cookie) and hands the plan to the life cycle.
That keeps a kind a small, testable piece that reaches nothing of the
service, and one place to add a new kind.

Two kinds start new sessions: desktops (``unix-*`` and the admin's own
types, :class:`DesktopKind`) and remote desktops (``windows``, ``vnc``:
:class:`RemoteDesktopKind`, an nxagent desktop whose program is a viewer).
Shadows attach to an existing display (:mod:`nxgate.node.shadow_sessions`)
and browser views are the node's viewers (:mod:`nxgate.node.browser_viewer`).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from twisted.logger import Logger

from nxgate.node.agents import nxagent, probe
from nxgate.node.agents import remote_desktop as remote
from nxgate.config import Config, SessionsSection
from nxgate.vocabulary.caller import Caller
from nxgate.vocabulary.errors import Kind, SessionError
from nxgate.node.programs import session_command
from nxgate.vocabulary.requests import PUBLISHED_TYPE, StartRequest

log = Logger()


@dataclass(frozen=True)
class Launch:
    """What a kind asks the node to start for one request."""

    plan: nxagent.AgentPlan
    options: dict[str, Any] = field(default_factory=dict)  # added to the session's options
    services: bool = False  # whether the client's sound, printing and folders apply
    secret: str | None = field(default=None, repr=False)  # the program's stdin (a viewer's password)
    judge: Callable[[str], SessionError | None] | None = None  # the program's first status line


class SessionKind(Protocol):
    def handles(self, session_type: str) -> bool: ...

    async def prepare(self, caller: Caller, request: StartRequest) -> Launch: ...


class DesktopKind:
    """A desktop or an application in nxagent (``-D``, or ``-R`` rootless)."""

    def __init__(self, config: Callable[[], Config], settings: Callable[[], SessionsSection]) -> None:
        self.config = config  # follows a reload
        self.settings = settings

    def handles(self, session_type: str) -> bool:
        return session_type not in remote.PROTOCOLS and not session_type.startswith("shadow")

    async def prepare(self, caller: Caller, request: StartRequest) -> Launch:
        settings = self.settings()
        if request.type == PUBLISHED_TYPE:
            # X2Go's published applications: rootless, no program of its own, kept without windows.
            return Launch(nxagent.AgentPlan(mode="-R", keep_without_windows=True), services=True)
        program = session_command(request, self.config().types, settings)
        if not request.encrypted and not settings.allow_unencrypted:
            raise SessionError(Kind.ENCRYPTION_REQUIRED, "Unencrypted sessions are not allowed.")
        return Launch(nxagent.AgentPlan(mode="-R" if request.rootless else "-D", program=program), services=True)


class RemoteDesktopKind:
    """An RDP or VNC desktop: nxagent with a viewer of the remote host as its
    program, run as the user; the viewer reports its login on its status
    line before the client is answered."""

    def __init__(self, reactor: Any, config: Callable[[], Config]) -> None:
        self.reactor = reactor
        self.config = config

    def handles(self, session_type: str) -> bool:
        return session_type in remote.PROTOCOLS

    async def prepare(self, caller: Caller, request: StartRequest) -> Launch:
        config = self.config()
        desktop = remote.remote_desktop(request.type, request.remote, config)
        missing = remote.missing_engine(desktop)
        if missing is not None:
            raise SessionError(Kind.UNAVAILABLE, missing)
        target = desktop.target or desktop.address
        why = await probe.unreachable(self.reactor, desktop.host, desktop.port,
                                      min(5.0, config.remote.connect_timeout))
        if why is not None:
            log.info("{user} from {address}: remote desktop {target} unreachable: {why}", user=caller.user,
                     address=caller.address, target=target, why=why)
            raise SessionError(Kind.REMOTE_FAILED, f"Cannot connect to the remote desktop {target}: {why}.")
        viewer = remote.viewer_command(desktop, request.display, config, sys.executable)
        plan = nxagent.AgentPlan(
            mode="-D",
            program=viewer.argv,
            program_early=viewer.reports_status,
            attach_signal=signal.SIGUSR1 if viewer.reports_status else 0,
            program_env=(("PYTHONPATH", os.pathsep.join(sys.path)),) if viewer.reports_status else (),
        )
        log.info("{user} from {address} opens {protocol} desktop {target} with the {engine} engine", user=caller.user,
                 address=caller.address, protocol=desktop.protocol.upper(), target=target, engine=desktop.engine,
                 audit="remote_start")
        return Launch(plan, options={"remote": {"protocol": desktop.protocol, "address": desktop.address,
                                                "target": desktop.target, "engine": desktop.engine}},
                      secret=viewer.stdin, judge=lambda status: remote.viewer_failure(desktop, status))


def kind_for(kinds: tuple[SessionKind, ...], session_type: str) -> SessionKind:
    """The first kind that handles ``session_type`` (a shadow type has none: it is attached, not started)."""
    for kind in kinds:
        if kind.handles(session_type):
            return kind
    raise SessionError(Kind.INVALID_REQUEST, f"Session type '{session_type}' is attached, not started.")
