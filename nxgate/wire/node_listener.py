"""A node's listener on ``[cluster] listen``: the session API and the
session streams, for gateways only.

One TLS port carries both (:mod:`nxgate.wire.connection` checks the
peer's certificate first): a connection whose first byte is 0 speaks AMP
(:mod:`nxgate.wire.protocol`, an AMP box starts with a two-byte key
length below 256), one that starts with ``NXSTREAM `` asks for a stream.
One port means one firewall rule and one certificate check path; the
first-byte test costs nothing after that.

A stream's request is ``open_stream``'s arguments (the caller, the
session, the kind: :func:`nxgate.wire.protocol.read_stream_request`), and
it is answered by this machine's node exactly as the router here would
have it answered (:meth:`nxgate.node.local.LocalNode.open_stream`: the
caller resolved again on this machine, the owner checked, the end picked
from the node's own session table, never from the wire).  Only members
with role gateway get this far, the same peers that may make any call of
the API for the users they authenticated; the agent itself still checks
the session cookie the client proxy must present, as on a single box.
"""

from __future__ import annotations

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
from nxgate.wire.splice import Splice, TransportEnd

log = Logger()

STREAM_HELLO = wire.STREAM_HELLO


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
class _SessionEnd(protocol.Protocol):
    """The session's end of a stream (the stream the node opened): its events go to the splice."""

    def __init__(self, stream: NodeStream) -> None:
        self.stream = stream

    def connectionMade(self) -> None:
        self.stream.end_connected(self.transport)

    def dataReceived(self, data: bytes) -> None:
        if self.stream.splice is not None:
            self.stream.splice.received("session", data)

    def readConnectionLost(self) -> None:
        if self.stream.splice is not None:
            self.stream.splice.eof("session")  # TLS cannot half-close: the stream ends

    def writeConnectionLost(self) -> None:
        pass

    def connectionLost(self, reason: Any) -> None:
        self.stream.end_lost()


class NodeStream(protocol.Protocol):
    """A gateway's stream connection: its request, then TLS <-> the end the node opened.

    The gateway sends ``NXSTREAM`` and ``open_stream``'s arguments on one
    line; the node answers ``OK`` once the end is connected (then raw bytes
    both ways) or ``ERR`` with the refusal's kind and words."""

    def __init__(self, node: Any, member: str) -> None:
        self.node, self.member = node, member
        self.head = b""
        self.asked = False
        self.stream: Any = None
        self.end: Any = None
        self.splice: Splice | None = None
        self.pending: list[bytes] = []
        self.session_id = ""
        self.closed = False

    def dataReceived(self, data: bytes) -> None:
        if self.splice is not None:
            self.splice.received("gateway", data)
            return
        if self.asked:  # the end is not connected yet
            self.pending.append(data)
            return
        self.head += data
        if b"\n" not in self.head:
            if len(self.head) > wire.MAX_STREAM_REQUEST:
                self._refuse(SessionError(Kind.INVALID_REQUEST, "The stream request is too long."))
            return
        line, _, rest = self.head.partition(b"\n")
        self.head, self.asked = b"", True
        if rest:
            self.pending.append(rest)
        try:
            caller, self.session_id, kind = wire.read_stream_request(line)
        except (ValueError, TypeError, KeyError) as error:
            log.warn("gateway {member} sent a stream request this node cannot read: {error}", member=self.member,
                     error=str(error))
            self._refuse(SessionError(Kind.INVALID_REQUEST, "The node cannot read this stream request."))
            return
        self.transport.pauseProducing()  # nothing piles up before the end is there
        opened = defer.ensureDeferred(self.node.open_stream(caller, self.session_id, kind))
        opened.addCallbacks(self._opened, self._not_opened)

    def _opened(self, stream: Any) -> None:
        if self.closed:  # the gateway left meanwhile
            stream.close()
            return
        self.stream = stream
        stream.attach(_SessionEnd(self))

    def _not_opened(self, failure: Failure) -> None:
        if failure.check(SessionError):
            self._refuse(failure.value)
            return
        log.failure("a stream of session {id} for gateway {member} failed", failure, id=self.session_id,
                    member=self.member)
        self._refuse(SessionError(Kind.INTERNAL, "Internal error on the session node."))

    def end_connected(self, transport: Any) -> None:
        if self.closed:
            transport.loseConnection()
            return
        self.end = transport
        self.transport.write(b"OK\n")
        for chunk in self.pending:
            transport.write(chunk)
        self.pending.clear()
        self.splice = Splice(TransportEnd(self.transport), TransportEnd(transport), names=("gateway", "session"))
        self.transport.resumeProducing()
        # A session's own streams (its agent, a view) are few; its reverse connections (each print request, each
        # sound client) are many: those are for the debug log.
        say = log.info if self.stream.kind.number is None else log.debug
        say("relaying the {kind} stream of session {id} for gateway {member}", kind=str(self.stream.kind),
            id=self.session_id, member=self.member)

    def _refuse(self, error: SessionError) -> None:
        log.info("refused a stream of session {id} for gateway {member}: {why}", id=self.session_id or "-",
                 member=self.member, why=error.message)
        self.closed = True
        self.transport.write(wire.stream_refusal(error))
        self.transport.loseConnection()

    def end_lost(self) -> None:
        if not self.closed:
            self.closed = True
            if self.splice is not None:
                self.splice.lost("session")
            else:
                self.transport.loseConnection()
            log.debug("stream of session {id} closed by the session's end", id=self.session_id)

    def connectionLost(self, reason: Any) -> None:
        if not self.closed:
            self.closed = True
            if self.splice is not None:
                self.splice.lost("gateway")
                log.debug("stream of session {id} closed by gateway {member}", id=self.session_id, member=self.member)
            elif self.stream is not None:
                self.stream.close()


def choose(node: Any) -> Callable[[bytes, str], Any]:
    """AMP or a stream, by the first bytes (see the module's docstring)."""

    def pick(head: bytes, member: str) -> Any:
        if head[:1] == b"\x00":
            return NodeAMP(node, member)
        if head[:len(STREAM_HELLO)] == STREAM_HELLO[:len(head)]:
            return NodeStream(node, member) if len(head) >= len(STREAM_HELLO) else None
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

    def __init__(self, listen: str, tls: ClusterTLS, node: Any, authorize: Callable[[frozenset[str]], Any],
                 wrap: Callable[[Any], Any] | None = None) -> None:
        """``wrap``: what listens in front of the TLS factory (the gateway's
        guard of unauthenticated connections, nxgate.gateway.doors.guard)."""
        super().__init__()
        self.factory = GateFactory(authorize, choose(node), role="gateway")
        front = self.factory.tls_factory(tls)
        strports.service(listen, wrap(front) if wrap is not None else front).setServiceParent(self)
