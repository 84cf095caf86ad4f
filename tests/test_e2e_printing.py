"""End to end: printing from a real session on the client's printer through
the NX cups channel (issue 14).

The client side is real: ``ippeveprinter`` (an IPP Everywhere printer that
keeps each job as a file) behind a private CUPS with one queue, and in front
of them nxgate-client's gate (tests/harness/cups.py), which the real
``nxproxy -S cups=PORT`` connects the channel to.  The server side is the
session's own cupsd, run as the user.  A text printed with ``lp`` in the
session's environment (read from the session program's /proc/PID/environ)
must arrive as a job file holding that text.  Also: another user sees
neither the queue nor the jobs (nor gets through the channel's port),
suspend stops cupsd and resume brings the printers back with the new
cookie, a SIGKILLed gateway leaves no cupsd behind, printing switched off in
``[services]``, a plain CUPS behind the channel (NoMachine's way, no gate),
and ``nxgate-client --print`` itself.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.parse
import uuid

from nxgate.protocols import service_channels
from nxgate.protocols import ipp
from tests.harness.cups import ClientCups, GateProcess, client_printing
from tests.harness.gateway import Gateway
from tests.harness.process import wait_for
from tests.harness.ssh import Attachment, NXClient, SessionInfo
from tests.harness.users import create_user
from tests.test_e2e_client import TYPES as CLIENT_TYPES
from tests.test_e2e_client import ClientScreenTestCase, agent_processes
from tests.test_e2e_sessions import RED, START, TYPES, SessionTestCase, proc_environ
from tests.test_e2e_sound import as_user

QUEUE = "clientprinter"
OPTIONS = {"sessions": {"display_base": "1340", "display_limit": "60", "connect_timeout": "60"}}


def cupsd_of(user: str) -> list[int]:
    result = subprocess.run(["pgrep", "-u", user, "-x", "cupsd"], capture_output=True, text=True)
    return [int(pid) for pid in result.stdout.split()]


class PrintingTestCase(SessionTestCase):
    options = OPTIONS

    def setUp(self):
        super().setUp()
        self.printer, self.cups = client_printing(self, self.gateway.workdir)

    def start_with_printing(self, client: NXClient, cups: str = "1") -> SessionInfo:
        reply = client.command(START.format(name="print", type="unix-console", extra=f'--cups="{cups}"'),
                               timeout=60)
        self.assertIn(b"NX> 710 Session status: running", reply, reply)
        return SessionInfo.parse(reply)

    def attach_with_printing(self, client: NXClient, info: SessionInfo, cups: ClientCups | None = None,
                             gate: bool = True) -> Attachment:
        cups = cups or self.cups
        port = cups.port
        if gate:
            process = GateProcess(info.cookie, cups.server)
            self.addCleanup(process.close)
            port = process.port
        attachment = Attachment(client, info, self.screen.name, self.gateway.workdir, options=f"cups={port}")
        self.addCleanup(attachment.detach)
        return attachment

    def session_env(self, info: SessionInfo, user=None) -> dict[str, str]:
        """The environment of the session's program (its xterm), found by the
        session's id in it: a dying xterm of an earlier test's user with the
        same uid must not be taken for it."""
        env = wait_for(lambda: _program_env((user or self.user).name, info.session_id), 20, "the session program")
        return {key: env[key] for key in ("CUPS_SERVER", "HOME") if key in env}

    def wait_for_queue(self, env: dict[str, str], queue: str = QUEUE, user=None) -> str:
        user = user or self.user

        def listed():
            result = as_user(user.name, env, "lpstat", "-a")
            return result.stdout if result.returncode == 0 and queue in result.stdout else None

        return wait_for(listed, 60, f"the queue {queue} in {user.name}'s session", interval=0.3)

    def print_text(self, env: dict[str, str], user=None, queue: str = QUEUE) -> bytes:
        """Print a fresh line of text with lp in the session; the text."""
        user = user or self.user
        text = f"nxgate printing test {uuid.uuid4().hex}\n"
        path = os.path.join(user.home, f"print-{uuid.uuid4().hex[:8]}.txt")
        written = as_user(user.name, env, "sh", "-c", f"printf '%s' '{text.strip()}' > {path}")
        self.assertEqual(written.returncode, 0, written.stderr)
        printed = as_user(user.name, env, "lp", "-d", queue, path)
        self.assertEqual(printed.returncode, 0, printed.stderr)
        self.assertIn("request id is", printed.stdout)
        return text.strip().encode()


def _program_env(user: str, session_id: str) -> dict[str, str] | None:
    result = subprocess.run(["pgrep", "-u", user, "-x", "xterm"], capture_output=True, text=True)
    for pid in result.stdout.split():
        try:
            env = proc_environ(int(pid))
        except OSError:
            continue
        if env.get("NXGATE_SESSION_ID") == session_id:
            return env
    return None


def _only_session(user: str) -> str | None:
    """The id of the user's one session (nxgate-client started it)."""
    result = subprocess.run(["pgrep", "-u", user, "-x", "nxagent"], capture_output=True, text=True)
    for pid in result.stdout.split():
        try:
            return proc_environ(int(pid)).get("NXGATE_SESSION_ID")
        except OSError:
            continue
    return None


class PrintingTests(PrintingTestCase):
    def test_a_text_printed_with_lp_in_the_session_arrives_at_the_clients_printer(self):
        client = self.login()
        info = self.start_with_printing(client)
        self.attach_with_printing(client, info)
        self.screen.wait_for_colour(RED, 20000)
        env = self.session_env(info)
        socket_path = env.get("CUPS_SERVER", "")
        self.assertTrue(socket_path.startswith(os.path.join(self.gateway.state_dir, "sessions", info.session_id)),
                        env)
        queues = self.wait_for_queue(env)
        self.assertIn(QUEUE, queues)
        default = as_user(self.user.name, env, "lpstat", "-d")
        self.assertIn(QUEUE, default.stdout)  # the client's default printer is the session's
        text = self.print_text(env)
        job = self.printer.wait_for_text(text)
        self.assertEqual(job.strip(), text)
        # The private files: in the user's 0700 session directory (cupsd makes
        # its own 0755), a 0600 printers.conf holding the credential, which is
        # nowhere in a process's argv or the log.
        directory = os.path.dirname(socket_path)
        st = os.stat(os.path.dirname(directory))
        self.assertEqual((st.st_uid, stat.S_IMODE(st.st_mode)), (self.user.entry.pw_uid, 0o700))
        conf = os.path.join(directory, "printers.conf")
        self.assertEqual(stat.S_IMODE(os.stat(conf).st_mode), 0o600)
        from nxgate.protocols import printgate

        credential = printgate.credential(info.cookie)
        with open(conf) as handle:
            self.assertIn(credential, handle.read())
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as handle:
                        self.assertNotIn(credential.encode(), handle.read())
                except OSError:
                    pass
        self.assertNotIn(credential, self.gateway.log())
        self.assertEqual(len(cupsd_of(self.user.name)), 1)

    def test_another_user_sees_neither_the_queue_nor_the_jobs(self):
        client = self.login()
        info = self.start_with_printing(client)
        self.attach_with_printing(client, info)
        env = self.session_env(info)
        self.wait_for_queue(env)
        # A job stays queued for a while: the printer pauses.
        self.print_text(env)
        # The other user, pointed at the first user's cupsd, gets nowhere.
        stranger_env = {"CUPS_SERVER": env["CUPS_SERVER"], "HOME": self.other.home}
        for argv in (("lpstat", "-a"), ("lpstat", "-o"), ("lpstat", "-v")):
            result = as_user(self.other.name, stranger_env, *argv)
            self.assertNotEqual(result.returncode, 0, result.stdout)  # he cannot reach the socket at all
            self.assertNotIn(QUEUE, result.stdout + result.stderr)
            self.assertNotIn(self.user.name, result.stdout)
        printed = as_user(self.other.name, stranger_env, "lp", "-d", QUEUE, "/etc/hostname")
        self.assertNotEqual(printed.returncode, 0, printed.stdout)
        listing = as_user(self.other.name, {"HOME": self.other.home}, "ls", os.path.dirname(env["CUPS_SERVER"]))
        self.assertNotEqual(listing.returncode, 0)
        # ... and his own printing session has his own printer only.
        _other_printer, other_cups = client_printing(self, self.gateway.workdir, "OtherPrinter", "otherprinter")
        other_client = self.login(self.other)
        other_info = self.start_with_printing(other_client)
        self.attach_with_printing(other_client, other_info, cups=other_cups)
        other_env = self.session_env(other_info, self.other)
        self.assertNotEqual(other_env["CUPS_SERVER"], env["CUPS_SERVER"])
        queues = self.wait_for_queue(other_env, "otherprinter", self.other)
        self.assertNotIn(QUEUE, queues)
        jobs = as_user(self.other.name, other_env, "lpstat", "-o")
        self.assertNotIn(self.user.name, jobs.stdout)
        # The channel's port is on loopback for everyone: without the
        # session's credential the client's gate answers 401.
        port = service_channels.channel_port("printing", info.display)
        body = ipp.request(ipp.CUPS_GET_PRINTERS, 1, requested=("printer-name",))

        def ask_as_stranger() -> bytes:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as stranger:
                stranger.sendall(ipp.http_post("/", body, f"127.0.0.1:{port}"))
                answer = b""
                while chunk := stranger.recv(65536):
                    answer += chunk
            return answer

        # Under load the NX channel to the client's gate was once closed before the gate answered
        # (an empty answer: nothing seen, but not the gate's word): ask again a few times.
        for _ in range(3):
            answer = ask_as_stranger()
            if answer:
                break
            time.sleep(1)
        self.assertTrue(answer.startswith(b"HTTP/1.1 401 "), answer[:100])
        self.assertNotIn(b"clientprinter", answer)

    def test_suspend_stops_cupsd_and_resume_brings_the_printers_back(self):
        client = self.login()
        info = self.start_with_printing(client)
        attachment = self.attach_with_printing(client, info)
        env = self.session_env(info)
        self.wait_for_queue(env)
        conf = os.path.join(os.path.dirname(env["CUPS_SERVER"]), "printers.conf")
        attachment.detach()
        self.wait_status(info.session_id, "Suspended")
        wait_for(lambda: not cupsd_of(self.user.name), 20, "the session's cupsd to stop at suspend")
        wait_for(lambda: not os.path.exists(conf), 10, "the credential to go at suspend")
        client = self.login()
        reply = client.command(START.format(name="x", type="unix-console", extra='--cups="1"').replace(
            "startsession", "restoresession") + f' --id="{info.session_id}"', timeout=60)
        resumed = SessionInfo.parse(reply)
        self.assertNotEqual(resumed.cookie, info.cookie)
        self.attach_with_printing(client, resumed)
        self.wait_status(info.session_id, "Running")
        self.wait_for_queue(env)
        self.assertEqual(len(cupsd_of(self.user.name)), 1)
        text = self.print_text(env)
        self.assertEqual(self.printer.wait_for_text(text).strip(), text)

    def test_a_plain_cups_behind_the_channel_works_too(self):
        """A client that connects the channel straight to its CUPS (as
        NoMachine's does) gets no 401, and the session prints all the same."""
        client = self.login()
        info = self.start_with_printing(client)
        self.attach_with_printing(client, info, gate=False)
        env = self.session_env(info)
        self.wait_for_queue(env)
        text = self.print_text(env)
        self.assertEqual(self.printer.wait_for_text(text).strip(), text)

    def test_without_cups_the_session_has_no_printing(self):
        client = self.login()
        info = self.start_with_printing(client, cups="0")
        self.attach_with_printing(client, info)
        self.screen.wait_for_colour(RED, 20000)
        self.assertNotIn("CUPS_SERVER", self.session_env(info))
        time.sleep(2)
        self.assertEqual(cupsd_of(self.user.name), [])


class PrintingSwitchedOffTests(PrintingTestCase):
    options = {**OPTIONS, "services": {"printing": "no"}}

    def test_a_client_asking_for_printing_gets_a_working_session_without_it(self):
        client = self.login()
        info = self.start_with_printing(client)  # asks for --cups="1"
        self.attach_with_printing(client, info)
        self.screen.wait_for_colour(RED, 20000)  # the session draws: it works
        self.assertNotIn("CUPS_SERVER", self.session_env(info))
        time.sleep(2)
        self.assertEqual(cupsd_of(self.user.name), [])
        self.assertEqual(self.printer.jobs(), [])


class GatewayKilledTests(PrintingTestCase):
    def test_a_sigkilled_gateway_leaves_no_cupsd_behind(self):
        client = self.login()
        info = self.start_with_printing(client)
        self.attach_with_printing(client, info)
        env = self.session_env(info)
        self.wait_for_queue(env)
        self.assertEqual(len(cupsd_of(self.user.name)), 1)
        self.gateway.process.kill()
        self.gateway.process.wait()
        self.gateway.process.stderr.close()
        self.gateway.process = None
        options = {"sessions": dict(OPTIONS["sessions"]), "types": dict(TYPES)}
        restarted = Gateway(state_dir=self.gateway.state_dir, options=options).start()
        self.addCleanup(restarted.stop)
        self.gateway, old = restarted, self.gateway
        self.addCleanup(lambda: setattr(self, "gateway", old))
        wait_for(lambda: self.listing().get(info.session_id) == "Suspended", 60, "the session taken back")
        wait_for(lambda: not cupsd_of(self.user.name), 30, "the session's cupsd to stop")
        # Terminating it leaves nothing either.
        client = self.login()
        client.command(f'terminate --sessionid="{info.session_id}"', timeout=30)
        wait_for(lambda: not agent_processes(self.user.name), 30, "the agent to end")
        self.assertEqual(cupsd_of(self.user.name), [])


class ClientPrintingTests(ClientScreenTestCase):
    """``nxgate-client --print`` against the real gateway, with the private
    CUPS standing in for the user's."""

    options = {"sessions": {"display_base": "1400", "display_limit": "60", "connect_timeout": "60"},
               "types": CLIENT_TYPES}

    def setUp(self):
        super().setUp()
        self.printer, self.cups = client_printing(self, self.gateway.workdir)

    def test_print_lets_the_session_print_here_and_its_gate_goes_with_the_client(self):
        client = self.background(self.argv("--geometry", "800x600", "--print", "--print-server", self.cups.server,
                                           "--verbose"), DISPLAY=self.screen.name)
        self.screen.wait_for_colour(RED, 20000, timeout=60)
        env = wait_for(lambda: _program_env(self.user.name, _only_session(self.user.name)), 20, "the session program")
        env = {key: env[key] for key in ("CUPS_SERVER", "HOME")}

        def listed():
            result = as_user(self.user.name, env, "lpstat", "-a")
            return result.returncode == 0 and QUEUE in result.stdout

        wait_for(listed, 60, "the client's queue in the session", interval=0.3)
        text = f"printed through nxgate-client {uuid.uuid4().hex}"
        path = os.path.join(self.user.home, "client-print.txt")
        as_user(self.user.name, env, "sh", "-c", f"printf '%s\\n' '{text}' > {path}")
        printed = as_user(self.user.name, env, "lp", path)  # the default: the client's default printer
        self.assertEqual(printed.returncode, 0, printed.stderr)
        self.assertEqual(self.printer.wait_for_text(text.encode()).strip(), text.encode())
        # The jobs went on an SSH channel of their own, not through nxagent's cups channel: its Unix socket ...
        tunnel = re.search(r"the client takes its printing back \(listening at (\S+)\)", self.gateway.log())
        self.assertIsNotNone(tunnel, "the gateway's log says where the printers' tunnel listens")
        path = tunnel.group(1)
        self.assertTrue(stat.S_ISSOCK(os.stat(path).st_mode), path)
        conf = os.path.join(os.path.dirname(env["CUPS_SERVER"]), "printers.conf")
        with open(conf) as handle:
            self.assertIn(f"@{urllib.parse.quote(path, safe='')}/printers/{QUEUE}", handle.read(),
                          "the queue sends into the tunnel")
        # ... which lets in the session's user only: another user is cut off before the client sees him.
        stranger = create_user()
        self.addCleanup(stranger.remove)
        probe = ("import socket, sys\n"
                 "s = socket.socket(socket.AF_UNIX)\n"
                 "s.settimeout(10)\n"
                 "s.connect(sys.argv[1])\n"
                 "s.sendall(sys.stdin.buffer.read())\n"
                 "answer = b''\n"
                 "try:\n"
                 "    while chunk := s.recv(65536): answer += chunk\n"
                 "except OSError: pass\n"
                 "sys.stdout.buffer.write(answer)\n")
        body = ipp.request(ipp.CUPS_GET_PRINTERS, 1, requested=("printer-name",))
        request = ipp.http_post("/", body, "localhost")
        answers = {}
        for who in (stranger.name, self.user.name):
            answers[who] = subprocess.run(["runuser", "-u", who, "--", sys.executable, "-c", probe, path],
                                          input=request, capture_output=True, timeout=30).stdout
        self.assertEqual(answers[stranger.name], b"", "another user got an answer through the tunnel")
        self.assertIn(f"refused a printing connection from uid {stranger.entry.pw_uid}",
                      self.gateway.log())
        self.assertTrue(answers[self.user.name].startswith(b"HTTP/1.1 200 "), answers[self.user.name][:100])
        self.assertIn(QUEUE.encode(), answers[self.user.name])
        client.send_signal(signal.SIGTERM)
        client.wait(30)
        for pid in agent_processes(self.user.name):
            os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not agent_processes(self.user.name), 20, "the agents to end")
        wait_for(lambda: not cupsd_of(self.user.name), 20, "the session's cupsd to end")


JAILED_PROBE = r"""#!/bin/sh
# In the jail: wait for the client's queue, print a text, then draw.
printf '%s\n' '@TEXT@' > "$HOME/jailed.txt"
i=0
until lpstat -a 2>/dev/null | grep -q clientprinter; do
    i=$((i + 1)); [ $i -gt 300 ] && break; sleep 0.2
done
lp -d clientprinter "$HOME/jailed.txt" > "$HOME/lp.out" 2>&1
exec xterm -bg '#00ff00' -geometry 50x10+30+30
"""


class JailedPrintingTests(PrintingTestCase):
    options = {**OPTIONS, "jail": {"enabled": "yes"}}

    def setUp(self):
        import shutil

        from twisted.trial.unittest import SkipTest

        if not shutil.which("bwrap"):
            raise SkipTest("bubblewrap (bwrap) is not installed")
        super().setUp()

    def test_a_jailed_session_prints_from_inside_its_jail(self):
        """The cupsd runs outside the jail; its socket is in the session
        directory, which the jail binds, and the channel's port is on the
        host's loopback, which the jail shares."""
        import shutil

        from tests.test_e2e_sessions import GREEN

        text = f"printed from a jail {uuid.uuid4().hex}"
        probe = os.path.join(self.user.home, "print-probe.sh")
        with open(probe, "w") as handle:
            handle.write(JAILED_PROBE.replace("@TEXT@", text))
        shutil.chown(probe, self.user.name)
        os.chmod(probe, 0o755)
        client = self.login()
        reply = client.command(START.format(name="jailed", type="unix-application",
                                            extra=f'--cups="1" --application="{probe}"'), timeout=60)
        info = SessionInfo.parse(reply)
        for agent in agent_processes(self.user.name):  # jailed indeed
            self.assertNotEqual(os.readlink(f"/proc/{agent}/ns/pid"), os.readlink("/proc/self/ns/pid"))
        self.attach_with_printing(client, info)
        self.assertEqual(self.printer.wait_for_text(text.encode()).strip(), text.encode())
        self.screen.wait_for_colour(GREEN, 10000)
        with open(os.path.join(self.user.home, "lp.out")) as handle:
            self.assertIn("request id is clientprinter-", handle.read())


class BarePrinterTests(PrintingTestCase):
    def test_a_bare_ipp_printer_as_the_print_server_is_one_queue(self):
        """--print-server pointing at an IPP printer itself (no CUPS): the
        session gets one queue named after it, and prints on it."""
        client = self.login()
        info = self.start_with_printing(client)
        gate = GateProcess(info.cookie, f"127.0.0.1:{self.printer.port}")
        self.addCleanup(gate.close)
        attachment = Attachment(client, info, self.screen.name, self.gateway.workdir, options=f"cups={gate.port}")
        self.addCleanup(attachment.detach)
        env = self.session_env(info)
        self.wait_for_queue(env, "ClientPrinter")
        text = self.print_text(env, queue="ClientPrinter")
        self.assertEqual(self.printer.wait_for_text(text).strip(), text)
