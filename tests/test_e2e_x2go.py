"""End to end: X2Go's own client, pyhoca-cli (python3-x2go, Debian), against nxgate (issue 24).

A real user, the real gateway (``twistd nxgate``), and Debian's pyhoca-cli
with its nxproxy drawing into a client Xvfb with a window manager.  The
picture on the client is compared with nxagent's own framebuffer (``xwd``
with the session's X authority), >= 99 % of the pixels equal, after a start
and after a resume; listing, suspend, terminate and the session limit are
checked as the client reports them.  The refusals (commands outside X2Go's
contract, another user's session names, fuzzed exec strings) go over
OpenSSH's client to the same SSH port and must run nothing.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
import sys
import tempfile

from twisted.trial.unittest import SkipTest, TestCase

from tests.harness import browser as browsers
from tests.harness import pixels
from tests.harness.gateway import REPO, Gateway
from tests.harness.pixels import Rect
from tests.harness.process import stop, wait_for
from tests.harness.shared import class_fixture
from tests.harness.ssh import askpass_env
from tests.harness.users import NEED_ROOT, create_user, is_root
from tests.harness.x2goclient import X2GoClientMachine
from tests.harness.web import web_base, web_options
from tests.harness.x11 import ClientScreen, Screenshot

PASSWORD = "X2go-e2e-Pw-7731"
_NAME_LINE = re.compile(r"Session Name: (\S+)")
_STARTED = re.compile(r"X2Go session (\S+) \(session ([0-9A-F]{32}),")


def display_of(name: str) -> int:
    """The display of an X2Go session name (``user-DISPLAY-time_st…``: the command word may hold '-' too)."""
    return int(re.search(r"-(\d+)-\d+_st", name).group(1))


def _fixture(options: dict | None = None):
    if not is_root():
        raise SkipTest(NEED_ROOT)
    if shutil.which("pyhoca-cli") is None:
        raise SkipTest("pyhoca-cli is not installed (apt-get install pyhoca-cli python3-x2go)")
    user = create_user(password=PASSWORD)
    other = create_user(password=PASSWORD)
    gateway = Gateway({"sessions": {"max_sessions_per_user": "2"}, **(options or {})}).start()
    screen = ClientScreen(1280, 1024, window_manager=True)

    def teardown() -> None:
        screen.close()
        gateway.stop()
        user.remove()
        other.remove()

    return (user, other, gateway, screen), teardown


class X2GoCase(TestCase):
    timeout = 600
    #: More options of a gateway of the class's own (None: the gateway the X2Go classes share).
    gateway_options: dict | None = None

    def setUp(self) -> None:
        owner, options = (X2GoCase, None) if self.gateway_options is None else (type(self), self.gateway_options)
        self.user, self.other, self.gateway, self.screen = class_fixture(owner, lambda: _fixture(options))
        self.home = tempfile.mkdtemp(prefix="x2go-client-")
        self.addCleanup(shutil.rmtree, self.home, True)
        self.clients: list[subprocess.Popen] = []
        self.addCleanup(self._stop_clients)
        self.addCleanup(self._terminate_all)

    # ------------------------------------------------------------ client
    def argv(self, *args: str, user=None) -> list[str]:
        user = user or self.user
        return ["pyhoca-cli", "--server", "127.0.0.1", "-p", str(self.gateway.port), "-l", user.name,
                "--password", PASSWORD, "--add-to-known-hosts", *args]

    def env(self) -> dict[str, str]:
        return dict(os.environ, DISPLAY=self.screen.name, HOME=self.home)

    def cli(self, *args: str, user=None, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(*args, user=user), env=self.env(), stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=timeout)

    def session_client(self, *args: str) -> tuple[subprocess.Popen, str]:
        """pyhoca-cli that starts or resumes a session and stays attached; its log file."""
        log = tempfile.mktemp(prefix="pyhoca-", suffix=".log", dir=self.home)
        with open(log, "wb") as handle:
            process = subprocess.Popen(self.argv(*args), env=self.env(), stdin=subprocess.DEVNULL, stdout=handle,
                                       stderr=subprocess.STDOUT)
        self.clients.append(process)
        return process, log

    def ssh(self, command: str, user=None) -> subprocess.CompletedProcess:
        """A command at the X2Go door as OpenSSH's client sends it (a password login)."""
        user = user or self.user
        argv = ["ssh", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
                "-o", "PubkeyAuthentication=no", "-o", "PreferredAuthentications=password,keyboard-interactive",
                "-o", "NumberOfPasswordPrompts=1", "-p", str(self.gateway.port), "-l", user.name, "127.0.0.1",
                command]
        env = dict(os.environ, **askpass_env(PASSWORD))
        return subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
                              start_new_session=True)

    def _stop_clients(self) -> None:
        for process in self.clients:
            stop(process)

    def _terminate_all(self) -> None:
        for name in self.listed():
            self.cli("-T", name)

    @staticmethod
    def read(log: str) -> str:
        with open(log, errors="replace") as handle:
            return handle.read()

    def refusals(self, since: int = 0) -> list[dict]:
        """The door's refused commands in the audit log, from its record ``since`` on.  The audit
        log has every one: the main log holds an address's repeated warnings back for a minute
        (and then tells of them in one line), and this gateway is shared by every test here."""
        return [record for record in self.gateway.audit()[since:] if record["event"] == "x2go_refused"]

    def listed(self, user=None) -> dict[str, str]:
        """Session name -> status, as pyhoca-cli --list-sessions prints them."""
        result = self.cli("--list-sessions", user=user)
        sessions: dict[str, str] = {}
        name = None
        for line in result.stdout.splitlines():
            match = _NAME_LINE.search(line)
            if match:
                name = match.group(1)
            elif name and line.strip().startswith("status:"):
                sessions[name] = line.split(":", 1)[1].strip()
        return sessions

    def started_name(self, process: subprocess.Popen, log: str) -> str:
        def name() -> str | None:
            if process.poll() is not None:
                raise AssertionError(f"pyhoca-cli exited {process.returncode}: {self.read(log)[-3000:]}")
            match = re.search(r"Using session (\S+) as master session", self.read(log))
            return match.group(1) if match else None

        try:
            return wait_for(name, 90, "pyhoca-cli to report its session")
        except AssertionError:
            raise AssertionError(f"no session reported: {self.read(log)[-3000:]}\n{self.gateway.log()[-3000:]}") from None

    def session_id(self, name: str) -> str:
        for found, session_id in _STARTED.findall(self.gateway.log()):
            if found == name:
                return session_id
        raise AssertionError(f"no start of {name} in the gateway's log")

    # ----------------------------------------------------------- picture
    def authority(self, session_id: str) -> str:
        return os.path.join(self.gateway.state_dir, "sessions", session_id, "authority")

    def agent_shot(self, display: int, session_id: str) -> Screenshot:
        return pixels.grab(f":{display}", self.authority(session_id))

    def desktop_equal(self, name: str) -> float:
        """The share of the agent's screen equal in its window on the client (best within the wait)."""
        display, session_id = display_of(name), self.session_id(name)
        best: list = [0.0, None, None]

        def equal() -> bool:
            drawn = self.agent_shot(display, session_id)
            windows = [rect for _, _, rect in pixels.windows(self.screen.name)
                       if (rect.width, rect.height) == (drawn.width, drawn.height)]
            if not windows:
                return False
            shown = pixels.crop(self.screen.shot(), windows[-1])
            share = pixels.equal_share(drawn, shown) if drawn.colours() > 1 else 0.0
            if share >= best[0]:
                best[:] = [share, drawn, shown]
            return share >= 0.99

        try:
            wait_for(equal, 90, "the session's desktop on the client", interval=1)
        except AssertionError:
            pass
        self.keep_pictures(name, best)
        return best[0]

    def window_equal(self, name: str, title: str) -> float:
        """A rootless session: its window ``title`` on the client against the agent's."""
        display, session_id = display_of(name), self.session_id(name)
        best: list = [0.0, None, None]

        def equal() -> bool:
            inside = pixels.find_window(f":{display}", title, self.authority(session_id), min_size=50)
            outside = pixels.find_window(self.screen.name, title, min_size=50)
            if inside is None or outside is None:
                return False
            drawn = pixels.crop(self.agent_shot(display, session_id), inside)
            shown = pixels.crop(self.screen.shot(), Rect(outside.x, outside.y, drawn.width, drawn.height))
            share = pixels.equal_share(drawn, shown) if drawn.colours() > 1 else 0.0
            if share >= best[0]:
                best[:] = [share, drawn, shown]
            return share >= 0.99

        try:
            wait_for(equal, 90, f"the {title} window on the client", interval=1)
        except AssertionError:
            pass
        self.keep_pictures(name, best)
        return best[0]

    def keep_pictures(self, name: str, best: list) -> None:
        share, drawn, shown = best
        if share < 0.99 or os.environ.get("NXGATE_KEEP_TEST_DIRS"):
            stem = os.path.join(self.gateway.workdir, f"{self.id().rsplit('.', 1)[-1]}")
            saved = [pixels.save_png(shot, f"{stem}-{side}.png") for side, shot in (("agent", drawn), ("client", shown))
                     if shot is not None and shot.width]
            saved.append(pixels.save_png(self.screen.shot(), f"{stem}-whole-client.png"))
            print(f"\n    {name}: {share:.2%} equal; pictures: {' '.join(saved)}")

    def x2goclient(self, settings: str, lang: str = "C") -> tuple[subprocess.Popen, str, int]:
        """x2goclient --debug on a session profile "gw" with ``settings`` (profile lines), run as a client user
        of its own (tests.harness.x2goclient: the session's user accepts its key, as x2goclient takes no
        password on its command line); its process, its log, and where the gateway's log stood before."""
        machine = X2GoClientMachine(self, self.screen, self.gateway.port, self.user, settings)
        before = len(self.gateway.log())  # the gateway is shared with other tests of the module
        process = machine.start(lang=lang)
        self.clients.append(process)
        return process, machine.log, before

    def agent_running(self, name: str) -> bool:
        return os.path.exists(os.path.join(self.gateway.state_dir, "sessions", self.session_id(name)))


class PyhocaSessionTests(X2GoCase):
    def test_console_start_list_suspend_resume_terminate(self):
        client, log = self.session_client("-c", "TERMINAL", "-g", "800x600", "-q", "lan")
        name = self.started_name(client, log)
        self.assertRegex(name, rf"^{self.user.name}-\d+-\d+_stRTERMINAL_dp24$")
        self.assertGreaterEqual(self.window_equal(name, f"{self.user.name}@"), 0.99)
        self.assertEqual(self.listed().get(name), "R", self.cli("--list-sessions").stdout)

        suspended = self.cli("-S", name)
        self.assertEqual(suspended.returncode, 0, suspended.stdout + suspended.stderr)
        wait_for(lambda: self.listed().get(name) == "S", 30, "the session listed as suspended")
        stop(client)

        resumed, log = self.session_client("-R", name, "-g", "800x600", "-q", "lan")
        self.assertEqual(self.started_name(resumed, log), name)
        self.assertGreaterEqual(self.window_equal(name, f"{self.user.name}@"), 0.99)
        self.assertEqual(self.listed().get(name), "R")

        terminated = self.cli("-T", name)
        self.assertEqual(terminated.returncode, 0, terminated.stdout + terminated.stderr)
        wait_for(lambda: name not in self.listed(), 30, "the session to leave the listing")
        session_id = self.session_id(name)
        wait_for(lambda: f"session {session_id} of {self.user.name} ended" in self.gateway.log(), 30,
                 "the session's end in the log")

    def test_xfce_desktop_picture(self):
        client, log = self.session_client("-c", "XFCE", "-t", "desktop", "-g", "1024x768", "-q", "lan")
        name = self.started_name(client, log)
        self.assertRegex(name, r"_stDXFCE_dp24$")
        self.assertGreaterEqual(self.desktop_equal(name), 0.99)
        self.assertEqual(self.listed().get(name), "R")

    def test_the_session_limit_is_refused_with_the_clients_message(self):
        first, log1 = self.session_client("-c", "TERMINAL", "-g", "640x480", "-q", "lan")
        self.started_name(first, log1)
        second, log2 = self.session_client("-c", "TERMINAL", "-g", "640x480", "-q", "lan")
        self.started_name(second, log2)
        third = self.cli("-c", "TERMINAL", "-g", "640x480", "-q", "lan")
        output = third.stdout + third.stderr
        # pyhoca-cli's own words (it exits 0 all the same); x2gostartagent's LIMIT went to its stderr.
        self.assertIn("session startup for session profile ,,Pyhoca-Client_Session failed", output)
        self.assertEqual(len(self.listed()), 2)
        self.assertRegex(self.gateway.log(), r"X2Go x2gostartagent of \S+ from \S+ refused: Server capacity: reached")


class DesktopSharingTests(X2GoCase):
    """X2Go's desktop sharing (pyhoca-cli -D user@:display) on nxgate's shadowing."""

    def test_sharing_ones_own_desktop_view_only_and_another_user_is_denied(self):
        client, log = self.session_client("-c", "TERMINAL", "-t", "desktop", "-g", "800x600", "-q", "lan")
        name = self.started_name(client, log)
        display, session_id = display_of(name), self.session_id(name)
        listed = self.cli("--list-desktops")
        self.assertIn(f"{self.user.name}@:{display}", listed.stdout)
        self.assertNotIn(f"{self.user.name}@:{display}", self.cli("--list-desktops", user=self.other).stdout)

        viewer, log = self.session_client("-D", f"{self.user.name}@:{display}", "--share-mode", "0")
        shared = self.started_name(viewer, log)
        self.assertIn("_stS", shared)
        self.assertIn(f"watches {session_id} of {self.user.name} (view-only)", self.gateway.log())
        shadow_display = display_of(shared)
        best = [0.0]

        def equal() -> bool:
            window = pixels.find_window(self.screen.name, f"NX - nxgate.test:{shadow_display}", min_size=50)
            if window is None:
                return False
            drawn = self.agent_shot(display, session_id)
            shown = pixels.crop(self.screen.shot(), Rect(window.x, window.y, drawn.width, drawn.height))
            best[0] = max(best[0], pixels.equal_share(drawn, shown) if drawn.colours() > 1 else 0.0)
            return best[0] >= 0.99

        try:
            wait_for(equal, 90, "the shared desktop in the viewer's window", interval=1)
        except AssertionError:
            pass
        self.assertGreaterEqual(best[0], 0.99)

        denied = self.cli("-D", f"{self.user.name}@:{display}", "--share-mode", "1", user=self.other)
        self.assertNotIn("Using session", denied.stdout + denied.stderr)
        # python-x2go checks --list-desktops first, which does not offer it; the server would refuse it too
        # (CommandTests.test_sharing_a_desktop_one_may_not_share_is_access_denied).
        self.assertNotIn(f"shadow attach: {self.other.name} ", self.gateway.log())


class RefusalTests(X2GoCase):
    """Commands outside the contract and other users' sessions, over OpenSSH's client."""

    def user_processes(self) -> set[int]:
        out = subprocess.run(["ps", "-u", self.user.name, "-o", "pid="], capture_output=True, text=True).stdout
        return {int(pid) for pid in out.split()}

    def test_commands_outside_the_contract_are_refused_and_run_nothing(self):
        marker = os.path.join(self.user.home, "must-stay")
        with open(marker, "w") as handle:
            handle.write("x")
        before = self.user_processes()
        for command in ("id; cat /etc/shadow", "x2golistsessions; rm -rf ~", "x2golistsessions | sh",
                        "echo $(id)", "bash -l -c 'id'", "x2golistsessions && touch ~/pwned"):
            result = self.ssh(command)
            self.assertEqual(result.returncode, 127, (command, result.stdout, result.stderr))
            self.assertIn("command refused", result.stderr)
            self.assertNotIn("root:", result.stdout)
        self.assertTrue(os.path.exists(marker))
        self.assertFalse(os.path.exists(os.path.join(self.user.home, "pwned")))
        self.assertEqual(self.user_processes() - before, set())
        # The audit log has every refusal (the main log may hold repeated warnings back after the fuzz test).
        commands = {record["command"]: record["reason"] for record in self.refusals()}
        self.assertIn("b'id; cat /etc/shadow'", commands)
        self.assertIn("the command 'id'", commands["b'id; cat /etc/shadow'"])
        self.assertTrue(any("the command 'rm'" in reason for reason in commands.values()), commands)

    def test_a_sample_of_fuzzed_exec_strings_starts_nothing(self):
        before = self.user_processes()
        pieces = ["x2golistsessions", "x2gostartagent", "echo", ";", "&&", "&", "|", "$(", "`", "'", '"', "\\",
                  "{", "}", ">", "<", "~root", "$HOME", "X2GODATABEGIN:1", "bash -l -c", "sh -c", "exit", "\t",
                  "x2goterminate-session", "../../etc/passwd", "*", "rm", "id"]
        rng = random.Random(24)
        for _ in range(25):
            command = " ".join(rng.choice(pieces) for _ in range(rng.randint(1, 8)))
            result = self.ssh(command)
            self.assertNotIn("Traceback", result.stderr)
        self.assertEqual(self.user_processes() - before, set())
        self.assertNotIn("Traceback", self.gateway.log())
        self.assertEqual(self.listed(), {})

    def test_another_users_session_is_not_found_in_any_command(self):
        client, log = self.session_client("-c", "TERMINAL", "-g", "640x480", "-q", "lan")
        name = self.started_name(client, log)
        wrapper = 'echo X2GODATABEGIN:abcdef12-0000-0000-0000-000000000000; PATH=/usr/local/bin:/usr/bin:/bin sh -c "{}"; echo X2GODATAEND:abcdef12-0000-0000-0000-000000000000'
        for command in (f"x2gosuspend-session {name}", f"x2goterminate-session {name}",
                        f"x2goresume-session {name} 800x600 lan 16m-jpeg-9 us pc105/us 1 both false",
                        f"x2gocmdexitmessage {name}", f"x2goumount-session {name}",
                        f"setsid x2goruncommand 1000 1 {name} 1 xterm none R 1>/dev/null 2>/dev/null & exit"):
            result = self.ssh(wrapper.format(command), user=self.other)
            self.assertIn("no such session", result.stderr, (command, result.stdout, result.stderr))
        listing = self.ssh(wrapper.format("x2golistsessions"), user=self.other)
        self.assertNotIn(name, listing.stdout)
        self.assertEqual(self.listed().get(name), "R")
        self.assertIn(f"no session '{name}' of theirs", self.gateway.log())


class MixedClientTests(X2GoCase):
    """One session, several kinds of client: pyhoca-cli, nxgate-client (NX), pyhoca-cli again."""

    def nxgate_client(self, *args: str, background: bool = False):
        argv = [sys.executable, "-m", "nxgate.clients.nx", "--accept-any-host-key", *args,
                f"{self.user.name}@127.0.0.1:{self.gateway.port}"]
        env = dict(os.environ, PYTHONPATH=REPO, NXGATE_PASSWORD=PASSWORD, DISPLAY=self.screen.name, HOME=self.home,
                   TMPDIR=self.home)
        if background:
            process = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)
            self.clients.append(process)
            return process
        return subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)

    def nx_listing(self) -> dict[str, str]:
        """Session id -> status, as an NX client lists them."""
        result = self.nxgate_client("--list")
        self.assertEqual(result.returncode, 0, result.stderr)
        return {line.split()[0]: line.split()[3] for line in result.stdout.splitlines() if line.strip()}

    def test_pyhoca_then_nxgate_client_then_pyhoca_again(self):
        title = f"{self.user.name}@"
        first, log = self.session_client("-c", "TERMINAL", "-g", "800x600", "-q", "lan")
        name = self.started_name(first, log)
        session_id = self.session_id(name)
        self.assertGreaterEqual(self.window_equal(name, title), 0.99)
        stop(first)  # the X2Go client goes away: the session is suspended, as with X2Go's server
        wait_for(lambda: self.listed().get(name) == "S", 30, "the session suspended after pyhoca-cli left")

        self.assertEqual(self.nx_listing().get(session_id), "Suspended")
        nx = self.nxgate_client("--resume", session_id, "--geometry", "800x600", background=True)
        wait_for(lambda: self.nx_listing().get(session_id) == "Running", 60, "nxgate-client to resume it")
        self.assertGreaterEqual(self.window_equal(name, title), 0.99)
        self.assertEqual(self.listed().get(name), "R")  # X2Go's listing sees the NX client's resume
        stop(nx)
        wait_for(lambda: self.listed().get(name) == "S", 30, "the session suspended after nxgate-client left")

        again, log = self.session_client("-R", name, "-g", "800x600", "-q", "lan")
        self.assertEqual(self.started_name(again, log), name)
        self.assertGreaterEqual(self.window_equal(name, title), 0.99)
        self.assertEqual(self.nx_listing().get(session_id), "Running")


def _portal_fixture():
    if not is_root():
        raise SkipTest(NEED_ROOT)
    why = browsers.available()
    if why is not None or shutil.which("pyhoca-cli") is None:
        raise SkipTest(why or "pyhoca-cli is not installed")
    user = create_user(password=PASSWORD)
    gateway = Gateway(web_options()).start()
    screen = ClientScreen(1280, 1024, window_manager=True)

    def teardown() -> None:
        screen.close()
        gateway.stop()
        user.remove()

    return (user, user, gateway, screen), teardown


class PortalThenPyhocaTests(X2GoCase):
    """A session started in the browser portal (started for a later client, never attached) resumed by pyhoca-cli."""

    def setUp(self) -> None:
        self.user, self.other, self.gateway, self.screen = class_fixture(PortalThenPyhocaTests, _portal_fixture)
        self.home = tempfile.mkdtemp(prefix="x2go-client-")
        self.addCleanup(shutil.rmtree, self.home, True)
        self.clients = []
        self.addCleanup(self._stop_clients)
        self.addCleanup(self._terminate_all)

    def test_a_portal_session_resumes_in_pyhoca_cli(self):
        browser = browsers.Browser()
        self.addCleanup(browser.quit)
        base = web_base(self.gateway)
        browser.login(base, self.user.name, PASSWORD)
        browser.wait(lambda: browser.find_all("nav .who"), what="the portal")
        browser.find("form.start input[name=name]").send_keys("from-the-portal")
        browser.find("form.start select[name=type] option[value=unix-console]").click()
        browser.find("form.start button[type=submit]").click()
        browser.wait(lambda: "new session was started" in browser.text(), 60, "the session to start")

        listed = wait_for(lambda: self.listed() or None, 30, "the portal's session in X2Go's listing")
        (name, status), = listed.items()
        self.assertEqual(status, "S")
        # The name given in the portal is what X2Go's listing can show: x2goclient's "Command" column.
        self.assertRegex(name, rf"^{self.user.name}-\d+-\d+_stDfrom-the-portal_dp24$")
        display = display_of(name)
        session_id = re.search(rf"starting session ([0-9A-F]{{32}}) \(unix-console, display :{display}\)",
                               self.gateway.log()).group(1)
        client, log = self.session_client("-R", name, "-g", "800x600", "-q", "lan")
        self.assertEqual(self.started_name(client, log), name)
        self.assertIn(f"session {session_id} of {self.user.name}, started for later: a fresh agent with the first"
                      " client's cookie", self.gateway.log())
        self.assertGreaterEqual(self.portal_desktop_equal(display, session_id, name), 0.99)
        self.assertEqual(self.listed().get(name), "R")

    def portal_desktop_equal(self, display: int, session_id: str, name: str) -> float:
        best: list = [0.0, None, None]

        def equal() -> bool:
            drawn = self.agent_shot(display, session_id)
            window = pixels.find_window(self.screen.name, "NX - ", min_size=50)
            if window is None:
                return False
            shown = pixels.crop(self.screen.shot(), Rect(window.x, window.y, drawn.width, drawn.height))
            share = pixels.equal_share(drawn, shown) if drawn.colours() > 1 else 0.0
            if share >= best[0]:
                best[:] = [share, drawn, shown]
            return share >= 0.99

        try:
            wait_for(equal, 90, "the portal's session on the X2Go client", interval=1)
        except AssertionError:
            pass
        self.keep_pictures(name, best)
        return best[0]


class X2GoClientTests(X2GoCase):
    """Debian's x2goclient (Qt, libssh) under the client Xvfb, driven by a session profile and a key.

    x2goclient takes no password on its command line: the user logs in with
    a key from his ~/.ssh/authorized_keys (the profile's ``key=``), so no
    dialog needs typing.  Sound, printing and folder sharing are on, as in
    a new profile: x2goclient then asks for reverse forwards and copies its
    sshfs key with SCP, and shows a "Connection failed" dialog if either is
    refused."""

    def setUp(self) -> None:
        super().setUp()
        if shutil.which("x2goclient") is None:
            raise SkipTest("x2goclient is not installed (apt-get install x2goclient)")

    def test_x2goclient_logs_in_with_a_key_and_shows_the_desktop(self):
        audited = len(self.gateway.audit())
        process, log, before = self.x2goclient("command=XFCE\nrootless=false\nwidth=1024\nheight=768\n")

        def started() -> str | None:
            if process.poll() is not None:
                raise AssertionError(f"x2goclient exited {process.returncode}: {self.read(log)[-3000:]}")
            found = _STARTED.findall(self.gateway.log()[before:])
            return found[-1][0] if found else None

        session = wait_for(started, 90, "x2goclient to start a session")
        self.assertRegex(session, r"_stDXFCE_dp24$")
        wait_for(lambda: "X2Go runcommand 'xfce4-session'" in self.gateway.log()[before:], 60,
                 "x2goclient's x2goruncommand once its link was up")
        self.assertGreaterEqual(self.desktop_equal(session), 0.99)
        self.assertEqual(self.listed().get(session), "R")
        log_text = self.gateway.log()[before:]
        self.assertIn("asked for a reverse forward", log_text)
        self.assertRegex(log_text, r"pushed the key bundle key\.\S+ for its shared folders")
        self.assertEqual(self.refusals(audited), [])
        self.assertEqual([name for _, name, _ in pixels.windows(self.screen.name) if name == "Error"], [])
