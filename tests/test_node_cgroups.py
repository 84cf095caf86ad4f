"""Unit tests of nxgate.node.cgroups: the limits of jailed sessions."""

from __future__ import annotations

import os

from twisted.trial.unittest import SynchronousTestCase

from nxgate.node import cgroups
from nxgate.node.cgroups import SessionCgroups


class CgroupTests(SynchronousTestCase):
    """nxgate.node.cgroups on a fake cgroup v2 tree in a temporary directory."""

    def tree(self, controllers: str | None) -> str:
        root = self.mktemp()
        os.makedirs(root)
        if controllers is not None:
            for name, text in (("cgroup.controllers", controllers), ("cgroup.subtree_control", "")):
                with open(os.path.join(root, name), "w") as handle:
                    handle.write(text)
        return root

    def test_only_configured_limits(self):
        self.assertEqual(cgroups.wanted("", "", 0), {})
        self.assertEqual(cgroups.wanted("2G", "", 200), {"memory.max": "2G", "pids.max": "200"})

    def test_why_limits_cannot_apply(self):
        self.assertIn("not a cgroup v2 hierarchy", SessionCgroups(self.tree(None)).unavailable({"pids.max": "9"}))
        self.assertIn("memory are not available",
                      SessionCgroups(self.tree("cpu pids")).unavailable({"memory.max": "1G", "pids.max": "9"}))
        self.assertIsNone(SessionCgroups(self.tree("cpu memory pids")).unavailable({"memory.max": "1G"}))

    def test_create_writes_the_limits_and_remove_removes_it(self):
        root = self.tree("cpu memory pids")
        os.makedirs(os.path.join(root, "nxgate"))
        with open(os.path.join(root, "nxgate", "cgroup.subtree_control"), "w"):
            pass
        groups = SessionCgroups(root)
        procs = groups.create("ABC", {"memory.max": "1G", "pids.max": "50"})
        self.assertEqual(procs, os.path.join(root, "nxgate", "ABC", "cgroup.procs"))
        with open(os.path.join(root, "cgroup.subtree_control")) as handle:
            self.assertEqual(handle.read(), "+memory +pids")
        with open(os.path.join(root, "nxgate", "ABC", "memory.max")) as handle:
            self.assertEqual(handle.read(), "1G")
        for name in os.listdir(os.path.join(root, "nxgate", "ABC")):  # cgroupfs has no real files to remove
            os.unlink(os.path.join(root, "nxgate", "ABC", name))
        groups.remove("ABC")
        self.assertFalse(os.path.exists(os.path.join(root, "nxgate", "ABC")))
        groups.remove("ABC")  # gone already: fine
