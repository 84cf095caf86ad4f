"""Starting RDP ("windows") and VNC sessions: an nxagent desktop whose
program is a viewer of the remote desktop, run as the user."""

from __future__ import annotations

import os
import signal
import sys

from twisted.logger import Logger

from nxgate.backends import nxagent, probe, remote
from nxgate.conversation import Client
from nxgate.nx.params import Params
from nxgate.nx.shell import Reply
from nxgate.session.manager import SessionManager
from nxgate.session.request import StartRequest

log = Logger(namespace="nxgate.session")


class RemoteSessions:
    def __init__(self, manager: SessionManager) -> None:
        self.manager = manager

    @property
    def config(self):  # type: ignore[no-untyped-def]
        return self.manager.config  # follows a reload

    async def start(self, client: Client, request: StartRequest, params: Params) -> Reply:
        desktop = remote.remote_desktop(request.type, params, self.config)
        missing = remote.missing_engine(desktop)
        if missing is not None:
            raise remote.refused(missing)
        why = await probe.unreachable(self.manager.reactor, desktop.host, desktop.port, min(
            5.0, self.config.remote.connect_timeout))
        if why is not None:
            log.info("{user} from {address}: remote desktop {target} unreachable: {why}", user=client.user,
                     address=client.address, target=desktop.target or desktop.address, why=why)
            raise remote.refused(f"Error: Cannot connect to the remote desktop "
                                 f"{desktop.target or desktop.address}: {why}.")
        viewer = remote.viewer_command(desktop, request.display, self.config, sys.executable)
        plan = nxagent.AgentPlan(
            mode="-D",
            program=viewer.argv,
            program_early=viewer.reports_status,
            attach_signal=signal.SIGUSR1 if viewer.reports_status else 0,
            program_env=(("PYTHONPATH", os.pathsep.join(sys.path)),) if viewer.reports_status else (),
        )
        session = self.manager.new_session(client, request.type, request.name, request.display, request.encrypted)
        session = session.evolve(options={"remote": {"protocol": desktop.protocol, "address": desktop.address,
                                                     "target": desktop.target, "engine": desktop.engine}})
        log.info("{user} from {address} opens {protocol} desktop {target} with the {engine} engine", user=client.user,
                 address=client.address, protocol=desktop.protocol.upper(), target=desktop.target or desktop.address,
                 engine=desktop.engine, audit="remote_start")
        return await self.manager.launch(client, session, request.display, plan, secret=viewer.stdin,
                                         judge=lambda status: remote.viewer_failure(desktop, status))
