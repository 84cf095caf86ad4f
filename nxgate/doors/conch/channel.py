"""The seam between an SSH session channel of the built-in (Conch) door and
an NX conversation: :class:`ChannelTransport` is what the conversation
writes to, :class:`ChannelHandler` is what the channel feeds."""

from __future__ import annotations

from nxgate.doors.conch.server import NXSessionChannel
from nxgate.doors.conversation import Conversation


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

    def __init__(self, conversation: Conversation, channel: NXSessionChannel) -> None:
        self.conversation = conversation
        self.channel = channel

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
        self.conversation.connection_lost()
