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
* **The owner's shadow notice.**  While someone shadows a session, a notice
  on its screen says so; it runs as the owner, whose uid an interactive
  shadow lets the viewer use.  Killing it as the owner's uid (what
  ``pkill -f shadow_notice`` typed through the shadow does) must end the
  shadow; hiding it must not make it go.
* **Display starvation.**  Lock files in /tmp naming pid 1 counted as held
  forever, and the search for a free display stopped after 256 displays
  held by others: 300 lock files planted by another user stopped every new
  session.  Now what holds a display is what the kernel says (a bound X
  socket, a taken port), the planted lock is taken over for the new
  session's user, and nothing counts how far the search goes.
* **A session started for later loses its display.**  nxagent gives up
  waiting for a first client after 60 s and the gateway starts a fresh
  one; another user, binding the display's abstract X name (and planting
  its lock) in a tight loop, won it in between and the session ended.
  Now the gateway holds the name from the start to the end of the session
  and takes the lock over before the fresh agent starts.
"""

from __future__ import annotations

import glob
import os
import pwd
import re
import signal
import struct
import subprocess
import sys
import uuid

from tests.harness import pixels
from tests.harness.cluster import admin_cli
from tests.harness.cups import client_printing
from tests.harness.process import Timeout, wait_for
from tests.harness.ssh import SessionInfo
from tests.harness.users import create_user
from tests.harness.x11 import quiet_display_range
from tests.test_e2e_client import RED, ClientScreenTestCase
from tests.test_e2e_client import TYPES as CLIENT_TYPES
from tests.test_e2e_dbus import NAME, PATH, fixture_with_bus, user_env
from tests.test_e2e_dbus import as_user as dbus_as_user
from tests.test_e2e_printing import QUEUE, _only_session, _program_env, cupsd_of
from tests.test_e2e_sessions import SessionTestCase
from tests.test_e2e_shadow import ShadowTestCase
from tests.test_e2e_sharing import client_share_set_up
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
        self.folder = client_share_set_up(self, super().setUp)
        self.printer, self.cups = client_printing(self, self.gateway.workdir)
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


NOTICE_AMBER = (255, 204, 0)  # the shadow notice's background


class ShadowNoticeTests(ShadowTestCase):
    """alice's session is shadowed by bob (an admin) with her consent."""

    options = {**ShadowTestCase.options, "sessions": {"display_base": "3300", "display_limit": "20"}}

    def notice_shown(self, display: int, authority: str) -> bool:
        return pixels.grab(f":{display}", authority).count(NOTICE_AMBER) > 2000

    def notices(self) -> list[str]:
        return subprocess.run(["pgrep", "-u", self.user.name, "-f", "shadow_notice.py"], capture_output=True,
                              text=True).stdout.split()

    def shadowed(self):
        """alice's session, bob's shadow of it with her consent, and its notice's pid."""
        info = self.master()
        shadow = SessionInfo.parse(self.attach_shadow(self.other, info.session_id, answer="a"))
        attachment = self.attach(self.shadow_client, shadow, self.viewer_screen)
        self.viewer_screen.wait_for_colour(RED, 10000)
        authority = os.path.join(self.gateway.state_dir, "sessions", info.session_id, "authority")
        wait_for(lambda: self.notice_shown(info.display, authority), 30, "the notice on alice's screen")
        (notice,) = self.notices()
        return info, shadow, attachment, authority, notice

    def test_the_notice_killed_with_the_owners_uid_ends_the_shadow(self):
        info, shadow, attachment, _authority, notice = self.shadowed()
        # Killed with alice's uid, as bob would through his interactive shadow: the shadow goes.
        subprocess.run(["runuser", "-u", self.user.name, "--", "kill", notice], check=True, timeout=10)
        wait_for(lambda: attachment.proxy.poll() is not None, 30, "bob's shadow viewer to be dropped")
        wait_for(lambda: shadow.session_id not in self.listing(self.other), 20, "the shadow to end")
        log = self.gateway.log()
        self.assertIn("the notice was closed by a signal, not by its End button", log)
        self.assertIn("the shadow is ended with it", log)
        # Its agent was told to end; nx-libs takes its own fixed waits (and more under load) to go.
        wait_for(lambda: not subprocess.run(["pgrep", "-u", self.user.name, "-f", f"nxagent.*:{shadow.display}$"],
                                            capture_output=True).stdout, 30, "the shadow's agent to end")
        self.assertEqual(self.listing().get(info.session_id), "Running")  # alice's own session goes on

    def test_a_hidden_notice_shows_itself_again(self):
        info, shadow, _attachment, authority, notice = self.shadowed()
        # Unmapped, as xdotool run with alice's uid can: it shows itself again, and the shadow runs on.
        env = dict(os.environ, DISPLAY=f":{info.display}", XAUTHORITY=authority)
        # Paused while it is unmapped, so that the test sees it hidden (it shows itself again within
        # a moment, which a loaded machine's screen grabs could miss); it answers the unmap once it runs.
        os.kill(int(notice), signal.SIGSTOP)
        try:
            subprocess.run(["xdotool", "search", "--classname", "nxgate-shadow-notice", "windowunmap", "%@"],
                           env=env, check=True, timeout=10)
            wait_for(lambda: not self.notice_shown(info.display, authority), 10, "the notice to be hidden")
        finally:
            os.kill(int(notice), signal.SIGCONT)
        wait_for(lambda: self.notice_shown(info.display, authority), 10, "the notice to show itself again")
        self.assertEqual(self.notices(), [notice])
        self.assertIn(shadow.session_id, self.listing(self.other))


PLANTED = 300
PLANTED_BASE = quiet_display_range(3500, PLANTED)


class PlantedTmpTests(SessionTestCase):
    """bob plants 300 lock files naming pid 1 over alice's whole display
    range and beyond (20 numbers), and a socket file and a temporary lock
    at its first display."""

    options = {"sessions": {"display_base": str(PLANTED_BASE), "display_limit": "20"}}

    def plant(self) -> None:
        bob = pwd.getpwnam(self.other.name)
        numbers = range(PLANTED_BASE, PLANTED_BASE + PLANTED)
        for n in numbers:
            self.assertFalse(os.path.lexists(f"/tmp/.X{n}-lock"), f"/tmp/.X{n}-lock exists before the test")
        self.addCleanup(lambda: [os.unlink(f"/tmp/.X{n}-lock") for n in numbers if os.path.lexists(f"/tmp/.X{n}-lock")])
        script = ('for n in $(seq {first} {last}); do printf "%10d\\n" 1 > /tmp/.X$n-lock; done; '
                  ': > /tmp/.X11-unix/X{first}; : > /tmp/.tX{first}-lock').format(first=numbers[0], last=numbers[-1])
        subprocess.run(["setpriv", f"--reuid={bob.pw_uid}", f"--regid={bob.pw_gid}", "--clear-groups", "sh", "-c",
                        script], check=True, cwd="/")
        for path in (f"/tmp/.X11-unix/X{numbers[0]}", f"/tmp/.tX{numbers[0]}-lock"):
            self.addCleanup(lambda p=path: os.path.lexists(p) and os.unlink(p))
        self.assertEqual(os.lstat(f"/tmp/.X{numbers[-1]}-lock").st_uid, bob.pw_uid)

    def test_lock_files_naming_pid_1_stop_no_session(self):
        self.plant()
        client = self.login()
        info = self.start(client)  # today's main: "Display limit exceeded"
        self.assertEqual(info.display, PLANTED_BASE)  # bob's lock there held nothing: taken over
        self.attach(client, info)
        self.screen.wait_for_colour(RED, 20000)
        self.assertIn(f"display :{PLANTED_BASE}: no X server held it (a lock naming pid 1", self.gateway.log())
        # The admin sees bob's other plants, each to be taken over at the next start there.
        status = admin_cli("status", socket=os.path.join(self.gateway.state_dir, "admin.sock")).stdout
        held = {int(line.split()[0][1:]): line for line in status.splitlines() if line.startswith("  :")}
        self.assertIn(f"held by {self.other.name}", held[PLANTED_BASE + 1])
        self.assertIn("no X server: the next start there takes it over", held[PLANTED_BASE + 1])
        self.assertNotIn(PLANTED_BASE, held)


#: bob's squatter: for ARGV[2] seconds, binds display ARGV[1]'s abstract X
#: name and plants its lock and socket file whenever he can (as fast as he
#: can); says what he won and how many tries it took.
SQUATTER = """
import os, socket, sys, time
n, until = sys.argv[1], time.monotonic() + float(sys.argv[2])
won, tries, held = set(), 0, []
while time.monotonic() < until:
    tries += 1
    if "abstract" not in won:
        s = socket.socket(socket.AF_UNIX)
        try:
            s.bind("\\0/tmp/.X11-unix/X" + n)
            s.listen(5)
            held.append(s)
            won.add("abstract")
        except OSError:
            s.close()
    for what, path in (("lock", "/tmp/.X" + n + "-lock"), ("socket file", "/tmp/.X11-unix/X" + n)):
        if what not in won:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                os.write(fd, b"%10d\\n" % os.getpid())
                os.close(fd)
                won.add(what)
            except OSError:
                pass
print("won:", ",".join(sorted(won)) or "nothing", "tries:", tries, flush=True)
"""


class ForLaterSquat:
    """A session started for later over D-Bus, whose display bob tries to
    win while nxagent is restarted after its 60-second wait (mixed into a
    SessionTestCase with ``jail`` and ``display_base``)."""

    timeout = 420

    def make_fixture(self):
        return fixture_with_bus(self, lambda address: {
            "dbus": {"address": address}, "jail": {"enabled": self.jail},
            "sessions": {"display_base": self.display_base, "display_limit": "10"}})

    def gdbus(self, method, *args):
        return dbus_as_user(self.user, ["gdbus", "call", "--system", "--dest", NAME, "--object-path", PATH,
                                        "--method", f"{NAME}.{method}", *args], env=user_env(self.user, self.bus))

    def agent_pid(self, session_id: str) -> int | None:
        shown = self.gdbus("GetSession", session_id)
        found = re.findall(r"'agent_pid': <(\d+)>", shown.stdout)
        return int(found[0]) if shown.returncode == 0 and found else None

    def test_the_display_stays_the_sessions_across_the_agents_restart(self):
        started = self.gdbus("StartSession", "unix-console", "Later")
        self.assertEqual(started.returncode, 0, started.stderr)
        (session_id,) = re.findall(r"'id': <'([0-9A-F]{32})'>", started.stdout)
        (display,) = [int(n) for n in re.findall(r"'display': <(\d+)>", started.stdout)]
        first_agent = self.agent_pid(session_id)
        bob = pwd.getpwnam(self.other.name)
        squatter = subprocess.Popen(["setpriv", f"--reuid={bob.pw_uid}", f"--regid={bob.pw_gid}", "--clear-groups",
                                     sys.executable, "-c", SQUATTER, str(display), "90"], stdout=subprocess.PIPE,
                                    text=True, cwd="/")
        self.addCleanup(lambda: (squatter.kill(), squatter.wait()))
        for path in (f"/tmp/.X{display}-lock", f"/tmp/.X11-unix/X{display}"):
            self.addCleanup(lambda p=path: os.path.lexists(p) and os.lstat(p).st_uid == bob.pw_uid and os.unlink(p))
        # nxagent gives up on its first client after 60 s; the fresh one must come up on the same display.
        ended = f"session {session_id} of {self.user.name} ended"
        wait_for(lambda: "starting a fresh agent that waits on" in self.gateway.log() or ended in self.gateway.log(),
                 150, "the agent's restart", interval=1)
        self.assertNotIn(ended, self.gateway.log())
        wait_for(lambda: self.agent_pid(session_id) not in (None, first_agent), 60, "the fresh agent", interval=1)
        said = squatter.stdout.readline().strip()
        # What he may still win (the lock and socket file in the host's /tmp while no agent runs) is
        # taken over before the fresh agent starts, or lies outside a jail's own /tmp; the name never.
        self.assertNotIn("abstract", said.split()[1], f"bob won the display's abstract X name ({said})")
        self.assertEqual(self.listing().get(session_id), "Suspended", self.gateway.log()[-3000:])
        self.assertNotIn(f"session {session_id} of {self.user.name} ended", self.gateway.log())
        client = self.login()
        resumed = self.restore(client, session_id)
        self.assertEqual(resumed.display, display)
        self.attach(client, resumed)
        self.screen.wait_for_colour(RED, 20000)  # its xterm draws on the display it kept


class ForLaterSquatTests(ForLaterSquat, SessionTestCase):
    jail = "no"
    display_base = "3820"


class JailedForLaterSquatTests(ForLaterSquat, SessionTestCase):
    jail = "yes"
    display_base = "3840"
