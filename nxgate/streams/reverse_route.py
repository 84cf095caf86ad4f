"""The gateway's end of a reverse listener: its route (see :mod:`nxgate.streams.reverse`).

A door that holds a client's SSH connection makes one :class:`ReverseRoute`
per session and service the client takes back: :meth:`ReverseRoute.open`
asks the session's node for the route (``open_stream`` through the router:
this machine's node, or another member's over TLS, one path), reads its
announcements, opens each announced connection as a stream of its own and
hands it to ``deliver``, which opens a channel to the client and splices
the two (or closes the stream).  Closing the route (the client's connection
went, it cancelled the forward) closes the node's listener with it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from twisted.internet import defer, protocol
from twisted.logger import Logger
from twisted.python.failure import Failure

from nxgate.streams import reverse
from nxgate.streams.reverse import RouteError
from nxgate.vocabulary.caller import Caller
from nxgate.vocabulary.errors import SessionError
from nxgate.vocabulary.streams import Stream, StreamKind

log = Logger()

OpenStream = Callable[[Caller, str, StreamKind], Awaitable[Stream]]


class ReverseRoute:
    """One session's ``service`` on its way back to one client.

    ``open_stream``: the router's (or any node interface's); ``deliver(stream)``:
    takes each connection's stream (attaches it or closes it); ``ended(why)``:
    called once when the route ends by itself (the node closed it: the
    session ended, a newer client took it over)."""

    def __init__(self, open_stream: OpenStream, caller: Caller, session_id: str, service: str,
                 deliver: Callable[[Stream], None], ended: Callable[[str], None] = lambda why: None) -> None:
        self.open_stream = open_stream
        self.caller = caller
        self.session_id = session_id
        self.service = reverse.SERVICES[service]
        self.deliver = deliver
        self.ended = ended
        self.transport: Any = None
        self.closed = False
        self.pending: list[bytes] = []  # settings to send once the route is open
        self.delivered = 0

    def __repr__(self) -> str:
        return f"ReverseRoute({self.session_id!r}, {self.service.word!r})"

    async def open(self) -> None:
        """Ask the node for the route; SessionError with its words if it will not."""
        stream = await self.open_stream(self.caller, self.session_id, reverse.listener_kind(self.service.word))
        if self.closed:
            stream.close()
            return
        stream.attach(_RouteProtocol(self))

    def send(self, name: str, value: bytes) -> None:
        """A setting for the session's side (``cookie``), now or once the route is open."""
        line = reverse.setting(name, value)
        if self.transport is not None:
            self.transport.write(line)
        elif not self.closed:
            self.pending = [*(kept for kept in self.pending if not kept.startswith(name.encode() + b" ")), line]

    def close(self) -> None:
        """The client's side went: the node's listener goes too."""
        if self.closed:
            return
        self.closed = True
        if self.transport is not None:
            self.transport.loseConnection()

    # ------------------------------------------------------------ internal
    def connected(self, transport: Any) -> None:
        self.transport = transport
        for line in self.pending:
            transport.write(line)
        self.pending = []

    def announced(self, number: int) -> None:
        taken = defer.ensureDeferred(self.open_stream(self.caller, self.session_id,
                                                      reverse.connection_kind(self.service.word, number)))
        taken.addCallbacks(self._taken, self._not_taken, errbackArgs=(number,))

    def _taken(self, stream: Stream) -> None:
        if self.closed:
            stream.close()
            return
        self.delivered += 1
        try:
            self.deliver(stream)
        except Exception:
            log.failure("session {id}: a {what} connection could not be sent to the client", id=self.session_id,
                        what=self.service.what)
            stream.close()

    def _not_taken(self, failure: Failure, number: int) -> None:
        if failure.check(SessionError):
            log.info("session {id}: {what} connection {number} could not be taken: {why}", id=self.session_id,
                     what=self.service.what, number=number, why=failure.value.message)
        else:
            log.failure("session {id}: {what} connection {number} could not be taken", failure, id=self.session_id,
                        what=self.service.what, number=number)

    def lost(self, why: str) -> None:
        self.transport = None
        if not self.closed:
            self.closed = True
            self.ended(why)


class _RouteProtocol(protocol.Protocol):
    def __init__(self, route: ReverseRoute) -> None:
        self.route = route
        self.lines = reverse.LineReader()
        self.why = "the node closed it"

    def connectionMade(self) -> None:
        self.route.connected(self.transport)

    def dataReceived(self, data: bytes) -> None:
        try:
            for line in self.lines.feed(data):
                self.route.announced(reverse.read_announcement(line))
        except RouteError as error:
            log.warn("session {id}: the node sent the {what} route {error}; closing it", id=self.route.session_id,
                     what=self.route.service.what, error=str(error))
            self.why = "the node sent a bad line"
            self.transport.loseConnection()

    def connectionLost(self, reason: Any = protocol.connectionDone) -> None:
        self.route.lost(self.why)
