"""Unit tests of nxgate.node.cgroups: the limits of jailed sessions, in the
cgroup subtree systemd delegates to the service (issue 23: never the root's)."""

from __future__ import annotations

import os

from twisted.trial.unittest import SynchronousTestCase

from nxgate.node import cgroups
from nxgate.node.cgroups import SessionCgroups

OWN = "/system.slice/nxgate.service"


class CgroupTests(SynchronousTestCase):
    """nxgate.node.cgroups on a fake cgroup v2 tree in a temporary directory."""

    def tree(self, controllers: str | None, delegated: str | None = None) -> str:
        root = self.mktemp()
        os.makedirs(root)
        if controllers is not None:
            self.files(root, {"cgroup.controllers": controllers, "cgroup.subtree_control": ""})
        if delegated is not None:
            base = os.path.join(root, OWN.lstrip("/"))
            os.makedirs(base)
            self.files(base, {"cgroup.controllers": delegated, "cgroup.subtree_control": "",
                              "cgroup.procs": "4242\n4343\n"})
        return root

    @staticmethod
    def files(directory: str, contents: dict[str, str]) -> None:
        for name, text in contents.items():
            with open(os.path.join(directory, name), "w") as handle:
                handle.write(text)

    @staticmethod
    def read(*parts: str) -> str:
        with open(os.path.join(*parts)) as handle:
            return handle.read()

    def test_only_configured_limits(self):
        self.assertEqual(cgroups.wanted("", "", 0), {})
        self.assertEqual(cgroups.wanted("2G", "", 200), {"memory.max": "2G", "pids.max": "200"})

    def test_own_cgroup_is_the_v2_line(self):
        self.assertEqual(cgroups.own_cgroup("1:name=systemd:/x\n0::/system.slice/nxgate.service\n"), OWN)
        self.assertIsNone(cgroups.own_cgroup("4:memory:/x\n"))

    def test_why_limits_cannot_apply(self):
        self.assertIn("not a cgroup v2 hierarchy", SessionCgroups(self.tree(None), OWN).unavailable({"pids.max": "9"}))
        self.assertIn("root cgroup", SessionCgroups(self.tree("cpu memory pids"), "/").unavailable({"pids.max": "9"}))
        self.assertIn("cannot be read", SessionCgroups(self.tree("cpu memory pids"), OWN).unavailable({"pids.max": "9"}))
        self.assertIn("memory are not delegated", SessionCgroups(self.tree("cpu memory pids", "cpu pids"), OWN)
                      .unavailable({"memory.max": "1G", "pids.max": "9"}))
        self.assertIsNone(SessionCgroups(self.tree("cpu memory pids", "cpu memory pids"), OWN)
                          .unavailable({"memory.max": "1G"}))

    def test_create_writes_under_the_services_own_cgroup_only(self):
        root = self.tree("cpu memory pids", "cpu memory pids")
        base = os.path.join(root, OWN.lstrip("/"))
        os.makedirs(os.path.join(base, "sessions"))
        self.files(os.path.join(base, "sessions"), {"cgroup.subtree_control": ""})
        groups = SessionCgroups(root, OWN)
        procs = groups.create("ABC", {"memory.max": "1G", "pids.max": "50"})
        self.assertEqual(procs, os.path.join(base, "sessions", "ABC", "cgroup.procs"))
        self.assertEqual(self.read(root, "cgroup.subtree_control"), "")  # the root's is never written
        self.assertEqual(self.read(base, "cgroup.subtree_control"), "+memory +pids")
        self.assertEqual(self.read(base, "sessions", "cgroup.subtree_control"), "+memory +pids")
        self.assertEqual(self.read(base, "sessions", "ABC", "memory.max"), "1G")
        # The service's processes left the inner node (a fake file keeps the last one written).
        self.assertEqual(self.read(base, "gateway", "cgroup.procs"), "4343")
        for name in os.listdir(os.path.join(base, "sessions", "ABC")):  # cgroupfs has no real files to remove
            os.unlink(os.path.join(base, "sessions", "ABC", name))
        groups.remove("ABC")
        self.assertFalse(os.path.exists(os.path.join(base, "sessions", "ABC")))
        groups.remove("ABC")  # gone already: fine
