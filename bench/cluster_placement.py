#!/usr/bin/env python3
"""Placement decision time with 1,000 live sessions (issue 13: < 5 ms).

Two figures:

* pure: :func:`nxgate.gateway.placement.place` over the members' rows (3
  nodes as in the issue, and 100 to see how it grows); the live sessions
  are in the rows' counts, so this is what the formula itself costs;
* with the store: what a gateway's ``startsession`` pays before it asks the
  chosen node, :class:`nxgate.gateway.router.ClusterSessions` deciding
  against a private PostgreSQL server (tests/harness/databases.py) holding
  1,000 live sessions over 3 nodes: the user's live sessions counted over
  the cluster, the members read, the node chosen.  The node's own start is
  a stub that answers at once (its time is the session start, measured by
  bench/sessions.py).

    .venv/bin/python bench/cluster_placement.py [--sessions 1000] [--calls 300] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from twisted.internet import defer, task  # noqa: E402

from nxgate.gateway.placement import place  # noqa: E402
from nxgate.gateway.router import ClusterSessions  # noqa: E402
from nxgate.config import Config, StoreSection  # noqa: E402
from nxgate.host.files import StateLayout  # noqa: E402
from nxgate.threads import inline  # noqa: E402
from nxgate.vocabulary.caller import Caller  # noqa: E402
from nxgate.vocabulary.model import Member, Session, State  # noqa: E402
from nxgate.vocabulary.requests import DisplaySettings, StartRequest  # noqa: E402
from nxgate.store.factory import open_store  # noqa: E402
from tests.harness import databases  # noqa: E402

TARGET_MS = 5.0
GIB = 1024 ** 3
START = StartRequest(type="unix-default", name="bench", display=DisplaySettings(), encrypted=True, rootless=False)


def members(count: int, sessions: int, now: float) -> list[Member]:
    return [Member(name=f"node-{n}", address=f"10.0.0.{n + 1}:7022", roles=frozenset({"node"}), started=now - 100,
                   last_heartbeat=now, sessions=sessions // count + (n < sessions % count), load=0.3 * n, cpus=4,
                   free_memory=8 * GIB, weight=1.0 + (n % 2)) for n in range(count)]


def timed(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    return {"median_ms": statistics.median(values) * 1000, "p95_ms": values[max(int(len(values) * 0.95) - 1, 0)] * 1000,
            "calls": len(values)}


def pure(calls: int, sessions: int) -> dict:
    out = {}
    now = time.time()
    for count in (3, 100):
        rows = members(count, sessions, now)
        times = []
        for _ in range(calls):
            began = time.perf_counter()
            place(rows, now, 2.0)
            times.append(time.perf_counter() - began)
        out[f"{count}_nodes"] = timed(times)
    return out


class StubNode:
    """A node that starts nothing and answers at once."""

    async def start(self, caller, request):
        return None


async def with_store(reactor, store, calls: int, sessions: int) -> dict:
    now = reactor.seconds()
    for member in members(3, sessions, now):
        await store.heartbeat(member)
    for start in range(0, sessions, 200):
        await defer.gatherResults([store.insert(Session(
            id=f"{n:032X}", user=f"user{n // 5:04d}", uid=10000 + n // 5, gid=100, type="unix-xfce", name=f"d{n}",
            display=1000 + n % 300, server_name="bench", cookie=f"{n:032x}", state=State.RUNNING, created=now + n,
            changed=now + n, node=f"node-{n % 3}")) for n in range(start, min(start + 200, sessions))])
    config = Config()
    object.__setattr__(config, "cluster", SimpleNamespace(name="gw-1", roles=frozenset({"gateway"}), heartbeat=3600.0))
    stub = StubNode()
    api = ClusterSessions(reactor, lambda: config, None, store, lambda name, address: stub)
    times = []
    for i in range(calls):
        caller = Caller(f"user{(i * 37) % (sessions // 5):04d}", 1, 1)
        began = time.perf_counter()
        await api.start(caller, START)
        times.append(time.perf_counter() - began)
    return timed(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    figures: dict = {"target_ms": TARGET_MS, "sessions": args.sessions, "pure": pure(args.calls * 10, args.sessions)}
    for name, figure in figures["pure"].items():
        print(f"placement, pure, {name.replace('_', ' ')}: {figure['median_ms'] * 1000:.1f} µs median, "
              f"{figure['p95_ms'] * 1000:.1f} µs p95")
    server = None
    why = databases.PostgresServer.available()
    if why:
        figures["postgresql"] = {"skipped": why}
        print(f"with PostgreSQL: skipped ({why})")
    else:
        server = databases.PostgresServer()

        async def run(reactor) -> None:
            config = Config(store=StoreSection(url=server.start(), password_file=server.password_file))
            store = open_store(config, StateLayout(tempfile.gettempdir()), inline, reactor)
            try:
                figures["postgresql"] = await with_store(reactor, store, args.calls, args.sessions)
            finally:
                await store.close()

        try:
            task.react(lambda reactor: defer.ensureDeferred(run(reactor)), [])
        except SystemExit:
            pass
        finally:
            server.cleanup()
        figure = figures.get("postgresql", {})
        if "median_ms" in figure:
            print(f"placement with PostgreSQL reads ({args.sessions} live sessions, 3 nodes): "
                  f"{figure['median_ms']:.2f} ms median, {figure['p95_ms']:.2f} ms p95 (target < {TARGET_MS:g} ms): "
                  f"{'met' if figure['median_ms'] < TARGET_MS else 'NOT met'}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(figures, handle, indent=2)
            handle.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
