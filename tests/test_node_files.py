"""Writing and removing users' files safely (nxgate.node.files)."""

from __future__ import annotations

import os
import subprocess
import tempfile

from twisted.trial.unittest import TestCase

from nxgate.node import files


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


class NamesInDirTests(TestCase):
    """names_in_dir reads a directory the user controls: bounded, no links."""

    def setUp(self) -> None:
        self.top = tempfile.mkdtemp(prefix="nxgate-names-")
        self.addCleanup(subprocess.run, ["rm", "-rf", self.top], check=False)

    def test_at_most_the_limit_of_names(self) -> None:
        for index in range(10):
            open(os.path.join(self.top, f"f{index}"), "w").close()
        self.assertEqual(len(files.names_in_dir(self.top, 4)), 4)
        self.assertEqual(sorted(files.names_in_dir(self.top, 100)), sorted(f"f{index}" for index in range(10)))

    def test_a_link_in_the_directorys_place_gives_no_names(self) -> None:
        outside = tempfile.mkdtemp(prefix="nxgate-outside-")
        self.addCleanup(subprocess.run, ["rm", "-rf", outside], check=False)
        open(os.path.join(outside, "C-" + "0" * 32), "w").close()
        os.symlink(outside, os.path.join(self.top, "cache-console"))
        self.assertEqual(files.names_in_dir(os.path.join(self.top, "cache-console"), 100), [])

    def test_a_missing_directory_gives_no_names(self) -> None:
        self.assertEqual(files.names_in_dir(os.path.join(self.top, "nothing"), 100), [])
