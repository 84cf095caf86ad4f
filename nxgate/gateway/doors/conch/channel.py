"""The seam between an SSH session channel of the built-in (Conch) door and
an NX conversation: :class:`ChannelTransport` is what the conversation
writes to, :class:`ChannelHandler` is what the channel feeds."""

from __future__ import annotations

from typing import Any

from twisted.internet import defer

from nxgate.gateway.doors.conch.server import NXSessionChannel
from nxgate.wire.service_tunnels import ServiceTunnels
from nxgate.gateway.doors.conversation import Conversation


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
    """The handler of an NX shell channel: feeds the conversation."""

    def __init__(self, conversation: Conversation, channel: NXSessionChannel, tunnel_sockets: str) -> None:
        """``tunnel_sockets``: the root-owned directory of the tunnels' Unix sockets."""
        self.conversation = conversation
        self.channel = channel
        self.tunnel_sockets = tunnel_sockets
        self.tunnels: ServiceTunnels | None = None

    def tunnel_request(self, data: bytes) -> defer.Deferred[int]:
        """The client asks for a session's folders or printers on SSH channels
        of their own (:mod:`nxgate.wire.tunnel_registry`)."""
        if self.tunnels is None:
            self.tunnels = ServiceTunnels(self.conversation.reactor, self.channel.conn, self._authorize,
                                          self.conversation.blocking, self.tunnel_sockets)
        return self.tunnels.request(data)

    async def _authorize(self, service: str, session_id: str) -> tuple[str, int]:
        """(user, uid) when this shell's NX login owns the session and it was
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
        return caller.user, caller.uid

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
        if self.tunnels is not None:
            self.tunnels.close()
        self.conversation.connection_lost()
