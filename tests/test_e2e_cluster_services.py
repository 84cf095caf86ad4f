"""End to end: nxgate-client's printers and folders for a session on another cluster member, over the
client's own SSH connection (reverse streams: the NX door on gateway 1 opens a route to node 2, whose
reverse listeners the session's cupsd and smbnetfs reach).  Before, the tunnels listened in the gateway's
own process, so a session on another member fell back to the NX channels.

nxgate-client logs in to gateway 1 with ``--print`` and ``--share``; the session runs on node 2.  A text
printed with ``lp`` in the session arrives at the client's printer (the private CUPS of
tests/harness/cups.py), a file of the client's folder is read in the session and one written there
arrives in the folder, byte for byte; node 2's log says both go back to the client over its SSH
connection (not the NX channels), and the mount's path names node 2's reverse listener.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid

from twisted.trial.unittest import SkipTest

from tests.harness.cups import client_printing
from tests.harness.gateway import REPO
from tests.harness.process import stop, wait_for
from tests.harness.x11 import ClientScreen
from tests.test_e2e_cluster import ClusterTestCase
from tests.test_e2e_printing import QUEUE, _only_session, _program_env
from tests.test_e2e_sound import as_user

RED = (255, 0, 0)


class ClientServicesThroughTheClusterTests(ClusterTestCase):
    def setUp(self):
        if not os.path.exists("/dev/fuse") or shutil.which("smbnetfs") is None:
            raise SkipTest("no /dev/fuse or smbnetfs here")
        super().setUp()
        mode = os.stat("/dev/fuse").st_mode & 0o777
        if mode & 0o006 != 0o006:
            os.chmod("/dev/fuse", 0o666)
            self.addCleanup(os.chmod, "/dev/fuse", mode)
        self.folder = tempfile.mkdtemp(prefix="nxgate-share-")
        self.addCleanup(shutil.rmtree, self.folder, True)

    def test_printing_and_folders_of_a_session_on_node_2_come_back_through_gateway_1(self):
        gateway, node = self.members(("gw1", "gateway"), ("node2", "node"))
        printer, cups = client_printing(self, gateway.workdir)
        screen = ClientScreen(800, 600)
        self.addCleanup(screen.close)
        with open(os.path.join(self.folder, "hello.txt"), "wb") as handle:
            handle.write(b"from the client's folder\n")
        tmp = tempfile.mkdtemp(prefix="nxgate-client-tmp-")
        self.addCleanup(shutil.rmtree, tmp, True)
        env = {key: value for key, value in os.environ.items() if key != "NXGATE_PASSWORD"}
        env.update(PYTHONPATH=REPO, TMPDIR=tmp, NXGATE_PASSWORD=self.user.password, DISPLAY=screen.name)
        client = subprocess.Popen(
            [sys.executable, "-m", "nxgate.clients.nx", "--accept-any-host-key", "--geometry", "800x600", "--print",
             "--print-server", cups.server, "--share", f"work={self.folder}", "--verbose",
             f"{self.user.name}@127.0.0.1:{gateway.port}"],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.addCleanup(stop, client)
        screen.wait_for_colour(RED, 20000, timeout=120)
        session_id = wait_for(lambda: _only_session(self.user.name), 30, "the session's agent")
        self.assertEqual(self.sessions(gateway)[session_id]["node"], "node2")

        # The folder: mounted through node 2's reverse listener, files both ways.
        wait_for(lambda: "the client takes its folders back" in node.log(), 60, "the folders' route on node 2")
        port = int(re.search(r"the client takes its folders back \(listening on 127\.0\.0\.1:(\d+)\)",
                             node.log()).group(1))
        link = os.path.join(self.user.home, "MyShares", "work")
        wait_for(lambda: as_user(self.user.name, {"HOME": self.user.home}, "test", "-d", link + "/").returncode == 0,
                 90, "the client's folder at ~/MyShares/work")
        self.assertIn(f"/127.0.0.1:{port}/work", os.readlink(link), "smbnetfs mounts through the reverse listener")
        read = as_user(self.user.name, {"HOME": self.user.home}, "cat", os.path.join(link, "hello.txt"))
        self.assertEqual(read.stdout, "from the client's folder\n")
        payload = uuid.uuid4().hex
        wrote = as_user(self.user.name, {"HOME": self.user.home}, "sh", "-c",
                        f"printf '%s' {payload} > {os.path.join(link, 'back.txt')}")
        self.assertEqual(wrote.returncode, 0, wrote.stderr)
        with open(os.path.join(self.folder, "back.txt")) as handle:
            self.assertEqual(handle.read(), payload)

        # The printers: the session's queue sends into node 2's reverse listener; a job arrives at the client.
        wait_for(lambda: "the client takes its printing back" in node.log(), 60, "the printers' route on node 2")
        path = re.search(r"the client takes its printing back \(listening at (\S+)\)", node.log()).group(1)
        self.assertTrue(path.startswith(os.path.join(node.state_dir, "reverse")), path)
        program = wait_for(lambda: _program_env(self.user.name, session_id), 30, "the session program")
        session_env = {key: program[key] for key in ("CUPS_SERVER", "HOME")}
        wait_for(lambda: QUEUE in as_user(self.user.name, session_env, "lpstat", "-a").stdout, 90,
                 "the client's queue in the session", interval=0.3)
        text = f"printed on node 2 through gateway 1 {uuid.uuid4().hex}"
        document = os.path.join(self.user.home, "cluster-print.txt")
        as_user(self.user.name, session_env, "sh", "-c", f"printf '%s\\n' '{text}' > {document}")
        printed = as_user(self.user.name, session_env, "lp", document)
        self.assertEqual(printed.returncode, 0, printed.stderr)
        self.assertEqual(printer.wait_for_text(text.encode()).strip(), text.encode())
        self.assertNotIn("through the NX", node.log())
        client.send_signal(signal.SIGTERM)
        client.wait(30)
        wait_for(lambda: "the client no longer takes its folders back" in node.log(), 30,
                 "the route's end on node 2 when the client went")
