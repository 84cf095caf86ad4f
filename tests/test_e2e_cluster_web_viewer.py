"""End to end: the browser viewer of a session that another cluster member runs (issues 23 and 25).

A gateway with the portal and a node, separate ``twistd nxgate`` processes
on a private PostgreSQL (:mod:`tests.test_e2e_cluster`'s fixture).  A
session started through the gateway runs on the node; opened in Chromium
on the gateway's portal, it is shown by an x11vnc that the *node* starts on
the session's display (the gateway only relays the stream, a ``view``
stream over the cluster's TLS link), and the page's canvas equals the
agent's framebuffer on the node.
"""

from __future__ import annotations

import os

from twisted.trial.unittest import SkipTest

from tests.harness import pixels
from tests.harness.browser import Browser, available
from tests.harness.process import wait_for
from tests.harness.web import web_base, web_options
from tests.test_e2e_cluster import ClusterTestCase
from tests.test_e2e_web_viewer import RED, canvas_shot, programs_of


class ClusterWebViewerTests(ClusterTestCase):
    def setUp(self) -> None:
        why = available()
        if why:
            raise SkipTest(why)
        super().setUp()

    def test_a_session_on_the_node_is_shown_by_the_nodes_viewer(self) -> None:
        gateway = self.cluster.member("gw-web", "gateway", options=web_options()).start()
        node = self.cluster.member("node-v", "node").start()
        wait_for(lambda: {row["name"] for row in self.nodes(gateway) if row["state"] == "up"} >= {"gw-web", "node-v"},
                 20, "every member's heartbeat")
        screen = self.screen()
        client, info = self.start(gateway, "seen from afar")
        attachment = self.attach(client, info, screen, gateway)
        self.assertEqual(self.sessions(gateway)[info.session_id]["node"], "node-v")
        screen.wait_for_colour(RED, 20000, timeout=60)

        browser = Browser(1024, 768)
        self.addCleanup(browser.quit)
        base = web_base(gateway)
        browser.login(base, self.user.name, self.user.password)
        browser.wait(lambda: browser.find_all("nav .who"), what="the portal after the login")
        browser.get(base + "/")
        browser.wait(lambda: browser.find_all("form[action='/view/open'] button"), 30, "an Open button")[0].click()
        browser.wait(lambda: (shot := canvas_shot(browser)) is not None and shot.count(RED) > 20000, 60,
                     "the session drawn in the page")
        wait_for(lambda: self.suspended_in(gateway, info.session_id), 30, "the NX client's suspension")
        attachment.detach()

        authority = self.authority(node, info.session_id)

        def same_picture() -> bool:
            shot, master = canvas_shot(browser), pixels.grab(f":{info.display}", authority)
            return (shot is not None and (shot.width, shot.height) == (master.width, master.height)
                    and pixels.equal_share(shot, master) > 0.97)

        wait_for(same_picture, 30, "the canvas to equal the agent's framebuffer on the node")
        # The node started the viewer (one x11vnc, as the user) and the gateway relays it.
        self.assertIn("x11vnc on session " + info.session_id, node.log())
        self.assertNotIn("x11vnc on session", gateway.log())
        self.assertIn(f"on member node-v", gateway.log())
        self.assertEqual(sorted(programs_of(self.user.entry.pw_uid).values()), ["x11vnc"])

        # Leaving the page ends the node's viewer; the session stays suspended there.
        browser.get(base + "/")
        wait_for(lambda: not programs_of(self.user.entry.pw_uid), 20, "the node's x11vnc to end")
        self.assertTrue(self.suspended_in(gateway, info.session_id))
        directory = os.path.join(node.state_dir, "sessions", info.session_id)
        wait_for(lambda: not [n for n in os.listdir(directory) if n.startswith("view-")], 15,
                 "the viewer's socket to go")
