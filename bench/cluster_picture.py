#!/usr/bin/env python3
"""Several machines against one box (issue 13): start -> picture and
resume -> picture through a gateway to a session on another node, against
the same on a single box (target: cluster / single <= 1.15); and the time
from a node's death to its session being listed as lost (target <= 2 x
heartbeat), through the gateway that started the session there and
through another one (both keep in touch with every node: a node process
that dies closes their connections; a machine that vanishes without a
word would go by the heartbeats, three of them).

Real processes as in tests/test_e2e_cluster.py: ``twistd nxgate`` members
(a gateway only, nodes only) on a private PostgreSQL, OpenSSH as nxssh,
nxagent, nxproxy drawing on an Xvfb.  The picture is there when the
session's red xterm covers 20,000 pixels of the client screen.  Runs
alternate between the two set-ups so that the machine's load falls on
both alike.  Needs root (it creates a Unix user).

    .venv/bin/python bench/cluster_picture.py [--runs 5] [--heartbeat 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from nxgate.gateway.router import LOST_MARK  # noqa: E402
from tests.harness import databases  # noqa: E402
from tests.harness.cluster import Cluster  # noqa: E402
from tests.harness.gateway import Gateway  # noqa: E402
from tests.harness.process import wait_for  # noqa: E402
from tests.harness.ssh import Attachment, NXClient, SessionInfo  # noqa: E402
from tests.harness.users import create_user  # noqa: E402
from tests.harness.x11 import ClientScreen  # noqa: E402
from tests.test_e2e_cluster import OPTIONS, RED, RESTORE, START  # noqa: E402
from tests.test_e2e_store import end_agents, listed  # noqa: E402

TARGET_RATIO = 1.15
SHOWN = 20000  # red pixels: the session's picture is on the client screen


class Setup:
    """One way to reach sessions: ``front`` is what the client logs in to."""

    def __init__(self, name: str, front: Gateway, user, screen: ClientScreen) -> None:
        self.name, self.front, self.user, self.screen = name, front, user, screen
        self.clients: list[NXClient] = []

    def login(self) -> NXClient:
        client = NXClient(self.front.port)
        self.clients.append(client)
        client.greet()
        reply = client.login(self.user.name, self.user.password)
        if b"NX> 103 " not in reply:
            raise RuntimeError(f"login refused: {reply!r}")
        client.prompt()
        return client

    def to_picture(self, command: str) -> tuple[float, Attachment, SessionInfo]:
        """Seconds from ``command`` (after the login) until its picture is on the screen."""
        client = self.login()
        began = time.monotonic()
        reply = client.command(command, timeout=90)
        if b"NX> 710 Session status: running" not in reply:
            raise RuntimeError(f"{self.name}: {reply!r}")
        info = SessionInfo.parse(reply)
        attachment = Attachment(client, info, self.screen.name, self.front.workdir)
        wait_for(lambda: self.screen.shot().count(RED) >= SHOWN, 60, "the picture", interval=0.01)
        return time.monotonic() - began, attachment, info

    def suspended(self, session_id: str) -> bool:
        client = self.login()
        row = listed(client.command('listsession --status="suspended,running"')).get(session_id, b"")
        client.close()
        return b"Suspended" in row

    def cycle(self) -> tuple[float, float]:
        """(start -> picture, resume -> picture) of one new session, ended after."""
        start, attachment, info = self.to_picture(START.format(name="bench"))
        attachment.detach()
        wait_for(lambda: self.screen.shot().count(RED) == 0, 30, "the screen cleared", interval=0.05)
        wait_for(lambda: self.suspended(info.session_id), 30, "the session suspended")
        resume, attachment, _ = self.to_picture(RESTORE.format(id=info.session_id))
        attachment.detach()
        client = self.login()
        client.command(f'terminate --sessionid="{info.session_id}"', timeout=60)
        for client in self.clients:
            client.close()
        self.clients.clear()
        wait_for(lambda: self.screen.shot().count(RED) == 0, 30, "the screen cleared", interval=0.05)
        return start, resume


def summary(values: list[float]) -> dict:
    return {"median_s": statistics.median(values), "min_s": min(values), "max_s": max(values), "runs": len(values)}


def node_death(cluster: Cluster, user, heartbeat: float) -> dict:
    """A node SIGKILLed: seconds until each gateway lists its session as lost."""
    gw_talked, gw_silent, node = cluster.members["gw-1"], cluster.members["gw-2"], cluster.members["node-b"]
    setup = Setup("cluster", gw_talked, user, None)  # type: ignore[arg-type]
    client = setup.login()
    reply = client.command(START.format(name="doomed"), timeout=90)
    info = SessionInfo.parse(reply)
    client.close()

    def is_lost(gateway: Gateway) -> bool:
        rows = json.loads(cluster.members[gateway].admin("--json", "sessions").stdout)["result"]
        return any(row["id"] == info.session_id and row["name"].endswith(LOST_MARK) for row in rows)

    node.kill()
    died = time.monotonic()
    seen: dict[str, float] = {}
    while len(seen) < 2 and time.monotonic() - died < 10 * heartbeat + 10:
        for name in ("gw-1", "gw-2"):
            if name not in seen and is_lost(name):
                seen[name] = time.monotonic() - died
        time.sleep(0.02)
    del gw_silent
    return {"heartbeat_s": heartbeat, "through_connected_gateway_s": seen.get("gw-1"),
            "through_other_gateway_s": seen.get("gw-2"), "target_s": 2 * heartbeat}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--heartbeat", type=float, default=2.0, help="[cluster] heartbeat of the members")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("cluster_picture.py needs root: it creates a Unix user", file=sys.stderr)
        return 2
    why = databases.PostgresServer.available()
    if why:
        print(f"skipped: {why}")
        if args.json:
            with open(args.json, "w") as handle:
                json.dump({"skipped": why}, handle)
        return 0
    server = databases.PostgresServer()
    user = create_user()
    screen = ClientScreen(800, 600)
    single = Gateway({**OPTIONS, "sessions": {**OPTIONS["sessions"], "display_base": "2900",
                                              "display_limit": "20"}}).start()
    cluster = Cluster(server.start(), server.password_file, OPTIONS)
    figures: dict = {"target_ratio": TARGET_RATIO}
    try:
        for name, roles in (("gw-1", "gateway"), ("gw-2", "gateway"), ("node-a", "node")):
            cluster.member(name, roles, options={"cluster": {"heartbeat": str(args.heartbeat)}}).start()
        wait_for(lambda: all(row["state"] == "up" for row in
                             json.loads(cluster.members["gw-1"].admin("nodes", "--json").stdout)) and
                 len(json.loads(cluster.members["gw-1"].admin("nodes", "--json").stdout)) == 3, 30, "the members")
        setups = [Setup("single", single, user, screen), Setup("cluster", cluster.members["gw-1"], user, screen)]
        times: dict[str, dict[str, list[float]]] = {s.name: {"start": [], "resume": []} for s in setups}
        for setup in setups:  # a first, unmeasured round each: caches, the TLS connection
            setup.cycle()
        for run in range(args.runs):
            for setup in setups if run % 2 == 0 else reversed(setups):
                start, resume = setup.cycle()
                times[setup.name]["start"].append(start)
                times[setup.name]["resume"].append(resume)
                print(f"run {run + 1} {setup.name:8}: start -> picture {start:.2f} s, resume -> picture "
                      f"{resume:.2f} s", flush=True)
        for what in ("start", "resume"):
            one, many = summary(times["single"][what]), summary(times["cluster"][what])
            ratio = many["median_s"] / one["median_s"]
            figures[f"{what}_to_picture"] = {"single": one, "cluster": many, "ratio": ratio}
            print(f"{what} -> picture: single box {one['median_s']:.2f} s, through a gateway to another node "
                  f"{many['median_s']:.2f} s: {ratio:.2f}x (target <= {TARGET_RATIO}x): "
                  f"{'met' if ratio <= TARGET_RATIO else 'NOT met'}")
        cluster.member("node-b", "node", options={"cluster": {"heartbeat": str(args.heartbeat)}}).start()
        cluster.members["node-a"].admin("drain", "--node", "node-a")  # the doomed session goes to node-b
        wait_for(lambda: any(r["name"] == "node-b" and r["state"] == "up" for r in
                             json.loads(cluster.members["gw-1"].admin("nodes", "--json").stdout)), 30, "node-b")
        death = figures["node_death_to_lost"] = node_death(cluster, user, args.heartbeat)
        for key, label in (("through_connected_gateway_s", "the gateway that started the session"),
                           ("through_other_gateway_s", "another gateway")):
            value = death[key]
            shown = "not seen" if value is None else f"{value:.2f} s"
            met = value is not None and value <= death["target_s"]
            print(f"node death -> lost, {label}: {shown} (heartbeat {args.heartbeat:g} s, target <= "
                  f"{death['target_s']:g} s): {'met' if met else 'NOT met'}")
    finally:
        screen.close()
        single.stop()
        cluster.close()
        end_agents(user)
        user.remove()
        server.cleanup()
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(figures, handle, indent=2)
            handle.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
