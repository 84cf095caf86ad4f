"""The seam between an SSH session channel of the built-in (Conch) door and
an NX conversation: :class:`ChannelTransport` is what the conversation
writes to, :class:`ChannelHandler` is what the channel feeds."""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.logger import Logger

from nxgate.gateway.doors.conch.server import NXSessionChannel
from nxgate.gateway.doors.conversation import Conversation
from nxgate.protocols import service_tunnel as tunnels
from nxgate.streams import reverse
from nxgate.streams.reverse_channel import MAX_PER_CONNECTION, send_back
from nxgate.streams.reverse_route import ReverseRoute
from nxgate.vocabulary.errors import SessionError

log = Logger()


class ChannelTransport:
    """Lets a conversation write to, and close, an SSH session channel."""

    def __init__(self, channel: NXSessionChannel) -> None:
        self.channel = channel

    def write(self, data: bytes) -> None:
        self.channel.write(data)

    def close(self) -> None:
        self.channel.finish(0)

    def pause_input(self) -> None:
        """Stop reading from the client's connection (the relay's agent is
        behind).  After ``bye`` the connection carries only this channel."""
        self.channel.conn.transport.transport.pauseProducing()

    def resume_input(self) -> None:
        self.channel.conn.transport.transport.resumeProducing()


class ChannelHandler:
    """The handler of an NX shell channel: feeds the conversation, and
    carries the session's printers and folders back to ``nxgate-client`` when
    it asks (:mod:`nxgate.protocols.service_tunnel`) as reverse streams from the
    session's node (:mod:`nxgate.streams.reverse`): one path on one box and
    for a session on another cluster member."""

    def __init__(self, conversation: Conversation, channel: NXSessionChannel) -> None:
        self.conversation = conversation
        self.channel = channel
        self.routes: dict[tuple[str, str], ReverseRoute] = {}
        self.closed = False

    def tunnel_request(self, data: bytes) -> defer.Deferred[int]:
        """The client asks for a session's folders or printers on SSH channels
        of their own: 1 granted (the session's node listens for them), 0 refused."""
        return defer.ensureDeferred(self._tunnel(data))

    async def _tunnel(self, data: bytes) -> int:
        try:
            service, session_id = tunnels.decode(data)
        except tunnels.TunnelRequestError as problem:
            log.info("refused a service tunnel request: {problem}", problem=str(problem))
            return 0
        caller = self.conversation.caller
        try:
            user = await self._authorize(service, session_id)
        except (PermissionError, SessionError) as problem:
            log.info("refused a {service} tunnel for session {id}: {problem}", service=service, id=session_id,
                     problem=getattr(problem, "message", None) or str(problem))
            return 0
        if self.closed or caller is None:
            return 0
        key = (service, session_id)
        if key in self.routes:
            return 1
        what = f"the {reverse.SERVICES[service].what} of session {session_id}"
        payload = tunnels.encode(service, session_id)

        def deliver(stream: Any) -> None:
            if not send_back(self.channel.conn, stream, tunnels.CHANNEL, what, payload):
                log.warn("session {id} of {user}: dropped a {service} connection: its nxgate-client's connection"
                         " carries {limit} such connections already", id=session_id, user=user, service=service,
                         limit=MAX_PER_CONNECTION)

        def ended(why: str) -> None:
            self.routes.pop(key, None)
            log.info("session {id} of {user}: {service} no longer goes back to its nxgate-client ({why})",
                     id=session_id, user=user, service=service, why=why)

        route = ReverseRoute(self.conversation.commands.service.open_stream, caller, session_id, service, deliver,
                             ended)
        self.routes[key] = route
        try:
            await route.open()
        except SessionError as refusal:
            self.routes.pop(key, None)
            log.info("refused a {service} tunnel for session {id}: {problem}", service=service, id=session_id,
                     problem=refusal.message)
            return 0
        if self.closed:
            route.close()
            return 0
        log.info("session {id} of {user}: {service} through its own SSH channel", id=session_id, user=user,
                 service=service)
        return 1

    async def _authorize(self, service: str, session_id: str) -> str:
        """The user when this shell's NX login owns the session and it was
        granted ``service``; else PermissionError (the service's refusals
        raise its own errors: not found, not yours)."""
        caller = self.conversation.caller
        if caller is None:
            raise PermissionError("no NX login on this channel yet")
        view: Any = await self.conversation.commands.service.show(caller, session_id)
        if view.user != caller.user:  # an admin too: a tunnel only into the caller's own session
            raise PermissionError(f"the session belongs to {view.user!r}, not {caller.user!r}")
        if service not in view.options.get("services", ()):
            raise PermissionError(f"the session was not granted {service}")
        return str(caller.user)

    def data_received(self, data: bytes) -> None:
        self.conversation.data_received(data)

    def eof_received(self) -> None:
        self.conversation.eof_received()

    def pause_output(self) -> None:
        """The client's SSH window is full: stop reading from the agent."""
        if self.conversation.relay is not None:
            self.conversation.relay.pause_agent()

    def resume_output(self) -> None:
        if self.conversation.relay is not None:
            self.conversation.relay.resume_agent()

    def connection_lost(self) -> None:
        self.closed = True
        for route in list(self.routes.values()):
            route.close()
        self.routes.clear()
        self.conversation.connection_lost()
