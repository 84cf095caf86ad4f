"""The listening doors' guard: the Twisted side of :mod:`nxgate.gateway.doors.preauth`.

One :class:`DoorGuard` per gateway; :meth:`DoorGuard.wrap` puts it in
front of a door's factory.  Every new connection is asked about first (a
refused one is closed before the door sees it, so it costs no log line,
no SSH key exchange, no TLS handshake), then has ``[server]
login_grace_time`` seconds from its first byte to authenticate.  What
"authenticated" means is the door's: it calls :func:`authenticated` with
its transport when

* SSH: user authentication succeeded (the ``ssh-connection`` service
  starts);
* cluster port: the TLS handshake is done and the certificate names a
  member;
* shell socket: nxgate-shell's hello came (the peer is the kernel's word;
  the NX login then has ``[auth] login_timeout``);
* HTTPS portal: the TLS handshake is done (plain HTTP on loopback: a first
  whole request head arrived); :class:`GuardedFactory` with ``http=True``
  sees either itself.  A browser keeps connections open that it made ahead
  of need (preconnects, up to six per host) and a login takes several
  requests, so no later point would do without refusing real browsers;
  what follows the handshake is the portal's own 60 s idle timeout's.  For
  the same reason the portal's connections earn no penalty.

The deadline is the reactor's, so the door needs no timer of its own.

After authentication a connection counts for its user instead
(:mod:`nxgate.gateway.doors.user_connections`): a door that learns whose
login a connection carries calls :func:`nxgate.wire.guarded.user_logged_in`,
and refuses the login with the words it gets back when that user holds as
many connections as one may; the connection's end releases it.
"""

from __future__ import annotations

import random
import resource
from collections.abc import Callable
from typing import Any

from twisted.internet import protocol
from twisted.internet.interfaces import IHandshakeListener, ILoggingContext, IProtocolNegotiationFactory
from twisted.logger import Logger
from twisted.protocols.policies import ProtocolWrapper, WrappingFactory
from zope.interface import alsoProvides, implementer

from nxgate import descriptors
from nxgate.descriptors import count_open_files
from nxgate.gateway.doors.preauth import Block, Ending, Limits, PreauthTable, Refusal
from nxgate.gateway.doors.user_connections import UserConnections

log = Logger()

#: Seconds a count of open descriptors is trusted, far from the limit and
#: near it (between samples every admitted connection counts as one more, so
#: the estimate only errs high; closes show at the next sample).
FD_SAMPLE_PERIOD = 0.5
FD_SAMPLE_NEAR = 0.05
#: Bytes of an HTTP request head looked at for its end.
MAX_HEAD = 65536


def raise_file_limit() -> tuple[int, int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard one; (before, after, hard).

    Twisted's reactor (epoll) has no use for the select()-era 1024, and a
    gateway relays many connections; the descriptor reserve is then taken
    from the larger limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            target = soft
    return soft, target, hard




def peer_host(address: Any) -> str:
    """The key of a connection's source: its IP, or the kind of a local socket."""
    host = getattr(address, "host", None)
    return str(host) if host else "local"


class _Refused(protocol.Protocol):
    """Stands in for a refused connection where a protocol must be returned
    (inside TLS): closed at once, unread."""

    def connectionMade(self) -> None:
        self.transport.abortConnection()


@implementer(IHandshakeListener)
class GuardedConnection(ProtocolWrapper):
    """One admitted connection: its deadline and its place in the table."""

    factory: GuardedFactory

    def __init__(self, factory: GuardedFactory, wrapped: Any, source: str | None) -> None:
        super().__init__(factory, wrapped)
        self.source = source  # None: not counted (the shell socket)
        self.passed = False
        self.displaced = False
        self.timed_out = False
        self.deadline: Any = None
        self.head = b""

    def makeConnection(self, transport: Any) -> None:
        guard = self.factory.guard
        self.deadline = guard.reactor.callLater(guard.limits.grace, self._expired)
        super().makeConnection(transport)

    def nxgate_user(self, user: str) -> str | None:
        """The connection carries ``user``'s login: None, or the words of the
        refusal when that user holds as many connections as one may."""
        return self.factory.guard.user_connections.take(user, self)

    def nxgate_authenticated(self) -> None:
        if self.passed:
            return
        self.passed = True
        self.head = b""
        if self.deadline is not None and self.deadline.active():
            self.deadline.cancel()
        self.factory.guard.ended(self.source, Ending.AUTHENTICATED, self)
        if self.factory.trusts and self.source is not None:
            self.factory.guard.table.trust(self.source)

    def handshakeCompleted(self) -> None:
        """Inside TLS (the portal): the handshake is done."""
        if self.factory.http:
            self.nxgate_authenticated()
        if IHandshakeListener.providedBy(self.wrappedProtocol):
            self.wrappedProtocol.handshakeCompleted()

    def dataReceived(self, data: bytes) -> None:
        if not self.passed and self.source is not None:
            self.factory.guard.table.active(self)  # not the idle one a newcomer may displace
        if self.factory.http and not self.passed:
            seen = self.head + data
            if b"\r\n\r\n" in seen:
                self.nxgate_authenticated()
            else:
                self.head = seen[-3:]
        super().dataReceived(data)

    def _expired(self) -> None:
        self.deadline = None
        if self.passed:
            return
        self.timed_out = True
        self.factory.guard.expired(self.source, self.factory.door, self.getPeer())
        self.transport.abortConnection()

    def displace(self) -> None:
        """The table gave this silent connection's place to a newcomer (it no longer counts there)."""
        self.passed = self.displaced = True
        if self.deadline is not None and self.deadline.active():
            self.deadline.cancel()
        if self.transport is not None:
            self.transport.abortConnection()

    def connectionLost(self, reason: Any) -> None:
        self.factory.guard.user_connections.release(self)
        if self.deadline is not None and self.deadline.active():
            self.deadline.cancel()
        if not self.passed:
            self.passed = True
            ending = Ending.DEADLINE if self.timed_out else Ending.NOAUTH
            self.factory.guard.ended(self.source, ending if self.factory.penalize else Ending.UNPENALIZED, self)
        super().connectionLost(reason)


class GuardedFactory(WrappingFactory):
    """A door's factory behind the guard (see :meth:`DoorGuard.wrap`)."""

    protocol = GuardedConnection
    noisy = False  # "Starting factory" once is the door's own line

    def __init__(self, guard: DoorGuard, wrapped: Any, door: str, *, http: bool = False,
                 counted: bool = True, inside_tls: bool = False, trusts: bool = False) -> None:
        """``trusts``: an authenticated connection exempts its address for
        a while (the cluster port: authenticated means a member's certificate)."""
        super().__init__(wrapped)
        self.trusts = trusts
        self.guard, self.door, self.http = guard, door, http
        self.counted, self.inside_tls = counted, inside_tls
        self.penalize = not http
        if IProtocolNegotiationFactory.providedBy(wrapped):  # TLS asks the factory it wraps for ALPN (h2)
            alsoProvides(self, IProtocolNegotiationFactory)

    def acceptableProtocols(self) -> list[bytes]:
        return self.wrappedFactory.acceptableProtocols()

    def logPrefix(self) -> str:
        """The door's own name, as before (the tests and admins look for
        e.g. "NXSSHFactory starting on 4022")."""
        wrapped = self.wrappedFactory
        return wrapped.logPrefix() if ILoggingContext.providedBy(wrapped) else type(wrapped).__name__

    def buildProtocol(self, addr: Any) -> Any:
        connection = self.protocol(self, None, None)  # its place in the table, before the door sees it
        source = self.guard.admit(addr, self.door, self.counted, self.penalize, connection)
        if source is False:
            return _Refused() if self.inside_tls else None  # None: the port closes the socket at once
        inner = self.wrappedFactory.buildProtocol(addr)
        if inner is None:
            if source is not None:
                self.guard.ended(source, Ending.AUTHENTICATED, connection)  # the door itself said no: no penalty
            return None
        connection.wrappedProtocol, connection.source = inner, source
        return connection


class DoorGuard:
    """The table, the descriptor count and the log lines, for every door."""

    def __init__(self, reactor: Any, limits: Limits, *, count_files: Callable[[], int] = count_open_files,
                 file_limit: int | Callable[[], int] = descriptors.file_limit,
                 chance: Callable[[], float] = random.random) -> None:
        """``file_limit``: the process's open file limit, read at each use
        (an admin may change it under a running gateway with ``prlimit``), or
        a fixed number (tests)."""
        self.reactor = reactor
        self.table = PreauthTable(limits, reactor.seconds, chance, self._displaced)
        self.count_files = count_files
        self._file_limit = file_limit if callable(file_limit) else (lambda: file_limit)
        self.user_connections = UserConnections(limits.per_user)
        self._files = 0
        self._files_at = float("-inf")
        self._flushed_at = reactor.seconds()
        self.refused_user_files = 0

    @property
    def limits(self) -> Limits:
        return self.table.limits

    @property
    def file_limit(self) -> int:
        """The open file limit now (``getrlimit``: a system call, no file)."""
        return self._file_limit()

    def configure(self, limits: Limits) -> None:
        """A reload: new connections are judged by the new limits."""
        self.table.limits = limits
        self.user_connections.limit = limits.per_user

    def wrap(self, factory: Any, door: str, **options: Any) -> GuardedFactory:
        return GuardedFactory(self, factory, door, **options)

    def open_files(self) -> int:
        """The descriptor count, sampled (a listing of /proc/self/fd costs
        ~0.5 ms at 1,000 files; a flood must not make every accept pay it)."""
        now = self.reactor.seconds()
        near = self._files >= self.file_limit - 2 * self.limits.fd_reserve
        if now - self._files_at >= (FD_SAMPLE_NEAR if near else FD_SAMPLE_PERIOD):
            self._files, self._files_at = self.count_files(), now
        return self._files

    def users_may_open(self, count: int = 1) -> bool:
        """Whether what logged-in users hold in the gateway (SFTP and scp
        writes, X2Go graphics links) may take ``count`` more descriptors.

        Users stop two reserves short of the limit: between them and the
        limit the doors keep one for new connections, and PAM, NSS, the
        store and the running sessions the other, so one user's files can
        neither lock others out at the door nor make their right password
        fail."""
        if self.open_files() + count > self.file_limit - 2 * self.limits.fd_reserve:
            self.refused_user_files += 1
            return False
        self._files += count  # as for an admitted connection: the estimate errs high until the next sample
        return True

    def admit(self, addr: Any, door: str, counted: bool, penalties: bool = True,
              connection: GuardedConnection | None = None) -> str | None | bool:
        """The source a new connection counts under, None when it is not
        counted, or False when it is refused (logged, rate-limited)."""
        host = peer_host(addr)
        source = self.table.source_of(host)
        files = self.open_files()
        if counted:
            refusal = self.table.admit(source, files, self.file_limit, penalties, door, connection)
        elif files >= self.file_limit - self.limits.fd_reserve:
            refusal = Refusal.FILES
            self.table.refused["files"] += 1
        else:
            refusal = None
        if refusal is None:
            self._files += 1
            self._flush()
            return source if counted else None
        counts = self.table.note(source, refusal.name.lower())
        if counts is not None:
            self._log_refusals(source, counts, door, refusal)
        self._flush()
        return False

    def ended(self, source: str | None, ending: Ending, connection: GuardedConnection | None = None) -> None:
        if source is None:
            return
        block = self.table.ended(source, ending, connection)
        if block is not None:
            self._log_block(block)

    def _displaced(self, connection: Any, source: str, block: Block | None) -> None:
        """The table gave ``connection``'s place to a newcomer: close it, and say so (once a minute)."""
        connection.displace()
        counts = self.table.note(source, "displaced")
        if counts is not None:
            self._log_refusals(source, counts, connection.factory.door, None)
        if block is not None:
            self._log_block(block)

    def expired(self, source: str | None, door: str, peer: Any) -> None:
        """A connection's deadline passed: logged like a refusal (once a
        minute per source), since a flood of them is a flood of lines."""
        key = source or peer_host(peer)
        counts = self.table.note(key, "deadline")
        if counts is not None:
            self._log_refusals(key, counts, door, None)

    def _flush(self, force: bool = False) -> None:
        """Now and then: the refusals whose once-a-minute line is due."""
        now = self.reactor.seconds()
        if now - self._flushed_at < 10.0 and not force:
            return
        self._flushed_at = now
        for source, counts in self.table.flush_log():
            self._log_refusals(source, counts, "any", None)

    def flush(self) -> None:
        """For a timer: the last burst of a flood that ended is logged too."""
        self._flush(force=True)

    def _log_refusals(self, source: str, counts: dict[str, int], door: str, latest: Refusal | None) -> None:
        displaced = counts.pop("displaced", 0)
        if displaced:
            log.info("closed {count} silent connection(s) from {source} (latest on the {door} door) to make room for"
                     " newcomers: that door was full and this address held the most there ([server] max_startups;"
                     " one line per address per minute)", count=displaced, source=source, door=door,
                     event="preauth_displaced")
        deadline = counts.pop("deadline", 0)
        if deadline:
            log.info("closed {count} connection(s) from {source} (latest on the {door} door): not authenticated"
                     " within {grace:g} s ([server] login_grace_time; one line per address per minute)",
                     count=deadline, source=source, door=door, grace=self.limits.grace, event="preauth_deadline")
        if not counts:
            return
        reasons = "; ".join(f"{count} x {Refusal[name.upper()].value}" for name, count in sorted(counts.items()))
        log.warn("refused {count} connection(s) from {source} (latest on the {door} door): {reasons}"
                 " ({setting}; one line per address per minute)", count=sum(counts.values()), source=source,
                 door=door, reasons=reasons, setting=_SETTINGS[latest] if latest else "see [server]",
                 open_files=self._files, file_limit=self.file_limit, unauthenticated=self.table.total,
                 event="preauth_refused")

    def _log_block(self, block: Block) -> None:
        log.warn("refusing {source} for {seconds:.0f} s: its connections keep ending before authentication"
                 " (block {strikes} in a row; [server] penalty_* settings)", source=block.source,
                 seconds=block.seconds, strikes=block.strikes, event="preauth_penalty")

    def status(self) -> dict[str, Any]:
        return {**self.table.status(), "open_files": self.count_files(), "file_limit": self.file_limit,
                "fd_reserve": self.limits.fd_reserve, "refused_user_files": self.refused_user_files,
                **self.user_connections.status(), "max_connections_per_user": self.user_connections.limit}


_SETTINGS: dict[Refusal | None, str] = {
    Refusal.FILES: "[server] fd_reserve",
    Refusal.PER_ADDRESS: "[server] max_startups_per_address",
    Refusal.FULL: "[server] max_startups",
    Refusal.EARLY_DROP: "[server] max_startups",
    Refusal.PENALTY: "[server] penalty_min/penalty_max",
}
