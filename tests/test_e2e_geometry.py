"""End to end: the size of a session as the user sees it.

Real nxagent, real nxproxy drawing into an Xvfb client screen that runs a
window manager (as every client desktop does), and for each client variant
the size parameters it sends.  Measured three ways: nxagent's top-level
window on the client screen (xwininfo), nxagent's own screen (xdpyinfo with
the session's X authority), and the Screen column of ``listsession``.
"""

from __future__ import annotations

import re

from tests.harness.process import wait_for
from tests.harness.ssh import SessionInfo
from tests.harness.x11 import ClientScreen, session_screen_size
from tests.test_e2e_sessions import RED, SessionTestCase, agent_processes

COMMON = ('--session="size" --type="unix-console" --link="lan" --encryption="1" --cache="16M" --images="64M" '
          '--keyboard="pc105/us" --client="linux" --media="0" --backingstore="1"')

# What each client sends for the size (reference §2.5 and the clients' source).
NOMACHINE_WINDOW = '--geometry="1024x768+0+0" --screeninfo="1280x800x24+render"'
NOMACHINE_FULL = '--geometry="fullscreen" --screeninfo="1280x800x24+render"'
OPENNX_FULL = '--geometry="1280x800" --fullscreen="1" --screeninfo="1280x800x24+render+fullscreen"'
OPENNX_AVAILABLE = '--geometry="available" --screeninfo="1280x800x24+render"'
NXCL_FULL = '--geometry="fullscreen" --screeninfo="1280x800x24+render"'
REMMINA_DEFAULT = '--geometry="1000x700" --screeninfo="0x0x24+render"'
NXGATE_CLIENT = '--geometry="1152x720" --screeninfo="1152x720x24+render"'
NXGATE_CLIENT_FULL = '--geometry="1280x800" --screeninfo="1280x800x24+render" --fullscreen="1"'


class SizeMeasures(SessionTestCase):
    """Starting sessions with a client's size parameters, and measuring them."""

    screen_size = (1280, 800)
    # Displays of their own: other test modules' gateways and client screens use 500-1200 and chosen ranges
    # (tests.test_e2e_displays squats 1650-1730, tests.test_node_thumbnails holds 1779); make test runs
    # modules side by side.
    options = {"sessions": {"display_base": "2000", "display_limit": "40"}}
    def start_with(self, client, size: str, command: str = "startsession", extra: str = "") -> SessionInfo:
        reply = client.command(f"{command} {COMMON} {size} {extra}", timeout=60)
        self.assertIn(b"NX> 710 Session status: running", reply, reply)
        return SessionInfo.parse(reply)

    def agent_size(self, info: SessionInfo) -> tuple[int, int]:
        (agent,) = agent_processes(self.user.name)
        return session_screen_size(info.display, agent)

    def listed(self, info: SessionInfo) -> tuple[str, str]:
        """(options, screen) of the session in listsession."""
        client = self.login()
        reply = client.command('listsession --status="suspended,running"').decode()
        client.close()
        match = re.search(rf"^\d+\s+\S+\s+{info.session_id}\s+(\S+)\s+\d+\s+(\d+x\d+)\s", reply, re.MULTILINE)
        self.assertIsNotNone(match, reply)
        return match.group(1), match.group(2)

    def settled_size(self, info: SessionInfo, screen: ClientScreen, label: str = "") -> tuple[int, int, str]:
        """(width, height, list options) once the client's window, nxagent's
        screen and the list agree (nxagent may resize more than once while
        the window manager places its window); fails if they never do."""
        seen: list[object] = []

        def same(first, second):
            window, agent = first(), second()
            seen[:] = [window, agent]
            return agent if window is not None and window[:2] == agent else None

        try:
            width, height = wait_for(lambda: same(screen.agent_window, lambda: self.agent_size(info)), 20,
                                     "the client window and the agent screen to agree", interval=0.2)
            options, listed = wait_for(lambda: (lambda row: row if row[1] == f"{width}x{height}" else None)(
                self.listed(info)), 10, "the list to show the agent's size", interval=0.5)
        except AssertionError as error:
            self.fail(f"{error}; client window, agent screen: {seen}; listed: {self.listed(info)}")
        if label:
            print(f"\n    {label} on a {screen.width}x{screen.height} client: {width}x{height} {options}")
        return width, height, options

    def started(self, size: str) -> SessionInfo:
        """A session with these size parameters, drawn on the class's screen
        (``self.attachment`` is its client)."""
        client = self.login()
        info = self.start_with(client, size)
        self.attachment = self.attach(client, info)
        self.screen.wait_for_colour(RED, 20000)
        return info

    def full_screen_requests_get_the_client_screen(self):
        for size in (NOMACHINE_FULL, NXCL_FULL, OPENNX_FULL, NXGATE_CLIENT_FULL):
            with self.subTest(size=size):
                info = self.started(size)
                width, height, options = self.settled_size(info, self.screen, size)
                self.assertEqual((width, height), (1280, 800))
                self.assertTrue(options.startswith("F"), options)
                self.end_all_sessions()


class SessionSizeTests(SizeMeasures):
    window_manager = True

    def test_windowed_session_has_exactly_the_requested_size(self):
        for size, expected in ((NOMACHINE_WINDOW, (1024, 768)), (NXGATE_CLIENT, (1152, 720))):
            with self.subTest(size=size):
                info = self.started(size)
                width, height, options = self.settled_size(info, self.screen, size)
                self.assertEqual((width, height), expected)
                self.assertTrue(options.startswith("-"), options)  # not full screen
                self.end_all_sessions()

    def test_remmina_default_profile(self):
        info = self.started(REMMINA_DEFAULT)
        self.assertEqual(self.settled_size(info, self.screen, REMMINA_DEFAULT)[:2], (1000, 700))

    def test_full_screen_requests_get_the_client_screen(self):
        self.full_screen_requests_get_the_client_screen()

    def test_available_area(self):
        """Older OpenNX: a window as large as the work area; the window
        manager fits it in, the desktop takes the window's size."""
        info = self.started(OPENNX_AVAILABLE)
        width, height, options = self.settled_size(info, self.screen, OPENNX_AVAILABLE)
        self.assertEqual(width, 1280)
        self.assertTrue(600 < height < 800, height)  # less the window manager's title bar
        self.assertTrue(options.startswith("-"), options)

    def test_the_desktop_follows_the_client_window(self):
        info = self.started(NOMACHINE_WINDOW)
        self.assertEqual(self.settled_size(info, self.screen)[:2], (1024, 768))
        _, _, window = self.screen.agent_window()
        self.screen.xdotool("windowsize", window, "900", "700")
        self.assertEqual(self.settled_size(info, self.screen)[:2], (900, 700))

    def resumed_on_a_smaller_screen(self, size: str) -> tuple[int, int, str]:
        info = self.started('--geometry="1200x740" --screeninfo="1280x800x24+render"')
        self.assertEqual(self.settled_size(info, self.screen)[:2], (1200, 740))
        (first,) = agent_processes(self.user.name)
        self.attachment.detach()
        self.wait_status(info.session_id, "Suspended")
        small = ClientScreen(1024, 768, window_manager=True)
        self.addCleanup(small.close)
        client = self.login()
        resumed = self.start_with(client, size, "restoresession", f'--id="{info.session_id}"')
        self.attach(client, resumed, small)
        small.wait_for_colour(RED, 20000)
        self.assertEqual(agent_processes(self.user.name), [first])
        return self.settled_size(resumed, small, "resumed with " + size)

    def test_resume_on_a_smaller_screen_fits_it(self):
        width, height, options = self.resumed_on_a_smaller_screen('--geometry="1024x768" '
                                                                  '--screeninfo="1024x768x24+render"')
        self.assertTrue(width <= 1024 and height <= 768, (width, height))
        self.assertTrue(options.startswith("-"), options)

    def test_resume_full_screen_on_another_screen(self):
        width, height, options = self.resumed_on_a_smaller_screen(NOMACHINE_FULL.replace("1280x800", "1024x768"))
        self.assertEqual((width, height), (1024, 768))
        self.assertTrue(options.startswith("F"), options)


class BareScreenTests(SizeMeasures):
    """A client screen without a window manager: nxagent then always shows
    the session full screen (nx-libs Screen.c forces it), at a size of its
    own choosing for a windowed request; the list must still tell the truth."""

    def test_full_screen_requests_get_the_client_screen(self):
        self.full_screen_requests_get_the_client_screen()

    def test_the_list_shows_the_real_size(self):
        info = self.started(NOMACHINE_WINDOW)
        width, height, options = self.settled_size(info, self.screen, NOMACHINE_WINDOW + " (no window manager)")
        self.assertTrue(options.startswith("F"), options)
        self.assertTrue(width <= 1280 and height <= 800, (width, height))
