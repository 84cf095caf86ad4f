"""The gateway's start-up line says what this process listens on (issue 27:
a node-only member claimed it listened for NX logins on port 4022)."""

from __future__ import annotations

from twisted.trial.unittest import TestCase

from nxgate.config import ClusterConfig, Config, ServerSection
from nxgate.gateway.root import startup_line


def formatted(config: Config, serves_doors: bool) -> str:
    text, fields = startup_line(config, serves_doors, "nxgate")
    return text.format(**fields)


class StartupLineTests(TestCase):
    def test_a_node_only_member_names_its_cluster_port_and_no_nx_port(self) -> None:
        config = Config(server=ServerSection(server_name="n"), cluster=ClusterConfig(
            name="node-a", roles=frozenset({"node"}), listen="tcp:7022:interface=10.0.0.5", address="10.0.0.5:7022"))
        line = formatted(config, serves_doors=False)
        self.assertNotIn("4022", line)
        self.assertNotIn("listening on", line)
        self.assertIn("cluster member node-a with role node only: no NX logins here", line)
        self.assertIn("gateways reach it on 10.0.0.5, port 7022 ([cluster] listen)", line)

    def test_a_gateway_names_its_nx_port(self) -> None:
        for cluster in (None, ClusterConfig(name="gw", roles=frozenset({"gateway"}))):
            config = Config(server=ServerSection(server_name="g"), cluster=cluster)
            line = formatted(config, serves_doors=True)
            self.assertIn("listening on all interfaces, port 4022 (tcp:4022:backlog=1024) for NX logins", line)
