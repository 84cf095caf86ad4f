"""The Makefile a newcomer runs first: where `make run` listens, and the
commands `make install` puts on PATH."""

import os
import subprocess

from twisted.trial.unittest import SynchronousTestCase

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make(*args: str) -> str:
    """Run make in the checkout and return its output."""
    return subprocess.run(["make", "-C", REPO, "--no-print-directory", *args], capture_output=True, text=True,
                          check=True, timeout=60).stdout


class MakefileTests(SynchronousTestCase):
    def run_command(self, *args: str) -> str:
        # -n: only print; -o install: take the installation as done.
        return make("-n", "-o", "install", "run", *args)

    def test_run_listens_on_port_4022_of_all_interfaces_unless_told(self):
        self.assertIn(" --port tcp:4022:backlog=1024", self.run_command())
        self.assertIn(" --port tcp:4122:backlog=1024", self.run_command("PORT=4122"))
        self.assertIn(" --port tcp:4022:interface=127.0.0.1", self.run_command("LISTEN=tcp:4022:interface=127.0.0.1"))

    def test_every_listen_example_keeps_the_backlog_it_recommends(self):
        """Issue 25: the README's ``make run LISTEN=...`` example dropped the
        ``backlog=1024`` that the default and the README recommend (Twisted's
        default backlog is 50: a rush of logins would be dropped)."""
        import re

        examples = []
        for name in ("README.md", "Makefile"):
            with open(os.path.join(REPO, name), encoding="utf-8") as handle:
                examples += [(name, found) for found in re.findall(r"make run LISTEN=(\S+?)`", handle.read())]
        self.assertTrue(examples)
        for name, listen in examples:
            self.assertIn(":backlog=1024", listen, name)
            self.assertIn(f" --port {listen}", self.run_command(f"LISTEN={listen}"))

    def test_install_links_the_commands_and_leaves_foreign_files_alone(self):
        bindir, venv = os.path.abspath(self.mktemp()), os.path.abspath(self.mktemp())
        os.makedirs(bindir)
        with open(os.path.join(bindir, "nxgate-config"), "w") as handle:
            handle.write("someone else's\n")
        output = make("-s", "link-commands", f"BINDIR={bindir}", f"VENV={venv}")
        for command in ("nxgate-client", "nxgate-admin"):
            self.assertEqual(os.readlink(os.path.join(bindir, command)), os.path.join(venv, "bin", command))
        self.assertFalse(os.path.islink(os.path.join(bindir, "nxgate-config")))
        self.assertIn("not linking", output)
        self.assertEqual(open(os.path.join(bindir, "nxgate-config")).read(), "someone else's\n")
