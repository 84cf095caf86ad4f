"""End to end: X2Go's published applications (python-x2go's API, as pyhoca-gui uses it; x2goclient's mode).

The gateway publishes one .desktop file (``[sessions] published_applications``)
with a PNG icon.  python-x2go starts a published-applications session (type
P: ``_stRPUBLISHED``, a rootless agent with no program of its own), lists the
applications -- name, comment, categories and the icon, byte for byte --
and starts the one listed with its own ``exec_published_application``: the
application's window inside the session (the agent's framebuffer) and on
the client are the same picture.  A program that is not a listed
application is refused in the same session.  x2goclient in its
published-applications mode starts the same kind of session and lists the
applications.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable

from twisted.trial.unittest import SkipTest

from tests.harness.gateway import REPO, Gateway
from tests.harness.process import stop, wait_for
from tests.harness.shared import class_fixture
from tests.harness.users import NEED_ROOT, create_user, is_root
from tests.harness.x11 import ClientScreen
from tests.test_e2e_x2go import PASSWORD, X2GoCase, display_of
from tests.test_e2e_x2go_commands import program_argv

ICON = "/usr/share/icons/hicolor/48x48/apps/filled-xterm.png"
EXEC = "xterm -xrm 'XTerm*allowTitleOps: false' -title \"Published a b\""
DESKTOP = f"""[Desktop Entry]
Type=Application
Name=Published Terminal
Name[de]=Veröffentlichtes Terminal
Comment=An xterm that nxgate publishes
Icon={ICON}
Exec={EXEC} %U
Categories=System;TerminalEmulator;
"""


#: The published xterm's argv, as the node starts it from EXEC.
PUBLISHED_ARGV = ["xterm", "-xrm", "XTerm*allowTitleOps: false", "-title", "Published a b"]


class PublishedClient:
    """python-x2go's published-applications calls (tests/harness/python_x2go_published.py, Debian's
    python3) against a gateway: its menu, then EXEC started from it; stays attached until stopped."""

    def __init__(self, port: int, user: str, password: str, home: str, display: str) -> None:
        self.out = os.path.join(home, "driver.out")
        with open(self.out, "wb") as handle:
            self.process = subprocess.Popen(
                ["/usr/bin/python3", os.path.join(REPO, "tests", "harness", "python_x2go_published.py"), "127.0.0.1",
                 str(port), user, home, EXEC], env=dict(os.environ, DISPLAY=display, HOME=home, LANG="C.UTF-8"),
                stdin=subprocess.PIPE, stdout=handle, stderr=subprocess.STDOUT)
        self.process.stdin.write(password.encode() + b"\n")
        self.process.stdin.close()

    def said(self) -> str:
        with open(self.out, errors="replace") as handle:
            return handle.read()

    def menu(self, gateway_log: Callable[[], str]) -> list[dict]:
        """The menu's entries, once python-x2go printed them (its output and the gateway's log if it exits)."""
        def printed() -> list | None:
            if self.process.poll() is not None:
                raise AssertionError(f"python-x2go exited: {self.said()[-3000:]}\n{gateway_log()[-2000:]}")
            line = next((line for line in self.said().splitlines() if line.startswith("[")), None)
            return json.loads(line) if line else None

        return wait_for(printed, 120, "python-x2go's menu of published applications")

    def wait_started(self, user: str) -> None:
        """Until python-x2go said it started EXEC and the xterm runs as ``user``."""
        wait_for(lambda: "STARTED" in self.said(), 60, "python-x2go to start the application")
        wait_for(lambda: PUBLISHED_ARGV in program_argv(user, "xterm"), 60, "the published xterm to run")


def _fixture():
    if not is_root():
        raise SkipTest(NEED_ROOT)
    applications = tempfile.mkdtemp(prefix="nxgate-published-")
    os.chmod(applications, 0o755)
    with open(os.path.join(applications, "nxgate-test.desktop"), "w", encoding="utf-8") as handle:
        handle.write(DESKTOP)
    user = create_user(password=PASSWORD)
    gateway = Gateway({"sessions": {"published_applications": applications}}).start()
    screen = ClientScreen(1280, 1024, window_manager=True)

    def teardown() -> None:
        screen.close()
        gateway.stop()
        user.remove()
        shutil.rmtree(applications, True)

    return (user, user, gateway, screen), teardown


class PublishedApplicationsTests(X2GoCase):
    def setUp(self) -> None:
        self.user, self.other, self.gateway, self.screen = class_fixture(PublishedApplicationsTests, _fixture)
        self.home = tempfile.mkdtemp(prefix="x2go-client-")
        self.addCleanup(shutil.rmtree, self.home, True)
        self.clients = []
        self.addCleanup(self._stop_clients)
        self.addCleanup(self._terminate_all)

    def test_python_x2go_lists_the_applications_and_starts_one_rootless(self):
        client = PublishedClient(self.gateway.port, self.user.name, PASSWORD, self.home, self.screen.name)
        self.clients.append(client.process)
        (entry,) = client.menu(self.gateway.log)
        self.assertEqual(entry["desktop"].splitlines(), [
            "Name=Published Terminal", "Name[de]=Veröffentlichtes Terminal", "Comment=An xterm that nxgate publishes",
            f"Exec={EXEC} %U", "Categories=System;TerminalEmulator;"])
        with open(ICON, "rb") as handle:
            self.assertEqual(base64.b64decode(entry["icon"]), handle.read())
        name = re.findall(r"X2Go session (\S+) \(session [0-9A-F]{32}, unix-published\)", self.gateway.log())[-1]
        self.assertRegex(name, rf"^{self.user.name}-\d+-\d+_stRPUBLISHED_dp24$")

        client.wait_started(self.user.name)
        self.assertIn(f"starts the published application {PUBLISHED_ARGV!r}", self.gateway.log())
        self.assertGreaterEqual(self.window_equal(name, "Published a b"), 0.99)

        # The same session, a program nobody published: refused by the session's node, nothing started.
        display = display_of(name)
        refused = self.ssh(f'echo X2GODATABEGIN:abcdef12-0000-0000-0000-000000000000; PATH=/usr/local/bin:/usr/bin:/bin'
                           f' sh -c "export DISPLAY=:{display} && export X2GO_SESSION={name} && setsid xterm -title'
                           f' pwned 1>/dev/null 2>/dev/null & exit"; echo X2GODATAEND:abcdef12-0000-0000-0000-000000000000')
        self.assertIn("xterm is not a published application of this server", refused.stderr)
        self.assertIn("not a published application; refused", self.gateway.log())
        self.assertFalse(any("pwned" in argv for argv in program_argv(self.user.name, "xterm")))
        stop(client.process)

    def test_x2goclient_starts_a_published_applications_session_and_lists_them(self):
        if shutil.which("x2goclient") is None:
            raise SkipTest("x2goclient is not installed (apt-get install x2goclient)")
        _process, _log, before = self.x2goclient("command=PUBLISHED\npublished=true\nrootless=true\nwidth=800\n"
                                                 "height=600\n", lang="C.UTF-8")
        wait_for(lambda: "X2Go x2gogetapps of" in self.gateway.log()[before:], 120, "x2goclient's x2gogetapps")
        self.assertRegex(self.gateway.log()[before:], r"X2Go x2gogetapps of \S+: 1 applications of the machine of "
                                                      r"session [0-9A-F]{32}")
        self.assertRegex(self.gateway.log()[before:], r"_stRPUBLISHED_dp24 \(session [0-9A-F]{32}, unix-published\)")
        self.assertNotIn("refused X2Go command", self.gateway.log()[before:])
        (name,) = [n for n, status in self.listed().items() if "_stRPUBLISHED_" in n and status == "R"]
        self.assertTrue(name)

