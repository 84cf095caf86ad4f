"""Writing and removing users' files safely (nxgate.host.files)."""

from __future__ import annotations

import os
import subprocess
import tempfile

from twisted.trial.unittest import TestCase

from nxgate.host import files


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
