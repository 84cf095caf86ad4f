"""Finding what a session started by the marker in its environment."""

from __future__ import annotations

import os
import subprocess

from twisted.trial.unittest import SkipTest, TestCase

from nxgate.session import processes

SESSION = "C0FFEE" * 5 + "AB"


class TaggedProcessesTests(TestCase):
    def spawn(self, env: dict[str, str], uid: int | None = None) -> int:
        def become() -> None:
            if uid is not None:
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)

        process = subprocess.Popen(["sleep", "600"], env={"PATH": os.defpath, **env}, preexec_fn=become)
        self.addCleanup(lambda: (process.kill(), process.wait()))
        return process.pid

    def found(self, uid: int) -> set[int]:
        return {process.pid for process in processes.tagged_processes(SESSION, uid)}

    def test_finds_the_sessions_processes_only(self):
        tagged = self.spawn({processes.SESSION_MARKER: SESSION, "OTHER": "x"})
        untagged = self.spawn({"OTHER": "x"})
        other_session = self.spawn({processes.SESSION_MARKER: "1" + SESSION[1:]})
        prefix = self.spawn({processes.SESSION_MARKER: SESSION + "0"})
        found = self.found(os.getuid())
        self.assertIn(tagged, found)
        for pid in (untagged, other_session, prefix):
            self.assertNotIn(pid, found)

    def test_never_another_users_process(self):
        if os.getuid() != 0:
            raise SkipTest("needs root to start a process as another user")
        nobody = 65534
        theirs = self.spawn({processes.SESSION_MARKER: SESSION}, uid=nobody)
        self.assertNotIn(theirs, self.found(0))
        self.assertIn(theirs, self.found(nobody))
