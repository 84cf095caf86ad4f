"""End to end: the doors of a gateway that only routes see the sessions of
other members as a single box's doors see its own (issue 23).

A gateway-only member (no local sessions at all) and a node share a private
PostgreSQL.  A session is started through the gateway's SSH door with a real
NX login; it runs on the node.  Then:

* a user's ``nxgate-session watch`` on the gateway's D-Bus hears the session
  start and suspend (the node pushes its events over the members' wire);
* the gateway's portal serves the session's thumbnail (drawn on the node,
  as the user, from the session's own agent): the PNG is compared with the
  agent's framebuffer, scaled;
* renamed "x (machine down)" over D-Bus, it is still listed as running:
  "lost" is a field of the session, not a suffix of its name.
"""

from __future__ import annotations

import grp
import http.cookiejar
import io
import os
import pwd
import re
import shutil
import ssl
import subprocess
import tempfile
import urllib.parse
import urllib.request

from tests.harness import accounts, pixels
from tests.harness.process import wait_for
from tests.harness.x11 import Screenshot
from tests.test_e2e_cluster import ClusterTestCase
from tests.test_e2e_dbus import NAME, PATH, SystemBus, Watcher, as_user, user_env
from tests.test_e2e_store import listed
from tests.test_e2e_web import matching, scaled

_SITE = re.compile(r"Site \(TLS\) starting on (\d+)")
_TOKEN = re.compile(r'name="csrf" value="([^"]+)"')
_THUMB = re.compile(r'<img class="thumb" src="(/thumb/[^"]+)"')


class Portal:
    """The portal as a browser speaks to it: a cookie jar over HTTPS (the
    test's own self-signed certificate), the login form with its token."""

    def __init__(self, base: str) -> None:
        self.base = base
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        self.opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context),
                                                  urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))

    def get(self, path: str) -> tuple[int, str, bytes]:
        with self.opener.open(self.base + path, timeout=30) as answer:
            return answer.status, answer.headers.get("Content-Type", ""), answer.read()

    def login(self, user: str, password: str) -> str:
        _, _, form = self.get("/login")
        token = _TOKEN.search(form.decode()).group(1)
        data = urllib.parse.urlencode({"csrf": token, "user": user, "password": password}).encode()
        with self.opener.open(self.base + "/login", data=data, timeout=30) as answer:
            return answer.read().decode()


def png(data: bytes) -> Screenshot:
    from PIL import Image

    image = Image.open(io.BytesIO(data)).convert("RGBA")
    return Screenshot(image.width, image.height, image.tobytes())


class GatewayOnlyDoorsTests(ClusterTestCase):
    def test_dbus_signals_and_thumbnails_of_a_session_on_another_member(self):
        bus = SystemBus()
        self.addCleanup(bus.close)
        gateway = self.cluster.member("gw-a", "gateway", options={
            "dbus": {"address": bus.address}, "web": {"listen": "ssl:0:interface=127.0.0.1", "thumbnail_ttl": "1"}})
        node = self.cluster.member("node-b", "node")
        gateway.start()
        node.start()
        wait_for(lambda: {row["name"] for row in self.nodes(gateway) if row["state"] == "up"} >= {"gw-a", "node-b"},
                 20, "every member's heartbeat")
        watcher = Watcher(self, self.user, bus)

        client, info = self.start(gateway, "far")
        self.assertEqual(self.sessions(gateway)[info.session_id]["node"], "node-b")
        # Heard on the gateway's bus, though the session and its events are the node's.
        wait_for(lambda: "SessionCreated" in watcher.signals(info.session_id), 20, "SessionCreated on the gateway's bus")
        screen = self.screen()
        attachment = self.attach(client, info, screen, node)
        self.assert_picture(screen, node, info)
        wait_for(lambda: "SessionRunning" in watcher.signals(info.session_id), 20, "SessionRunning on the gateway's bus")

        # The portal of the gateway: the session's thumbnail, drawn on the node.
        port = int(wait_for(lambda: (_SITE.findall(gateway.log()) or [None])[-1], 20, "the portal to listen"))
        portal = Portal(f"https://127.0.0.1:{port}")
        page = portal.login(self.user.name, self.user.password)
        source = _THUMB.search(page)
        self.assertIsNotNone(source, "the portal offers no thumbnail of the session on the other member")
        status, kind, data = portal.get(source.group(1))
        self.assertEqual((status, kind), (200, "image/png"))
        thumbnail = png(data)
        frame = pixels.grab(f":{info.display}", self.authority(node, info.session_id))
        self.assertGreaterEqual(matching(thumbnail, scaled(frame, thumbnail.width, thumbnail.height), tolerance=8),
                                0.95)
        self.assertAlmostEqual(thumbnail.width / thumbnail.height, frame.width / frame.height, delta=0.05)

        # A name that reads like the old "lost" suffix is only a name.
        renamed = as_user(self.user, ["gdbus", "call", "--system", "--dest", NAME, "--object-path", PATH, "--method",
                                      f"{NAME}.Rename", info.session_id, "x (machine down)"], env=user_env(self.user, bus))
        self.assertEqual(renamed.returncode, 0, renamed.stderr)
        row = listed(self.login(gateway).command('listsession --status="suspended,running"'))[info.session_id]
        self.assertIn(b"x (machine down)", row)
        self.assertRegex(row, rb"\bRunning\b")
        self.assertEqual(self.sessions(gateway)[info.session_id]["state"], "running")

        attachment.detach()
        wait_for(lambda: "SessionSuspended" in watcher.signals(info.session_id), 30,
                 "SessionSuspended on the gateway's bus")
        # Nothing of the session is on the gateway: it only routes.
        self.assertNotIn(info.session_id, gateway.admin("--json", "status").stdout)


class NodeOwnsTheUserTests(ClusterTestCase):
    """A node whose accounts are numbered differently from the gateway's: the
    session's files and processes are the node's own uid for that name
    (issue 23: the node never trusts the uid a gateway resolved)."""

    def test_a_node_with_another_uid_for_the_user_runs_the_session_as_its_own(self):
        entry = self.user.entry
        elsewhere = entry.pw_uid + 20000
        with self.assertRaises(KeyError):
            pwd.getpwuid(elsewhere)
        directory = tempfile.mkdtemp(prefix="nxgate-accounts-")
        self.addCleanup(shutil.rmtree, directory, True)
        etc = accounts.private_etc(directory, self.user.name, grp.getgrgid(entry.pw_gid).gr_name, elsewhere)
        # On the node's machine the user's home is its own uid's.
        subprocess.run(["chown", "-R", f"{elsewhere}:{elsewhere}", entry.pw_dir], check=True)
        self.addCleanup(subprocess.run, ["pkill", "-KILL", "-U", str(elsewhere)], check=False)

        gateway = self.cluster.member("gw-a", "gateway")
        node = self.cluster.member("node-b", "node")
        node.wrapper = accounts.wrapper(etc)
        gateway.start()
        node.start()
        wait_for(lambda: {row["name"] for row in self.nodes(gateway) if row["state"] == "up"} >= {"gw-a", "node-b"},
                 20, "every member's heartbeat")

        client, info = self.start(gateway, "renumbered")
        session_dir = os.path.join(node.state_dir, "sessions", info.session_id)
        self.assertEqual(os.stat(session_dir).st_uid, elsewhere)
        self.assertEqual(os.stat(self.authority(node, info.session_id)).st_uid, elsewhere)
        screen = self.screen()
        self.attach(client, info, screen, node)
        self.assert_picture(screen, node, info)
        agents = [pid for pid in os.listdir("/proc") if pid.isdigit() and _uid_of(pid) == elsewhere
                  and _name_of(pid) == "nxagent"]
        self.assertTrue(agents, "no nxagent runs as the node's uid of the user")
        self.assertEqual(self.sessions(gateway)[info.session_id]["node"], "node-b")


def _uid_of(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _name_of(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return ""
