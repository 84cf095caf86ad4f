"""The whole suite, its modules in parallel: what `make test` and CI run.

    python -m tests.harness.suite [--jobs N] [--allowed-skips FILE] [tests.test_x ...]

Most of the suite waits: for a gateway, an agent, a browser, a timeout
that must pass.  So modules run as separate ``trial`` processes, ``--jobs``
at a time (each with its own temporary directory and log), the longest
first, so that the waiting of one overlaps the work of others.  A module
is the unit: its classes keep their shared fixtures
(:mod:`tests.harness.shared`) and its tests their order.  The modules in
:data:`ALONE` share something with every other (the system's packages,
the PAM service every gateway logs in with) and run with nothing beside
them.

After the run it prints the slowest tests, every skip with its reason, and
one closing line: ``suite: N passed, N failed, N skipped``.  With
``--allowed-skips .ci/allowed-skips`` (CI) a skip that the file does not
list fails the run: a test that needs a program gets its Debian package in
the Makefile's ``APT_PACKAGES`` rather than a silent skip.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: Modules that run with no other beside them, and why.
ALONE = {
    "tests.test_debian_package": "installs and purges the nxgate package: it replaces /etc/pam.d/nxgate, "
                                 "which every other gateway's logins read, and holds dpkg's lock",
}

#: Modules that share something among themselves (not with the others), so
#: that at most one of each group runs at a time, and why.
ONE_AT_A_TIME = {
    "unit tests of the session service that allocate real display numbers from 3100-3600 (claims under "
    "/run/nxgate/displays), several through the same set-up (ManagerTests, SessionSide): side by side they "
    "take each other's numbers": (
        "tests.test_admin_server", "tests.test_cluster_sessions", "tests.test_node_streams",
        "tests.test_node_supervisor", "tests.test_reactor_blocking", "tests.test_services", "tests.test_sessions_for_later",
        "tests.test_sessions_manager", "tests.test_sharing"),
}


def together(module: str, other: str) -> bool:
    """Whether ``module`` may not run while ``other`` does (one group of :data:`ONE_AT_A_TIME`)."""
    return any(module in group and other in group for group in ONE_AT_A_TIME.values())


#: About how long the longest modules take (seconds, one at a time on two
#: busy cores), only to start them first; an end-to-end module not listed
#: counts as a minute, any other as a few seconds.  The previous run's own
#: figures (kept in the temporary directory) win.
EXPECTED = {
    "tests.test_e2e_dbus_later": 310, "tests.test_e2e_web_viewer": 210, "tests.test_e2e_x2go": 160,
    "tests.test_e2e_preauth": 130, "tests.test_e2e_sessions": 110, "tests.test_e2e_web": 110,
    "tests.test_e2e_printing": 100, "tests.test_viewer_rdp": 40, "tests.test_viewer_vnc": 40,
    "tests.test_store_backends": 20,
}

SEPARATOR = re.compile(r"^(={79}|-{79})$")
TEST_LINE = re.compile(r"^(tests\.[\w.]+) \.\.\. ")
SECONDS = re.compile(r"^\((\d+\.\d+) secs\)$")
VERDICT = re.compile(r"^(PASSED|FAILED) \((.*)\)$")
TEST_ID = re.compile(r"^tests\.[\w.]+$")


@dataclasses.dataclass
class Outcome:
    """What one module's trial said."""

    module: str
    seconds: float = 0.0
    code: int | None = None
    counts: dict[str, int] = dataclasses.field(default_factory=dict)
    durations: dict[str, float] = dataclasses.field(default_factory=dict)
    skips: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (test id, reason)
    summary: str = ""

    @property
    def passed(self) -> int:
        return self.counts.get("successes", 0)

    @property
    def failed(self) -> int:
        bad = sum(self.counts.get(k, 0) for k in ("failures", "errors", "unexpectedSuccesses"))
        return bad or (0 if self.code == 0 else 1)

    @property
    def skipped(self) -> int:
        return self.counts.get("skips", 0)


def read_output(module: str, text: str, code: int | None, seconds: float) -> Outcome:
    """Parse trial's ``timing`` reporter: each test's time, the closing
    verdict's counts, and the ``[SKIPPED]`` blocks of its summary."""
    outcome = Outcome(module, seconds, code)
    lines = text.splitlines()
    current = None
    for line in lines:
        started = TEST_LINE.match(line)
        if started:
            current = started.group(1)
        took = SECONDS.match(line)
        if took and current:
            outcome.durations[current] = float(took.group(1))
            current = None
        verdict = VERDICT.match(line)
        if verdict:
            outcome.counts = {key: int(value) for key, value in
                              (part.split("=") for part in verdict.group(2).split(", ") if "=" in part)}
    first_separator = next((i for i, line in enumerate(lines) if line == "=" * 79), None)
    if first_separator is not None:
        outcome.summary = "\n".join(lines[first_separator:])
    for index, line in enumerate(lines):
        if line == "[SKIPPED]" and index and lines[index - 1] == "=" * 79:
            block = []
            for following in lines[index + 1:]:
                if SEPARATOR.match(following):
                    break
                block.append(following)
            ids = []
            while block and TEST_ID.match(block[-1]):
                ids.insert(0, block.pop())
            reason = "\n".join(block).strip()
            outcome.skips += [(test, reason) for test in ids]
    return outcome


@dataclasses.dataclass(frozen=True)
class Allowed:
    """One line of tests/allowed-skips: a test id (or its class's or
    module's) that may skip in CI, the words its reason must hold, and why CI
    cannot have what it needs."""

    test: str
    reason: str
    why: str

    def covers(self, test: str, reason: str) -> bool:
        return (test == self.test or test.startswith(self.test + ".")) and self.reason in reason


def read_allowed(path: str) -> list[Allowed]:
    """``test id | words of the skip's reason | why CI cannot have it``, one a line; # starts a comment."""
    allowed = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = [part.strip() for part in line.split("|")]
            if len(parts) != 3 or not all(parts):
                raise SystemExit(f"{path}:{number}: expected 'test id | reason words | why', got {line!r}")
            allowed.append(Allowed(*parts))
    return allowed


def not_allowed(skips: Iterable[tuple[str, str]], allowed: Sequence[Allowed]) -> list[tuple[str, str]]:
    return [(test, reason) for test, reason in skips if not any(a.covers(test, reason) for a in allowed)]


def modules(names: Sequence[str]) -> list[str]:
    if names:
        return list(names)
    found = sorted(name[:-3] for name in os.listdir(os.path.join(REPO, "tests"))
                   if name.startswith("test_") and name.endswith(".py"))
    return [f"tests.{name}" for name in found]


def expected(module: str, previous: dict[str, float]) -> float:
    if module in previous:
        return previous[module]
    return EXPECTED.get(module, 60.0 if module.startswith("tests.test_e2e_") else 5.0)


class Running:
    """One module's trial process, its output in a log file."""

    def __init__(self, module: str, workdir: str, env: dict[str, str]) -> None:
        self.module = module
        self.log_path = os.path.join(workdir, f"{module}.log")
        self.started = time.monotonic()
        self.log = open(self.log_path, "wb")
        argv = [sys.executable, "-m", "twisted.trial", "--reporter=timing",
                f"--temp-directory={os.path.join(workdir, module)}", module]
        self.process = subprocess.Popen(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=self.log,
                                        stderr=subprocess.STDOUT, start_new_session=True)

    def finished(self) -> Outcome | None:
        code = self.process.poll()
        if code is None:
            return None
        self.log.close()
        with open(self.log_path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
        return read_output(self.module, text, code, time.monotonic() - self.started)

    def stop(self) -> None:
        """The module's whole process group (its gateways, agents, browsers)."""
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait()


def run(names: Sequence[str], jobs: int, workdir: str, module_timeout: float) -> list[Outcome]:
    env = dict(os.environ, PYTHONPATH=REPO + (os.pathsep + os.environ["PYTHONPATH"]
                                              if os.environ.get("PYTHONPATH") else ""))
    timings_path = os.path.join(workdir, "module-seconds.json")
    try:
        with open(timings_path) as handle:
            previous = json.load(handle)
    except (OSError, ValueError):
        previous = {}
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    pending = sorted(modules(names), key=lambda m: (m in ALONE, -expected(m, previous), m))
    total, outcomes, running = len(pending), [], []
    began = time.monotonic()
    print(f"Running {total} test modules, {jobs} at a time (logs in {workdir})", flush=True)
    try:
        while pending or running:
            for module in list(pending):
                if len(running) >= jobs or any(r.module in ALONE for r in running):
                    break
                if module in ALONE and running:
                    break  # the ALONE modules come last: every other has started
                if any(together(module, r.module) for r in running):
                    continue
                pending.remove(module)
                running.append(Running(module, workdir, env))
            time.sleep(0.2)
            for process in list(running):
                outcome = process.finished()
                if outcome is None and time.monotonic() - process.started > module_timeout:
                    process.stop()
                    outcome = process.finished()
                    outcome.summary += f"\n{process.module}: stopped after {module_timeout:.0f} s"
                    outcome.code = outcome.code or -1
                if outcome is None:
                    continue
                running.remove(process)
                outcomes.append(outcome)
                word = "ok" if outcome.failed == 0 else "FAILED"
                print(f"[{len(outcomes):3}/{total}] {word:6} {outcome.module:45} {outcome.seconds:7.1f} s  "
                      f"{outcome.passed} passed, {outcome.failed} failed, {outcome.skipped} skipped"
                      f"  (at {time.monotonic() - began:.0f} s)", flush=True)
                if outcome.failed:
                    print(outcome.summary or open(process.log_path, errors="replace").read()[-6000:], flush=True)
    finally:
        for process in running:
            process.stop()
    with open(timings_path, "w") as handle:
        json.dump({**previous, **{o.module: round(o.seconds, 1) for o in outcomes}}, handle, indent=1, sort_keys=True)
    return outcomes


def report(outcomes: Sequence[Outcome], seconds: float, allowed: Sequence[Allowed] | None,
           slowest: int = 25) -> int:
    durations = sorted(((s, t) for o in outcomes for t, s in o.durations.items()), reverse=True)
    print(f"\nThe {min(slowest, len(durations))} slowest tests:")
    for took, test in durations[:slowest]:
        print(f"  {took:7.1f} s  {test}")
    print("\nThe slowest modules (seconds, beside the others):")
    for outcome in sorted(outcomes, key=lambda o: -o.seconds)[:slowest]:
        print(f"  {outcome.seconds:7.1f} s  {outcome.module}")
    skips = [skip for o in outcomes for skip in o.skips]
    if skips:
        print(f"\nSkipped ({len(skips)}):")
        for test, reason in skips:
            print(f"  {test}: {reason}")
    code = 0 if all(o.failed == 0 for o in outcomes) else 1
    if allowed is not None:
        refused = not_allowed(skips, allowed)
        if refused:
            print(f"\n{len(refused)} skip(s) that the allowed list does not have (CI has every program of the "
                  "Makefile's APT_PACKAGES: install what they need there, or list them with why CI cannot):")
            for test, reason in refused:
                print(f"  {test}: {reason}")
            code = code or 2
    failed = [o.module for o in outcomes if o.failed]
    if failed:
        print(f"\nFailed modules: {' '.join(failed)}")
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"\nThe suite took {seconds / 60:.1f} min, the modules {sum(o.seconds for o in outcomes) / 60:.1f} min "
          f"in all; they used {(used.ru_utime + used.ru_stime) / 60:.1f} min of CPU (what they started and "
          f"waited for), {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at the end.")
    print(f"suite: {sum(o.passed for o in outcomes)} passed, {sum(o.failed for o in outcomes)} failed, "
          f"{len(skips)} skipped")
    return code


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", help="test modules (default: every tests/test_*.py)")
    parser.add_argument("--jobs", "-j", type=int, default=4, help="modules at a time (default 4)")
    parser.add_argument("--allowed-skips", metavar="FILE",
                        help="fail on a skip that FILE does not list (CI: .ci/allowed-skips)")
    parser.add_argument("--temp-directory", default=os.path.join(REPO, "_trial_temp"),
                        help="where each module's trial directory and log go")
    parser.add_argument("--module-timeout", type=float, default=3600.0,
                        help="stop a module that runs longer (seconds)")
    options = parser.parse_args(argv)
    allowed = read_allowed(options.allowed_skips) if options.allowed_skips else None  # a bad list fails first
    began = time.monotonic()
    outcomes = run(options.modules, max(1, options.jobs), os.path.abspath(options.temp_directory),
                   options.module_timeout)
    return report(outcomes, time.monotonic() - began, allowed)


if __name__ == "__main__":
    sys.exit(main())
