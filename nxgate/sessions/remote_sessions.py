"""Starting RDP ("windows") and VNC sessions: an nxagent desktop whose
program is a viewer of the remote desktop, run as the user."""

from __future__ import annotations

import os
import signal
import sys
from typing import TYPE_CHECKING

from twisted.logger import Logger

from nxgate.backends import nxagent, probe, remote
from nxgate.sessions.caller import Caller
from nxgate.sessions.errors import Kind, SessionError
from nxgate.sessions.requests import StartRequest
from nxgate.sessions.results import Ready

if TYPE_CHECKING:
    from nxgate.sessions.service import SessionService

log = Logger(namespace="nxgate.session")

#: The session types that are a remote desktop (the manager routes them here).
PROTOCOLS = tuple(remote.PROTOCOLS)


class RemoteSessions:
    def __init__(self, manager: SessionService) -> None:
        self.manager = manager

    @property
    def config(self):  # type: ignore[no-untyped-def]
        return self.manager.config  # follows a reload

    async def start(self, caller: Caller, request: StartRequest) -> Ready:
        desktop = remote.remote_desktop(request.type, request.remote, self.config)
        missing = remote.missing_engine(desktop)
        if missing is not None:
            raise SessionError(Kind.UNAVAILABLE, missing)
        why = await probe.unreachable(self.manager.reactor, desktop.host, desktop.port, min(
            5.0, self.config.remote.connect_timeout))
        if why is not None:
            log.info("{user} from {address}: remote desktop {target} unreachable: {why}", user=caller.user,
                     address=caller.address, target=desktop.target or desktop.address, why=why)
            raise SessionError(Kind.REMOTE_FAILED, f"Cannot connect to the remote desktop "
                                 f"{desktop.target or desktop.address}: {why}.")
        viewer = remote.viewer_command(desktop, request.display, self.config, sys.executable)
        plan = nxagent.AgentPlan(
            mode="-D",
            program=viewer.argv,
            program_early=viewer.reports_status,
            attach_signal=signal.SIGUSR1 if viewer.reports_status else 0,
            program_env=(("PYTHONPATH", os.pathsep.join(sys.path)),) if viewer.reports_status else (),
        )
        session = self.manager.new_session(caller, request.type, request.name, request.display, request.encrypted)
        session = session.evolve(options={"remote": {"protocol": desktop.protocol, "address": desktop.address,
                                                     "target": desktop.target, "engine": desktop.engine}})
        log.info("{user} from {address} opens {protocol} desktop {target} with the {engine} engine", user=caller.user,
                 address=caller.address, protocol=desktop.protocol.upper(), target=desktop.target or desktop.address,
                 engine=desktop.engine, audit="remote_start")
        return await self.manager.launch(caller, session, request.display, plan, secret=viewer.stdin,
                                         judge=lambda status: remote.viewer_failure(desktop, status))
