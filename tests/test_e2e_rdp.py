"""End to end: Windows (RDP) sessions through the real NX path, against xrdp.

xrdp's login screen is a deterministic picture in colours the test host
chooses; both engines (rdpy in Python, FreeRDP's xfreerdp) must show it on
the NX client's screen, take typing into its user field, and survive a
suspend and resume.
"""

from __future__ import annotations

import subprocess
import time

from tests.harness.process import wait_for
from tests.harness.rdphost import GREEN, MAGENTA, RDPHost, free_port
from tests.harness.ssh import SessionInfo
from tests.test_e2e_remote import remote_start
from tests.test_e2e_sessions import SessionTestCase

BLACK = (0, 0, 0)


class RDPTestCase(SessionTestCase):
    engine = "rdpy"

    def make_fixture(self):
        host = RDPHost("tls")
        return self.fixture_with_host(host, {
            "target win": {"protocol": "rdp", "host": "127.0.0.1", "port": str(host.port), "engine": self.engine,
                           "security": "tls"},
            "target gone": {"protocol": "rdp", "host": "127.0.0.1", "port": str(free_port())},  # nothing listens
        })

    def start_windows(self, server: str = "win"):
        client = self.login()
        started = time.monotonic()
        # No user: xrdp shows its login screen (with one it would try to log in).
        reply = client.command(remote_start("windows", server, "", '--fullscreen="1"'), timeout=60)
        return client, reply, started

    def check_login_screen_and_typing(self):
        client, reply, started = self.start_windows()
        self.assertIn(b"NX> 710 Session status: running", reply, reply)
        info = SessionInfo.parse(reply)
        attachment = self.attach(client, info)
        self.screen.wait_for_colour(MAGENTA, 50000, timeout=40)
        self.screen.wait_for_colour(GREEN, 10000, timeout=20)
        print(f"\n    startsession to first remote picture (RDP, {self.engine}): {time.monotonic() - started:.2f} s")
        time.sleep(6)  # rdpy: the server ignores input for its first seconds
        black_before = self.screen.shot().count(BLACK)
        self.screen.xdotool("mousemove", "400", "300")
        self.screen.xdotool("type", "--delay", "60", "WWWWWWWW")
        wait_for(lambda: self.screen.shot().count(BLACK) > black_before + 100, 20, "the typed text in xrdp's user field")
        return info, attachment


class RdpyTests(RDPTestCase):
    engine = "rdpy"

    def test_login_screen_typing_suspend_resume(self):
        info, attachment = self.check_login_screen_and_typing()
        attachment.detach()
        self.wait_status(info.session_id, "Suspended")
        self.assertTrue(subprocess.run(["pgrep", "-u", self.user.name, "-f", "nxgate.clients.engines.rdp"],
                                       capture_output=True).stdout)
        second = self.login()
        self.attach(second, self.restore(second, info.session_id))
        self.screen.wait_for_colour(MAGENTA, 50000, timeout=30)

    def test_unreachable_rdp_host(self):
        started = time.monotonic()
        _, reply, _ = self.start_windows("gone")
        self.assertIn(b"NX> 596 Error: Cannot connect to the remote desktop gone: ", reply)
        self.assertLess(time.monotonic() - started, 60)  # a deadline: refused at once, not after a hung connect


class FreeRDPTests(RDPTestCase):
    engine = "freerdp"

    def test_login_screen_and_typing(self):
        self.check_login_screen_and_typing()
        listing = subprocess.run(["ps", "-eww", "-o", "args"], capture_output=True, text=True).stdout
        self.assertIn("xfreerdp", listing)
        self.assertIn("/from-stdin:force", listing)
