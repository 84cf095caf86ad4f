"""The session API of another member, as a gateway uses it.

:class:`RemoteNode` implements :class:`nxgate.sessions.api.SessionAPI` by
sending every call over AMP (:mod:`nxgate.cluster.protocol`) to the named
member's local session service, over the mutually authenticated TLS of
:mod:`nxgate.cluster.connection`.  Its answers and refusals are the
node's own (a SessionError keeps its kind and words).  A Ready's stream is
marked with the node's name and address, so the relay goes there
(:mod:`nxgate.cluster.stream`).

One connection per member, made at the first call and again at the next
call after it broke; a member that cannot be reached fails the call with
``Kind.UNAVAILABLE`` and a sentence naming it, and the log says why.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

from OpenSSL import SSL
from twisted.internet import defer
from twisted.internet.error import ConnectionClosed
from twisted.logger import Logger
from twisted.protocols import amp

from nxgate.cluster import protocol as wire
from nxgate.cluster.connection import dial
from nxgate.cluster.tls import ClusterTLS
from nxgate.sessions.caller import Caller
from nxgate.sessions.errors import Kind, SessionError
from nxgate.sessions.requests import RestoreRequest, ShadowRequest, ShareMount, StartRequest
from nxgate.sessions.results import (Listing, Progress, ProgressCallback, Ready, ServiceStatus, SessionEvent,
                                     SessionView, ShadowTarget)

log = Logger(namespace="nxgate.cluster.remote")


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

    def connectionLost(self, reason: Any) -> None:
        super().connectionLost(reason)
        self.node.lost(self)


class RemoteNode:
    """Member ``name`` at ``address`` (``host:port``) as a SessionAPI."""

    def __init__(self, reactor: Any, tls: ClusterTLS, name: str, address: str,
                 listener: Callable[[SessionEvent], None] | None = None) -> None:
        """``listener``: hears the member's session events, from each connection on."""
        self.reactor, self.tls, self.name, self.address = reactor, tls, name, address
        self.listener = listener
        self.connection: _GatewayAMP | None = None
        self.connecting: defer.Deferred[_GatewayAMP] | None = None
        self.waiting: list[defer.Deferred[_GatewayAMP]] = []
        self.progress_callbacks: dict[int, ProgressCallback] = {}
        self.calls = itertools.count(1)
        #: When (this gateway's clock) the connection to the member broke or
        #: could not be made; None while it works or was never needed.  A
        #: member killed is seen at once this way, heartbeats take three
        #: periods (see :meth:`RemoteNodes.broken`).
        self.broken_at: float | None = None
        self.closing = False

    def __repr__(self) -> str:
        return f"RemoteNode({self.name!r}, {self.address!r})"

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
        error = SessionError(Kind.UNAVAILABLE, f"The session node {self.name} cannot be reached; try again later.")
        error.unreachable = not asked  # nothing was asked of it: placement may try the next node
        return error

    async def _call(self, method: str, *arguments: Any, progress: ProgressCallback | None = None) -> Any:
        try:
            encoded = wire.encode_arguments(method, arguments)
        except (TypeError, ValueError):  # a bug of this gateway, not a node that cannot be reached
            log.failure("{method} for member {name} could not be encoded", method=method, name=self.name)
            raise SessionError(Kind.INTERNAL, "Internal error on this gateway.") from None
        connection = await self._connection()
        call = next(self.calls)
        if progress is not None:
            self.progress_callbacks[call] = progress
        try:
            answer = await connection.callRemote(wire.Call, call=call, method=method, arguments=encoded)
        except amp.RemoteAmpError as error:
            log.error("member {name} failed {method}: {error}", name=self.name, method=method, error=str(error))
            raise SessionError(Kind.INTERNAL, "Internal error on the session node.") from None
        except (ConnectionClosed, SSL.Error, amp.ProtocolSwitched) as error:  # the connection broke during the call
            raise self._unavailable(f"{method}: {error}", asked=True) from None
        except Exception:
            log.failure("{method} for member {name} failed on this gateway", method=method, name=self.name)
            raise SessionError(Kind.INTERNAL, "Internal error on this gateway.") from None
        finally:
            self.progress_callbacks.pop(call, None)
        try:
            return wire.decode_outcome(method, answer["outcome"])
        except (ValueError, TypeError, KeyError) as error:
            log.error("member {name} answered {method} with something this gateway cannot read: {error}",
                      name=self.name, method=method, error=str(error))
            raise SessionError(Kind.INTERNAL, "Internal error: the session node's answer was unreadable.") from None

    async def _connection(self) -> _GatewayAMP:
        if self.connection is not None:
            return self.connection
        waiter: defer.Deferred[_GatewayAMP] = defer.Deferred()
        self.waiting.append(waiter)
        if self.connecting is None:
            self.connecting = dial(self.reactor, self.tls, self.name, self.address, _GatewayAMP(self))
            self.connecting.addCallbacks(self._connected, self._not_connected)
        try:
            return await waiter
        except SessionError:
            raise
        except Exception as error:
            raise self._unavailable(str(error)) from None

    def _connected(self, connection: _GatewayAMP) -> None:
        self.connecting = None
        self.connection = connection
        self.broken_at = None
        log.info("connected to cluster member {name} at {address}", name=self.name, address=self.address)
        if self.listener is not None:
            connection.callRemote(wire.Subscribe).addErrback(
                lambda failure: log.warn("member {name} will not send its session events: {why}", name=self.name,
                                         why=failure.getErrorMessage()))
        waiting, self.waiting = self.waiting, []
        for waiter in waiting:
            waiter.callback(connection)

    def _not_connected(self, failure: Any) -> None:
        self.connecting = None
        # Said once per outage (the gateway tries again every heartbeat); "connected" ends it.
        quiet = self.broken_at is not None
        if self.broken_at is None:
            self.broken_at = self.reactor.seconds()
        waiting, self.waiting = self.waiting, []
        error = self._unavailable(failure.getErrorMessage(), quiet=quiet)
        for waiter in waiting:
            waiter.errback(error)

    def lost(self, connection: _GatewayAMP) -> None:
        """The connection broke: the next call dials again."""
        if self.connection is connection:
            self.connection = None
            if not self.closing:
                self.broken_at = self.reactor.seconds()
            log.info("connection to cluster member {name} closed", name=self.name)

    def close(self) -> None:
        self.closing = True
        if self.connection is not None:
            self.connection.transport.loseConnection()


class RemoteNodes:
    """One :class:`RemoteNode` per member, by name."""

    def __init__(self, config: Any, reactor: Any, tls: ClusterTLS | None = None,
                 listener: Callable[[SessionEvent], None] | None = None) -> None:
        """``listener``: hears every member's session events (the router's :meth:`heard`)."""
        self.reactor = reactor
        self.tls = tls or ClusterTLS.from_config(config.cluster)
        self.listener = listener
        self.nodes: dict[str, RemoteNode] = {}

    def get(self, name: str, address: str) -> RemoteNode:
        """The member ``name``; a changed address (the member moved) starts afresh."""
        node = self.nodes.get(name)
        if node is None or node.address != address:
            if node is not None:
                node.close()
            node = self.nodes[name] = RemoteNode(self.reactor, self.tls, name, address, self.listener)
        return node

    def broken(self, name: str) -> float | None:
        """When this gateway's connection to member ``name`` broke (None: it
        did not).  Until the member writes a heartbeat after that moment, the
        gateway treats it as down: its sessions are listed as lost and new
        ones go elsewhere at once, not three heartbeats later."""
        node = self.nodes.get(name)
        return None if node is None else node.broken_at

    def close(self) -> None:
        for node in self.nodes.values():
            node.close()
