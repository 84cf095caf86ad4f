"""Prometheus metrics (optional: nothing breaks without prometheus-client).

Counters and histograms live in a registry of their own; the session gauges
are read from the session manager when scraped, so they are never stale.
The endpoint is off unless ``[metrics] listen`` is set (localhost by default
when it is).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

try:
    import prometheus_client
    from prometheus_client.core import GaugeMetricFamily
except ImportError:  # pragma: no cover - the Debian package makes it optional
    prometheus_client = None

REGISTRY: Any = prometheus_client.CollectorRegistry() if prometheus_client else None

if prometheus_client is not None:
    LOGINS = prometheus_client.Counter("nxgate_logins", "NX and SSH password logins by result", ["result"],
                                       registry=REGISTRY)
    RELAYED = prometheus_client.Counter("nxgate_relayed_bytes", "Bytes relayed between clients and agents",
                                        ["direction"], registry=REGISTRY)
    # Bound once: looking a label up costs ~9x the increment, per relayed chunk.
    _RELAYED_UP = RELAYED.labels(direction="up")
    _RELAYED_DOWN = RELAYED.labels(direction="down")
    AGENT_START = prometheus_client.Histogram(
        "nxgate_agent_start_seconds", "Time from launching nxagent until it listens", registry=REGISTRY,
        buckets=(0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 2, 5, 10, 30))


def available() -> bool:
    return prometheus_client is not None


def login(result: str) -> None:
    if prometheus_client is not None:
        LOGINS.labels(result=result).inc()


def relayed_up(count: int) -> None:
    """Client to agent bytes; called per chunk, so kept to one increment."""
    if prometheus_client is not None:
        _RELAYED_UP.inc(count)


def relayed_down(count: int) -> None:
    """Agent to client bytes."""
    if prometheus_client is not None:
        _RELAYED_DOWN.inc(count)


def agent_started(seconds: float) -> None:
    if prometheus_client is not None:
        AGENT_START.observe(seconds)


class SessionCollector:
    """``nxgate_sessions{node, state, type}``: the node's live sessions right
    now; ``node`` names this member, so a cluster's scrapes add up (a member
    that only routes, ``manager`` None, has none)."""

    def __init__(self, manager: Any, node: str = "") -> None:
        self.manager = manager
        self.node = node

    def collect(self) -> Any:
        family = GaugeMetricFamily("nxgate_sessions", "Live sessions by node, state and type",
                                   labels=["node", "state", "type"])
        sessions = self.manager.sessions.values() if self.manager is not None else ()
        counts = Counter((s.state.value, s.type) for s in sessions if s.state.live)
        for (state, session_type), count in sorted(counts.items()):
            family.add_metric([self.node, state, session_type], count)
        yield family


class PreauthCollector:
    """``nxgate_unauthenticated_connections``, ``nxgate_open_files`` and
    ``nxgate_refused_connections_total{reason}`` from the doors' guard
    (nxgate.gateway.doors.guard), read when scraped."""

    def __init__(self, guard: Any, node: str = "") -> None:
        self.guard = guard
        self.node = node

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily

        now = self.guard.status()
        pending = GaugeMetricFamily("nxgate_unauthenticated_connections",
                                    "Connections not authenticated yet, over every door", labels=["node"])
        pending.add_metric([self.node], now["unauthenticated"])
        yield pending
        files = GaugeMetricFamily("nxgate_open_files", "Open file descriptors of the gateway", labels=["node"])
        files.add_metric([self.node], now["open_files"])
        yield files
        limit = GaugeMetricFamily("nxgate_open_files_limit", "The gateway's soft open file limit", labels=["node"])
        limit.add_metric([self.node], now["file_limit"])
        yield limit
        refused = CounterMetricFamily("nxgate_refused_connections", "New connections the doors closed at once",
                                      labels=["node", "reason"])
        for reason, count in sorted(now["refused"].items()):
            refused.add_metric([self.node, reason], count)
        yield refused


def resource(manager: Any, node: str = "", guard: Any = None) -> Any:
    """The Twisted web resource serving /metrics."""
    from prometheus_client.twisted import MetricsResource
    from twisted.web.resource import Resource

    REGISTRY.register(SessionCollector(manager, node))
    if guard is not None:
        REGISTRY.register(PreauthCollector(guard, node))
    root = Resource()
    root.putChild(b"metrics", MetricsResource(registry=REGISTRY))
    return root
