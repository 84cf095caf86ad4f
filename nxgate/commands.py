"""The session commands of the NX shell, dispatched to their handlers."""

from __future__ import annotations

from twisted.internet import defer

from nxgate.conversation import Client
from nxgate.nx.errors import NXError
from nxgate.nx.listing import format_session_list
from nxgate.nx.params import Params
from nxgate.nx.shell import Reply


class SessionCommands:
    """Answers ``listsession`` and friends for one logged-in client."""

    def execute(self, client: Client, command: str, params: Params) -> defer.Deferred[Reply]:
        if command == "listsession":
            lines = format_session_list(client.user, [], capacity_reached=False)
            return defer.succeed(Reply(tuple(lines)))
        return defer.fail(NXError(500, f"ERROR: {command} is not available on this server", last_operation_failed=True))
