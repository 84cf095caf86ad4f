#!/usr/bin/env python3
"""The session store under a listsession: ``live(user)`` with 10 000 stored
sessions, on SQLite, PostgreSQL and MariaDB (issue 13: < 20 ms on PostgreSQL).

Each back end is nxgate's own store behind the asynchronous interface, on a
private server started by tests/harness/databases.py (as ``nobody``, in a
temporary directory, on loopback), so a figure is the whole path a gateway
pays: a thread hop, the driver, the query, rows into Sessions, the hop back.
Also measured: the whole live list (what ``nxgate-admin sessions`` reads),
``admit`` (a start's count-and-insert under the cluster-wide lock),
``swap`` and a heartbeat; and the bare drivers' round trip for the same
query, for choosing a driver.

Why ``live(user)`` is "listsession through a gateway": a clustered gateway
answers ``listsession`` from the shared store (nxgate.gateway.router:
``store.live(user=...)``, merged with the members' states), so with 10 000
stored sessions this query is what grows; the NX round trip on top of it
(SSH channel, formatting) does not depend on the store and is measured by
bench/scale.py's listsession figures.  A single box answers from its own
memory and never reads the store for a listing.

    .venv/bin/python bench/store_listing.py [--sessions 10000] [--calls 300] [--json FILE] [--only sqlite,postgresql,mysql]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from twisted.internet import defer, task  # noqa: E402

from nxgate.config import Config, StoreSection  # noqa: E402
from nxgate.host.files import StateLayout  # noqa: E402
from nxgate.threads import inline  # noqa: E402
from nxgate.vocabulary.model import Member, Session, State  # noqa: E402
from nxgate.store.factory import open_store  # noqa: E402
from tests.harness import databases  # noqa: E402

USERS_EVERY = 10  # sessions per user: max_sessions_per_user's default


def session(n: int, state: State = State.SUSPENDED) -> Session:
    return Session(id=f"{n:032X}", user=f"user{n // USERS_EVERY:05d}", uid=10000 + n // USERS_EVERY, gid=100,
                   type="unix-xfce", name=f"desk {n}", display=1000 + n % 200, server_name="bench.example",
                   cookie=f"{n:032x}", state=state, created=1.7e9 + n, changed=1.7e9 + n, node=f"node-{n % 3}",
                   options={"display": {"geometry": "1280x800", "depth": 24}, "program": ["startxfce4"]})


def timed(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    return {"median_ms": statistics.median(values) * 1000, "p95_ms": values[int(len(values) * 0.95) - 1] * 1000,
            "calls": len(values)}


async def measure(store, calls: int, sessions: int) -> dict:
    began = time.perf_counter()
    batch = 200
    for start in range(0, sessions, batch):
        await defer.gatherResults([store.insert(session(n)) for n in range(start, min(start + batch, sessions))])
    fill_s = time.perf_counter() - began
    users = sessions // USERS_EVERY
    result: dict = {"sessions": sessions, "fill_s": fill_s}

    async def series(name: str, call, count: int = calls) -> None:
        times = []
        for i in range(count):
            t = time.perf_counter()
            await call(i)
            times.append(time.perf_counter() - t)
        result[name] = timed(times)

    async def live_user(i: int) -> None:
        listed = await store.live(f"user{(i * 7919) % users:05d}")
        assert len(listed) == USERS_EVERY, len(listed)

    await series("live_user", live_user)
    await series("live_all", lambda i: store.live(), max(10, calls // 20))

    async def admit(i: int) -> None:
        hit = await store.admit(session(sessions + i), 10, 1_000_000, 1_000_000)  # all three counts
        assert hit is None

    await series("admit", admit, max(20, calls // 5))
    stored = {}

    async def swap(i: int) -> None:
        current = stored.get(i % 50) or await store.get(session(i % 50).id)
        assert await store.swap(current.evolve(state=State.RUNNING if i % 2 else State.SUSPENDED))
        stored[i % 50] = current.evolve(revision=current.revision + 1)

    await series("swap", swap, max(20, calls // 5))

    async def heartbeat(i: int) -> None:
        await store.heartbeat(Member(name="node-0", address="10.0.0.1:7022", roles=frozenset({"node"}),
                                     started=1.7e9, last_heartbeat=1.7e9 + i, sessions=i, load=0.5, cpus=4,
                                     free_memory=2 ** 33))

    await series("heartbeat", heartbeat, max(20, calls // 5))
    return result


def bare_driver(kind: str, server, calls: int) -> dict:
    """The same user query through each importable driver, without nxgate."""
    from nxgate.store.location import parse

    location = parse(server.url, server.password_file)
    out = {}
    candidates = {"postgresql": ["psycopg2", "psycopg"], "mysql": ["pymysql", "MySQLdb"]}[kind]
    quote = '"' if kind == "postgresql" else "`"
    query = f"SELECT * FROM sessions WHERE {quote}user{quote}=%s AND {quote}state{quote} IN (%s,%s) ORDER BY created"
    for name in candidates:
        try:
            module = __import__(name)
        except ImportError:
            out[name] = "not installed"
            continue
        if name in ("psycopg2", "psycopg"):
            connection = module.connect(host=location.host, port=location.port, user=location.user,
                                        password=location.password, dbname=location.database)
        else:
            connection = module.connect(host=location.host, port=location.port, user=location.user,
                                        password=location.password, database=location.database)
        cursor = connection.cursor()
        times = []
        for i in range(calls):
            t = time.perf_counter()
            cursor.execute(query, (f"user{(i * 7919) % 1000:05d}", "suspended", "running"))
            cursor.fetchall()
            connection.commit()
            times.append(time.perf_counter() - t)
        connection.close()
        out[name] = timed(times)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10000)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--only", default="sqlite,postgresql,mysql")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    kinds = [k for k in args.only.split(",") if k]
    figures: dict = {"target_live_user_ms_postgresql": 20.0}
    servers = []

    async def run(reactor) -> None:
        for kind in kinds:
            server = None
            if kind == "sqlite":
                directory = tempfile.mkdtemp(prefix="nxgate-bench-store-")
                config = Config(store=StoreSection(url=f"sqlite:{directory}/nxgate.sqlite"))
            else:
                server_kind = {"postgresql": databases.PostgresServer, "mysql": databases.MariaDBServer}[kind]
                why = server_kind.available()
                if why:
                    figures[kind] = {"skipped": why}
                    print(f"{kind}: skipped ({why})")
                    continue
                server = server_kind()
                servers.append(server)
                config = Config(store=StoreSection(url=server.start(), password_file=server.password_file))
            store = open_store(config, StateLayout(tempfile.gettempdir()), inline, reactor)
            try:
                figures[kind] = await measure(store, args.calls, args.sessions)
            finally:
                await store.close()
            if server is not None:
                figures[kind]["bare_drivers"] = bare_driver(kind, server, args.calls)
            f = figures[kind]
            print(f"{kind:10} live(user) of {args.sessions} stored: {f['live_user']['median_ms']:.2f} ms median, "
                  f"{f['live_user']['p95_ms']:.2f} ms p95 | all {args.sessions} live: "
                  f"{f['live_all']['median_ms']:.0f} ms | admit {f['admit']['median_ms']:.2f} ms | swap "
                  f"{f['swap']['median_ms']:.2f} ms | heartbeat {f['heartbeat']['median_ms']:.2f} ms | "
                  f"fill {f['fill_s']:.1f} s", flush=True)
            for name, bare in f.get("bare_drivers", {}).items():
                shown = bare if isinstance(bare, str) else f"{bare['median_ms']:.2f} ms median"
                print(f"{'':10}   bare {name}: {shown}")

    try:
        task.react(lambda reactor: defer.ensureDeferred(run(reactor)), [])
    except SystemExit as exit_:
        code = exit_.code
    else:
        code = 0
    finally:
        for server in servers:
            server.cleanup()
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(figures, handle, indent=2)
            handle.write("\n")
    pg = figures.get("postgresql", {}).get("live_user", {}).get("median_ms")
    if pg is not None:
        print(f"PostgreSQL listsession-equivalent: {pg:.2f} ms (target < 20 ms): {'met' if pg < 20 else 'NOT met'}")
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
