"""End to end: pyhoca-cli on a cluster gateway gets, suspends and resumes a session that runs on another
member: the X2Go door's graphics link goes through the same stream to the node as the NX door's, and
the picture on the client is the agent's on the node.  python-x2go's published applications (as
pyhoca-gui uses them) for a session on another member: the menu comes from the node's .desktop files
and the application runs there, rootless, with the same picture on the client."""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
import tempfile

from twisted.trial.unittest import SkipTest

from tests.harness import pixels
from tests.harness.process import stop, wait_for
from tests.harness.x11 import ClientScreen
from tests.test_e2e_cluster import ClusterTestCase
from tests.test_e2e_x2go import display_of
from tests.test_e2e_x2go_published import DESKTOP, ICON, PUBLISHED_ARGV, PublishedClient

_STARTED = re.compile(r"X2Go session (\S+) \(session ([0-9A-F]{32}),")


class X2GoThroughTheClusterTests(ClusterTestCase):
    def setUp(self):
        if shutil.which("pyhoca-cli") is None:
            raise SkipTest("pyhoca-cli is not installed (apt-get install pyhoca-cli python3-x2go)")
        super().setUp()
        self.home = tempfile.mkdtemp(prefix="x2go-cluster-client-")
        self.addCleanup(shutil.rmtree, self.home, True)
        self.client_screen = ClientScreen(1280, 1024, window_manager=True)
        self.addCleanup(self.client_screen.close)

    def pyhoca(self, gateway, *args: str) -> tuple[subprocess.Popen, str]:
        log = tempfile.mktemp(prefix="pyhoca-", suffix=".log", dir=self.home)
        with open(log, "wb") as handle:
            process = subprocess.Popen(
                ["pyhoca-cli", "--server", "127.0.0.1", "-p", str(gateway.port), "-l", self.user.name, "--password",
                 self.user.password, "--add-to-known-hosts", *args],
                env=dict(os.environ, DISPLAY=self.client_screen.name, HOME=self.home), stdin=subprocess.DEVNULL,
                stdout=handle, stderr=subprocess.STDOUT)
        self.addCleanup(stop, process)
        return process, log

    def reported(self, process: subprocess.Popen, log: str) -> str:
        def name() -> str | None:
            with open(log, errors="replace") as handle:
                text = handle.read()
            if process.poll() is not None and "as master session" not in text:
                raise AssertionError(f"pyhoca-cli exited {process.returncode}: {text[-3000:]}")
            match = re.search(r"Using session (\S+) as master session", text)
            return match.group(1) if match else None

        return wait_for(name, 120, "pyhoca-cli to report its session")

    def window_equal(self, node, session_id: str, display: int, title: str | None = None) -> float:
        title = title or f"{self.user.name}@"
        authority = os.path.join(node.state_dir, "sessions", session_id, "authority")
        best = [0.0]

        def equal() -> bool:
            inside = pixels.find_window(f":{display}", title, authority, min_size=50)
            outside = pixels.find_window(self.client_screen.name, title, min_size=50)
            if inside is None or outside is None:
                return False
            drawn = pixels.crop(pixels.grab(f":{display}", authority), inside)
            shown = pixels.crop(self.client_screen.shot(), pixels.Rect(outside.x, outside.y, drawn.width,
                                                                       drawn.height))
            best[0] = max(best[0], pixels.equal_share(drawn, shown) if drawn.colours() > 1 else 0.0)
            return best[0] >= 0.99

        try:
            wait_for(equal, 90, "the node's session on the X2Go client", interval=1)
        except AssertionError:
            pixels.save_png(self.client_screen.shot(), os.path.join(node.workdir, "x2go-client.png"))
        return best[0]

    def test_pyhoca_on_gateway_1_runs_and_resumes_a_session_on_node_2(self):
        gateway, node = self.members(("gw1", "gateway"), ("node2", "node"))
        first, log = self.pyhoca(gateway, "-c", "TERMINAL", "-g", "800x600", "-q", "lan")
        name = self.reported(first, log)
        found = dict(_STARTED.findall(gateway.log()))
        session_id, display = found[name], display_of(name)
        self.assertEqual(self.sessions(gateway)[session_id]["node"], "node2")
        self.assertTrue(os.path.isdir(os.path.join(node.state_dir, "sessions", session_id)))
        self.assertGreaterEqual(self.window_equal(node, session_id, display), 0.99)

        stop(first)
        wait_for(lambda: self.sessions(gateway)[session_id]["state"] == "suspended", 60, "the suspension")
        again, log = self.pyhoca(gateway, "-R", name, "-g", "800x600", "-q", "lan")
        self.assertEqual(self.reported(again, log), name)
        self.assertGreaterEqual(self.window_equal(node, session_id, display), 0.99)
        self.assertEqual(self.sessions(gateway)[session_id]["state"], "running")

    def test_python_x2go_on_gateway_1_runs_a_published_application_on_node_2(self):
        applications = tempfile.mkdtemp(prefix="nxgate-published-")
        self.addCleanup(shutil.rmtree, applications, True)
        os.chmod(applications, 0o755)
        with open(os.path.join(applications, "nxgate-test.desktop"), "w", encoding="utf-8") as handle:
            handle.write(DESKTOP)
        published = {"sessions": {"published_applications": applications}}
        gateway = self.cluster.member("gw1", "gateway", options=published).start()
        node = self.cluster.member("node2", "node", options=published).start()
        wait_for(lambda: {row["name"] for row in self.nodes(gateway) if row["state"] == "up"} >= {"gw1", "node2"}, 20,
                 "every member's heartbeat")

        client = PublishedClient(gateway.port, self.user.name, self.user.password, self.home, self.client_screen.name)
        self.addCleanup(stop, client.process)
        (entry,) = client.menu(gateway.log)
        self.assertIn("Name=Published Terminal", entry["desktop"].splitlines())
        with open(ICON, "rb") as handle:
            self.assertEqual(base64.b64decode(entry["icon"]), handle.read())
        name, session_id = _STARTED.findall(gateway.log())[-1]
        self.assertEqual(self.sessions(gateway)[session_id]["node"], "node2")
        client.wait_started(self.user.name)
        # Started by node 2 (its log), not by the gateway the client speaks to.
        self.assertIn(f"starts the published application {PUBLISHED_ARGV!r}", node.log())
        self.assertNotIn("starts the published application", gateway.log())
        self.assertGreaterEqual(self.window_equal(node, session_id, display_of(name), title="Published a b"), 0.99)
