"""A node's listener on ``[cluster] listen``: the session API and the
session streams, for gateways only.

One TLS port carries both (:mod:`nxgate.wire.connection` checks the
peer's certificate first): a connection whose first byte is 0 speaks AMP
(:mod:`nxgate.wire.protocol`, an AMP box starts with a two-byte key
length below 256), one that starts with ``NXSTREAM <id>\\n`` is a session's
stream.  One port means one firewall rule and one certificate check path;
the first-byte test costs nothing after that.

The stream needs no ticket besides the session id: only members with role
gateway get this far (the same peers that may ask for any session through
the API, acting for the users they authenticated), the node picks the
agent socket and its owner from its own session table, never from the
wire, and the agent itself still checks the session cookie the client
proxy must present, as on a single box.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable
from typing import Any

from twisted.application import service, strports
from twisted.internet import defer, protocol
from twisted.internet.interfaces import IHalfCloseableProtocol
from twisted.logger import Logger
from twisted.protocols import amp
from twisted.python.failure import Failure
from zope.interface import implementer

from nxgate.wire import protocol as wire
from nxgate.wire.connection import GateFactory
from nxgate.wire.tls import ClusterTLS
from nxgate.vocabulary.errors import Kind, SessionError
from nxgate.vocabulary.results import Progress, SessionEvent
from nxgate.wire import agentsocket
from nxgate.wire.splice import Splice, TransportEnd

log = Logger(namespace="nxgate.cluster.node")

STREAM_HELLO = b"NXSTREAM "
_STREAM_LINE = re.compile(rb"NXSTREAM ([A-Za-z0-9]{1,64})(?: (view))?\n")
#: What a stream reaches: the session's agent (no word), or "view": a browser
#: viewer's x11vnc that the node starts on the session's display for this
#: stream and stops with it (nxgate.clients.browser_viewer.BrowserViewers.open_live).
STREAM_KINDS = ("", "view")


class NodeAMP(amp.AMP):
    """One gateway's AMP connection, answered by this machine's node
    (:class:`nxgate.node.local.LocalNode`: the same object the router here
    calls, so a call from another gateway meets the same checks, and the
    caller is resolved again on this machine)."""

    def __init__(self, node: Any, member: str) -> None:
        super().__init__()
        self.node = node
        self.member = member
        self.unsubscribe: Callable[[], None] | None = None

    @wire.Subscribe.responder
    def subscribe(self) -> dict[str, Any]:
        """From now on, push this node's session changes to the gateway (once per connection)."""
        if self.unsubscribe is None:
            self.unsubscribe = self.node.subscribe(self._event)
            log.info("gateway {member} listens to this node's session events", member=self.member)
        return {}

    def _event(self, event: SessionEvent) -> None:
        if self.transport is not None:
            self.callRemote(wire.Event, event=wire.encode(event))

    def connectionLost(self, reason: Any) -> None:
        if self.unsubscribe is not None:
            self.unsubscribe()
            self.unsubscribe = None
        super().connectionLost(reason)

    @wire.Call.responder
    def call(self, call: int, method: str, arguments: Any) -> defer.Deferred[dict[str, Any]]:
        return defer.ensureDeferred(self._call(call, method, arguments)).addCallback(lambda out: {"outcome": out})

    async def _call(self, call: int, method: str, arguments: Any) -> dict[str, Any]:
        try:
            values = wire.decode_arguments(method, arguments)
        except (ValueError, TypeError, KeyError) as error:
            log.warn("gateway {member} sent a call this node cannot read: {method}: {error}", member=self.member,
                     method=method, error=str(error))
            return wire.encode_error(SessionError(Kind.INVALID_REQUEST, f"The node cannot read this request ({method})."))
        extra: dict[str, Any] = {}
        if method == "attach_shadow":
            extra["progress"] = lambda progress: self._progress(call, progress)
        try:
            result = await getattr(self.node, method)(*values, **extra)
        except SessionError as error:
            return wire.encode_error(error)
        except Exception:
            log.failure("{method} for gateway {member} failed", Failure(), method=method, member=self.member)
            return wire.encode_error(SessionError(Kind.INTERNAL, "Internal error on the session node."))
        return {"ok": wire.encode(result)}

    def _progress(self, call: int, progress: Progress) -> None:
        self.callRemote(wire.Progress, call=call, progress=progress.value)


@implementer(IHalfCloseableProtocol)
class _AgentEnd(protocol.Protocol):
    """The agent's socket: its events go to the stream's splice."""

    def __init__(self, stream: NodeStream) -> None:
        self.stream = stream

    def connectionMade(self) -> None:
        self.stream.agent_connected(self.transport)

    def dataReceived(self, data: bytes) -> None:
        if self.stream.splice is not None:
            self.stream.splice.received("agent", data)

    def readConnectionLost(self) -> None:
        if self.stream.splice is not None:
            self.stream.splice.eof("agent")  # TLS cannot half-close: the stream ends

    def writeConnectionLost(self) -> None:
        pass

    def connectionLost(self, reason: Any) -> None:
        self.stream.agent_lost()


class NodeStream(protocol.Protocol):
    """A gateway's stream for one session: TLS <-> the agent's socket.

    The gateway sends ``NXSTREAM <id>\\n``; the node answers ``OK\\n`` once
    the agent is connected (then raw bytes both ways) or ``ERR <text>\\n``."""

    def __init__(self, reactor: Any, sessions: Any, member: str,
                 viewers: Callable[[], Any] | None = None) -> None:
        self.reactor, self.sessions, self.member = reactor, sessions, member
        self.viewers = viewers
        self.viewer: Any = None
        self.kind = ""
        self.head = b""
        self.agent: Any = None
        self.splice: Splice | None = None
        self.pending: list[bytes] = []
        self.session_id = ""
        self.closed = False
        self.up = self.down = 0

    def dataReceived(self, data: bytes) -> None:
        if self.splice is not None:
            self.splice.received("gateway", data)
            return
        if self.session_id:  # the agent is not connected yet
            self.pending.append(data)
            return
        self.head += data
        if b"\n" not in self.head:
            if len(self.head) > 100:
                self._refuse("a stream request line that is too long")
            return
        line, _, rest = self.head.partition(b"\n")
        match = _STREAM_LINE.fullmatch(line + b"\n")
        if match is None:
            self._refuse("a malformed stream request")
            return
        self.session_id = match.group(1).decode()
        self.kind = (match.group(2) or b"").decode()
        if rest:
            self.pending.append(rest)
        if self.kind == "view":
            defer.ensureDeferred(self._open_view()).addErrback(self._view_failed)
            return
        self._open()

    def _open(self) -> None:
        session = self.sessions.sessions.get(self.session_id)
        target = self.sessions.stream_target(session) if session is not None and session.state.live else None
        if target is None:
            self._refuse(f"no live encrypted session {self.session_id} on this node")
            return
        self.transport.pauseProducing()  # nothing piles up before the agent is there
        agentsocket.connect_soon(self.reactor, target.path, target.uid, self._reached)

    async def _open_view(self) -> None:
        """A browser viewer of the session, for a gateway that checked its
        caller owns it (as for the agent's stream): its x11vnc, then the relay."""
        session = self.sessions.sessions.get(self.session_id)
        viewers = self.viewers() if self.viewers is not None else None
        if session is None or viewers is None or not viewers.shows_live(self.session_id):
            self._refuse(f"session {self.session_id} cannot be shown in a browser on this node")
            return
        self.transport.pauseProducing()
        self.viewer = await viewers.open_live(session.user, self.session_id)
        self.viewer.on_close = lambda why: self.agent_lost()
        if self.closed:
            self.viewer.close()
            return
        self._reach_view(self.reactor.seconds() + 10.0)

    def _reach_view(self, deadline: float) -> None:
        """Connect to the viewer's x11vnc as soon as it listens (every 20 ms: it takes a tenth of a second)."""
        if self.closed:
            return
        try:
            sock = agentsocket.connect(self.viewer.vnc_socket, self.viewer.uid)
        except (FileNotFoundError, ConnectionRefusedError) as error:
            if self.reactor.seconds() < deadline and all(self.viewer.alive().values()):
                self.reactor.callLater(0.02, self._reach_view, deadline)
            else:
                self._reached(None, str(error))
        except OSError as error:
            self._reached(None, str(error))
        else:
            self._reached(sock, "")
            self.reactor.callLater(1.0, self._nudge_view)

    def _nudge_view(self) -> None:
        if not self.closed and self.viewer is not None:
            defer.ensureDeferred(self.viewer.nudge_selection()).addErrback(
                lambda failure: log.failure("cannot nudge the clipboard of session {id}'s browser viewer", failure,
                                            id=self.session_id))

    def _view_failed(self, failure: Failure) -> None:
        if failure.check(SessionError):
            self._refuse(failure.value.message)
        else:
            log.failure("browser viewer of session {id} for gateway {member} failed", failure, id=self.session_id,
                        member=self.member)
            self._refuse("the browser viewer could not start (see the node's log)")

    def _reached(self, sock: socket.socket | None, error: str) -> None:
        if sock is None:
            self._refuse(f"cannot reach the agent of session {self.session_id}: {error}")
            return
        if self.closed:
            sock.close()
            return
        try:
            self.reactor.adoptStreamConnection(sock.fileno(), socket.AF_UNIX,
                                               protocol.Factory.forProtocol(lambda: _AgentEnd(self)))
        finally:
            sock.close()

    def agent_connected(self, transport: Any) -> None:
        if self.closed:
            transport.loseConnection()
            return
        self.agent = transport
        self.transport.write(b"OK\n")
        for chunk in self.pending:
            transport.write(chunk)
        self.pending.clear()
        self.splice = Splice(TransportEnd(self.transport), TransportEnd(transport), names=("gateway", "agent"))
        self.transport.resumeProducing()
        log.info("relaying the stream of session {id} for gateway {member}", id=self.session_id, member=self.member)

    def _refuse(self, why: str) -> None:
        log.warn("refused a stream for gateway {member}: {why}", member=self.member, why=why)
        self.closed = True
        self._end_viewer()
        self.transport.write(b"ERR " + why.encode("utf-8", "replace")[:200] + b"\n")
        self.transport.loseConnection()

    def _end_viewer(self) -> None:
        viewer, self.viewer = self.viewer, None
        if viewer is not None:
            viewer.on_close = None
            viewer.close()

    def agent_lost(self) -> None:
        self._end_viewer()
        if not self.closed:
            self.closed = True
            if self.splice is not None:
                self.splice.lost("agent")
            log.info("stream of session {id} closed by the agent", id=self.session_id)

    def connectionLost(self, reason: Any) -> None:
        self._end_viewer()
        if not self.closed:
            self.closed = True
            if self.splice is not None:
                self.splice.lost("gateway")
                log.info("stream of session {id} closed by gateway {member}", id=self.session_id, member=self.member)


def choose(reactor: Any, node: Any, viewers: Callable[[], Any] | None = None) -> Callable[[bytes, str], Any]:
    """AMP or a stream, by the first bytes (see the module's docstring);
    ``viewers`` gives the node's browser viewers (for ``view`` streams)."""
    sessions = node.service

    def pick(head: bytes, member: str) -> Any:
        if head[:1] == b"\x00":
            return NodeAMP(node, member)
        if head[:len(STREAM_HELLO)] == STREAM_HELLO[:len(head)]:
            return NodeStream(reactor, sessions, member, viewers) if len(head) >= len(STREAM_HELLO) else None
        return False
    return pick


def gateway_members(store: Any, this_member: str = "") -> Callable[[frozenset[str]], Any]:
    """The default check of who may use a node: a name in the certificate
    must be a member that the shared store lists with role gateway.

    A store without a member list (a build before the cluster store) can
    only tell that the CA signed the certificate: then the one name it
    carries is accepted, and that is logged once."""
    warned: list[bool] = []

    async def authorize(names: frozenset[str]) -> str | None:
        members = getattr(store, "members", None)
        if members is None:
            if not warned:
                warned.append(True)
                log.warn("the session store keeps no member list: any certificate of the cluster CA may use this"
                         " node")
            return next(iter(names)) if len(names) == 1 else None
        known = [m.name for m in await members() if m.name in names and "gateway" in m.roles]
        return known[0] if len(known) == 1 else None

    return lambda names: defer.ensureDeferred(authorize(names))


class NodeListener(service.MultiService):
    """``[cluster] listen`` with TLS, serving this machine's ``node`` to gateways."""

    def __init__(self, reactor: Any, listen: str, tls: ClusterTLS, node: Any,
                 authorize: Callable[[frozenset[str]], Any],
                 wrap: Callable[[Any], Any] | None = None, viewers: Callable[[], Any] | None = None) -> None:
        """``wrap``: what listens in front of the TLS factory (the gateway's
        guard of unauthenticated connections, nxgate.gateway.doors.guard)."""
        super().__init__()
        self.factory = GateFactory(authorize, choose(reactor, node, viewers), role="gateway")
        front = self.factory.tls_factory(tls)
        strports.service(listen, wrap(front) if wrap is not None else front).setServiceParent(self)
