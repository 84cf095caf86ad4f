"""The session API of another member, as a gateway uses it.

:class:`RemoteNode` implements :class:`nxgate.vocabulary.api.SessionAPI` by
sending every call over AMP (:mod:`nxgate.wire.protocol`) to the named
member's local session manager, over the mutually authenticated TLS of
:mod:`nxgate.wire.connection`.  Its answers and refusals are the
node's own (a SessionError keeps its kind and words).  A Ready's stream is
marked with the node's name and address (for the logs and listings: the
relay asks for the stream with ``open_stream``, which goes to the node on a
stream connection of its own, :mod:`nxgate.wire.member_stream`).

One connection per member, kept by Twisted's ``ClientService`` (see
:class:`RemoteNode`); a member that cannot be reached fails the call at
once with ``ErrorKind.UNAVAILABLE`` and a sentence naming it (``unreachable``:
nothing was asked, placement may try the next member), and the log says
why, once per outage.  The link's state (:attr:`RemoteNode.link_state`) is the
member's state for this gateway (:mod:`nxgate.gateway.membership`): a
member whose certificate is not from the cluster's CA still writes its
heartbeat into the shared database, but its link is refused.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

from OpenSSL import SSL
from twisted.application.internet import ClientService, backoffPolicy
from twisted.internet import defer, protocol
from twisted.internet.error import ConnectionClosed
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.internet.task import deferLater
from twisted.logger import Logger
from twisted.protocols import amp
from zope.interface import implementer

from nxgate.wire import protocol as wire
from nxgate.wire.connection import dial
from nxgate.wire.member_stream import RemoteStreams
from nxgate.wire.tls import ClusterTLS
from nxgate.vocabulary.caller import Caller
from nxgate.vocabulary.errors import ErrorKind, SessionError
from nxgate.vocabulary.model import MEMBER_CONNECTING, MEMBER_UP
from nxgate.vocabulary.requests import FolderShares, RestoreRequest, ShadowRequest, ShareMount, StartRequest
from nxgate.vocabulary.results import (DesktopEntry, FolderMount, Listing, Progress, ProgressCallback, Ready, ServiceStatus, SessionEvent,
                                     SessionView, ShadowTarget)
from nxgate.vocabulary.streams import Stream, StreamKind

log = Logger()

REFUSED_CERTIFICATE = "refused: certificate not from the cluster's CA"
REFUSED_OURS = "refused: it does not trust this gateway's certificate"
#: OpenSSL's words for a certificate this gateway did not verify, and the TLS alerts of a member that did not.
_NOT_VERIFIED = ("certificate verify failed",)
_NOT_TRUSTED = ("unknown ca", "bad certificate", "certificate unknown", "unsupported certificate")


def link_problem(message: str) -> str:
    """A failed link attempt (its error's text) as the member's state in ``nxgate-admin nodes``."""
    lowered = message.lower()
    if any(words in lowered for words in _NOT_VERIFIED):
        return REFUSED_CERTIFICATE
    if any(words in lowered for words in _NOT_TRUSTED):
        return REFUSED_OURS
    if "its certificate" in lowered:  # verified, but it names another member (nxgate.wire.tls.PeerRefused)
        return f"refused: {message.rpartition(': ')[2]}"
    return f"unreachable: {message}"


class _GatewayAMP(amp.AMP):
    """The gateway's end of one member connection: hears Progress boxes."""

    def __init__(self, node: RemoteNode) -> None:
        super().__init__()
        self.node = node

    @wire.Progress.responder
    def progress(self, call: int, progress: str) -> dict[str, Any]:
        callback = self.node.progress_callbacks.get(call)
        if callback is not None:
            try:
                callback(Progress(progress))
            except ValueError:
                log.warn("member {name} sent an unknown progress {progress!r}", name=self.node.name, progress=progress)
        return {}

    @wire.Event.responder
    def event(self, event: Any) -> dict[str, Any]:
        try:
            heard = wire.decode(SessionEvent, event)
        except (ValueError, TypeError, KeyError) as error:
            log.warn("member {name} sent an event this gateway cannot read: {error}", name=self.node.name,
                     error=str(error))
            return {}
        if self.node.listener is not None:
            self.node.listener(heard)
        return {}

    def connectionMade(self) -> None:
        super().connectionMade()
        self.node.connection = self

    def connectionLost(self, reason: Any) -> None:
        super().connectionLost(reason)
        self.node.lost(self, reason)


@implementer(IStreamClientEndpoint)
class _MemberEndpoint:
    """:func:`nxgate.wire.connection.dial` as the endpoint of the member
    link's ClientService: connected means TLS done and the certificate
    checked."""

    def __init__(self, node: RemoteNode) -> None:
        self.node = node

    def __repr__(self) -> str:  # in Twisted's "Scheduling retry ... to connect {endpoint}" line
        return f"cluster member {self.node.name} at {self.node.address}"

    def connect(self, factory: Any) -> defer.Deferred[Any]:
        node = self.node
        node.attempting = True
        connected = dial(node.reactor, node.tls, node.name, node.address, factory.buildProtocol(None))
        connected.addCallbacks(node._connected, node._not_connected)
        return connected


class RemoteNode:
    """Member ``name`` at ``address`` (``host:port``) as a SessionAPI.

    The link is Twisted's ``ClientService``: it dials when first needed,
    and after a break it dials again in the background (backing off) for a
    few attempts, then rests until the next call or heartbeat.  A call never
    waits for a back-off: if the link is down and no attempt is under way,
    it dials at once, and fails with ``unreachable`` when that attempt fails."""

    #: Background attempts after a break before the link rests (the
    #: gateway's heartbeat, ``keep_in_touch``, still dials every node that is up).
    RETRIES = 5

    def __init__(self, reactor: Any, tls: ClusterTLS, name: str, address: str,
                 listener: Callable[[SessionEvent], None] | None = None,
                 streams: RemoteStreams | None = None) -> None:
        """``listener``: hears the member's session events, from each connection on;
        ``streams``: opens its streams (one for all members: :class:`RemoteNodes`)."""
        self.reactor, self.tls, self.name, self.address = reactor, tls, name, address
        self.own_streams = streams is None
        self.streams = streams if streams is not None else RemoteStreams(reactor, tls)
        self.listener = listener
        self.connection: _GatewayAMP | None = None
        self.attempting = False
        self.failures = 0
        self.progress_callbacks: dict[int, ProgressCallback] = {}
        self.calls = itertools.count(1)
        #: When (this gateway's clock) the connection to the member broke or
        #: could not be made, the outage the log tells once; None while it
        #: works or was never needed.
        self.broken_at: float | None = None
        #: Why the link does not work (:func:`link_problem`), since it last failed or broke; "" while it works.
        self.problem = ""
        self.closing = False
        self.link = ClientService(_MemberEndpoint(self), protocol.Factory.forProtocol(lambda: _GatewayAMP(self)),
                                  retryPolicy=backoffPolicy(initialDelay=1.0, maxDelay=10.0), clock=reactor)

    def __repr__(self) -> str:
        return f"RemoteNode({self.name!r}, {self.address!r})"

    @property
    def link_state(self) -> str:
        """The link's state: up, the problem since it last failed (until it
        works again), or connecting (its first attempt is under way or to come)."""
        if self.connection is not None:
            return MEMBER_UP
        return self.problem or MEMBER_CONNECTING

    # ----------------------------------------------------- SessionAPI
    async def start(self, caller: Caller, request: StartRequest) -> Ready:
        return self._at_node(await self._call("start", caller, request))

    async def start_for_later(self, caller: Caller, session_type: str, name: str) -> SessionView:
        return await self._call("start_for_later", caller, session_type, name)

    async def restore(self, caller: Caller, request: RestoreRequest) -> Ready:
        return self._at_node(await self._call("restore", caller, request))

    async def attach_shadow(self, caller: Caller, request: ShadowRequest,
                            progress: ProgressCallback = lambda progress: None) -> Ready:
        return self._at_node(await self._call("attach_shadow", caller, request, progress=progress))

    async def suspend(self, caller: Caller, session_id: str) -> SessionView:
        return await self._call("suspend", caller, session_id)

    async def terminate(self, caller: Caller, session_id: str, reason: str = "user request") -> SessionView:
        return await self._call("terminate", caller, session_id, reason)

    async def rename(self, caller: Caller, session_id: str, name: str) -> SessionView:
        return await self._call("rename", caller, session_id, name)

    async def add_mount(self, caller: Caller, session_id: str, mount: ShareMount) -> bool:
        return await self._call("add_mount", caller, session_id, mount)

    async def mount_folders(self, caller: Caller, session_id: str, shares: FolderShares) -> tuple[FolderMount, ...]:
        return await self._call("mount_folders", caller, session_id, shares)

    async def unmount_folders(self, caller: Caller, session_id: str, path: str = "") -> tuple[FolderMount, ...]:
        return await self._call("unmount_folders", caller, session_id, path)

    async def folders(self, caller: Caller, session_id: str) -> tuple[FolderMount, ...]:
        return await self._call("folders", caller, session_id)

    async def applications(self, caller: Caller, session_id: str) -> tuple[DesktopEntry, ...]:
        return await self._call("applications", caller, session_id)

    async def run_application(self, caller: Caller, session_id: str, argv: tuple[str, ...]) -> bool:
        return await self._call("run_application", caller, session_id, argv)

    async def list(self, caller: Caller) -> Listing:
        return await self._call("list", caller)

    async def show(self, caller: Caller, session_id: str) -> SessionView:
        return await self._call("show", caller, session_id)

    async def shadow_targets(self, caller: Caller) -> tuple[ShadowTarget, ...]:
        return await self._call("shadow_targets", caller)

    async def status(self, caller: Caller) -> ServiceStatus:
        return await self._call("status", caller)

    async def set_draining(self, caller: Caller, on: bool) -> bool:
        return await self._call("set_draining", caller, on)

    async def thumbnail(self, caller: Caller, session_id: str) -> bytes:
        return await self._call("thumbnail", caller, session_id)

    async def open_stream(self, caller: Caller, session_id: str, kind: StreamKind) -> Stream:
        """On a stream connection of its own to the member (not the AMP link): see
        :mod:`nxgate.wire.member_stream`."""
        if self.closing:
            raise self._unavailable("this gateway is stopping", quiet=True)
        return await self.streams.open(self.name, self.address, caller, session_id, kind)

    def subscribe(self, observer: Callable[[SessionEvent], None]) -> Callable[[], None]:
        """``observer`` hears this member's session events from its next connection on."""
        self.listener = observer

        def stop() -> None:
            self.listener = None
        return stop

    async def connect(self) -> None:
        """Be connected (a gateway keeps in touch with every node, so that
        one whose process dies is seen at once; see :attr:`broken_at`).
        Never raises: a failure is in the log and in ``broken_at``."""
        try:
            await self._connection()
        except SessionError:
            pass

    # ------------------------------------------------------------ wire
    def _at_node(self, ready: Ready) -> Ready:
        if ready.stream is None:
            return ready
        return dataclasses.replace(ready, stream=dataclasses.replace(ready.stream, node=self.name,
                                                                     address=self.address))

    def _unavailable(self, why: str, asked: bool = False, quiet: bool = False) -> SessionError:
        if not quiet:
            log.warn("cluster member {name} at {address} cannot be reached: {why}", name=self.name,
                     address=self.address, why=why, event="cluster_member_unreachable")
        error = SessionError(ErrorKind.UNAVAILABLE, f"The session node {self.name} cannot be reached; try again later.")
        error.unreachable = not asked  # nothing was asked of it: placement may try the next node
        return error

    async def _call(self, method: str, *arguments: Any, progress: ProgressCallback | None = None) -> Any:
        try:
            encoded = wire.encode_arguments(method, arguments)
        except (TypeError, ValueError):  # a bug of this gateway, not a node that cannot be reached
            log.failure("{method} for member {name} could not be encoded", method=method, name=self.name)
            raise SessionError(ErrorKind.INTERNAL, "Internal error on this gateway.") from None
        connection = await self._connection()
        call = next(self.calls)
        if progress is not None:
            self.progress_callbacks[call] = progress
        try:
            answer = await connection.callRemote(wire.Call, call=call, method=method, arguments=encoded)
        except amp.RemoteAmpError as error:
            log.error("member {name} failed {method}: {error}", name=self.name, method=method, error=str(error))
            raise SessionError(ErrorKind.INTERNAL, "Internal error on the session node.") from None
        except (ConnectionClosed, SSL.Error, amp.ProtocolSwitched) as error:  # the connection broke during the call
            raise self._unavailable(f"{method}: {error}", asked=True) from None
        except Exception:
            log.failure("{method} for member {name} failed on this gateway", method=method, name=self.name)
            raise SessionError(ErrorKind.INTERNAL, "Internal error on this gateway.") from None
        finally:
            self.progress_callbacks.pop(call, None)
        try:
            return wire.decode_outcome(method, answer["outcome"])
        except (ValueError, TypeError, KeyError) as error:
            log.error("member {name} answered {method} with something this gateway cannot read: {error}",
                      name=self.name, method=method, error=str(error))
            raise SessionError(ErrorKind.INTERNAL, "Internal error: the session node's answer was unreadable.") from None

    async def _connection(self) -> _GatewayAMP:
        if self.connection is not None:
            return self.connection
        if self.closing:
            raise self._unavailable("this gateway is stopping", quiet=True)
        if not self.attempting:
            # Out of any transition of the link first (this call may come from
            # a callback of its last attempt or of the connection's end).
            await deferLater(self.reactor, 0, lambda: None)
            if self.connection is not None:
                return self.connection
            if not self.link.running:
                self.link.startService()
            elif not self.attempting:  # waiting out a back-off: this call dials now
                await self.link.stopService()
                self.link.startService()
        try:
            return await self.link.whenConnected(failAfterFailures=1)
        except Exception as error:  # the attempt's failure, logged once per outage by _not_connected
            raise self._unavailable(str(error) or type(error).__name__, quiet=True) from None

    def _connected(self, connection: Any) -> Any:
        self.attempting = False
        self.failures = 0
        self.broken_at = None
        self.problem = ""
        log.info("connected to cluster member {name} at {address}", name=self.name, address=self.address)
        if self.listener is not None:
            connection.callRemote(wire.Subscribe).addErrback(
                lambda failure: log.warn("member {name} will not send its session events: {why}", name=self.name,
                                         why=failure.getErrorMessage()))
        return connection

    def _not_connected(self, failure: Any) -> Any:
        self.attempting = False
        self.failures += 1
        problem, self.problem = self.problem, link_problem(failure.getErrorMessage())
        # Said once per outage (the link and the heartbeat try again), and when it turns into a refusal;
        # "connected" ends it.
        if self.broken_at is None or (self.problem != problem and self.problem.startswith("refused")):
            self.broken_at = self.broken_at or self.reactor.seconds()
            self._unavailable(self.problem if self.problem.startswith("refused") else failure.getErrorMessage())
        if self.failures >= self.RETRIES and not self.closing:
            self.reactor.callLater(0, self._rest)
        return failure

    def _rest(self) -> None:
        """Stop the background attempts (the next call or heartbeat dials)."""
        if self.connection is None and not self.attempting and self.link.running:
            self.link.stopService()

    def lost(self, connection: _GatewayAMP, reason: Any = None) -> None:
        """The connection broke: the next call dials again."""
        if self.connection is connection:
            self.connection = None
            if not self.closing:
                self.broken_at = self.reactor.seconds()
                # A member that refuses this gateway's certificate does so after the handshake (TLS 1.3).
                problem = link_problem(getattr(reason, "getErrorMessage", lambda: "")())
                self.problem = problem if problem.startswith("refused") else "unreachable: its connection closed"
            log.info("connection to cluster member {name} closed", name=self.name)

    def close(self) -> None:
        self.closing = True
        if self.link.running:
            self.link.stopService()
        if self.own_streams:
            self.streams.close()


class RemoteNodes:
    """One :class:`RemoteNode` per member, by name."""

    def __init__(self, config: Any, reactor: Any, tls: ClusterTLS | None = None,
                 listener: Callable[[SessionEvent], None] | None = None) -> None:
        """``listener``: hears every member's session events (the router's :meth:`heard`)."""
        self.reactor = reactor
        self.tls = tls or ClusterTLS.from_config(config.cluster)
        self.listener = listener
        self.nodes: dict[str, RemoteNode] = {}
        #: Every member's streams, with a spare connection kept to each (nxgate.wire.member_stream).
        self.streams = RemoteStreams(reactor, self.tls)

    def get(self, name: str, address: str) -> RemoteNode:
        """The member ``name``; a changed address (the member moved) starts afresh."""
        node = self.nodes.get(name)
        if node is None or node.address != address:
            if node is not None:
                node.close()
            node = self.nodes[name] = RemoteNode(self.reactor, self.tls, name, address, self.listener, self.streams)
        return node

    def link_state(self, name: str) -> str:
        """The state of this gateway's link to member ``name`` (connecting:
        not dialled yet).  Until it works again after a break or a refusal,
        the gateway treats the member as down: its sessions are listed as
        lost and new ones go elsewhere, at once, not three heartbeats later."""
        node = self.nodes.get(name)
        return MEMBER_CONNECTING if node is None else node.link_state

    def close(self) -> None:
        for node in self.nodes.values():
            node.close()
        self.streams.close()
