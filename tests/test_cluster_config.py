"""The [cluster] section: absent means one box; present, every problem at once."""

import os

from twisted.trial.unittest import SynchronousTestCase

from nxgate import config


class ClusterConfigTests(SynchronousTestCase):
    def setUp(self):
        self.dir = os.path.abspath(self.mktemp())
        os.makedirs(self.dir)
        for name in ("ca.pem", "a.pem", "a.key"):
            open(os.path.join(self.dir, name), "w").close()

    def write(self, text):
        path = os.path.join(self.dir, "nxgate.conf")
        with open(path, "w") as handle:
            handle.write(text)
        return path

    def problems(self, text):
        with self.assertRaises(config.ConfigError) as caught:
            config.load(self.write(text))
        return "\n".join(caught.exception.problems)

    def test_absent_is_single_box(self):
        self.assertIsNone(config.load(None).cluster)
        self.assertIsNone(config.load(self.write("[server]\nlisten = tcp:4022\n")).cluster)

    def test_full_section(self):
        c = config.load(self.write(
            "[cluster]\nname = node-a\nroles = gateway, node\nlisten = tcp:7022:interface=127.0.0.21\n"
            "address = 127.0.0.21:7022\nca = ca.pem\ncertificate = a.pem\nkey = a.key\nheartbeat = 0.5\nweight = 2\n"))
        cluster = c.cluster
        self.assertEqual(cluster.name, "node-a")
        self.assertEqual(cluster.roles, frozenset({"gateway", "node"}))
        self.assertEqual(cluster.ca, os.path.join(self.dir, "ca.pem"))  # relative to the file
        self.assertEqual(cluster.key, os.path.join(self.dir, "a.key"))
        self.assertEqual((cluster.heartbeat, cluster.weight), (0.5, 2.0))

    def test_gateway_only_needs_no_listener_and_roles_default_to_both(self):
        c = config.load(self.write("[cluster]\nname = gw\nroles = gateway\nca = ca.pem\ncertificate = a.pem\nkey = a.key\n"))
        self.assertEqual(c.cluster.roles, frozenset({"gateway"}))
        c = config.load(self.write("[cluster]\nname = n\nlisten = tcp:7022\naddress = h:7022\n"
                                   "ca = ca.pem\ncertificate = a.pem\nkey = a.key\n"))
        self.assertEqual(c.cluster.roles, frozenset({"gateway", "node"}))
        self.assertEqual((c.cluster.heartbeat, c.cluster.weight), (2.0, 1.0))

    def test_every_problem_at_once(self):
        text = self.problems("[cluster]\nname = Node_A\nroles = gateway, broker\nheartbeat = 0\n"
                             "address = nowhere\nca = missing.pem\ncolour = blue\n")
        for expected in ("[cluster] name = 'Node_A': expected a DNS name",
                         "[cluster] roles = 'gateway, broker': expected gateway, node or both",
                         "[cluster] heartbeat = '0'", "unknown option 'colour'",
                         "[cluster] needs certificate", "[cluster] needs key",
                         "[cluster] needs listen on a member with role node",
                         "[cluster] address = 'nowhere': expected host:port",
                         "missing.pem: no such file"):
            self.assertIn(expected, text)
        self.assertNotIn("needs name", text)  # given but wrong: said once

    def test_changing_the_cluster_needs_a_restart(self):
        base = "[cluster]\nname = gw\nroles = gateway\nca = ca.pem\ncertificate = a.pem\nkey = a.key\n"
        running = config.load(self.write(base))
        self.assertEqual(config.restart_needed(running, config.load(self.write(base))), [])
        self.assertEqual(config.restart_needed(running, config.load(self.write(base.replace("gw", "gw2")))),
                         ["[cluster]"])
        self.assertEqual(config.restart_needed(running, config.load(self.write(""))), ["[cluster]"])
