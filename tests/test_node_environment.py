"""The users' compose cache directories (nxgate.node.environment)."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile

from twisted.trial.unittest import TestCase

from nxgate.node import environment

#: As root the directories are given to another uid, as the gateway does;
#: otherwise only our own uid can own them.
USER = (54321, 54321) if os.geteuid() == 0 else (os.getuid(), os.getgid())


class ComposeCacheTests(TestCase):
    def setUp(self) -> None:
        self.state = tempfile.mkdtemp(prefix="nxgate-state-")
        self.addCleanup(shutil.rmtree, self.state, True)
        self.parent = os.path.join(self.state, environment.COMPOSE_CACHES)
        self.mine = os.path.join(self.parent, str(USER[0]))

    def test_the_users_directory_is_made_private_to_them_below_a_traversable_parent(self) -> None:
        self.assertEqual(environment.prepare_compose_cache(self.state, *USER), self.mine)
        parent, mine = os.lstat(self.parent), os.lstat(self.mine)
        self.assertEqual((parent.st_uid, stat.S_IMODE(parent.st_mode)), (os.geteuid(), 0o711))
        self.assertEqual((mine.st_uid, mine.st_gid, stat.S_IMODE(mine.st_mode)), (*USER, 0o700))
        self.assertEqual(environment.compose_cache_environment(self.mine), {"XCOMPOSECACHE": self.mine})

    def test_the_next_session_finds_it_with_what_the_programs_wrote(self) -> None:
        environment.prepare_compose_cache(self.state, *USER)
        cache = os.path.join(self.mine, "l4_030_table")
        with open(cache, "w") as handle:
            handle.write("parsed")
        self.assertEqual(environment.prepare_compose_cache(self.state, *USER), self.mine)
        with open(cache) as handle:
            self.assertEqual(handle.read(), "parsed")

    def test_a_parent_made_wider_is_narrowed_again(self) -> None:
        os.mkdir(self.parent, 0o755)
        os.chmod(self.parent, 0o777)
        self.assertEqual(environment.prepare_compose_cache(self.state, *USER), self.mine)
        self.assertEqual(stat.S_IMODE(os.lstat(self.parent).st_mode), 0o711)

    def test_no_cache_where_the_users_directory_is_not_private(self) -> None:
        environment.prepare_compose_cache(self.state, *USER)
        os.chmod(self.mine, 0o755)
        self.assertIsNone(environment.prepare_compose_cache(self.state, *USER))

    def test_no_cache_where_a_link_stands_for_the_users_directory(self) -> None:
        elsewhere = tempfile.mkdtemp(prefix="nxgate-elsewhere-")
        self.addCleanup(shutil.rmtree, elsewhere, True)
        os.chmod(elsewhere, 0o700)
        os.mkdir(self.parent, 0o711)
        os.symlink(elsewhere, self.mine)
        self.assertIsNone(environment.prepare_compose_cache(self.state, *USER))

    def test_no_cache_where_the_parent_is_a_link(self) -> None:
        elsewhere = tempfile.mkdtemp(prefix="nxgate-elsewhere-")
        self.addCleanup(shutil.rmtree, elsewhere, True)
        os.symlink(elsewhere, self.parent)
        self.assertIsNone(environment.prepare_compose_cache(self.state, *USER))
        self.assertEqual(os.listdir(elsewhere), [])

    def test_no_cache_without_a_state_directory(self) -> None:
        self.assertIsNone(environment.prepare_compose_cache(os.path.join(self.state, "missing"), *USER))

    def test_no_directory_no_variable(self) -> None:
        self.assertEqual(environment.compose_cache_environment(None), {})
