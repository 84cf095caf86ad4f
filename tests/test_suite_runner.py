"""The suite runner (tests/harness/suite.py) reads what trial really prints:
each test's time, the counts, and every skip with its reason, so that CI
fails on a skip the allowed list does not have."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

from twisted.trial.unittest import TestCase

from tests.harness import suite

MISSING = "frobnicate is not installed (apt-get install frobnicate)"
SAMPLE = textwrap.dedent('''
    from twisted.trial.unittest import SkipTest, TestCase


    class Sample(TestCase):
        def test_passes(self):
            pass

        def test_fails(self):
            self.fail("on purpose")

        def test_needs_a_program(self):
            raise SkipTest("frobnicate is not installed (apt-get install frobnicate)")

        def test_needs_it_too(self):
            raise SkipTest("frobnicate is not installed (apt-get install frobnicate)")

        def test_needs_a_device(self):
            raise SkipTest("no /dev/fuse here:\\nFUSE mounts cannot be tested")


    class Other(TestCase):
        def test_errs(self):
            raise RuntimeError("a bug")
''')


class ReadingTrialTests(TestCase):
    def setUp(self):
        self.base = os.path.abspath(self.mktemp())
        package = os.path.join(self.base, "tests")
        os.makedirs(package)
        open(os.path.join(package, "__init__.py"), "w").close()
        with open(os.path.join(package, "test_sample.py"), "w") as handle:
            handle.write(SAMPLE)
        result = subprocess.run([sys.executable, "-m", "twisted.trial", "--reporter=timing",
                                 f"--temp-directory={os.path.join(self.base, 'trial')}", "tests.test_sample"],
                                cwd=self.base, env=dict(os.environ, PYTHONPATH=self.base), capture_output=True,
                                text=True, timeout=120)
        self.outcome = suite.read_output("tests.test_sample", result.stdout, result.returncode, 1.0)

    def test_counts_times_and_skips(self):
        outcome = self.outcome
        self.assertEqual((outcome.passed, outcome.failed, outcome.skipped), (1, 2, 3))
        self.assertEqual(len(outcome.durations), 6)
        self.assertIn("tests.test_sample.Sample.test_passes", outcome.durations)
        self.assertEqual(sorted(outcome.skips), [
            ("tests.test_sample.Sample.test_needs_a_device", "no /dev/fuse here:\nFUSE mounts cannot be tested"),
            ("tests.test_sample.Sample.test_needs_a_program", MISSING),
            ("tests.test_sample.Sample.test_needs_it_too", MISSING)])
        self.assertIn("on purpose", outcome.summary)
        self.assertIn("a bug", outcome.summary)

    def test_only_listed_skips_with_their_reason_are_allowed(self):
        allowed_path = os.path.join(self.base, "allowed")
        with open(allowed_path, "w") as handle:
            handle.write("# comment\n\ntests.test_sample.Sample.test_needs_a_device | /dev/fuse | no FUSE in CI\n"
                         "tests.test_sample.Sample | gnome | a reason these skips do not give\n")
        allowed = suite.read_allowed(allowed_path)
        self.assertEqual([test for test, _ in suite.not_allowed(self.outcome.skips, allowed)],
                         ["tests.test_sample.Sample.test_needs_a_program",
                          "tests.test_sample.Sample.test_needs_it_too"])
        whole_module = [suite.Allowed("tests.test_sample", "frobnicate", "why")]
        self.assertEqual(len(suite.not_allowed(self.outcome.skips, whole_module)), 1)
        self.assertEqual(suite.not_allowed(self.outcome.skips, [suite.Allowed("tests.test_samp", "", "x")]),
                         self.outcome.skips)  # a prefix of a name is not its module

    def test_a_line_without_its_reason_is_refused(self):
        bad = os.path.join(self.base, "bad")
        with open(bad, "w") as handle:
            handle.write("tests.test_sample.Sample.test_needs_a_program\n")
        self.assertRaises(SystemExit, suite.read_allowed, bad)

    def test_the_repositorys_list_reads(self):
        for entry in suite.read_allowed(os.path.join(suite.REPO, ".ci", "allowed-skips")):
            self.assertTrue(entry.test.startswith("tests.test_"), entry)


class SchedulingTests(TestCase):
    def test_every_module_allocating_the_unit_tests_displays_is_in_their_group(self):
        """A new unit-test module with the real display allocator (or the set-ups that use it) must
        join the group that runs one at a time, or it takes its neighbours' display numbers."""
        (group,) = [modules for why, modules in suite.ONE_AT_A_TIME.items() if "3100-3600" in why]
        markers = ("display_base=", "test_sessions_manager", "ManagerTests", "SessionSide")
        directory = os.path.join(suite.REPO, "tests")
        for name in sorted(os.listdir(directory)):
            if name.startswith("test_") and name.endswith(".py") and name != "test_suite_runner.py":
                with open(os.path.join(directory, name), encoding="utf-8") as handle:
                    source = handle.read()
                if any(marker in source for marker in markers):
                    self.assertIn(f"tests.{name[:-3]}", group, name)
        for module in group:
            self.assertTrue(os.path.exists(os.path.join(suite.REPO, *module.split(".")) + ".py"), module)

    def test_modules_of_one_group_never_run_side_by_side(self):
        started, finished = [], []

        class Fake:
            def __init__(self, module, workdir, env):
                self.module, self.started, self.polls = module, time.monotonic(), 0
                started.append((module, [m for m in running_now()]))
                alive.append(self)

            def finished(self):
                self.polls += 1
                if self.polls < 2:
                    return None
                alive.remove(self)
                finished.append(self.module)
                return suite.Outcome(self.module, code=0, counts={"successes": 1})

        alive: list = []

        def running_now():
            return [f.module for f in alive]

        group = ("tests.test_g1", "tests.test_g2", "tests.test_g3")
        self.patch(suite, "Running", Fake)
        self.patch(suite, "ONE_AT_A_TIME", {"why": group})
        self.patch(suite, "ALONE", {"tests.test_z_alone": "why"})
        self.patch(suite.time, "sleep", lambda seconds: None)
        names = [*group, "tests.test_a", "tests.test_b", "tests.test_z_alone"]
        outcomes = suite.run(names, 3, os.path.abspath(self.mktemp()), 60)
        self.assertEqual(sorted(o.module for o in outcomes), sorted(names))
        for module, beside in started:
            if module in group:
                self.assertFalse(set(beside) & set(group), (module, beside))
            if module == "tests.test_z_alone":
                self.assertEqual(beside, [])
        self.assertEqual(finished[-1], "tests.test_z_alone")
