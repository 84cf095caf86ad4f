"""End to end: RDP and VNC hosts through the real NX path.

A real VNC server (x11vnc / Xtigervnc over an Xvfb with a known picture) or
xrdp; the gateway starts an nxagent desktop with a viewer in it; the test
client sees the remote pixels on its own Xvfb through the SSH tunnel and
nxproxy, and types into the remote side.
"""

from __future__ import annotations

import os
import subprocess
import time

from tests.harness.process import wait_for
from tests.harness.ssh import SessionInfo
from tests.harness.vnchost import ORANGE, VNCHost
from tests.test_e2e_sessions import START, SessionTestCase, agent_processes

BLUE_TERM = (0, 0, 255)
PASSWORD = "vnc-Secret-1"


def remote_start(kind: str, server: str, password: str = "", extra: str = "") -> str:
    return START.format(name=f"{kind} test", type=kind, extra=(
        f'--agent_server="{server}" --agent_user="" --agent_password="{password}" --agent_domain="" {extra}'))


class VNCSessionTestCase(SessionTestCase):
    """A VNC host with a password, and a gateway that knows it as target "lab"."""

    vnc_server = "x11vnc"
    allow_any_host = "yes"
    engine = ""
    password: str | None = PASSWORD

    def make_fixture(self):
        host = VNCHost(self.vnc_server, password=self.password)
        target = {"protocol": "vnc", "host": "127.0.0.1", "port": str(host.port)}
        if self.engine:
            target["engine"] = self.engine
        return self.fixture_with_host(host, {"remote": {"allow_any_host": self.allow_any_host}, "target lab": target})

    def setUp(self):
        super().setUp()
        self.host.set_background(ORANGE)  # a test may have changed it

    def start_remote(self, server: str, password: str = PASSWORD, extra: str = ""):
        client = self.login()
        reply = client.command(remote_start("vnc", server, password, extra), timeout=60)
        return client, reply


class VNCTests(VNCSessionTestCase):
    def test_remote_picture_and_typing(self):
        typed = os.path.join(self.host.dir, "typed.txt")
        self.host.xterm_typing_into(typed, BLUE_TERM)
        started = time.monotonic()
        client, reply = self.start_remote(f"127.0.0.1::{self.host.port}")
        self.assertIn(b"NX> 710 Session status: running", reply, reply)
        self.attach(client, SessionInfo.parse(reply))
        self.screen.wait_for_colour(ORANGE, 20000, timeout=30)
        self.screen.wait_for_colour(BLUE_TERM, 20000, timeout=30)
        print(f"\n    startsession to first remote picture (VNC): {time.monotonic() - started:.2f} s")
        self.screen.xdotool("mousemove", "50", "50")
        time.sleep(0.5)
        self.screen.xdotool("type", "--delay", "40", "through vnc")
        self.screen.xdotool("key", "Return")
        wait_for(lambda: "through vnc" in open(typed).read(), 20, "the typing on the VNC host")
        # The password is in no process's argv or environment.
        listing = subprocess.run(["ps", "-eww", "-o", "args"], capture_output=True, text=True).stdout
        self.assertNotIn(PASSWORD, listing)
        viewer = subprocess.run(["pgrep", "-u", self.user.name, "-f", "nxgate.clients.engines.vnc"], capture_output=True,
                                text=True).stdout.split()
        self.assertEqual(len(viewer), 1)
        with open(f"/proc/{viewer[0]}/environ", "rb") as environ:
            self.assertNotIn(PASSWORD.encode(), environ.read())
        self.assertNotIn(PASSWORD, self.gateway.log())

    def test_suspend_and_resume_keep_the_remote_connection(self):
        client, reply = self.start_remote(f"127.0.0.1:{self.host.port}")
        info = SessionInfo.parse(reply)
        attachment = self.attach(client, info)
        self.screen.wait_for_colour(ORANGE, 20000, timeout=30)
        viewer = subprocess.run(["pgrep", "-u", self.user.name, "-f", "nxgate.clients.engines"], capture_output=True,
                                text=True).stdout.split()
        attachment.detach()
        self.wait_status(info.session_id, "Suspended")
        self.host.set_background((0, 128, 0))  # changes while suspended are seen on resume
        time.sleep(1)
        self.assertEqual(subprocess.run(["pgrep", "-u", self.user.name, "-f", "nxgate.clients.engines"],
                                        capture_output=True, text=True).stdout.split(), viewer)
        second = self.login()
        self.attach(second, self.restore(second, info.session_id))
        self.screen.wait_for_colour((0, 128, 0), 20000, timeout=30)

    def test_wrong_password_is_an_nx_error(self):
        _, reply = self.start_remote(f"127.0.0.1::{self.host.port}", "not-the-password")
        self.assertIn(f"NX> 596 Error: The remote desktop 127.0.0.1:{self.host.port} refused the login:".encode(),
                      reply)
        self.assertIn(b"NX> 500 ERROR: Last operation failed.", reply)
        wait_for(lambda: not agent_processes(self.user.name), 20, "the failed session's agent to end")

    def test_unreachable_host_is_an_nx_error(self):
        started = time.monotonic()
        _, reply = self.start_remote("127.0.0.1::1")
        self.assertIn(b"NX> 596 Error: Cannot connect to the remote desktop 127.0.0.1:1:", reply)
        self.assertLess(time.monotonic() - started, 60)  # a deadline: refused at once, not after a hung connect
        self.assertEqual(agent_processes(self.user.name), [])

    def test_target_by_name(self):
        client, reply = self.start_remote("lab")
        self.attach(client, SessionInfo.parse(reply))
        self.screen.wait_for_colour(ORANGE, 20000, timeout=30)


class TargetsOnlyTests(VNCSessionTestCase):
    vnc_server = "tigervnc"
    allow_any_host = "no"

    def test_only_targets_and_tigervnc(self):
        _, reply = self.start_remote(f"127.0.0.1::{self.host.port}")
        self.assertIn(b"is not a remote desktop this server serves. Available: lab (vnc).", reply)
        client, reply = self.start_remote("lab")
        self.attach(client, SessionInfo.parse(reply))
        self.screen.wait_for_colour(ORANGE, 20000, timeout=30)


class NoPasswordTests(VNCSessionTestCase):
    vnc_server = "tigervnc"
    password = None

    def test_vnc_without_a_password(self):
        client, reply = self.start_remote(f"127.0.0.1::{self.host.port}", password="")
        self.attach(client, SessionInfo.parse(reply))
        self.screen.wait_for_colour(ORANGE, 20000, timeout=30)


class NativeVNCTests(VNCSessionTestCase):
    engine = "tightvnc"

    def test_xtightvncviewer_engine(self):
        client, reply = self.start_remote("lab")
        self.attach(client, SessionInfo.parse(reply))
        self.screen.wait_for_colour(ORANGE, 20000, timeout=40)
        listing = subprocess.run(["ps", "-eww", "-o", "args"], capture_output=True, text=True).stdout
        self.assertIn("xtightvncviewer", listing)
        self.assertNotIn(PASSWORD, listing)
