"""The session commands of the NX shell, dispatched to the session manager."""

from __future__ import annotations

from twisted.internet import defer
from twisted.logger import Logger

from nxgate.conversation import Client
from nxgate.backends import remote
from nxgate.nx import errors
from nxgate.nx.errors import NXError
from nxgate.nx.params import Params
from nxgate.nx.shell import Reply
from nxgate.session import request
from nxgate.session.manager import SessionManager
from nxgate.session.remote import RemoteSessions
from nxgate.shadow.service import ShadowService

log = Logger(namespace="nxgate.commands")


class SessionCommands:
    """Turns a parsed command into a manager call; validation errors become NX errors."""

    def __init__(self, manager: SessionManager, shadow: ShadowService) -> None:
        self.manager = manager
        self.shadow = shadow
        self.remote = RemoteSessions(manager)

    def execute(self, client: Client, command: str, params: Params) -> defer.Deferred[Reply]:
        return defer.ensureDeferred(self._execute(client, command, params))

    async def _execute(self, client: Client, command: str, params: Params) -> Reply:
        manager = self.manager
        if command == "listsession":
            if params.get("type", "").strip().lower().startswith("shadow"):
                return self.shadow.list(client)
            return manager.list(client, params)
        if command == "attachsession":
            return await self.shadow.attach(client, params)
        if command == "startsession":
            start = request.start_request(params)
            if start.ignored:
                log.info("startsession of {user} from {address}: ignored {ignored!r} (the server chooses the"
                         " session id and display)", user=client.user, address=client.address,
                         ignored=dict(start.ignored))
            if start.type in remote.PROTOCOLS:
                return await self.remote.start(client, start, params)
            return await manager.start(client, start)
        if command == "restoresession":
            session_id = request.session_id(params, "id", "restore", "sessionid")
            settings = request.display_settings(params)
            encrypted = params.get("encryption", "1").strip() != "0"
            return await manager.restore(client, session_id, settings, encrypted)
        if command == "terminate":
            return await manager.terminate(client, request.session_id(params, "sessionid", "id"))
        if command == "suspend":
            return await manager.suspend(client, request.session_id(params, "sessionid", "id"))
        raise NXError(errors.GENERIC_ERROR, f"ERROR: {command} is not available on this server",
                      last_operation_failed=True)
