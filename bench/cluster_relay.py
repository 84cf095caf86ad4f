#!/usr/bin/env python3
"""The cluster stream against the single-box relay (issue 13: >= 0.8x).

A session on another member is reached as gateway -> the node's
authenticated TLS stream endpoint -> the agent's local socket
(:mod:`nxgate.wire.member_stream`, :mod:`nxgate.wire.node_listener`).  This
measures that path and, in the same run and the same processes, the
single-box path (gateway -> the agent's socket), and prints the ratios:

* throughput up (client -> agent) and down (agent -> client, screen updates);
* the added latency: 1-byte round trips, p50/p99;
* opening a stream: from the client's ``bye`` (or request) until the agent's
  socket accepts (TCP_NODELAY on member connections took this from ~46 ms
  to a few);
* CPU seconds per GB of every process that relays.

Two kinds of rows:

* ``conch``: as the NX client does it, an OpenSSH ``ssh`` logs in to the real
  gateway (``twistd nxgate``) with the NX key, logs in, starts a session,
  and (as bench/relay.py does) this program SIGKILLs the session's nxagent
  and listens on its socket itself before ``bye``.  For the cluster row the
  gateway's stream target is that session on member ``bench-node-1``: a
  separate process running nxgate's own node listener (GateFactory + the
  NodeStream of nxgate.wire.node_listener, over the TLS of nxgate.wire.tls
  with certificates made by ``nxgate-admin cluster``), whose node opens
  just the sessions this benchmark hands it.  Routing a session to a
  node is issue 13's placement/routing work, not what is measured here: the
  gateway process runs with one hook (``Router.open_stream`` sends the
  streams listed in a routes file to the node's RemoteNode), everything
  after it is production code.
* ``plain``: no SSH. A small Twisted process relays a TCP client with
  nxgate's StreamRelay exactly as the Conch channel does (pausing each side
  when the other's buffer is full), to the local socket or through
  a RemoteNode's open_stream to the node: the cost of the cluster hop alone.

Needs root (creates Unix users, starts nxagent sessions).

    .venv/bin/python bench/cluster_relay.py [--size 512M] [--repeat 3] [--rounds 1000] [--json FILE]
        [--only conch,plain] [--profile DIR] [--pin]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
sys.path.insert(0, HERE)

NODE, GATEWAY = "bench-node-1", "bench-gw-1"
STREAM_BUFFER = 1024 * 1024


# ============================================================ child processes
def read_routes(path: str) -> dict[str, Any]:
    """The routes file the benchmark rewrites before each stream opens."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {}


def write_routes(path: str, routes: dict[str, Any]) -> None:
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        json.dump(routes, handle)
    os.replace(path + ".tmp", path)


def pki_files(pki: str, name: str) -> tuple[str, str, str]:
    return os.path.join(pki, "ca.pem"), os.path.join(pki, f"{name}.pem"), os.path.join(pki, f"{name}.key")


def name_process(name: str) -> None:
    """This process's name in /proc (comm), so that CPU is reported per role."""
    try:
        with open("/proc/self/comm", "w") as handle:
            handle.write(name[:15])
    except OSError:
        pass


def profiled(profile: str, run: Any) -> None:
    """``run()`` under cProfile, the stats written to ``profile`` at the end."""
    if not profile:
        run()
        return
    import cProfile

    profiler = cProfile.Profile()
    profiler.enable()
    try:
        run()
    finally:
        profiler.disable()
        profiler.dump_stats(profile)


def gateway_process(routes: str, twistd_args: list[str]) -> None:
    """``twistd nxgate`` whose streams for the sessions listed in ``routes``
    go to member ``NODE`` (the one hook; see the module's docstring)."""
    from nxgate.gateway.router import Router

    original = Router.open_stream

    async def open_stream(self: Any, caller: Any, session_id: str, kind: Any) -> Any:
        route = read_routes(routes).get(session_id)
        if route:
            return await self.remote(route["node"], route["address"]).open_stream(caller, session_id, kind)
        return await original(self, caller, session_id, kind)

    Router.open_stream = open_stream  # type: ignore[method-assign]
    from twisted.scripts.twistd import run

    name_process("bench-gateway")
    sys.argv = ["twistd", *twistd_args]
    run()


class RoutedNode:
    """A node as the stream listener asks it (``open_stream``): the sessions
    the benchmark listed, each running, its agent socket root's."""

    def __init__(self, reactor: Any, routes: str) -> None:
        self.reactor, self.routes = reactor, routes

    async def open_stream(self, caller: Any, session_id: str, kind: Any) -> Any:
        from nxgate.vocabulary.errors import Kind, SessionError

        path = read_routes(self.routes).get(session_id)
        if path is None:
            raise SessionError(Kind.NOT_FOUND, f"Could not find session {session_id}.")
        return await self._at(path, session_id, kind)

    async def _at(self, path: str, session_id: str, kind: Any) -> Any:
        from nxgate.wire import agentsocket

        sock = await agentsocket.reach(self.reactor, path, 0)
        return agentsocket.SocketStream(self.reactor, sock, session_id, kind)

    def local(self, path: str) -> Any:
        """``open_stream`` of the agent at ``path`` on this machine (what LocalNode does after its checks)."""
        return lambda caller, session_id, kind: self._at(path, session_id, kind)


def node_process(pki: str, routes: str, port_file: str, profile: str, cpu: int = -1) -> None:
    """Member ``NODE``: nxgate's node listener (TLS, certificate checks, the
    stream's NodeStream) for gateway ``GATEWAY``, on a free loopback port;
    alone on CPU ``cpu`` when it is not -1 (see ``--pin``)."""
    if cpu >= 0:
        os.sched_setaffinity(0, {cpu})
    from twisted.internet import reactor

    from nxgate.wire.connection import GateFactory
    from nxgate.wire.node_listener import choose
    from nxgate.wire.tls import ClusterTLS

    tls = ClusterTLS.load(NODE, *pki_files(pki, NODE))
    factory = GateFactory(lambda names: GATEWAY if GATEWAY in names else None, choose(RoutedNode(reactor, routes)),
                          role="gateway")
    port = reactor.listenTCP(0, factory.tls_factory(tls), interface="127.0.0.1")
    write_routes(port_file, {"port": port.getHost().port})
    name_process("bench-node")
    profiled(profile, reactor.run)


class PlainClient:
    """A TCP client as StreamRelay's ClientStream, as the Conch channel is
    one: ``LOCAL <id> <path>`` or ``NODE <id> <host:port>`` first, then raw bytes."""

    def __init__(self, reactor: Any, nodes: Any) -> None:
        from twisted.internet import protocol

        self.reactor, self.nodes = reactor, nodes
        self.head = b""
        self.relay: Any = None
        client = self

        class _Proto(protocol.Protocol):
            def connectionMade(self) -> None:
                client.transport = self.transport
                self.transport.bufferSize = STREAM_BUFFER
                self.transport.setTcpNoDelay(True)  # the client's own socket, as ssh sets it

            def dataReceived(self, data: bytes) -> None:
                client.received(data)

            def connectionLost(self, reason: Any) -> None:
                if client.relay is not None:
                    client.relay.close()

        self.protocol = _Proto()

    def received(self, data: bytes) -> None:
        if self.relay is not None:
            self.relay.write(data)
            return
        self.head += data
        if b"\n" not in self.head:
            return
        from twisted.internet.interfaces import IPushProducer
        from zope.interface import implementer

        from nxgate.vocabulary.caller import Caller
        from nxgate.wire.relay import StreamRelay

        line, _, rest = self.head.partition(b"\n")
        kind, sid, where = line.decode().split()
        if kind == "NODE":
            opener = self.nodes(where).open_stream
        else:
            opener = RoutedNode(self.reactor, "").local(where)
        self.relay = StreamRelay(Caller("bench", 0, 0, address="bench"), sid, self, rest, opener)

        @implementer(IPushProducer)
        class _AgentPauser:  # the client's send buffer is full: hold the agent (the SSH window's job)
            def pauseProducing(_) -> None:
                self.relay.pause_agent()

            def resumeProducing(_) -> None:
                self.relay.resume_agent()

            def stopProducing(_) -> None:
                self.relay.resume_agent()

        self.transport.registerProducer(_AgentPauser(), True)

    # ClientStream
    def write(self, data: bytes) -> None:
        self.transport.write(data)

    def close(self) -> None:
        self.transport.unregisterProducer()
        self.transport.loseConnection()

    def pause_input(self) -> None:
        self.transport.pauseProducing()

    def resume_input(self) -> None:
        self.transport.resumeProducing()


def plain_gateway_process(pki: str, port_file: str, profile: str) -> None:
    """A relay-only 'gateway': StreamRelay for TCP clients (see PlainClient)."""
    from twisted.internet import protocol, reactor

    from nxgate.wire.remote_node import RemoteNode
    from nxgate.wire.tls import ClusterTLS

    tls = ClusterTLS.load(GATEWAY, *pki_files(pki, GATEWAY))
    nodes: dict[str, RemoteNode] = {}

    def node(address: str) -> RemoteNode:
        if address not in nodes:
            nodes[address] = RemoteNode(reactor, tls, NODE, address)
        return nodes[address]

    class Factory(protocol.Factory):
        def buildProtocol(self, addr: Any) -> Any:
            return PlainClient(reactor, node).protocol

    port = reactor.listenTCP(0, Factory(), interface="127.0.0.1")
    write_routes(port_file, {"port": port.getHost().port})
    name_process("bench-plain")
    profiled(profile, reactor.run)


# ================================================================ the bench
def wait_port(process: subprocess.Popen, port_file: str, timeout: float = 20.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        port = read_routes(port_file).get("port")
        if port:
            return int(port)
        if process.poll() is not None:
            raise RuntimeError(f"{port_file}: the process exited {process.returncode}")
        time.sleep(0.05)
    raise RuntimeError(f"{port_file}: no port in time")


class PlainStream:
    """A plain row's stream: our TCP client socket and the 'agent' socket."""

    client_is_pipe = False

    def __init__(self, client: socket.socket, server: socket.socket, cpu_pids: Any, label: str) -> None:
        self.client, self.server, self.cpu_pids, self.label = client, server, cpu_pids, label
        self.wfd = self.rfd = client.fileno()

    def algorithms(self) -> str:
        return self.label

    def close(self) -> None:
        for sock in (self.client, self.server):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


class Setup:
    """Users, certificates, the gateway, the node and the plain relay process."""

    def __init__(self, display_base: int, profile_dir: str, node_cpu: int = -1) -> None:
        """Everything started, or nothing left behind (users, processes) if a step failed."""
        self.node_cpu = node_cpu
        self.cleanups: list[Any] = []
        self.processes: list[subprocess.Popen] = []
        try:
            self._start(display_base, profile_dir)
        except BaseException:
            self.close()
            raise

    def _start(self, display_base: int, profile_dir: str) -> None:
        import relay as rl
        from nxgate.wire import tls
        from tests.harness.gateway import Gateway
        from tests.harness.users import create_user

        self.rl = rl
        self.dir = tempfile.mkdtemp(prefix="nxgate-bench-cluster-")
        os.chmod(self.dir, 0o755)
        self.cleanups.append(lambda: shutil.rmtree(self.dir, ignore_errors=True))
        self.pki = os.path.join(self.dir, "pki")
        tls.make_ca(self.pki)
        for name in (GATEWAY, NODE):
            tls.make_cert(name, self.pki)
        self.gateway_routes = os.path.join(self.dir, "gateway-routes.json")
        self.node_routes = os.path.join(self.dir, "node-routes.json")
        write_routes(self.gateway_routes, {})
        write_routes(self.node_routes, {})
        self.user = create_user(prefix="nxb")
        self.cleanups.append(self.user.remove)
        self.nx = create_user(prefix="nxs")
        self.cleanups.append(self.nx.remove)
        self.profile_dir = profile_dir

        def child(mode: str, *args: str, name: str) -> subprocess.Popen:
            profile = os.path.join(profile_dir, f"{name}.prof") if profile_dir else ""
            process = subprocess.Popen([sys.executable, os.path.abspath(__file__), mode, *args, "--child-profile",
                                        profile], env=dict(os.environ, PYTHONPATH=REPO), stdin=subprocess.DEVNULL)
            self.processes.append(process)
            return process

        node_port_file = os.path.join(self.dir, "node.port")
        self.node = child("--node-process", self.pki, self.node_routes, node_port_file, "--node-cpu",
                          str(self.node_cpu), name="node")
        self.node_address = f"127.0.0.1:{wait_port(self.node, node_port_file)}"
        plain_port_file = os.path.join(self.dir, "plain.port")
        self.plain = child("--plain-gateway-process", self.pki, plain_port_file, name="plain-gateway")
        self.plain_port = wait_port(self.plain, plain_port_file)
        ca, certificate, key = pki_files(self.pki, GATEWAY)
        routes, here = self.gateway_routes, os.path.abspath(__file__)
        gateway_profile = os.path.join(profile_dir, "gateway.prof") if profile_dir else ""

        class RoutingGateway(Gateway):
            def _spawn(self, args: tuple[str, ...] = ()) -> subprocess.Popen:
                profile = ["--profile", gateway_profile, "--profiler", "cprofile", "--savestats"] \
                    if gateway_profile else []
                return subprocess.Popen(
                    [sys.executable, here, "--gateway-process", routes, "--", "--nodaemon", "--pidfile=",
                     "--logfile", self.logfile, *profile, "nxgate", "--config", self.config, *args],
                    cwd=self.workdir, env=dict(os.environ, PYTHONPATH=REPO), stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

        self.gateway = RoutingGateway({
            "ssh": {"nx_user": self.nx.name},
            "auth": {"failed_login_delay": "0.3"},
            "sessions": {"display_base": str(display_base), "display_limit": "200",
                         "max_sessions_per_user": "100", "agent_start_timeout": "60"},
            # A gateway that can reach other members (and runs sessions itself, as a one-box gateway does).
            "cluster": {"name": GATEWAY, "roles": "gateway, node", "listen": "tcp:0:interface=127.0.0.1",
                        "address": "127.0.0.1:1", "ca": ca, "certificate": certificate, "key": key},
        }).start()
        self.cleanups.append(self.gateway.stop)

    def close(self) -> None:
        for process in reversed(self.processes):
            process.terminate()
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for cleanup in reversed(self.cleanups):
            try:
                cleanup()
            except Exception as error:  # noqa: BLE001 - cleanup goes on
                print(f"cleanup: {error}", file=sys.stderr)


class ConchPath:
    """ssh -> the gateway (Conch) -> the agent's socket, here or on the node."""

    def __init__(self, setup: Setup, cluster: bool) -> None:
        self.setup, self.cluster = setup, cluster
        self.opens: list[float] = []

    def open(self) -> Any:
        rl, setup = self.setup.rl, self.setup
        from tests.harness.gateway import nx_key

        argv = ["ssh", *rl.SSH_COMMON, "-T", "-p", str(setup.gateway.port), "-i", nx_key(), "-o",
                "IdentitiesOnly=yes", "-o", "PubkeyAcceptedAlgorithms=+ssh-dss", f"{setup.nx.name}@127.0.0.1"]
        process, stderr_path = rl.spawn_ssh(argv)
        try:
            dialogue = rl.NXDialogue(process)
            display = dialogue.start_session(setup.user.name, setup.user.password)
            listener = rl.take_agent_port(display)
            path = listener.getsockname()
            if self.cluster:
                sid = dialogue.session_id
                if not sid:
                    raise RuntimeError("no session id in the NX reply")
                write_routes(setup.node_routes, {**read_routes(setup.node_routes), sid: path})
                write_routes(setup.gateway_routes, {**read_routes(setup.gateway_routes),
                                                    sid: {"node": NODE, "address": setup.node_address}})
            time.sleep(0.3)  # the gateway is done with the dead agent
            started = time.perf_counter()
            dialogue.bye()
            server = rl.accept(listener)
            self.opens.append(time.perf_counter() - started)
        except BaseException:
            rl.stop(process)
            raise
        pids = [setup.gateway.process.pid, process.pid] + ([setup.node.pid] if self.cluster else [])
        return rl.Stream(process, server, lambda: pids, stderr_path)


class PlainPath:
    """A TCP client -> the plain relay process -> the agent's socket, here or on the node."""

    def __init__(self, setup: Setup, cluster: bool) -> None:
        self.setup, self.cluster = setup, cluster
        self.opens: list[float] = []

    def open(self) -> PlainStream:
        from tests.harness.net import listen_unix_when_free

        setup = self.setup
        directory = tempfile.mkdtemp(prefix="nxcr", dir=setup.dir)
        os.rmdir(directory)  # listen_unix_when_free makes it, root's and 0700, as the gateway wants
        path = os.path.join(directory, "agent.sock")
        listener = listen_unix_when_free(path)
        sid = uuid.uuid4().hex.upper()
        if self.cluster:
            write_routes(setup.node_routes, {**read_routes(setup.node_routes), sid: path})
            head = f"NODE {sid} {setup.node_address}\n"
        else:
            head = f"LOCAL {sid} {path}\n"
        client = socket.create_connection(("127.0.0.1", setup.plain_port))
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        started = time.perf_counter()
        client.sendall(head.encode())
        server = setup.rl.accept(listener)
        self.opens.append(time.perf_counter() - started)
        pids = [setup.plain.pid] + ([setup.node.pid] if self.cluster else [])
        return PlainStream(client, server, lambda: pids, "TLS 1.3 via node" if self.cluster else "-")


ROWS = [  # name, kind, cluster
    ("conch one box", "conch", False),
    ("conch via node", "conch", True),
    ("plain one box", "plain", False),
    ("plain via node", "plain", True),
]


def ms(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"median_ms": statistics.median(ordered) * 1000, "max_ms": ordered[-1] * 1000,
            "all_ms": [v * 1000 for v in values]}


def measure(setup: Setup, kinds: set[str], size: int, repeat: int, rounds: int, directions: list[str],
            opens: int) -> dict[str, Any]:
    rl = setup.rl
    source = rl.rn.Source()
    paths = {name: (ConchPath if kind == "conch" else PlainPath)(setup, cluster)
             for name, kind, cluster in ROWS if kind in kinds}
    runs: dict[tuple[str, str], list] = {}
    loads: dict[tuple[str, str], list[float]] = {}
    rows: dict[str, dict[str, Any]] = {name: {"relay": name, "directions": {}} for name in paths}
    for rep in range(max(1, repeat)):  # round robin: a drifting load hits every row alike
        for name, path in paths.items():
            for direction in directions:
                run = rl.ssh_throughput_run(path, size, direction, source, rows[name])
                runs.setdefault((name, direction), []).append(run)
                loads.setdefault((name, direction), []).append(os.getloadavg()[0])
                print(f"  {name:<18}{direction:>5} run {rep + 1}: {size / 1e9 / run[0]:.3f} GB/s, "
                      f"{run[1] / (size / 1e9):.2f} CPU s/GB, load {loads[(name, direction)][-1]:.2f}", flush=True)
    for name, path in paths.items():
        row = rows[name]
        for direction in directions:
            row["directions"][direction] = rl.summarize_runs(runs[(name, direction)], size)
            row["directions"][direction]["load_1min"] = loads[(name, direction)]
        rl.ssh_latency(path, rounds, row)
        if isinstance(path, PlainPath):  # opening is cheap here: more samples
            for _ in range(opens):
                path.open().close()
        row["open"] = ms(path.opens)
    return rows


def ratios(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in ("conch", "plain"):
        here, there = rows.get(f"{kind} one box"), rows.get(f"{kind} via node")
        if not here or not there:
            continue
        for direction in there["directions"]:
            a, b = there["directions"][direction]["gb_per_s"], here["directions"][direction]["gb_per_s"]
            out[f"{kind}_{direction}"] = a / b if b else None
            # Run i of each row ran next to each other (round robin): their ratio moves less with the load.
            pairs = [x / y for x, y in zip(there["directions"][direction]["all_gb_per_s"],
                                           here["directions"][direction]["all_gb_per_s"]) if y]
            if pairs:
                out[f"{kind}_{direction}_paired"] = statistics.median(pairs)
        for key in ("latency_p50_us", "latency_p99_us"):
            out[f"{kind}_{key.replace('latency_', 'added_latency_')}"] = there[key] - here[key]
        out[f"{kind}_added_open_ms"] = there["open"]["median_ms"] - here["open"]["median_ms"]
        # With the node on its own machine the gateway's CPU is what limits a CPU-bound relay: its
        # CPU per GB one box / via node is the ratio to expect there (info; this box shares 2 CPUs).
        front = "bench-gateway" if kind == "conch" else "bench-plain"
        for direction in there["directions"]:
            a = here["directions"][direction].get("cpu_s_per_gb_by_process", {}).get(front)
            b = there["directions"][direction].get("cpu_s_per_gb_by_process", {}).get(front)
            if a and b:
                out[f"{kind}_{direction}_gateway_cpu_ratio"] = a / b
            # Pinned (--pin), the gateway and the client share one CPU and the node has the other: when
            # that CPU is the bottleneck, GB/s is inversely proportional to their CPU per GB, so this
            # ratio (one box / via node) bounds what the cluster row can reach against the one-box row.
            shared = ("bench-gateway", "bench-plain", "ssh")
            a = sum(here["directions"][direction].get("cpu_s_per_gb_by_process", {}).get(n, 0) for n in shared)
            b = sum(there["directions"][direction].get("cpu_s_per_gb_by_process", {}).get(n, 0) for n in shared)
            if a and b:
                out[f"{kind}_{direction}_front_cpu_bound"] = a / b
    return out


def print_rows(rows: dict[str, dict[str, Any]], computed: dict[str, Any]) -> None:
    header = (f"{'path':<18}{'dir':>5}{'GB/s':>8}{'spread':>8}{'CPU s/GB':>10}{'p50 us':>9}{'p99 us':>9}"
              f"{'open ms':>9}")
    print(header)
    print("-" * len(header))
    for row in rows.values():
        for index, (direction, figures) in enumerate(row["directions"].items()):
            values = figures["all_gb_per_s"]
            spread = (max(values) - min(values)) / statistics.median(values) * 100 if len(values) > 1 else 0.0
            tail = (f"{row['latency_p50_us']:>9.0f}{row['latency_p99_us']:>9.0f}{row['open']['median_ms']:>9.1f}"
                    if index == 0 else "")
            print(f"{row['relay'] if index == 0 else '':<18}{direction:>5}{figures['gb_per_s']:>8.3f}{spread:>7.0f}%"
                  f"{figures['cpu_s_per_gb']:>10.2f}{tail}")
    for key, value in computed.items():
        if value is not None:
            print(f"  {key:<32}{value:>9.2f}{'x' if key.endswith(('_up', '_down')) else ''}")


def print_profile(path: str, top: int = 18) -> None:
    import pstats

    if not os.path.exists(path):
        print(f"profile {path}: not written")
        return
    print(f"--- {os.path.basename(path)}: top {top} by own time")
    stats = pstats.Stats(path)
    stats.sort_stats("tottime").print_stats(top)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--gateway-process":
        gateway_process(argv[1], argv[3:])  # argv[2] is "--"
        return 0
    if argv and argv[0] in ("--node-process", "--plain-gateway-process"):
        profile = argv[argv.index("--child-profile") + 1]
        if argv[0] == "--node-process":
            node_process(argv[1], argv[2], argv[3], profile, int(argv[argv.index("--node-cpu") + 1]))
        else:
            plain_gateway_process(argv[1], argv[2], profile)
        return 0
    import relay as rl

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="512M", help="bytes per throughput run (k/m/g suffixes)")
    parser.add_argument("--repeat", type=int, default=3, help="throughput runs per row and direction (median)")
    parser.add_argument("--rounds", type=int, default=1000, help="1-byte round trips per row")
    parser.add_argument("--opens", type=int, default=20, help="extra stream openings per plain row")
    parser.add_argument("--directions", default="up,down")
    parser.add_argument("--only", default="conch,plain", help="conch (through SSH), plain (no SSH)")
    parser.add_argument("--display-base", type=int, default=2300)
    parser.add_argument("--profile", default="", help="cProfile the gateway, node and plain relay into DIR "
                        "(figures are then not comparable: profiling costs CPU)")
    parser.add_argument("--pin", action="store_true",
                        help="the node process alone on CPU 1, everything else (gateway, client, this bench) on "
                        "CPU 0: the node as if on its own machine, the gateway's CPU the bound")
    parser.add_argument("--json", default=os.path.join(HERE, "results", "cluster_relay.json"))
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("bench/cluster_relay.py needs root (it creates users and starts sessions)", file=sys.stderr)
        return 2
    size = rl.rn.parse_size(args.size)
    directions = [d for d in args.directions.split(",") if d]
    profile_dir = os.path.abspath(args.profile) if args.profile else ""
    if profile_dir:
        os.makedirs(profile_dir, exist_ok=True)
    node_cpu = -1
    if args.pin:
        if len(os.sched_getaffinity(0)) < 2:
            print("--pin needs two CPUs", file=sys.stderr)
            return 2
        node_cpu = max(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # inherited by everything started from here
    load_before = os.getloadavg()
    print(f"cluster stream benchmark: {size} bytes per run, median of {args.repeat}, {args.rounds} round trips, "
          f"{os.cpu_count()} CPUs{f', node pinned to CPU {node_cpu}, the rest to the other' if args.pin else ''}, "
          f"load {load_before[0]:.2f}", flush=True)
    setup = Setup(args.display_base, profile_dir, node_cpu)
    try:
        rows = measure(setup, set(args.only.split(",")), size, args.repeat, args.rounds, directions, args.opens)
    finally:
        setup.close()
    computed = ratios(rows)
    print()
    print_rows(rows, computed)
    if profile_dir:
        for name in ("gateway", "node", "plain-gateway"):
            print_profile(os.path.join(profile_dir, f"{name}.prof"))
    if args.json:
        os.makedirs(os.path.dirname(args.json), exist_ok=True)
        with open(args.json, "w") as handle:
            json.dump({"size": size, "repeat": args.repeat, "rounds": args.rounds, "cpus": os.cpu_count(),
                       "load_before": load_before, "load_after": os.getloadavg(), "profiled": bool(profile_dir),
                       "pinned": args.pin,
                       "rows": rows, "ratios": computed, "target_ratio": 0.9}, handle, indent=2)
            handle.write("\n")
        print(f"(JSON: {args.json})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
