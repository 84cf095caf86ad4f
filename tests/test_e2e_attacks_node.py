"""End to end: break-ins by another local user on the session side, played
against the real gateway.

* **The printing and folder tunnels.**  nxgate-client carries a session's
  printers and folders on SSH channels of their own; their listeners on
  the server let in the session user's processes only.  A socket that
  connects, sends and closes at once used to pass: the kernel's TCP table
  lists an orphaned socket as uid 0, and uid 0 counted as "the gateway
  itself".  Another real local user sends 1,000 such IPP Print-Job
  requests into the printers' tunnel and 1,000 SMB openings into the
  folder's: none may reach the client's print server (its CUPS's access
  log) or its Samba (which logs each connection that breaks off inside a
  packet), while the session's own user still prints and reads.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import uuid

from twisted.trial.unittest import SkipTest

from tests.harness.cups import client_printing
from tests.harness.process import Timeout, wait_for
from tests.harness.users import create_user
from tests.test_e2e_client import RED, ClientScreenTestCase
from tests.test_e2e_client import TYPES as CLIENT_TYPES
from tests.test_e2e_printing import QUEUE, _only_session, _program_env, cupsd_of
from tests.test_e2e_sound import as_user

ATTEMPTS = 1000

#: The intruder: ``ATTEMPTS`` connections to the tunnel at ARGV[1] (a port,
#: or a Unix socket's path), each sending stdin's bytes and closing at once;
#: prints how many connected (a send may meet a connection already cut off).
INTRUDER = """
import socket, sys
address, count = sys.argv[1], int(sys.argv[2])
payload = sys.stdin.buffer.read()
def connect():
    for _ in range(5):  # a full backlog drops a connection now and then: try again, as an intruder would
        try:
            if address.isdigit():
                return socket.create_connection(("127.0.0.1", int(address)), timeout=5)
            s = socket.socket(socket.AF_UNIX)
            s.connect(address)  # blocking: waits while the listener's backlog is full
            return s
        except OSError:
            pass
    return None

connected = 0
for _ in range(count):
    s = connect()
    if s is None:
        continue
    connected += 1
    try:
        s.sendall(payload)
    except OSError:
        pass
    s.close()
print(connected)
"""


def _attribute(tag: int, name: str, value: bytes) -> bytes:
    return struct.pack(">BH", tag, len(name)) + name.encode() + struct.pack(">H", len(value)) + value


def print_job(marker: str) -> bytes:
    """An HTTP POST of an IPP Print-Job for the client's queue, its document
    and job name carrying ``marker``."""
    body = (b"\x02\x00" + struct.pack(">HI", 0x0002, 1) + b"\x01"
            + _attribute(0x47, "attributes-charset", b"utf-8")
            + _attribute(0x48, "attributes-natural-language", b"en")
            + _attribute(0x45, "printer-uri", f"ipp://localhost/printers/{QUEUE}".encode())
            + _attribute(0x42, "requesting-user-name", b"intruder")
            + _attribute(0x42, "job-name", marker.encode())
            + _attribute(0x49, "document-format", b"text/plain")
            + b"\x03" + f"{marker}\n".encode())
    head = (f"POST /printers/{QUEUE} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/ipp\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    return head + body


#: The opening of an SMB message that announces 64 KiB and breaks off: the
#: client's Samba logs each such connection it gets ("read_fd_with_timeout
#: failed"), even at its log level 0.
SMB_OPENING = b"\x00\x00\xff\xff\xfeSMB@\x00intruder"
SAMBA_BROKE_OFF = "read_fd_with_timeout failed"


def tunnel_address(log: str, service: str) -> str:
    """Where the session's node says its ``service`` listener for the client's own SSH channel is: a port or a
    socket's path."""
    what = {"printing": "printing", "sharing": "folders"}[service]
    found = re.search(rf"the client takes its {what} back \(listening (?:on 127\.0\.0\.1:(\d+)|at (\S+))\)", log)
    if found is None:
        raise AssertionError(f"the gateway's log names no {service} tunnel")
    return found.group(1) or found.group(2)


class TunnelIntruderTests(ClientScreenTestCase):
    """alice's nxgate-client shares her printers and a folder; bob, another
    local user, floods both tunnels with connect-send-close attempts."""

    options = {"sessions": {"display_base": "3100", "display_limit": "20", "connect_timeout": "60"},
               "types": CLIENT_TYPES}

    def setUp(self):
        if not os.path.exists("/dev/fuse") or shutil.which("smbnetfs") is None:
            raise SkipTest("no /dev/fuse or smbnetfs here")
        super().setUp()
        mode = os.stat("/dev/fuse").st_mode & 0o777
        if mode & 0o006 != 0o006:
            os.chmod("/dev/fuse", 0o666)
            self.addCleanup(os.chmod, "/dev/fuse", mode)
        self.printer, self.cups = client_printing(self, self.gateway.workdir)
        self.folder = tempfile.mkdtemp(prefix="nxgate-share-")
        self.addCleanup(shutil.rmtree, self.folder, True)
        with open(os.path.join(self.folder, "hello.txt"), "w") as handle:
            handle.write("from the client's folder\n")
        self.intruder = create_user()
        self.addCleanup(self.intruder.remove)

    def intrude(self, address: str, payload: bytes) -> int:
        """bob's ATTEMPTS connect-send-close connections to ``address``; how many connected."""
        result = subprocess.run(["runuser", "-u", self.intruder.name, "--", sys.executable, "-c", INTRUDER, address,
                                 str(ATTEMPTS)], input=payload, capture_output=True, timeout=300)
        self.assertEqual(result.returncode, 0, result.stderr)
        return int(result.stdout)

    def requests_at_the_client(self, operation: str) -> list[str]:
        """The ``operation`` requests the client's CUPS took (its access log):
        bob sends Print-Job; the session's cupsd sends alice's jobs as
        Create-Job and Send-Document."""
        path = os.path.join(self.cups.dir, "access_log")
        if not os.path.exists(path):
            return []
        with open(path, errors="replace") as handle:
            return [line for line in handle if f" {operation} " in line]

    def samba_broken_off(self) -> int:
        count = 0
        for path in glob.glob(os.path.join(self.tmp, "**", "smbd.log"), recursive=True):
            with open(path, errors="replace") as handle:
                count += handle.read().count(SAMBA_BROKE_OFF)
        return count

    def test_connect_send_close_from_another_user_reaches_neither_printer_nor_share(self):
        client = self.background(self.argv("--geometry", "800x600", "--print", "--print-server", self.cups.server,
                                           "--share", f"work={self.folder}", "--verbose"), DISPLAY=self.screen.name)
        self.screen.wait_for_colour(RED, 20000, timeout=60)
        env = wait_for(lambda: _program_env(self.user.name, _only_session(self.user.name)), 20, "the session program")
        env = {key: env[key] for key in ("CUPS_SERVER", "HOME")}
        wait_for(lambda: QUEUE in as_user(self.user.name, env, "lpstat", "-a").stdout, 60,
                 "the client's queue in the session", interval=0.3)
        link = os.path.join(self.user.home, "MyShares", "work")
        wait_for(lambda: as_user(self.user.name, {}, "test", "-d", link + "/").returncode == 0, 60,
                 "the client's folder at ~/MyShares/work")
        printing, sharing = tunnel_address(self.gateway.log(), "printing"), tunnel_address(self.gateway.log(), "sharing")
        jobs_before, samba_before = len(self.requests_at_the_client("Print-Job")), self.samba_broken_off()

        marker = f"intruder-{uuid.uuid4().hex}"
        self.assertEqual(self.intrude(printing, print_job(marker)), ATTEMPTS, "bob reached the printers' tunnel")
        self.assertEqual(self.intrude(sharing, SMB_OPENING), ATTEMPTS, "bob reached the folder's tunnel")

        # alice still prints and reaches her Samba through the same tunnels, on connections made after
        # bob's: once hers came through, everything his could have carried has come through too.
        text = f"alice prints {uuid.uuid4().hex}"
        path = os.path.join(self.user.home, "alice.txt")
        as_user(self.user.name, env, "sh", "-c", f"printf '%s\\n' '{text}' > {path}")
        created = len(self.requests_at_the_client("Create-Job"))
        printed = as_user(self.user.name, env, "lp", "-d", QUEUE, path)
        self.assertEqual(printed.returncode, 0, printed.stderr)
        try:
            alice_printed = wait_for(lambda: len(self.requests_at_the_client("Create-Job")) > created, 90,
                                     "alice's job at the client's CUPS")
        except Timeout:
            alice_printed = False  # said below, after what bob did: his jobs may be what holds hers
        login = as_user(self.user.name, {}, "smbclient", "-p", sharing, "//127.0.0.1/work", "-U",
                        f"{self.user.name}%wrong", "-c", "ls")

        reached = len(self.requests_at_the_client("Print-Job")) - jobs_before
        broken_off = self.samba_broken_off() - samba_before
        self.assertEqual((reached, broken_off), (0, 0),
                         f"of bob's {ATTEMPTS} connect-send-close attempts, {reached} print jobs reached alice's print "
                         f"server and {broken_off} SMB openings her Samba")
        self.assertTrue(alice_printed, "alice's own job did not reach her print server")
        self.assertIn("NT_STATUS_LOGON_FAILURE", login.stdout + login.stderr, "alice's connection reached her Samba")
        self.assertEqual(self.printer.wait_for_text(text.encode()).strip(), text.encode())
        self.assertFalse([data for data in self.printer.texts() if marker.encode() in data],
                         "bob's document came out of alice's printer")
        uid = self.intruder.entry.pw_uid
        self.assertIn(f"refused a printing connection from uid {uid}", self.gateway.log())
        self.assertIn(f"refused a folders connection from", self.gateway.log())
        client.terminate()
        client.wait(30)
        wait_for(lambda: not cupsd_of(self.user.name), 30, "the session's cupsd to end")
