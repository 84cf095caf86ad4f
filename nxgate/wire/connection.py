"""TLS connections between members whose identity is checked before any
byte of the conversation is read.

Both sides wrap the protocol that does the work (AMP, a stream relay) in a
gate: TLS is handshaken (OpenSSL has checked the certificate against the
cluster CA), then the gate checks the name (:mod:`nxgate.wire.tls`),
and only then does the inner protocol see its ``connectionMade``.  Bytes
that arrive before are held, so a peer that is refused never reaches the
session service.

* :func:`dial`: to the member ``name`` at ``address``; the certificate must
  name ``name``.
* :class:`GateFactory`: the listener; ``authorize`` maps the DNS names of
  a verified certificate to the member name it accepts (or None), and
  ``choose`` picks the inner protocol from the first bytes (AMP or a
  stream, see :mod:`nxgate.wire.node_listener`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from OpenSSL.SSL import Error as TLSError
from OpenSSL.SSL import WantReadError, ZeroReturnError
from twisted.internet import defer, protocol
from twisted.internet.abstract import isIPAddress, isIPv6Address
from twisted.internet.endpoints import HostnameEndpoint, TCP4ClientEndpoint, TCP6ClientEndpoint
from twisted.internet.interfaces import IHandshakeListener
from twisted.logger import Logger
from twisted.protocols.policies import ProtocolWrapper
from twisted.protocols.tls import TLSMemoryBIOFactory, TLSMemoryBIOProtocol
from twisted.python.failure import Failure
from zope.interface import implementer

from nxgate.wire import records
from nxgate.wire.heap import keep_freed_memory
from nxgate.wire.tls import ClusterTLS, PeerRefused, check_server, peer_names
from nxgate.wire.guarded import authenticated
from nxgate.wire.tcp import no_delay

log = Logger()

#: Seconds for TCP connect plus TLS handshake to another member.
CONNECT_TIMEOUT = 5.0
#: What a peer may send before it is known to be a member (bytes).
_EARLY_LIMIT = 64 * 1024
#: A connection's first request that comes later than this after its
#: member was checked has the member checked again first (seconds).
RECHECK_AFTER = 2.0

Authorize = Callable[[frozenset[str]], "defer.Deferred[str | None] | str | None"]
Choose = Callable[[bytes, str], "protocol.Protocol | None | bool"]


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` / ``[v6]:port`` -> (host, port)."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


class _CoalescingTLS(TLSMemoryBIOProtocol):
    """Twisted's TLS protocol, but one application write becomes one write
    of TLS records to TCP.

    Twisted encrypts a write 16 KiB at a time and hands each record to the
    TCP transport on its own (plus a slice copy each).  For a stream that
    writes the agent's 200 KiB reads, that was a dozen small writes per
    read; here the records go into OpenSSL's memory BIO one after the other
    and come out with one read.  Measured with bench/cluster_relay.py's
    plain rows: the node -> gateway direction went from ~0.41 to ~0.66
    GB/s.  Everything else (handshake, shutdown, buffering before the
    handshake, errors) is Twisted's; the same private names as its own
    ``_write``."""

    def _write(self, data: bytes) -> None:
        if self._lostTLSConnection:
            return
        view = memoryview(data)
        done = 0
        while done < len(data):  # one pass: member connections write whole (records.whole_writes)
            try:
                done += self._tlsConnection.send(view[done:])
            except WantReadError:
                self._bufferedWrite(data[done:])
                break
            except TLSError:
                self._tlsShutdownFinished(Failure())
                return
        try:
            records = self._tlsConnection.bio_read(len(data) + 32768)  # all of it: records add ~22 bytes per 16 KiB
        except WantReadError:
            return
        self.transport.write(records)

    def _flushReceiveBIO(self) -> None:
        """Twisted's, but all the records one TCP read completed are
        decrypted into one buffer and delivered as one piece
        (:func:`nxgate.wire.records.read_all`), not one ``recv`` each."""
        if not records.AVAILABLE:
            super()._flushReceiveBIO()
            return
        while not self._lostTLSConnection:
            try:
                data = records.read_all(self._tlsConnection)
            except WantReadError:
                break
            except ZeroReturnError:
                self._shutdownTLS()
                if self._tlsConnection is None:  # the connection ended inside (its lost() ran)
                    return
                self._tlsShutdownFinished(None)
            except TLSError:
                self._tlsShutdownFinished(Failure())
            else:
                if not self._aborted:
                    ProtocolWrapper.dataReceived(self, data)
            if self._tlsConnection is None:
                return
        self._flushSendBIO()

    def dataReceived(self, data: bytes) -> None:
        """What one TCP read decrypts to goes to the gate as one piece:
        Twisted hands over each 16 KiB record on its own, and a gateway
        relaying them into an SSH channel sent twice as many SSH packets
        as for a local agent (each with its MAC and its Python calls)."""
        gate = self.wrappedProtocol
        if not isinstance(gate, _Batching):
            super().dataReceived(data)
            return
        gate.batch_begin()
        try:
            super().dataReceived(data)
        finally:
            gate.batch_end()


class _TLSFactory(TLSMemoryBIOFactory):
    """Twisted's TLS factory with :class:`_CoalescingTLS`; a process that
    makes one relays member streams, so its ``malloc`` keeps the memory of
    the streams' buffers (:func:`nxgate.wire.heap.keep_freed_memory`)."""

    protocol = _CoalescingTLS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        keep_freed_memory()


def _peer(transport: Any) -> str:
    peer = transport.getPeer()
    return f"{getattr(peer, 'host', '?')}:{getattr(peer, 'port', '?')}"


def _describe(reason: Any) -> str:
    value = getattr(reason, "value", reason)
    return getattr(value, "args", None) and str(value.args[0]) or str(value) or type(value).__name__


class _Batching(protocol.Protocol):
    """A gate that can hold what the TLS layer delivers during one TCP read
    and pass it on joined (see :meth:`_CoalescingTLS.dataReceived`)."""

    _held: list[bytes] | None = None

    def batch_begin(self) -> None:
        self._held = []

    def batch_end(self) -> None:
        held, self._held = self._held, None
        if held:
            self.deliver(held[0] if len(held) == 1 else b"".join(held))

    def dataReceived(self, data: bytes) -> None:
        if self._held is not None:
            self._held.append(data)
        else:
            self.deliver(data)

    def connectionLost(self, reason: Any) -> None:
        self.batch_end()  # what came before the end goes first
        self.lost(reason)

    def deliver(self, data: bytes) -> None:
        raise NotImplementedError

    def lost(self, reason: Any) -> None:
        raise NotImplementedError


@implementer(IHandshakeListener)
class _ClientGate(_Batching):
    def __init__(self, inner: protocol.Protocol, name: str, ready: defer.Deferred[Any], tls: ClusterTLS) -> None:
        self.inner, self.name, self.ready, self.tls = inner, name, ready, tls
        self.open = False
        self.remembered = False

    def connectionMade(self) -> None:
        no_delay(self.transport)

    def handshakeCompleted(self) -> None:
        try:
            check_server(self.transport.getHandle(), self.name)
        except PeerRefused as refused:
            self.tls.forget(self.name)
            log.warn("refused cluster member at {peer}: {reason}", peer=_peer(self.transport),
                     member=self.name, reason=str(refused), event="cluster_peer_refused")
            self.transport.abortConnection()
            self._fail(ConnectionRefusedError(f"member {self.name}: {refused}"))
            return
        self.open = True
        self.inner.makeConnection(self.transport)
        ready, self.ready = self.ready, None
        if ready is not None:
            ready.callback(self.inner)

    def deliver(self, data: bytes) -> None:
        if self.open:
            if not self.remembered:  # the member's tickets came before its first bytes
                self.remembered = True
                self.tls.remember(self.name, self.transport.getHandle())
            self.inner.dataReceived(data)

    def _fail(self, error: Exception) -> None:
        ready, self.ready = self.ready, None
        if ready is not None:
            ready.errback(error)

    def lost(self, reason: Any) -> None:
        if self.open:
            self.open = False
            self.inner.connectionLost(reason)
        else:
            self._fail(ConnectionError(f"TLS with member {self.name} failed: {_describe(reason)}"))


def _endpoint(reactor: Any, host: str, port: int, timeout: float) -> Any:
    """An address as written needs no name lookup: HostnameEndpoint would
    still send it through getaddrinfo in the thread pool (a thread hand-off
    on every stream opening, milliseconds on a busy machine)."""
    if isIPAddress(host):
        return TCP4ClientEndpoint(reactor, host, port, timeout=timeout)
    if isIPv6Address(host):
        return TCP6ClientEndpoint(reactor, host, port, timeout=timeout)
    return HostnameEndpoint(reactor, host, port, timeout=timeout)


def dial(reactor: Any, tls: ClusterTLS, name: str, address: str, inner: protocol.Protocol,
         timeout: float = CONNECT_TIMEOUT) -> defer.Deferred[Any]:
    """Connect to member ``name`` at ``address``: fires with ``inner`` once
    it is connected to a peer whose certificate names ``name``."""
    host, port = split_address(address)
    gates: list[_ClientGate] = []

    def cancel(_: Any) -> None:  # ClientService stopping while it dials: nothing left open
        connected.cancel()
        for gate in gates:
            if gate.transport is not None:
                gate.transport.abortConnection()

    ready: defer.Deferred[Any] = defer.Deferred(cancel)

    def build() -> _ClientGate:
        gates.append(_ClientGate(inner, name, ready, tls))
        return gates[-1]

    factory = _TLSFactory(tls.client(name), True, protocol.Factory.forProtocol(build))
    connected = _endpoint(reactor, host, port, timeout).connect(factory)
    connected.addErrback(lambda failure: ready.called or ready.errback(failure))
    timer = reactor.callLater(timeout * 2, lambda: ready.called or ready.errback(
        TimeoutError(f"member {name} at {address} did not complete TLS in time")))
    ready.addBoth(lambda result: (timer.active() and timer.cancel(), result)[1])
    return ready


@implementer(IHandshakeListener)
class _ServerGate(_Batching):
    """One accepted connection: authorize the certificate, then hand over."""

    def __init__(self, factory: GateFactory) -> None:
        self.factory = factory
        self.early: list[bytes] = []
        self.member: str | None = None
        self.names: frozenset[str] = frozenset()
        self.authorized_at = 0.0
        self.checking = False
        self.inner: protocol.Protocol | None = None
        self.done = False

    def _peer(self) -> str:
        return _peer(self.transport)

    def connectionMade(self) -> None:
        no_delay(self.transport)

    def handshakeCompleted(self) -> None:
        self.names = peer_names(self.transport.getHandle())
        self._authorize()

    def _authorize(self) -> None:
        self.checking = True
        d = defer.maybeDeferred(self.factory.authorize, self.names)
        d.addCallbacks(lambda member: self._authorized(member, self.names), self._authorize_failed)

    def _authorize_failed(self, failure: Any) -> None:
        log.failure("checking a cluster peer failed", failure)
        self._refuse("its membership could not be checked", frozenset())

    def _refuse(self, reason: str, names: frozenset[str]) -> None:
        log.warn("refused cluster peer {peer}: {reason}", peer=self._peer(), reason=reason,
                 names=", ".join(sorted(names)) or "-", event="cluster_peer_refused")
        self.done = True
        self.transport.abortConnection()

    def _authorized(self, member: str | None, names: frozenset[str]) -> None:
        self.checking = False
        self.authorized_at = self.factory.clock()
        if self.done:
            return
        if member is None or (self.member is not None and member != self.member):
            self._refuse(f"its certificate names {', '.join(sorted(names)) or 'no DNS name'},"
                         f" not a member with role {self.factory.role}", names)
            return
        if self.member is not None:  # checked again before its first request: see deliver()
            self._choose()
            return
        self.member = member
        authenticated(self.transport)  # a verified member: no longer under [server] login_grace_time and caps
        log.debug("cluster member {member} connected from {peer}", member=member, peer=self._peer())
        self._choose()

    def deliver(self, data: bytes) -> None:
        if self.inner is not None:
            self.inner.dataReceived(data)
            return
        self.early.append(data)
        if self.member is not None and not self.checking:
            if self.factory.clock() - self.authorized_at > RECHECK_AFTER:
                # A connection a gateway kept ready (nxgate.wire.member_stream's spare) is asked
                # for a stream later: its member is checked again as of now, before it is served.
                self._authorize()
            else:
                self._choose()  # a known member's first bytes may come with more behind them (one TCP read)
        if self.inner is None and not self.done and sum(map(len, self.early)) > _EARLY_LIMIT:
            log.warn("cluster peer {peer} sent too much before saying what it wants", peer=self._peer())
            self.done = True
            self.transport.abortConnection()

    def _choose(self) -> None:
        head = b"".join(self.early)
        if not head or self.done:
            return
        inner = self.factory.choose(head, self.member or "")
        if inner is None:
            return  # needs more bytes
        if inner is False:
            log.warn("cluster member {member} at {peer} spoke an unknown protocol", member=self.member,
                     peer=self._peer())
            self.done = True
            self.transport.abortConnection()
            return
        self.inner = inner
        self.early.clear()
        inner.makeConnection(self.transport)
        inner.dataReceived(head)

    def lost(self, reason: Any) -> None:
        if self.inner is not None:
            self.inner.connectionLost(reason)
        elif self.member is None and not self.done:
            # The handshake failed (no certificate, another CA, expired):
            # OpenSSL's words; the verify callback logged the details.
            log.warn("cluster peer {peer} failed TLS: {reason}", peer=self._peer(), reason=_describe(reason),
                     event="cluster_peer_refused")


class GateFactory(protocol.Factory):
    """Accepts members: wrap in :meth:`tls_factory` for the listener."""

    def __init__(self, authorize: Authorize, choose: Choose, role: str = "gateway",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.authorize, self.choose, self.role, self.clock = authorize, choose, role, clock

    def buildProtocol(self, addr: Any) -> _ServerGate:
        gate = _ServerGate(self)
        gate.factory = self
        return gate

    def tls_factory(self, tls: ClusterTLS) -> TLSMemoryBIOFactory:
        return _TLSFactory(tls.server(), False, self)
