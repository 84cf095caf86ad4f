"""``nxgate-client --print``: the client's end of the NX cups channel.

The session's cupsd sends jobs to the client's printers through the channel
(:mod:`nxgate.node.extras.printing`); the client's ``nxproxy -S cups=PORT``
connects each channel connection to PORT here, a loopback listener that
lets through only requests carrying the session's credential
(:mod:`nxgate.protocols.printgate`: another local user on the server who finds the
channel's port gets a 401) and relays them to the local print server
(``--print-server``: a CUPS at ``host[:port]`` or its Unix socket; by
default $CUPS_SERVER, else CUPS's own socket, else localhost:631).  The
listener goes when the client ends.
"""

from __future__ import annotations

import os
from typing import Any

from twisted.internet import protocol
from twisted.logger import Logger

from nxgate.protocols import printgate
from nxgate.wire.tcp import no_delay

log = Logger()

CUPS_SOCKET = "/run/cups/cups.sock"
CUPS_PORT = 631
CONNECT_TIMEOUT = 10


class PrintingError(Exception):
    pass


def default_server(environ: dict[str, str]) -> str:
    """Where CUPS's own clients would print: $CUPS_SERVER, else the local
    scheduler's socket, else localhost:631."""
    given = environ.get("CUPS_SERVER", "").strip()
    if given:
        return given
    return CUPS_SOCKET if os.path.exists(CUPS_SOCKET) else f"localhost:{CUPS_PORT}"


def parse_server(server: str) -> tuple[str, int] | str:
    """``/path`` (a Unix socket) or ``host[:port]`` → the path, or (host, port)."""
    if server.startswith("/"):
        return server
    host, sep, port = server.rpartition(":")
    if not sep or "]" in port:
        host, port = server, str(CUPS_PORT)
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise PrintingError(f"--print-server: {server!r} is not a socket path or host[:port]")
    return host, int(port)


class _Upstream(protocol.Protocol):
    def __init__(self, downstream: _GateProtocol) -> None:
        self.downstream = downstream

    def connectionMade(self) -> None:
        no_delay(self.transport)
        self.downstream.upstream_ready(self)

    def dataReceived(self, data: bytes) -> None:
        self.downstream.transport.write(data)

    def connectionLost(self, reason: Any = None) -> None:
        self.downstream.transport.loseConnection()


class _GateProtocol(protocol.Protocol):
    """One channel connection: checked by a :class:`printgate.Gate`, relayed
    to the print server once the first request passed."""

    factory: GateFactory

    def connectionMade(self) -> None:
        # IPP answers come in pieces: with Nagle's algorithm, the piece after a
        # first segment waited for the peer's delayed ACK (40 ms per request).
        no_delay(self.transport)
        self.gate = printgate.Gate(self.factory.session_cookie, host=self.factory.host_header,
                                   credential_required=not self.factory.tunnel)
        self.upstream: _Upstream | None = None
        self.connecting = False
        self.pending = b""

    def dataReceived(self, data: bytes) -> None:
        out = self.gate.feed(data)
        if out.refused:
            self.factory.refused += out.refused
        if out.to_client:
            self.transport.write(out.to_client)
        if out.to_server:
            if self.upstream is not None:
                self.upstream.transport.write(out.to_server)
            else:
                self.pending += out.to_server
                if not self.connecting:
                    self.connecting = True
                    self.factory.connect(self)
        if out.close:
            self.transport.loseConnection()

    def upstream_ready(self, upstream: _Upstream) -> None:
        self.upstream = upstream
        if self.pending:
            upstream.transport.write(self.pending)
            self.pending = b""

    def upstream_failed(self, failure: Any) -> None:
        log.warn("cannot reach the local print server: {error}", error=failure.getErrorMessage())
        self.transport.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        self.transport.loseConnection()

    def connectionLost(self, reason: Any = None) -> None:
        if self.upstream is not None:
            self.upstream.transport.loseConnection()


class GateFactory(protocol.ServerFactory):
    protocol = _GateProtocol

    noisy = False

    def __init__(self, reactor: Any, session_cookie: str, server: tuple[str, int] | str, tunnel: bool = False) -> None:
        self.reactor = reactor
        self.tunnel = tunnel  # for the session's own SSH channel (no credential: see nxgate.protocols.printgate)
        self.session_cookie = session_cookie
        self.server = server
        # The print server's own name: a CUPS refuses a Host it does not know
        # as one of its names (a remote one would refuse "localhost").
        if isinstance(server, str):
            self.host_header = "localhost"
        else:
            host = f"[{server[0]}]" if ":" in server[0] else server[0]
            self.host_header = f"{host}:{server[1]}"
        self.refused = 0

    def connect(self, downstream: _GateProtocol) -> None:
        # Imported here, on a print job's first connection: the endpoints
        # module brings TLS and HTTP modules with it (~30 ms), which every
        # nxgate-client run (--list, --suspend, ...) would pay at start.
        from twisted.internet.endpoints import HostnameEndpoint, UNIXClientEndpoint

        if isinstance(self.server, str):
            endpoint: Any = UNIXClientEndpoint(self.reactor, self.server, timeout=CONNECT_TIMEOUT)
        else:
            endpoint = HostnameEndpoint(self.reactor, self.server[0], self.server[1], timeout=CONNECT_TIMEOUT)
        d = endpoint.connect(protocol.Factory.forProtocol(lambda: _Upstream(downstream)))
        d.addErrback(downstream.upstream_failed)


class LocalPrinting:
    """The gates of one attachment, on 127.0.0.1 and free ports: one for the
    NX cups channel, one for the session's own SSH channel (its connections
    come only from the gateway's tunnel, see :mod:`nxgate.protocols.service_tunnel`)."""

    def __init__(self, reactor: Any, server: str) -> None:
        self.reactor = reactor
        self.server = parse_server(server)
        self.listener: Any = None
        self.tunnel_listener: Any = None
        self.factory: GateFactory | None = None
        self.port = 0
        self.tunnel_port = 0

    def open(self, session_cookie: str) -> int:
        """Listen for the channel; the port for nxproxy's ``cups=``."""
        self.factory = GateFactory(self.reactor, session_cookie, self.server)
        self.listener = self.reactor.listenTCP(0, self.factory, interface="127.0.0.1")
        self.port = int(self.listener.getHost().port)
        self.tunnel_listener = self.reactor.listenTCP(0, GateFactory(self.reactor, session_cookie, self.server,
                                                                     tunnel=True), interface="127.0.0.1")
        self.tunnel_port = int(self.tunnel_listener.getHost().port)
        return self.port

    def close(self) -> None:
        for listener in (self.listener, self.tunnel_listener):
            if listener is not None:
                listener.stopListening()
        self.listener = self.tunnel_listener = None
