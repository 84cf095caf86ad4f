"""End to end: X2Go's printing, a job printed in the session with ``lp`` arriving at the X2Go client as
x2goserver delivers it: a PDF and its ``.ready`` file in the client's print spool (which the client shares with
the session, mounted with sshfs back through its forward), picked up by the client's print action.

pyhoca-cli ``--printing --print-action PDFSAVE --save-to-folder DIR`` saves each job as a PDF in DIR; the test
reads the PDF with ``pdftotext`` and finds the printed text.  A job larger than the cap is refused with words at
``lp`` and nothing reaches the client.  On one box and for a session on another cluster member.
"""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import subprocess
import tempfile

from twisted.trial.unittest import SkipTest

from tests.harness.process import stop, wait_for
from tests.test_e2e_cluster import ClusterTestCase
from tests.test_e2e_sound import as_user
from tests.test_e2e_x2go import PASSWORD
from tests.harness.x2goclient import X2GoClientMachine
from tests.test_e2e_x2go_folders import FoldersCase, open_fuse


def cups_env(state_dir: str, session_id: str, home: str) -> dict[str, str]:
    return {"CUPS_SERVER": os.path.join(state_dir, "sessions", session_id, "cups", "socket"), "HOME": home}


def delivered(home: str) -> str | None:
    """The PDF a ``.ready`` file in the client's spool (python-x2go's, ``~/.x2go/S-<session>/spool``) names.

    python-x2go 0.6.1.3 then hands it to its print action, and every action (PDFSAVE, PDFVIEW, PRINT) fails
    on Python 3 before it does anything (``utils.slugify`` runs a str pattern on bytes), against x2goserver
    too: what the client received is read from its spool, where the files stay."""
    for ready in glob.glob(os.path.join(home, ".x2go", "S-*", "spool", "*.ready")):
        with open(ready, encoding="utf-8") as handle:
            name = handle.read().split("\n")[0]
        path = os.path.join(os.path.dirname(ready), name)
        if os.path.exists(path):
            return path
    return None


def pdf_text(path: str) -> str:
    return subprocess.run(["pdftotext", path, "-"], capture_output=True, text=True, check=True).stdout


def printing_profile(home: str, port: int, user: str) -> None:
    """A session profile with printing on: pyhoca-cli 0.6.1.2 passes ``--printing`` to python-x2go only for a
    profile (without one, python-x2go's ``allow_printing`` default overrides it, against x2goserver too)."""
    os.makedirs(os.path.join(home, ".x2goclient"), exist_ok=True)
    with open(os.path.join(home, ".x2goclient", "sessions"), "w") as handle:
        handle.write(f"[gw]\nname=gw\nhost=127.0.0.1\nsshport={port}\nuser={user}\ncommand=TERMINAL\nprint=true\n"
                     "sound=false\nspeed=4\npack=16m-jpeg\nquality=9\nwidth=800\nheight=600\n")


def x2goclient_printing(machine: X2GoClientMachine) -> str:
    """x2goclient's print settings as a user sets them: no dialog, a print command of his own (``cp`` of each PDF
    into a directory); that directory."""
    printed = os.path.dirname(machine.write("printed/.keep", b""))
    machine.write(".x2goclient/printing", "[General]\nshowdialog=false\npdfview=false\n\n"
                                          f"[print]\nstartcmd=true\ncommand=cp -t {printed}\nstdin=false\nps=false\n")
    return printed


def printed_pdf(directory: str) -> str | None:
    found = [name for name in os.listdir(directory) if name.endswith(".pdf")]
    return os.path.join(directory, found[0]) if found else None


PRINTER_READY = "printing to the X2Go client (queue X2Go"


def printer_session(log: str) -> str:
    """The session whose X2Go printer the log says is ready."""
    return next(line.split("session ")[1].split(" ")[0] for line in log.splitlines() if PRINTER_READY in line)


class PrintingCase(FoldersCase):
    def pyhoca_printing(self, saved: str, *args: str) -> tuple[subprocess.Popen, str]:
        printing_profile(self.home, self.gateway.port, self.user.name)
        log = tempfile.mktemp(prefix="pyhoca-", suffix=".log", dir=self.home)
        with open(log, "wb") as handle:
            process = subprocess.Popen(["pyhoca-cli", "-P", "gw", "-l", self.user.name, "--password", PASSWORD,
                                        "--add-to-known-hosts", "--printing", "--print-action", "PDFSAVE",
                                        "--save-to-folder", saved, *args],
                                       env=self.env(), stdin=subprocess.DEVNULL, stdout=handle,
                                       stderr=subprocess.STDOUT)
        self.clients.append(process)
        return process, log

    def printed_file(self, text: str) -> str:
        return postscript_file(self, text)


def postscript_file(case, text: str) -> str:
    """A one-page PostScript document with ``text`` in Helvetica (what an application prints), readable by the
    session's user; its PDF then holds the text as text (pdftotext reads it back)."""
    directory = tempfile.mkdtemp(dir="/tmp")
    case.addCleanup(shutil.rmtree, directory, True)
    os.chmod(directory, 0o755)
    path = os.path.join(directory, "job.ps")
    with open(path, "w") as handle:
        handle.write(f"%!PS-Adobe-3.0\n%%Pages: 1\n%%EndComments\n%%Page: 1 1\n/Helvetica findfont 14 scalefont setfont\n"
                     f"72 720 moveto ({text}) show\nshowpage\n%%EOF\n")
    os.chmod(path, 0o644)
    return path


class PyhocaPrintingTests(PrintingCase):
    def test_lp_in_the_session_arrives_as_a_pdf_at_the_client(self):
        saved = os.path.join(self.home, "printed")
        client, log = self.pyhoca_printing(saved)
        name = self.started_name(client, log)
        session_id = self.session_id(name)
        wait_for(lambda: PRINTER_READY in self.new_log(), 120, "X2Go's printer")
        words = f"nxgate X2Go printing {secrets.token_hex(6)}"
        env = cups_env(self.gateway.state_dir, session_id, self.user.home)
        queues = as_user(self.user.name, env, "lpstat", "-d")
        self.assertIn("X2Go", queues.stdout, queues.stderr)
        printed = as_user(self.user.name, env, "lp", "-t", "a test page", self.printed_file(words))
        self.assertEqual(printed.returncode, 0, printed.stderr)
        pdf = wait_for(lambda: delivered(self.home), 120, "the PDF and its .ready file in the client's spool")
        wait_for(lambda: words in pdf_text(pdf), 30, "the whole PDF")
        self.assertRegex(self.new_log(), r"X2Go print delivered: job \d+ \('a test page', \d+ bytes of PDF\) is in the"
                                         r" X2Go client's spool")
        # The spool the client shares is where x2goserver mounts it, and empty again (the client took the job).
        spool = f"/tmp/.x2go-{self.user.name}/spool/C-{session_id}"
        listed = as_user(self.user.name, {"HOME": self.user.home}, "ls", "-A", spool)
        self.assertEqual(listed.returncode, 0, listed.stderr)

    def test_a_job_larger_than_the_cap_is_refused_and_nothing_reaches_the_client(self):
        saved = os.path.join(self.home, "printed")
        client, log = self.pyhoca_printing(saved)
        session_id = self.session_id(self.started_name(client, log))
        wait_for(lambda: PRINTER_READY in self.new_log(), 120, "X2Go's printer")
        big = os.path.join(tempfile.mkdtemp(dir="/tmp"), "big.ps")
        self.addCleanup(shutil.rmtree, os.path.dirname(big), True)
        os.chmod(os.path.dirname(big), 0o755)
        with open(big, "wb") as handle:
            handle.truncate(1024 * 1024 * 1024)  # 1 GB (sparse)
        os.chmod(big, 0o644)
        env = cups_env(self.gateway.state_dir, session_id, self.user.home)
        refused = as_user(self.user.name, env, "lp", "-o", "raw", big, timeout=120)
        # cupsd refuses the request past [X2Go's cap]; lp says "Request Entity Too Large", or (a race in CUPS's
        # client between its writing and reading the answer) only that it failed.
        self.assertNotEqual(refused.returncode, 0, refused.stdout)
        self.assertRegex(refused.stderr, r"^lp: ")
        # The admin sees it: cupsd's refusal (its access log's 413) is a line in the gateway's log and the audit log.
        wait_for(lambda: "X2Go print refused: a " in self.new_log(), 60, "the refusal in the gateway's log")
        self.assertRegex(self.new_log(), rf"session {session_id} of {self.user.name}: X2Go print refused: a \S+ request"
                                         r" to /printers/X2Go larger than X2Go's printer takes \(100 MiB; cupsd answered"
                                         r" lp 'Request Entity Too Large'\); nothing reached the client")
        self.assertIn(session_id, [record.get("session") for record in self.gateway.audit()
                                   if record["event"] == "x2go_print_refused"])
        self.assertEqual(self.new_log().count("X2Go print refused: a "), 1)
        self.assertIsNone(delivered(self.home))
        self.assertEqual(glob.glob(os.path.join(self.home, ".x2go", "S-*", "spool", "*")), [])


class X2GoPrintingThroughTheClusterTests(ClusterTestCase):
    """pyhoca-cli and x2goclient on gateway 1, the session on node 2: jobs and folders come back through the
    cluster's streams."""

    def client_screen(self):
        from tests.harness.x11 import ClientScreen
        open_fuse(self)
        screen = ClientScreen(1024, 768, window_manager=True)
        self.addCleanup(screen.close)
        self.addCleanup(shutil.rmtree, f"/tmp/.x2go-{self.user.name}", True)
        return screen

    def both_ways(self, point: str, share: str) -> None:
        """The client's file read in the session; a copy of it written back to the client's folder."""
        read = as_user(self.user.name, {"HOME": self.user.home}, "cat", f"{point}/from-client.txt")
        self.assertEqual(read.stdout, "through the cluster\n", read.stderr)
        wrote = as_user(self.user.name, {"HOME": self.user.home}, "cp", f"{point}/from-client.txt",
                        f"{point}/back.txt")
        self.assertEqual(wrote.returncode, 0, wrote.stderr)
        with open(os.path.join(share, "back.txt")) as handle:
            self.assertEqual(handle.read(), "through the cluster\n")

    def test_pyhoca_on_gateway_1_gets_a_job_printed_on_node_2(self):
        if shutil.which("pyhoca-cli") is None:
            raise SkipTest("pyhoca-cli is not installed (apt-get install pyhoca-cli python3-x2go)")
        gateway, node = self.members(("gw1", "gateway"), ("node2", "node"))
        screen = self.client_screen()
        home = tempfile.mkdtemp(prefix="x2go-print-client-")
        self.addCleanup(shutil.rmtree, home, True)
        saved = os.path.join(home, "printed")
        printing_profile(home, gateway.port, self.user.name)
        log = os.path.join(home, "pyhoca.log")
        with open(log, "wb") as handle:
            process = subprocess.Popen(
                ["pyhoca-cli", "-P", "gw", "-l", self.user.name, "--password", self.user.password,
                 "--add-to-known-hosts", "--printing", "--print-action", "PDFSAVE", "--save-to-folder",
                 saved],
                env=dict(os.environ, DISPLAY=screen.name, HOME=home), stdin=subprocess.DEVNULL, stdout=handle,
                stderr=subprocess.STDOUT)
        self.addCleanup(stop, process)
        wait_for(lambda: PRINTER_READY in node.log(), 180, "X2Go's printer on node 2")
        session_id = printer_session(node.log())
        self.assertEqual(self.sessions(gateway)[session_id]["node"], "node2")
        words = f"printed on node 2 {secrets.token_hex(6)}"
        job = postscript_file(self, words)
        printed = as_user(self.user.name, cups_env(node.state_dir, session_id, self.user.home), "lp", job)
        self.assertEqual(printed.returncode, 0, printed.stderr)
        wait_for(lambda: delivered(home) and words in pdf_text(delivered(home)), 120, "the PDF at the client")

    def test_x2goclient_on_gateway_1_prints_and_shares_a_folder_with_a_session_on_node_2(self):
        if shutil.which("x2goclient") is None:
            raise SkipTest("x2goclient is not installed (apt-get install x2goclient)")
        gateway, node = self.members(("gw1", "gateway"), ("node2", "node"))
        machine = X2GoClientMachine(self, self.client_screen(), gateway.port, self.user,
                                    X2GoClientMachine.TERMINAL + "print=true\nfstunnel=true\n")
        share = os.path.dirname(machine.write("share/from-client.txt", "through the cluster\n"))
        printed = x2goclient_printing(machine)
        with open(os.path.join(machine.home, ".x2goclient", "sessions"), "a") as handle:
            handle.write(f"export=\"{share}:1;\"\n")
        machine.start()
        point = f"/tmp/.x2go-{self.user.name}/media/disk/{share.replace('/', '_')}"
        try:
            wait_for(lambda: f"is mounted at {point}" in node.log() and PRINTER_READY in node.log(), 180,
                     "the folder and the print spool mounted on node 2")
        except AssertionError:
            raise AssertionError(f"{machine.text()[-3000:]}\n{gateway.log()[-3000:]}\n{node.log()[-3000:]}") from None
        self.assertNotIn("is mounted at", gateway.log())  # the gateway's door asked; node 2 mounted
        self.both_ways(point, share)
        session_id = printer_session(node.log())
        self.assertEqual(self.sessions(gateway)[session_id]["node"], "node2")
        words = f"x2goclient prints on node 2 {secrets.token_hex(6)}"
        job = as_user(self.user.name, cups_env(node.state_dir, session_id, self.user.home), "lp",
                      postscript_file(self, words))
        self.assertEqual(job.returncode, 0, job.stderr)
        path = wait_for(lambda: printed_pdf(printed), 120, "the PDF through x2goclient's print command")
        wait_for(lambda: words in pdf_text(path), 30, "the whole PDF")

    def test_pyhoca_on_gateway_1_shares_a_folder_with_a_session_on_node_2(self):
        if shutil.which("pyhoca-cli") is None:
            raise SkipTest("pyhoca-cli is not installed (apt-get install pyhoca-cli python3-x2go)")
        gateway, node = self.members(("gw1", "gateway"), ("node2", "node"))
        screen = self.client_screen()
        home = tempfile.mkdtemp(prefix="x2go-folder-client-")
        self.addCleanup(shutil.rmtree, home, True)
        share = os.path.join(home, "share")
        os.makedirs(share)
        with open(os.path.join(share, "from-client.txt"), "w") as handle:
            handle.write("through the cluster\n")
        with open(os.path.join(home, "pyhoca.log"), "wb") as handle:
            process = subprocess.Popen(
                ["pyhoca-cli", "--server", "127.0.0.1", "-p", str(gateway.port), "-l", self.user.name, "--password",
                 self.user.password, "--add-to-known-hosts", "-c", "TERMINAL", "-g", "800x600", "-q", "lan",
                 "--sound", "none", "-F", share],
                env=dict(os.environ, DISPLAY=screen.name, HOME=home), stdin=subprocess.DEVNULL, stdout=handle,
                stderr=subprocess.STDOUT)
        self.addCleanup(stop, process)
        point = f"/tmp/.x2go-{self.user.name}/media/disk/{share.replace('/', '_')}"
        wait_for(lambda: f"is mounted at {point}" in node.log(), 120, "the client's folder mounted on node 2")
        self.assertNotIn("is mounted at", gateway.log())  # the gateway's door asked; node 2 mounted
        self.both_ways(point, share)


class X2GoClientPrintingTests(PrintingCase):
    """x2goclient with printing on (its profiles' default), its print settings saying what to do with a job:
    no dialog, a print command of the user's (``cp`` into a directory, where the test reads the PDF)."""

    def test_lp_in_the_session_arrives_at_x2goclients_print_command(self):
        if shutil.which("x2goclient") is None:
            raise SkipTest("x2goclient is not installed (apt-get install x2goclient)")
        machine = X2GoClientMachine(self, self.screen, self.gateway.port, self.user,
                                    X2GoClientMachine.TERMINAL + "print=true\nfstunnel=true\n")
        printed = x2goclient_printing(machine)
        before = len(self.gateway.log())
        client = machine.start()
        wait_for(lambda: PRINTER_READY in self.gateway.log()[before:], 120, "X2Go's printer in x2goclient's session")
        session_id = printer_session(self.gateway.log()[before:])
        words = f"x2goclient prints {secrets.token_hex(6)}"
        env = cups_env(self.gateway.state_dir, session_id, self.user.home)
        job = as_user(self.user.name, env, "lp", "-t", "from x2goclient's session", self.printed_file(words))
        self.assertEqual(job.returncode, 0, job.stderr)

        def pdf() -> str | None:
            if client.poll() is not None:
                raise AssertionError(f"x2goclient exited {client.returncode}: {machine.text()[-3000:]}")
            return printed_pdf(printed)

        try:
            path = wait_for(pdf, 120, "the PDF through x2goclient's print command")
        except AssertionError:
            raise AssertionError(f"{machine.text()[-4000:]}\n{self.gateway.log()[before:][-3000:]}") from None
        wait_for(lambda: words in pdf_text(path), 30, "the whole PDF")
        self.assertRegex(self.gateway.log()[before:], r"X2Go print delivered: job \d+ \(\"from x2goclient's session\","
                                                      r" \d+ bytes of PDF\)")
