"""Display claims between gateways on one machine (nxgate.node.files)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

from twisted.trial.unittest import TestCase

from nxgate.node import files

CLAIM_IN_ANOTHER_PROCESS = """
import sys
from nxgate.node import files
sys.exit(0 if files.claim_display(int(sys.argv[1]), sys.argv[2]) else 3)
"""


class DisplayClaimTests(TestCase):
    def setUp(self) -> None:
        self.directory = tempfile.mkdtemp(prefix="nxgate-claims-")
        self.addCleanup(subprocess.run, ["rm", "-rf", self.directory], check=False)

    def other_process_claims(self, display: int) -> bool:
        result = subprocess.run([sys.executable, "-c", CLAIM_IN_ANOTHER_PROCESS, str(display), self.directory],
                                check=False)
        self.assertIn(result.returncode, (0, 3))
        return result.returncode == 0

    def test_a_claimed_display_cannot_be_claimed_by_another_gateway(self) -> None:
        self.assertTrue(files.claim_display(7301, self.directory))
        self.addCleanup(files.release_display, 7301)
        self.assertFalse(self.other_process_claims(7301))
        self.assertTrue(self.other_process_claims(7302))

    def test_a_released_display_can_be_claimed_again(self) -> None:
        self.assertTrue(files.claim_display(7303, self.directory))
        files.release_display(7303)
        self.assertTrue(self.other_process_claims(7303))

    def test_the_same_gateway_may_claim_its_own_display_again(self) -> None:
        self.assertTrue(files.claim_display(7304, self.directory))
        self.addCleanup(files.release_display, 7304)
        self.assertTrue(files.claim_display(7304, self.directory))


class RemoveTreeTests(TestCase):
    """remove_tree runs in a thread on a directory the user could fill."""

    def test_removes_without_following_links(self) -> None:
        top = tempfile.mkdtemp(prefix="nxgate-tree-")
        outside = tempfile.mkdtemp(prefix="nxgate-outside-")
        self.addCleanup(subprocess.run, ["rm", "-rf", top, outside], check=False)
        with open(f"{outside}/keep", "w") as handle:
            handle.write("x")
        os.makedirs(f"{top}/a/b")
        os.symlink(outside, f"{top}/a/link")
        files.remove_tree(top)
        self.assertFalse(os.path.lexists(top))
        self.assertTrue(os.path.exists(f"{outside}/keep"))

    def test_a_missing_directory_is_no_error(self) -> None:
        files.remove_tree("/nonexistent/nxgate-test-tree")
