"""End to end: several machines (issue 13).  Separate ``twistd nxgate``
processes, each with its own state directory and loopback address, gateways
and nodes sharing a private PostgreSQL (or MariaDB) server, certificates
made with ``nxgate-admin cluster``, real nxagents, OpenSSH as nxssh and
nxproxy drawing on an Xvfb.

What the user sees is checked: the session's picture on the client screen
(against the agent's own framebuffer), the listing through another
gateway, the NX errors when a machine or the database is gone.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time

from twisted.trial.unittest import SkipTest, TestCase

from tests.harness import databases, pixels
from tests.harness.cluster import HEARTBEAT, Cluster, Member
from tests.harness.process import wait_for
from tests.harness.ssh import Attachment, NXClient, SessionInfo
from tests.harness.users import NEED_ROOT, create_user, is_root
from tests.harness.x11 import ClientScreen
from tests.test_e2e_store import agent_processes, end_agents, listed

RED = (255, 0, 0)
GREEN = (0, 255, 0)
START = ('startsession --session="{name}" --type="unix-console" --geometry="800x600" '
         '--screeninfo="800x600x24+render" --link="lan" --encryption="1" --cache="16M" --images="64M" '
         '--keyboard="pc105/us" --client="linux" --media="0" --backingstore="1"')
RESTORE = ('restoresession --id="{id}" --session="x" --type="unix-console" --geometry="800x600" '
           '--screeninfo="800x600x24+render" --link="lan" --encryption="1" --cache="16M" --images="64M" '
           '--keyboard="pc105/us" --client="linux" --media="0" --backingstore="1"')
OPTIONS = {"sessions": {"connect_timeout": "120"},
           "types": {"unix-console": "xterm -bg red -fg yellow -geometry 60x15+10+10"}}
ALL_LISTED = 'listsession --status="suspended,running"'


class ClusterTestCase(TestCase):
    timeout = 400
    server_kind: type = databases.PostgresServer
    private_server = False  # True: a server of this test's own (it is stopped under the cluster)

    def setUp(self):
        if not is_root():
            raise SkipTest(NEED_ROOT)
        why = self.server_kind.available()
        if why:
            raise SkipTest(why)
        if self.private_server:
            self.server = self.server_kind()
            self.addCleanup(self.server.cleanup)
            url = self.server.start()
        else:
            self.server = databases.shared(self.server_kind)
            url = self.server.new_database()
        self.cluster = Cluster(url, self.server.password_file, OPTIONS)
        self.addCleanup(self.cluster.close)
        self.user = create_user()
        self.addCleanup(self.user.remove)
        self.addCleanup(end_agents, self.user)

    # -------------------------------------------------------------- helpers
    def members(self, *specs: tuple[str, str]) -> list[Member]:
        """Members started, then every node up in the store as seen by the first gateway."""
        started = [self.cluster.member(name, roles).start() for name, roles in specs]
        gateway = next(m for m in started if "gateway" in m.roles)
        nodes = {m.name for m in started}
        wait_for(lambda: {row["name"] for row in self.nodes(gateway) if row["state"] == "up"} >= nodes, 20,
                 "every member's heartbeat")
        return started

    @staticmethod
    def nodes(member: Member) -> list[dict]:
        return json.loads(member.admin("nodes", "--json").stdout)

    @staticmethod
    def sessions(member: Member) -> dict[str, dict]:
        """Session id -> what ``nxgate-admin sessions`` says of it (every member's)."""
        return {row["id"]: row for row in json.loads(member.admin("--json", "sessions").stdout)["result"]}

    def login(self, member: Member) -> NXClient:
        client = NXClient(member.port)
        self.addCleanup(client.close)
        client.greet()
        self.assertIn(b"NX> 103 ", client.login(self.user.name, self.user.password))
        client.prompt()
        return client

    def start(self, member: Member, name: str) -> tuple[NXClient, SessionInfo]:
        client = self.login(member)
        reply = client.command(START.format(name=name), timeout=90)
        self.assertIn(b"NX> 710 Session status: running", reply, reply)
        return client, SessionInfo.parse(reply)

    def restore(self, member: Member, session_id: str) -> tuple[NXClient, SessionInfo]:
        client = self.login(member)
        reply = client.command(RESTORE.format(id=session_id), timeout=90)
        self.assertIn(b"NX> 710 Session status: running", reply, reply)
        return client, SessionInfo.parse(reply)

    def screen(self) -> ClientScreen:
        screen = ClientScreen(800, 600)
        self.addCleanup(screen.close)
        return screen

    def attach(self, client: NXClient, info: SessionInfo, screen: ClientScreen, member: Member) -> Attachment:
        attachment = Attachment(client, info, screen.name, member.workdir)
        self.addCleanup(attachment.detach)
        return attachment

    def authority(self, node: Member, session_id: str) -> str:
        return os.path.join(node.state_dir, "sessions", session_id, "authority")

    def assert_picture(self, screen: ClientScreen, node: Member, info: SessionInfo) -> None:
        """The client screen shows what the agent on ``node`` holds, pixel for pixel."""
        screen.wait_for_colour(RED, 20000, timeout=60)
        shots: list = [0.0, None, None, ""]

        def same() -> bool:
            try:
                agent = pixels.grab(f":{info.display}", self.authority(node, info.session_id))
            except AssertionError as error:  # xwd could not read it (yet): say so if it lasts
                shots[3] = str(error)
                return False
            # nxagent's window sits at the client screen's origin, the agent's size.
            client = pixels.crop(screen.shot(), pixels.Rect(0, 0, agent.width, agent.height))
            shots[:3] = [pixels.equal_share(client, agent), client, agent]
            return shots[0] >= 0.99

        try:
            wait_for(same, 30, "the client screen to show the agent's framebuffer", interval=0.5)
        except AssertionError:
            saved = [pixels.save_png(shot, os.path.join(node.workdir, f"{name}.png"))
                     for name, shot in (("client", shots[1]), ("agent", shots[2])) if shot is not None]
            raise AssertionError(f"only {shots[0]:.1%} of the pixels are the agent's: {saved} {shots[3]}") from None

    def suspended_in(self, member: Member, session_id: str) -> bool:
        client = self.login(member)
        row = listed(client.command(ALL_LISTED)).get(session_id, b"")
        client.close()
        return b"Suspended" in row


class SeveralMachinesTests(ClusterTestCase):
    def test_start_on_one_gateway_resume_through_the_other_and_a_gateway_dies(self):
        gw1, gw2, node_a, node_b = self.members(("gw-1", "gateway"), ("gw-2", "gateway"), ("node-a", "node"),
                                                ("node-b", "node"))
        by_name = {"node-a": node_a, "node-b": node_b}
        self.assertEqual(gw1.log().count("listening for gateways"), 0)  # a gateway only runs no sessions
        self.assertNotIn("NXSSHFactory starting", node_a.log())  # a node only serves no SSH door
        screen = self.screen()
        client, first = self.start(gw1, "first")
        attachment = self.attach(client, first, screen, gw1)
        where = self.sessions(gw1)[first.session_id]["node"]
        self.assertIn(where, by_name)
        self.assertTrue(os.path.isdir(os.path.join(by_name[where].state_dir, "sessions", first.session_id)))
        self.assert_picture(screen, by_name[where], first)
        # Placement spreads: the next session goes to the other node.
        _, second = self.start(gw1, "second")
        other = self.sessions(gw2)[second.session_id]["node"]
        self.assertEqual({where, other}, {"node-a", "node-b"})
        # Through the other gateway: both listed, the first resumed on its node.
        attachment.detach()
        wait_for(lambda: self.suspended_in(gw2, first.session_id), 30, "the first session suspended")
        rows = listed(self.login(gw2).command(ALL_LISTED))
        self.assertEqual(set(rows) >= {first.session_id, second.session_id}, True, rows)
        client, resumed = self.restore(gw2, first.session_id)
        self.assertEqual(resumed.display, first.display)
        self.attach(client, resumed, screen, gw2)
        self.assert_picture(screen, by_name[where], resumed)
        # The gateway carrying it dies: the session suspends on its node and
        # is resumed through the first gateway.
        gw2.kill()
        wait_for(lambda: self.suspended_in(gw1, first.session_id), 60, "the session suspended after gw-2 died")
        client, again = self.restore(gw1, first.session_id)
        self.attach(client, again, screen, gw1)
        # The picture again (red xterm on the client screen).  Not compared
        # with xwd here: after the SIGKILL, xwd is now and then refused by the
        # agent ("Invalid MIT-MAGIC-COOKIE-1 key") while the client draws fine.
        screen.wait_for_colour(RED, 20000, timeout=60)
        self.assertIn(f"session {first.session_id}", by_name[where].log())

    def test_a_node_dies_its_sessions_are_lost_new_ones_go_elsewhere_and_it_comes_back(self):
        gw1, node_a, node_b = self.members(("gw-1", "gateway"), ("node-a", "node"), ("node-b", "node"))
        by_name = {"node-a": node_a, "node-b": node_b}
        screen = self.screen()
        infos = []
        for n in range(2):  # drawn once, then suspended: resumable
            client, info = self.start(gw1, f"s{n}")
            attachment = self.attach(client, info, screen, gw1)
            screen.wait_for_colour(RED, 20000, timeout=60)
            attachment.detach()
            wait_for(lambda i=info: self.suspended_in(gw1, i.session_id), 30, "the session suspended")
            infos.append(info)
        placed = {info.session_id: self.sessions(gw1)[info.session_id]["node"] for info in infos}
        self.assertEqual(set(placed.values()), {"node-a", "node-b"})
        on_b = next(sid for sid, node in placed.items() if node == "node-b")
        gw1.admin("drain", "--node", "node-a")  # a third on node-b, for the admin to end while it is down
        _, third = self.start(gw1, "forgotten")
        gw1.admin("drain", "--node", "node-a", "--off")
        self.assertEqual(self.sessions(gw1)[third.session_id]["node"], "node-b")
        agents = agent_processes(self.user.name)
        node_b.kill()
        died = time.monotonic()

        def lost() -> bool:
            row = listed(self.login(gw1).command(ALL_LISTED)).get(on_b, b"")
            return row.split()[6:7] == [b"Lost"]  # the listing's Status column

        wait_for(lost, 30, "node-b's session listed as lost", interval=0.2)
        # About three heartbeats until down, plus the listing's own round trip.
        print(f"\nnode death -> listed as lost: {time.monotonic() - died:.2f}s (heartbeat {HEARTBEAT}s)")
        client = self.login(gw1)
        reply = client.command(RESTORE.format(id=on_b), timeout=60)
        self.assertIn(b"NX> 596 Error: Session " + on_b.encode() + b" runs on machine node-b, which is down", reply)
        self.assertIn(b"NX> 500 ERROR: Last operation failed.", reply)
        # The admin ends one for good (its machine might never come back).
        gw1.admin("terminate", third.session_id)
        self.assertNotIn(third.session_id, self.sessions(gw1))
        self.assertNotIn(third.session_id, listed(self.login(gw1).command(ALL_LISTED)))
        for n in range(2):
            _, info = self.start(gw1, f"after{n}")
            self.assertEqual(self.sessions(gw1)[info.session_id]["node"], "node-a")
        self.assertEqual(set(agents) - set(agent_processes(self.user.name)), set())  # its agents live on
        # It comes back: it takes back its own session, resumable again.
        node_b.start()
        wait_for(lambda: not lost(), 30, "node-b's session listed again")
        # The one the admin ended stays ended: its agent is one node-b does not know.
        self.assertNotIn(third.session_id, listed(self.login(gw1).command(ALL_LISTED)))
        status = json.loads(node_b.admin("--json", "status").stdout)["result"]
        self.assertIn(third.session_id, [unknown["id"] for unknown in status["unknown_sessions"]])
        client, resumed = self.restore(gw1, on_b)
        self.attach(client, resumed, screen, gw1)
        self.assert_picture(screen, node_b, resumed)
        self.assertIn("taken back", node_b.log())
        # Drained nodes get no new session; none left is a clear 599.
        gw1.admin("drain", "--node", "node-a")
        gw1.admin("drain", "--node", "node-b")
        reply = self.login(gw1).command(START.format(name="nowhere"), timeout=60)
        self.assertIn(b"NX> 599 No machine of this cluster can take a new session now; try again later.", reply)
        gw1.admin("drain", "--node", "node-b", "--off")
        _, info = self.start(gw1, "on b")
        self.assertEqual(self.sessions(gw1)[info.session_id]["node"], "node-b")

    def test_a_users_limit_holds_over_the_whole_cluster(self):
        specs = (("gw-1", "gateway"), ("gw-2", "gateway"), ("node-a", "node"), ("node-b", "node"))
        started = [self.cluster.member(name, roles, options={"sessions": {"max_sessions_per_user": "2"}}).start()
                   for name, roles in specs]
        gw1, gw2 = started[:2]
        wait_for(lambda: {r["name"] for r in self.nodes(gw1) if r["state"] == "up"} >= {"node-a", "node-b"}, 20,
                 "the nodes' heartbeats")
        first = self.start(gw1, "one")[1]
        second = self.start(gw1, "two")[1]  # gw-1 spreads them (another gateway learns at the next heartbeat)
        self.assertEqual({self.sessions(gw1)[info.session_id]["node"] for info in (first, second)},
                         {"node-a", "node-b"})  # one on each node: neither node alone is at the limit
        for gateway in (gw1, gw2):
            reply = self.login(gateway).command(START.format(name="three"), timeout=60)
            self.assertIn(f"NX> 599 Server capacity: reached for user: {self.user.name}".encode(), reply)
        self.assertEqual(len(self.sessions(gw2)), 2)

    def test_a_member_with_a_certificate_of_another_ca_is_refused(self):
        gw1 = self.cluster.member("gw-1", "gateway").start()
        stranger = self.cluster.member("node-x", "node", ca=self.cluster.other_ca()).start()
        refused = "refused: certificate not from the cluster's CA"
        # Its heartbeat is in the shared database (the database trusts it; the cluster does not): the
        # gateway lists it as refused, never up.
        seen: set[str] = set()

        def refused_listed() -> bool:
            states = {row["state"] for row in self.nodes(gw1) if row["name"] == "node-x"}
            seen.update(states)
            return refused in states

        wait_for(refused_listed, 20, "the stranger listed as refused")
        self.assertIn(refused, gw1.admin("nodes").stdout)
        reply = self.login(gw1).command(START.format(name="refused"), timeout=60)
        self.assertIn(b"NX> 599 No machine of this cluster can take a new session now", reply)  # never placed there
        self.assertIn(b"NX> 500 ERROR: Last operation failed.", reply)
        self.assertRegex(gw1.log(), r"cluster member node-x at \S+ cannot be reached: refused: certificate not from")
        wait_for(lambda: "refused" in stranger.log() or "failed TLS" in stranger.log(), 10, "the node's log")
        self.assertEqual(agent_processes(self.user.name), [])
        # A trusted node joins: the sessions go there, the idle stranger is never tried, and stays refused.
        self.cluster.member("node-a", "node").start()
        wait_for(lambda: {r["name"]: r["state"] for r in self.nodes(gw1)}.get("node-a") == "up", 20, "node-a up")
        for n in range(2):
            _, info = self.start(gw1, f"trusted {n}")
            self.assertEqual(self.sessions(gw1)[info.session_id]["node"], "node-a")
        self.assertNotIn("placing", gw1.log())  # "member node-x cannot be reached; placing ... elsewhere"
        self.assertEqual({row["name"]: row["state"] for row in self.nodes(gw1)}["node-x"], refused)
        self.assertNotIn("up", seen)


class StoreOutageTests(ClusterTestCase):
    private_server = True

    def test_the_database_down_new_requests_get_an_nx_error_and_the_relay_goes_on(self):
        gw1, node_a = self.members(("gw-1", "gateway"), ("node-a", "node"))
        screen = self.screen()
        client, info = self.start(gw1, "through the outage")
        self.attach(client, info, screen, gw1)
        self.assert_picture(screen, node_a, info)
        self.server.stop()
        databases.wait_until_down(self.server)
        reply = self.login(gw1).command(START.format(name="refused"), timeout=90)
        self.assertIn(b"NX> 596 Error: The cluster's session store cannot be reached", reply)
        self.assertIn(b"NX> 500 ERROR: Last operation failed.", reply)
        # The running session's stream does not need the database: a change on
        # its screen reaches the client.
        env = dict(os.environ, DISPLAY=f":{info.display}", XAUTHORITY=self.authority(node_a, info.session_id))
        subprocess.run(["xsetroot", "-solid", "#00ff00"], env=env, check=True, timeout=30)
        screen.wait_for_colour(GREEN, 100000, timeout=30)
        self.server.start()
        wait_for(lambda: info.session_id.encode() in self.login(gw1).command(ALL_LISTED), 60,
                 "the listing once the database is back")
        password = open(self.server.password_file).read().strip()
        for member in (gw1, node_a):
            self.assertNotIn(password, member.log())


class MariaDBClusterTests(ClusterTestCase):
    server_kind = databases.MariaDBServer

    def test_start_through_one_gateway_resume_through_the_other(self):
        gw1, gw2, node_a = self.members(("gw-1", "gateway"), ("gw-2", "gateway"), ("node-a", "node"))
        screen = self.screen()
        client, info = self.start(gw1, "on mariadb")
        attachment = self.attach(client, info, screen, gw1)
        self.assert_picture(screen, node_a, info)
        attachment.detach()
        wait_for(lambda: self.suspended_in(gw2, info.session_id), 30, "the session suspended")
        client, resumed = self.restore(gw2, info.session_id)
        self.attach(client, resumed, screen, gw2)
        self.assert_picture(screen, node_a, resumed)
        self.assertTrue(re.search(rf"{info.session_id}.*node-a", gw2.admin("sessions").stdout))


def greets(port: int) -> bool:
    """Whether an SSH server answers on 127.0.0.1:``port``."""
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as connection:
            connection.settimeout(2)
            return connection.recv(8).startswith(b"SSH-2.0-")
    except OSError:
        return False


class HAProxyTests(ClusterTestCase):
    """conf/haproxy-nxgate.cfg in front of two gateways: a client keeps
    reaching its session through the one address when a gateway dies."""

    def haproxy(self, gateways: list[Member]) -> int:
        import shutil as shutil_

        from tests.harness.net import free_port
        from tests.harness.gateway import REPO
        from tests.harness.process import stop

        if shutil_.which("haproxy") is None:
            raise SkipTest("haproxy is not installed (apt-get install haproxy)")
        with open(os.path.join(REPO, "conf", "haproxy-nxgate.cfg"), encoding="utf-8") as handle:
            text = handle.read()
        port = free_port()
        text = text.replace("bind 192.0.2.10:22", f"bind 127.0.0.1:{port}")
        for n, gateway in enumerate(gateways, 1):
            text = text.replace(f"192.0.2.1{n}:22", f"127.0.0.1:{gateway.port}")
        self.assertNotIn("192.0.2.", text)
        path = os.path.join(gateways[0].workdir, "haproxy.cfg")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
        checked = subprocess.run(["haproxy", "-c", "-f", path], capture_output=True, text=True, timeout=30)
        self.assertEqual(checked.returncode, 0, checked.stdout + checked.stderr)
        process = subprocess.Popen(["haproxy", "-db", "-f", path], stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.addCleanup(stop, process)
        return port

    def test_one_address_for_two_gateways_and_one_dies(self):
        gw1, gw2, node_a = self.members(("gw-1", "gateway"), ("gw-2", "gateway"), ("node-a", "node"))
        front = Member("front", "gateway", "", {})  # only its port is used: HAProxy's
        front.port = self.haproxy([gw1, gw2])
        self.addCleanup(front.stop)
        wait_for(lambda: greets(front.port), 20, "HAProxy to pass on a gateway's SSH greeting")
        screen = self.screen()
        client, info = self.start(front, "behind haproxy")
        attachment = self.attach(client, info, screen, gw1)
        self.assert_picture(screen, node_a, info)
        attachment.detach()
        wait_for(lambda: self.suspended_in(front, info.session_id), 30, "the session suspended")
        # Both gateways served someone; one dies; the address still works.
        gw1.kill()

        def resumed_through_the_front() -> tuple[NXClient, SessionInfo] | None:
            try:
                return self.restore(front, info.session_id)
            except Exception:  # a connection HAProxy gave to gw-1 before it noticed: the client tries again
                return None

        client, resumed = wait_for(resumed_through_the_front, 30, "a resume through HAProxy after gw-1 died")
        self.attach(client, resumed, screen, gw2)
        self.assert_picture(screen, node_a, resumed)
