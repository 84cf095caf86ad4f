"""Is a remote desktop reachable?  A TCP connect and nothing more: the
gateway (root) never parses what a remote host sends; viewers do, as users."""

from __future__ import annotations

from typing import Any

from twisted.internet import defer, endpoints, protocol


class _Probe(protocol.Protocol):
    def connectionMade(self) -> None:
        self.transport.abortConnection()


async def unreachable(reactor: Any, host: str, port: int, timeout: float) -> str | None:
    """None if ``host:port`` accepts a TCP connection, else why not."""
    endpoint = endpoints.HostnameEndpoint(reactor, host.encode("idna") if not host.isascii() else host, port,
                                          timeout=timeout)
    attempt = endpoints.connectProtocol(endpoint, _Probe())
    attempt.addTimeout(timeout + 1, reactor)
    try:
        await attempt
    except defer.TimeoutError:
        return f"no answer within {timeout:g} seconds"
    except Exception as error:  # ConnectError and friends carry the reason
        text = getattr(error, "osError", None) or getattr(error, "message", None) or str(error)
        return str(text).strip() or type(error).__name__
    return None
