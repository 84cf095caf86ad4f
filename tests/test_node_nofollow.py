"""Root in users' directories: symlink swaps must not move root's chmod,
chown or umount (issue 27 a).

Real files, real directories owned by another uid, real tmpfs mounts (the
gateway's ``umount2`` is the real call); the user's move is made at the
worst moment — deterministically, by doing it inside ``os.mkdir`` or
before the call, and once as a race loop against a thread that keeps
swapping.  Needs root (``mount``, ``chown``), as the gateway does.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
import threading

from twisted.trial.unittest import SkipTest, TestCase

from nxgate.host import files
from nxgate.node.services import sharing

USER = 65534  # nobody: the session's user in these tests


def mounted(path: str) -> bool:
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as handle:
        return any(line.split(" ")[4] == path for line in handle)


class _Root(TestCase):
    def setUp(self) -> None:
        if os.geteuid() != 0:
            raise SkipTest("root's own calls are what is tested")
        self.top = tempfile.mkdtemp(prefix="nxgate-nofollow-")
        self.addCleanup(shutil.rmtree, self.top, True)
        # Something of root's that the user would like changed: a setuid program.
        self.precious = os.path.join(self.top, "precious")
        with open(self.precious, "wb") as handle:
            handle.write(b"#!/bin/true\n")
        os.chmod(self.precious, 0o4755)

    def assert_precious_untouched(self) -> None:
        st = os.stat(self.precious)
        self.assertEqual((stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid), (0o4755, 0, 0))

    def user_dir(self, *parts: str) -> str:
        path = os.path.join(self.top, *parts)
        os.makedirs(path)
        os.chown(path, USER, USER)
        return path


class MakeSessionDirTests(_Root):
    def test_made_for_the_user(self) -> None:
        parent = self.user_dir("session")
        files.make_session_dir(os.path.join(parent, "cups"), USER, USER)
        st = os.lstat(os.path.join(parent, "cups"))
        self.assertTrue(stat.S_ISDIR(st.st_mode))
        self.assertEqual((stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid), (0o700, USER, USER))
        self.assertRaises(FileExistsError, files.make_session_dir, os.path.join(parent, "cups"), USER, USER)

    def test_swapped_for_a_symlink_after_mkdir(self) -> None:
        """The user renames the new directory and links its name to root's
        file between ``mkdir`` and ``chmod``: the old code made the setuid
        program 0700 and the user's."""
        parent = self.user_dir("session")
        made = os.path.join(parent, "cups")
        real_mkdir = os.mkdir

        def mkdir_then_swap(name: str, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
            real_mkdir(name, mode, dir_fd=dir_fd)
            os.rename(made, made + ".away")
            os.symlink(self.precious, made)

        self.patch(os, "mkdir", mkdir_then_swap)
        self.assertRaises(OSError, files.make_session_dir, made, USER, USER)
        self.assert_precious_untouched()

    def test_swapped_for_the_users_own_directory(self) -> None:
        parent = self.user_dir("session")
        made = os.path.join(parent, "cups")
        theirs = self.user_dir("theirs")
        os.chmod(theirs, 0o755)
        real_mkdir = os.mkdir

        def mkdir_then_swap(name: str, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
            real_mkdir(name, mode, dir_fd=dir_fd)
            os.rename(made, made + ".away")
            os.rename(theirs, made)

        self.patch(os, "mkdir", mkdir_then_swap)
        self.assertRaises(OSError, files.make_session_dir, made, USER, USER)

    def test_race_loop(self) -> None:
        """A thread keeps turning the name into a link to root's file and back, while root makes the directory."""
        parent = self.user_dir("session")
        made = os.path.join(parent, "cups")
        stop = threading.Event()

        def swapper() -> None:
            while not stop.is_set():
                try:
                    os.rename(made, made + ".away")
                    os.symlink(self.precious, made)
                    os.unlink(made)
                    os.rmdir(made + ".away")
                except OSError:
                    pass

        thread = threading.Thread(target=swapper)
        thread.start()
        try:
            for _ in range(3000):
                try:
                    files.make_session_dir(made, USER, USER)
                except OSError:
                    pass
                for leftover in (made, made + ".away"):
                    try:
                        os.rmdir(leftover)
                    except OSError:
                        pass
        finally:
            stop.set()
            thread.join()
        self.assert_precious_untouched()


class UmountTests(_Root):
    """``sharing._umount`` of a point found in mountinfo that the user has
    since replaced: the mount the link leads to stays."""

    def setUp(self) -> None:
        super().setUp()
        self.trusted = os.path.join(self.top, "sessions")
        os.mkdir(self.trusted, 0o711)
        self.session = self.user_dir("sessions", "0123abcd")
        self.shares = self.user_dir("sessions", "0123abcd", "shares")
        self.elsewhere = os.path.join(self.top, "elsewhere")
        os.makedirs(os.path.join(self.elsewhere, "mnt"))
        self.other_mount = os.path.join(self.elsewhere, "mnt")
        self.mount(self.other_mount)

    def mount(self, path: str) -> None:
        try:
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "nxgate-test", path], check=True,
                           capture_output=True)
        except (OSError, subprocess.CalledProcessError) as error:
            raise SkipTest(f"cannot mount a tmpfs here: {error}") from None
        self.addCleanup(lambda: subprocess.run(["umount", "-l", path], capture_output=True))

    def test_mount_point_swapped_for_a_symlink(self) -> None:
        key = self.user_dir("sessions", "0123abcd", "shares", "k")
        os.symlink(self.other_mount, os.path.join(key, "mnt"))
        self.assertRaises(OSError, sharing._umount, os.path.join(key, "mnt"), self.trusted)
        self.assertTrue(mounted(self.other_mount), "root unmounted the link's target")

    def test_directory_above_swapped_for_a_symlink(self) -> None:
        os.symlink(self.elsewhere, os.path.join(self.shares, "k"))
        self.assertRaises(OSError, sharing._umount, os.path.join(self.shares, "k", "mnt"), self.trusted)
        self.assertTrue(mounted(self.other_mount), "root unmounted a mount reached through the user's link")

    def test_session_dir_itself_is_a_symlink(self) -> None:
        os.rename(self.session, self.session + ".away")
        os.symlink(self.top, self.session)  # then .../0123abcd/elsewhere/mnt is the other mount
        self.assertRaises(OSError, sharing._umount, os.path.join(self.session, "elsewhere", "mnt"), self.trusted)
        self.assertTrue(mounted(self.other_mount))

    def test_real_mount_unmounted(self) -> None:
        point = os.path.join(self.user_dir("sessions", "0123abcd", "shares", "k2"), "mnt")
        os.mkdir(point)
        self.mount(point)
        sharing._umount(point, self.trusted)
        self.assertFalse(mounted(point))
        self.assertTrue(mounted(self.other_mount))

    def test_outside_trusted_refused(self) -> None:
        self.assertRaises(OSError, sharing._umount, self.other_mount, self.trusted)
        self.assertTrue(mounted(self.other_mount))
