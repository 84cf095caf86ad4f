"""End to end: a user's own command line through X2Go's clients (pyhoca-cli and x2goclient, Debian's).

The command a user types into his profile reaches the server pasted into a
shell program (python-x2go's ``sh -c "…"``, x2goclient's ``bash -l -c '…'``
in Latin-1).  nxgate runs no shell: it reads the words as a POSIX shell
would and starts that argv.  Checked here with the real clients, the real
gateway and nxagent: the program's own argv (``/proc``), its window found
by its title inside the session (the agent's framebuffer) and the same
picture on the client; and a command line with what nxgate does not run
(a pipe, ``$(…)``) refused with the client's own words, the reason in the
log, and nothing run.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess

from twisted.trial.unittest import SkipTest

from tests.harness import pixels
from tests.harness.process import wait_for
from tests.test_e2e_x2go import X2GoCase

#: xterm keeps the title it was given (Debian's bash would set its own at each prompt).
KEEP_TITLE = "-xrm 'XTerm*allowTitleOps: false'"


def program_argv(user: str, program: str) -> list[list[str]]:
    """The argv of each of ``user``'s processes running ``program``."""
    found = []
    uid = pwd.getpwnam(user).pw_uid
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                argv = [part.decode() for part in handle.read().split(b"\0")[:-1]]
        except (OSError, UnicodeDecodeError):
            continue
        if argv and os.path.basename(argv[0]) == program:
            found.append(argv)
    return found


def qsettings_value(text: str) -> str:
    """``text`` as Qt's QSettings writes a string value into x2goclient's INI file
    (quoted, ``\\"``, and ``\\xHHHH`` for what is not ASCII: a hex digit right
    after such an escape is escaped too, since Qt reads every hex digit)."""
    out, escaped = [], False
    for char in text:
        if ord(char) > 126 or (escaped and char in "0123456789abcdefABCDEF"):
            out.append(f"\\x{ord(char):04x}")
            escaped = True
            continue
        out.append({'"': '\\"', "\\": "\\\\"}.get(char, char))
        escaped = False
    return '"' + "".join(out) + '"'


class CommandLineCase(X2GoCase):
    def started_program(self, argv: list[str], client_log: str | None = None) -> None:
        """The session's program runs with exactly ``argv`` (it starts when the graphics link is up)."""
        try:
            wait_for(lambda: argv in program_argv(self.user.name, argv[0]), 60, f"{argv[0]} to run")
        except AssertionError:
            client = self.read(client_log)[-4000:] if client_log else ""
            raise AssertionError(f"not {argv}: {program_argv(self.user.name, argv[0])}\n{self.gateway.log()[-3000:]}"
                                 f"\n{client}") from None


class PyhocaCommandLineTests(CommandLineCase):
    def start(self, command: str) -> str:
        client, log = self.session_client("-c", command, "-g", "800x600", "-q", "lan")
        return self.started_name(client, log)

    def test_a_title_in_double_quotes_with_a_blank(self):
        name = self.start(f'xterm {KEEP_TITLE} -title "a b"')
        self.assertRegex(name, r"_stRxterm_dp24$")
        self.started_program(["xterm", "-xrm", "XTerm*allowTitleOps: false", "-title", "a b"])
        self.assertGreaterEqual(self.window_equal(name, "a b"), 0.99)

    def test_a_utf8_title_and_the_users_own_variables(self):
        name = self.start(f"xterm {KEEP_TITLE} -title 'Prüfung $USER' -T \"Prüfung für $USER\"")
        self.started_program(["xterm", "-xrm", "XTerm*allowTitleOps: false", "-title", "Prüfung $USER", "-T",
                              f"Prüfung für {self.user.name}"])
        self.assertGreaterEqual(self.window_equal(name, f"Prüfung für {self.user.name}"), 0.99)

    def test_a_command_line_with_a_substitution_is_refused_and_nothing_runs(self):
        audited = len(self.gateway.audit())
        result = self.cli("-c", "xterm -title $(id)", "-g", "640x480", "-q", "lan")
        self.assertIn("session startup for session profile ,,Pyhoca-Client_Session failed", result.stdout + result.stderr)
        refused = [(record["command"], record["reason"]) for record in self.refusals(audited)]
        self.assertTrue(any(re.match(r"b'.*x2gostartagent .* R xterm -title \$\(id\) both", command)
                            and reason == "command substitution ('$(…)')" for command, reason in refused), refused)
        self.assertEqual(program_argv(self.user.name, "xterm"), [])
        self.assertEqual(self.listed(), {})

    def test_a_command_line_with_a_separator_gets_the_clients_no_such_command(self):
        audited = len(self.gateway.audit())
        result = self.cli("-c", "xterm; id", "-g", "640x480", "-q", "lan")
        # python-x2go first asks "which xterm;" in a program that the separator breaks.
        self.assertIn("The remote X2Go Server does not know how to execute the command 'xterm; id'",
                      result.stdout + result.stderr)
        self.assertIn("'&&' without a command before it", [record["reason"] for record in self.refusals(audited)])
        self.assertEqual(self.listed(), {})


class X2GoClientCommandLineTests(CommandLineCase):
    """x2goclient with a rootless command profile; its --debug log and its dialogs."""

    def setUp(self) -> None:
        super().setUp()
        if shutil.which("x2goclient") is None:
            raise SkipTest("x2goclient is not installed (apt-get install x2goclient)")

    def run_x2goclient(self, command: str) -> tuple[subprocess.Popen, str, int]:
        return self.x2goclient(f"command={qsettings_value(command)}\nrootless=true\nwidth=800\nheight=600\n",
                               lang="C.UTF-8")

    def test_a_title_with_a_blank_and_latin1_letters(self):
        audited = len(self.gateway.audit())
        process, log, before = self.run_x2goclient(f'xterm {KEEP_TITLE} -title "Prüfung a b"')

        def started() -> str | None:
            if process.poll() is not None:
                raise AssertionError(f"x2goclient exited {process.returncode}: {self.read(log)[-3000:]}")
            found = re.findall(r"X2Go session (\S+) \(session", self.gateway.log()[before:])
            return found[-1] if found else None

        name = wait_for(started, 90, "x2goclient to start a session")
        self.assertRegex(name, r"_stRxterm_dp24$")
        self.started_program(["xterm", "-xrm", "XTerm*allowTitleOps: false", "-title", "Prüfung a b"], log)
        self.assertGreaterEqual(self.window_equal(name, "Prüfung a b"), 0.99)
        self.assertEqual(self.refusals(audited), [])

    def test_a_pipe_is_refused_with_words_x2goclient_shows(self):
        audited = len(self.gateway.audit())
        process, log, before = self.run_x2goclient("xterm | id")
        refused = wait_for(lambda: self.refusals(audited), 90, "the refusal")
        self.assertIn("a pipe ('|')", [record["reason"] for record in refused])
        # x2goclient shows a failed command's standard error in its "Error" dialog.
        wait_for(lambda: pixels.find_window(self.screen.name, "Error") is not None, 60, "x2goclient's error dialog")
        wait_for(lambda: "command refused: a pipe" in self.read(log), 30, "the refusal in x2goclient's own log")
        self.assertEqual(program_argv(self.user.name, "xterm"), [])
        self.assertEqual(self.listed(), {})


class SameBoundsTests(X2GoCase):
    """The NX door's bounds (NX> 597 for 99999x99999) hold at the X2Go door: nothing starts, the log says why."""

    def test_a_size_out_of_range_starts_nothing(self):
        result = self.cli("-c", "TERMINAL", "-g", "99999x99999", "-q", "lan")
        self.assertIn("session startup for session profile ,,Pyhoca-Client_Session failed", result.stdout + result.stderr)
        self.assertIn("refused: the session size 99999x99999: size out of range (64x64 to 16384x16384)",
                      self.gateway.log())
        self.assertEqual(self.listed(), {})
