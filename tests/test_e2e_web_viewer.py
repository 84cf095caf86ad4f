"""End to end: an NX session opened in a real browser (issue 15, "Open in the browser").

The real gateway with ``[web]``, real Unix users and PAM, a session started
by ``nxgate-client`` on an Xvfb standing in for the user's screen, and
Debian's Chromium (headless, :mod:`tests.harness.browser`) logged in to the
portal.  "Open" in the page suspends an NX client that shows the session
and shows the session's own screen (an x11vnc on the agent's display, no
resume); the page's canvas is checked against the session's own
framebuffer; keys typed in the page reach a program in the session (it
writes them to a file as the user); the session stays suspended while the
tab shows it, so ``nxgate-client`` resumes it with the typed text on screen,
after the tab closed or while it is open (the tab then ends).  Another
user gets nothing by any URL or WebSocket.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import time
from typing import Any
from urllib.parse import urlsplit

from twisted.trial.unittest import SkipTest

from tests.harness import pixels
from tests.harness.browser import Browser, available
from tests.harness.process import wait_for
from tests.harness.users import create_user
from tests.harness.web import web_base, web_options
from tests.harness.shared import class_fixture
from tests.harness.x11 import Screenshot
from tests import test_e2e_client as client_tests

RED = (255, 0, 0)
YELLOW = (255, 255, 0)
#: More yellow pixels than the xterm's cursor alone has (78 when focused): a typed line is on screen.
TEXT_YELLOW = 120
TK_GREY = (217, 217, 217)  # the owner's consent dialog's background
NOTICE_AMBER, NOTICE_RED = (255, 204, 0), (176, 0, 0)  # the shadow notice's background and its End button
#: The admin group of the portal and of the shadow policy (made by the shadow tests).
ADMINS = "nxtwv" + secrets.token_hex(3)
TYPED = "typed.txt"
#: The xterm's program writes what it reads (what the browser typed) to a file of the user's.
TYPES = {"unix-console": f"xterm -bg #ff0000 -fg #ffff00 -geometry 60x15+10+10 -e sh -c 'cat > $HOME/{TYPED}'"}

CANVAS_RGBA = """
const canvas = document.querySelector('#viewer-screen canvas');
if (!canvas || !canvas.width) return null;
const data = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
let text = '';
for (let i = 0; i < data.length; i += 32768) {
  text += String.fromCharCode.apply(null, data.subarray(i, Math.min(i + 32768, data.length)));
}
return [canvas.width, canvas.height, btoa(text)];
"""

FETCH_TICKET = """
const [handle, done] = [arguments[0], arguments[arguments.length - 1]];
const csrf = document.querySelector('input[name="csrf"]').value;
fetch('/view/ticket', {method: 'POST', headers: {'X-CSRF-Token': csrf},
                       body: new URLSearchParams({handle: handle, width: '800', height: '600'})})
  .then(async (answer) => done([answer.status, await answer.text()]), (error) => done([0, String(error)]));
"""


VIEWER_PROGRAMS = ("x11vnc", "Xvfb", "nxproxy")
#: What a tab showing a session that a client drew before costs: x11vnc on the session's display, nothing else.
LIVE_VIEWER_PROGRAMS = ("x11vnc",)


def programs_of(uid: int) -> dict[int, str]:
    """The viewer programs (x11vnc, Xvfb, nxproxy) running as ``uid``: pid -> name."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", encoding="utf-8") as handle:
                fields = dict(line.split(":", 1) for line in handle if ":" in line)
        except OSError:
            continue
        name = fields.get("Name", "").strip()
        if name in VIEWER_PROGRAMS and int(fields.get("Uid", "-1").split()[0]) == uid:
            found[int(entry)] = name
    return found


def tcp_listeners(pids: dict[int, str]) -> list[str]:
    """``ss``'s lines of the TCP sockets (IPv4 and IPv6) these processes listen on."""
    lines = subprocess.run(["ss", "-H", "-l", "-t", "-n", "-p"], capture_output=True, text=True,
                           check=True).stdout.splitlines()
    return [line for line in lines if any(int(pid) in pids for pid in re.findall(r"pid=(\d+)", line))]


def canvas_shot(browser: Browser) -> Screenshot | None:
    """The noVNC canvas's pixels (its framebuffer, unscaled) as a Screenshot."""
    import base64

    found = browser.driver.execute_script(CANVAS_RGBA)
    if not found:
        return None
    width, height, data = found
    return Screenshot(width, height, base64.b64decode(data))


def click_canvas(browser: Browser, x: int, y: int) -> None:
    """A real mouse click on the page's canvas at the session's pixel ``x, y`` (the canvas may be scaled)."""
    from selenium.webdriver.common.action_chains import ActionChains

    canvas = browser.find("#viewer-screen canvas")
    width = browser.driver.execute_script("return arguments[0].width;", canvas)
    scale = canvas.size["width"] / width
    ActionChains(browser.driver).move_to_element_with_offset(
        canvas, round(x * scale - canvas.size["width"] / 2), round(y * scale - canvas.size["height"] / 2)
    ).click().perform()


def handshake(base: str, ticket: str, cookie: str | None, origin: str | None = None) -> str:
    """A raw WebSocket upgrade to ``/view/ws``: the status line of the answer."""
    host = urlsplit(base).netloc
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    lines = [f"GET /view/ws?ticket={ticket} HTTP/1.1", f"Host: {host}", "Upgrade: websocket",
             "Connection: Upgrade", "Sec-WebSocket-Version: 13", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
             f"Origin: {origin or base}"]
    if cookie:
        lines.append(f"Cookie: {cookie}")
    with socket.create_connection(("127.0.0.1", int(host.rsplit(":", 1)[1])), timeout=10) as raw:
        with context.wrap_socket(raw) as tls:
            tls.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
            return tls.recv(4096).decode("latin-1").split("\r\n", 1)[0]


#: Every printable ASCII character, as typed into the page (issue 25: "(" and ")" never arrived).
PRINTABLE_ASCII = "".join(chr(code) for code in range(0x20, 0x7F))
SHIFT = 8  # the CDP modifier bit of Shift (AltGraph is a key of its own here)

#: What a browser reports for keys typed on a layout: (key, code, modifier keys held).  The page
#: (noVNC) sends the keysym of ``key``; the layout only changes which physical keys (``code``) and
#: modifiers make the character, which the session must not care about.
LAYOUTS: dict[str, dict[str, tuple[str, str, tuple[str, ...]]]] = {
    "us-altgr-intl": {"(": ("(", "Digit9", ("Shift",)), ")": (")", "Digit0", ("Shift",)),
                      "z": ("z", "KeyZ", ()), "y": ("y", "KeyY", ()),
                      "é": ("é", "KeyE", ("AltGraph",)), "ß": ("ß", "KeyS", ("AltGraph",)),
                      "€": ("€", "Digit5", ("AltGraph",))},
    "de": {"(": ("(", "Digit8", ("Shift",)), ")": (")", "Digit9", ("Shift",)),
           "z": ("z", "KeyY", ()), "y": ("y", "KeyZ", ()),
           "é": ("é", "KeyE", ("Dead",)), "ß": ("ß", "Minus", ()), "€": ("€", "KeyE", ("AltGraph",))},
}
_MODIFIER_KEYS = {"Shift": ("Shift", "ShiftLeft", 16), "AltGraph": ("AltGraph", "AltRight", 225),
                  "Dead": ("Dead", "Equal", 187)}


def press(browser: Browser, key: str, code: str, held: tuple[str, ...]) -> None:
    """One key stroke as Chromium reports it for a real keyboard (CDP ``Input.dispatchKeyEvent``):
    the modifiers (or the dead key) first, then the key with its text."""
    send = browser.driver.execute_cdp_cmd
    modifiers = SHIFT if "Shift" in held else 0
    for name in held:
        mod_key, mod_code, vk = _MODIFIER_KEYS[name]
        send("Input.dispatchKeyEvent", {"type": "rawKeyDown", "key": mod_key, "code": mod_code,
                                        "windowsVirtualKeyCode": vk, "modifiers": modifiers})
        if name == "Dead":
            send("Input.dispatchKeyEvent", {"type": "keyUp", "key": mod_key, "code": mod_code,
                                            "windowsVirtualKeyCode": vk})
    text = "\r" if key == "Enter" else key
    send("Input.dispatchKeyEvent", {"type": "keyDown", "key": key, "code": code, "text": text,
                                    "unmodifiedText": text, "modifiers": modifiers,
                                    "windowsVirtualKeyCode": 13 if key == "Enter" else 0})
    send("Input.dispatchKeyEvent", {"type": "keyUp", "key": key, "code": code, "modifiers": modifiers})
    for name in reversed(held):
        if name != "Dead":
            mod_key, mod_code, vk = _MODIFIER_KEYS[name]
            send("Input.dispatchKeyEvent", {"type": "keyUp", "key": mod_key, "code": mod_code,
                                            "windowsVirtualKeyCode": vk})


class WebViewerBase(client_tests.ClientTestCase):
    """One gateway with the portal, one user, a client screen; a browser per test (the helpers)."""

    timeout = 300
    options = {"sessions": {"display_base": "830", "display_limit": "60", "connect_timeout": "60"},
               "types": TYPES, **web_options(admin_groups=ADMINS),
               "shadow": {"admin_groups": ADMINS, "consent_timeout": "30"}}

    def setUp(self) -> None:
        why = available()
        if why:
            raise SkipTest(why)
        super().setUp()
        self.screen = class_fixture(type(self), self.make_fixture)[2]
        self.addCleanup(self.end_all_sessions)
        self.base = web_base(self.gateway)
        typed = os.path.join(self.user.entry.pw_dir, TYPED)
        if os.path.exists(typed):
            os.unlink(typed)

    def make_fixture(self) -> Any:
        from tests.harness.x11 import ClientScreen

        (user, gateway), teardown = super().make_fixture()
        try:
            screen = ClientScreen(800, 600)
        except BaseException:
            teardown()
            raise

        def teardown_all() -> None:
            screen.close()
            teardown()

        return (user, gateway, screen), teardown_all

    def end_all_sessions(self) -> None:
        for pid in client_tests.agent_processes(self.user.name):
            with contextlib.suppress(ProcessLookupError):  # it ended between the listing and now
                os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not client_tests.agent_processes(self.user.name), 20, "the agents to end")

    def attach(self, *args: str) -> Any:
        """nxgate-client in the background, attached to a session, drawing on the client screen."""
        return self.background(self.argv("--geometry", "800x600", *args), DISPLAY=self.screen.name)

    def only_session(self) -> tuple[str, tuple[str, str, str, str]]:
        sessions = self.sessions()
        self.assertEqual(len(sessions), 1, sessions)
        return next(iter(sessions.items()))

    def browser(self) -> Browser:
        browser = Browser(1024, 768)
        self.addCleanup(browser.quit)
        return browser

    def logged_in(self, user: Any = None) -> Browser:
        user = user or self.user
        browser = self.browser()
        browser.login(self.base, user.name, user.password)
        browser.wait(lambda: browser.find_all("nav .who"), what="the portal after the login")
        return browser

    def open_button(self, browser: Browser) -> Any:
        browser.get(self.base + "/")
        return browser.wait(lambda: browser.find_all("form[action='/view/open'] button"), 30,
                            "an Open in browser button")[0]

    def open_in_browser(self, browser: Browser) -> float:
        """Click "open"; the seconds until the canvas shows the session (red)."""
        button = self.open_button(browser)
        began = time.monotonic()
        button.click()
        browser.wait(lambda: canvas_shot(browser) and canvas_shot(browser).count(RED) > 20000, 60,
                     "the session drawn in the page")
        return time.monotonic() - began

    def click_into_xterm(self, browser: Browser) -> None:
        """Click inside the xterm (the session has no window manager: focus follows the pointer)."""
        click_canvas(browser, 100, 60)

    def close_the_tab(self, browser: Browser, session_id: str) -> None:
        """Close the viewer's tab (another one stays open): the session suspends, the viewer goes."""
        browser.driver.switch_to.new_window("tab")
        spare = browser.driver.current_window_handle
        for handle in browser.driver.window_handles:
            if handle not in (spare,):
                browser.driver.switch_to.window(handle)
                break
        self.assertNotEqual(browser.driver.current_window_handle, spare)
        browser.driver.close()
        browser.driver.switch_to.window(spare)
        wait_for(lambda: self.status(session_id) == "Suspended", 30, "the suspension after the tab closed")
        wait_for(lambda: not os.listdir(os.path.join(self.gateway.state_dir, "viewers")), 15,
                 "the viewer's programs and files to go")
        wait_for(lambda: not programs_of(self.user.entry.pw_uid), 15, "the viewer's programs to end")
        directory = os.path.join(self.gateway.state_dir, "sessions", session_id)
        wait_for(lambda: not [n for n in os.listdir(directory) if n.startswith("view-")], 15,
                 "the viewer's socket to go")

    def typed(self) -> str:
        try:
            with open(os.path.join(self.user.entry.pw_dir, TYPED), encoding="utf-8") as handle:
                return handle.read()
        except FileNotFoundError:
            return ""

    def status(self, session_id: str) -> str:
        return self.sessions().get(session_id, ("",) * 3)[2]

    def grab_session(self, display: int, authority: str) -> Any:
        """The session's framebuffer (xwd with its X authority)."""
        return pixels.grab(f":{display}", authority)

    def wait_for_the_canvas_to_be_the_session(self, browser: Browser, session_id: str, display: int,
                                              whole: bool = False, tolerance: int = 0) -> None:
        """Until the page's canvas shows what the session's framebuffer holds
        (97 % of the pixels equal, each colour channel within ``tolerance``); ``whole``: at the same size too."""
        authority = os.path.join(self.gateway.state_dir, "sessions", session_id, "authority")

        def same_picture() -> float:
            shot, master = canvas_shot(browser), self.grab_session(display, authority)
            if shot is None or (whole and (shot.width, shot.height) != (master.width, master.height)):
                return 0.0
            area = pixels.Rect(0, 0, min(shot.width, master.width), min(shot.height, master.height))
            share = pixels.equal_share(pixels.crop(shot, area), pixels.crop(master, area), tolerance)
            return share if share > 0.97 else 0.0

        wait_for(same_picture, 30, "the canvas to equal the session's framebuffer")



class WebViewerTests(WebViewerBase):
    """The browser viewer on one box."""

    def test_open_type_close_then_resume_with_the_client(self) -> None:
        # A session nxgate-client started and shows...
        client = self.attach("--name", "web test")
        self.screen.wait_for_colour(RED, 20000, timeout=60)
        session_id, _row = self.only_session()

        # ...opened in the browser: the client is suspended, the page draws the session, which stays
        # suspended (an NX client may resume it at any time).
        browser = self.logged_in()
        portal = browser.driver.current_window_handle
        self.open_in_browser(browser)
        code, stderr = self.finished(client, 30)
        self.assertEqual(code, 0, stderr)
        self.assertIn(f"disconnected from session {session_id}", stderr)
        self.assertEqual(self.status(session_id), "Suspended")
        source = browser.source
        for secret in (session_id, str(_row[0])):
            self.assertNotIn(secret, source)  # neither the id nor the display in the page

        # The viewer is one x11vnc, run as the user, listening on no TCP port, IPv4 or IPv6
        # (x11vnc once opened [::]:5900 without a password despite -rfbport 0 -no6 -noipv6).
        viewer_programs = programs_of(self.user.entry.pw_uid)
        self.assertEqual(sorted(set(viewer_programs.values())), sorted(LIVE_VIEWER_PROGRAMS), viewer_programs)
        self.assertEqual(tcp_listeners(viewer_programs), [])
        self.assertNotIn("view-", " ".join(os.listdir(os.path.join(self.gateway.state_dir, "viewers"))))

        # The canvas is the session's framebuffer.
        self.wait_for_the_canvas_to_be_the_session(browser, session_id, int(_row[0]))

        # Keys typed in the page reach the program in the session.
        self.click_into_xterm(browser)
        cursor = canvas_shot(browser).count(YELLOW)  # before typing: the yellow cursor alone
        from selenium.webdriver.common.action_chains import ActionChains
        ActionChains(browser.driver).send_keys("hello web 42!\n").perform()
        wait_for(lambda: "hello web 42!" in self.typed(), 30, "the typed line in the session's file")
        browser.wait(lambda: canvas_shot(browser).count(YELLOW) > cursor + 100, 20, "the echo drawn in the page")

        # Closing the tab suspends the session...
        del portal
        self.close_the_tab(browser, session_id)

        # ...and nxgate-client resumes it, with the typed text on screen.
        self.attach("--resume", session_id)
        self.screen.wait_for_colour(RED, 20000, timeout=60)
        self.screen.wait_for_colour(YELLOW, TEXT_YELLOW, timeout=20)
        self.assertEqual(self.status(session_id), "Running")
        # The NX client's keys reach the session again after the browser's.
        self.screen.xdotool("mousemove", "100", "60")
        time.sleep(1.0)  # the pointer into the xterm first (nxproxy compresses motion; keys go at once)
        self.screen.xdotool("type", "--delay", "30", "$((6*7)) back;")
        self.screen.xdotool("key", "Return")
        wait_for(lambda: "back;" in self.typed(), 30, "the client's typed line in the session's file")
        self.assertEqual(self.typed().split("\n")[1], "$((6*7)) back;")

    def test_started_in_the_browser_then_resumed_by_the_client(self) -> None:
        # A session started from the portal (no NX client ever had it)...
        browser = self.logged_in()
        browser.get(self.base + "/")
        browser.find("form.start input[name=name]").send_keys("from the web")
        browser.find("form.start select[name=type] option[value=unix-console]").click()
        browser.find("form.start button[type=submit]").click()
        browser.wait(lambda: "new session was started" in browser.text(), 60, "the session to start")
        session_id, _row = self.only_session()

        # ...opened in the page (its first client: an NX resume into the viewer's own display), typed into...
        self.open_in_browser(browser)
        self.assertEqual(self.status(session_id), "Running")
        self.assertEqual(sorted(set(programs_of(self.user.entry.pw_uid).values())), sorted(VIEWER_PROGRAMS))
        self.click_into_xterm(browser)
        cursor = canvas_shot(browser).count(YELLOW)  # before typing: the yellow cursor alone
        from selenium.webdriver.common.action_chains import ActionChains
        ActionChains(browser.driver).send_keys("started on the web 9\n").perform()
        wait_for(lambda: "started on the web 9" in self.typed(), 30, "the typed line in the session's file")
        browser.wait(lambda: canvas_shot(browser).count(YELLOW) > cursor + 100, 20, "the echo drawn in the page")

        # ...suspended by closing the tab, and resumed by nxgate-client with the text on its screen.
        self.close_the_tab(browser, session_id)
        self.attach("--resume", session_id)
        self.screen.wait_for_colour(RED, 20000, timeout=60)
        self.screen.wait_for_colour(YELLOW, TEXT_YELLOW, timeout=20)
        self.assertEqual(self.status(session_id), "Running")

    def session_env(self, session_id: str, display: int) -> dict[str, str]:
        """The environment of an X client of the session's own display (its X authority)."""
        authority = os.path.join(self.gateway.state_dir, "sessions", session_id, "authority")
        return dict(os.environ, DISPLAY=f":{display}", XAUTHORITY=authority)

    def selection(self, env: dict[str, str], which: str) -> str:
        result = subprocess.run(["xclip", "-o", "-selection", which], env=env, capture_output=True, timeout=10)
        return result.stdout.decode("utf-8", "replace") if result.returncode == 0 else ""

    def clipboard_field(self, browser: Browser) -> str:
        return browser.driver.execute_script("return document.getElementById('viewer-clipboard').value;")

    def test_clipboard_both_ways(self) -> None:
        self.attach("--name", "clipboard")
        self.screen.wait_for_colour(RED, 20000, timeout=60)
        session_id, row = self.only_session()
        env = self.session_env(session_id, int(row[0]))
        browser = self.logged_in()
        self.open_in_browser(browser)

        # Copied in the session (xclip owns its CLIPBOARD)...
        copied = "copied in the session: café ☃ 42"
        owner = subprocess.Popen(["xclip", "-quiet", "-selection", "clipboard"], env=env, stdin=subprocess.PIPE,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.addCleanup(lambda: owner.poll() is None and owner.kill())
        owner.stdin.write(copied.encode())
        owner.stdin.close()
        # ...shows in the page's clipboard field (and went to the browser's clipboard, where allowed).
        # (x11vnc holds selections back for 15 s after a client connects, unless CUT_BUFFER0 changed,
        # which the gateway does at once: a generous wait all the same.)
        browser.wait(lambda: self.clipboard_field(browser) == copied, 60, "the session's clipboard in the page")

        # Sent from the page: pasteable in the session (PRIMARY at least: see the README's limits).
        def selections() -> dict[str, str]:
            return {which: self.selection(env, which) for which in ("clipboard", "primary")}

        browser.find("#viewer-clipboard-panel summary").click()
        field = browser.find("#viewer-clipboard")
        field.clear()
        field.send_keys("sent from the page: ñ 7")
        browser.find("#viewer-clipboard-send").click()
        try:
            wait_for(lambda: "sent from the page: ñ 7" in selections().values(), 30,
                     "the page's text in the session's selections")
        except AssertionError:
            raise AssertionError(f"the session's selections: {selections()}") from None

        # Beyond Latin-1 (RFB's cut text): the page sends UTF-8 bytes, which nxagent passes on as they are.
        field.clear()
        field.send_keys("snow ☃ man")
        browser.find("#viewer-clipboard-send").click()
        wait_for(lambda: "snow ☃ man" in selections().values(), 30, "the snowman in the session")

    def agent_size(self, env: dict[str, str]) -> tuple[int, int] | None:
        """The session's framebuffer size, as ``xdpyinfo`` on its own display says."""
        result = subprocess.run(["xdpyinfo"], env=env, capture_output=True, text=True, timeout=10)
        found = re.search(r"dimensions:\s+(\d+)x(\d+) pixels", result.stdout)
        return (int(found[1]), int(found[2])) if found else None

    def canvas_box(self, browser: Browser) -> tuple[float, float]:
        """The canvas's size on the page (CSS pixels: what the user sees, scaled)."""
        return tuple(browser.driver.execute_script(
            "const r = document.querySelector('#viewer-screen canvas').getBoundingClientRect();"
            " return [r.width, r.height];"))

    def test_the_page_scales_the_session_to_the_window(self) -> None:
        """The tab shows the session's own screen at the size its NX client gave it (a browser cannot resize a
        suspended agent), scaled to the window with its aspect kept; a new window size only scales it again."""
        self.attach("--name", "resize")
        self.screen.wait_for_colour(RED, 20000, timeout=60)
        session_id, row = self.only_session()
        env = self.session_env(session_id, int(row[0]))
        client_size = self.agent_size(env)  # the NX client's
        browser = self.logged_in()
        self.open_in_browser(browser)
        self.wait_for_the_canvas_to_be_the_session(browser, session_id, int(row[0]), whole=True)
        self.assertEqual(self.agent_size(env), client_size)

        def aspect_kept() -> bool:
            width, height = self.canvas_box(browser)
            return abs(width / height - client_size[0] / client_size[1]) < 0.02

        self.assertTrue(aspect_kept(), (self.canvas_box(browser), client_size))
        before = self.canvas_box(browser)
        browser.driver.set_window_size(700, 900)
        wait_for(lambda: self.canvas_box(browser) != before, 20, "the canvas to scale to the window")
        time.sleep(1.5)  # past the page's 0.7 s wait for the window to keep still
        self.assertTrue(aspect_kept(), (self.canvas_box(browser), client_size))
        self.assertLess(self.canvas_box(browser)[0], before[0])
        self.assertEqual(browser.driver.execute_script("return window.nxgateViewer.resizes;"), 0)
        self.assertEqual(browser.find("#viewer").get_attribute("data-state"), "connected")
        self.wait_for_the_canvas_to_be_the_session(browser, session_id, int(row[0]), whole=True)
        self.assertEqual(self.agent_size(env), client_size)

    def test_open_a_suspended_session_without_resuming_it(self) -> None:
        """A suspended session is shown as its agent draws it, with no NX resume: one x11vnc on its display."""
        client = self.attach("--name", "suspended")
        self.screen.wait_for_colour(RED, 20000, timeout=60)
        session_id, row = self.only_session()
        client.send_signal(signal.SIGTERM)
        self.finished(client)
        wait_for(lambda: self.status(session_id) == "Suspended", 30, "the suspension")
        resumes = self.gateway.log().count(f"resuming session {session_id}")

        browser = self.logged_in()
        self.open_in_browser(browser)
        self.wait_for_the_canvas_to_be_the_session(browser, session_id, int(row[0]), whole=True)
        self.assertEqual(self.status(session_id), "Suspended")
        self.assertEqual(self.gateway.log().count(f"resuming session {session_id}"), resumes)
        viewer_programs = programs_of(self.user.entry.pw_uid)
        self.assertEqual(sorted(viewer_programs.values()), list(LIVE_VIEWER_PROGRAMS))
        self.assertEqual(tcp_listeners(viewer_programs), [])

        # What the session draws now reaches the page too (the suspended agent keeps drawing).
        self.click_into_xterm(browser)
        cursor = canvas_shot(browser).count(YELLOW)
        from selenium.webdriver.common.action_chains import ActionChains
        ActionChains(browser.driver).send_keys("while suspended 5\n").perform()
        wait_for(lambda: "while suspended 5" in self.typed(), 30, "the typed line in the session's file")
        browser.wait(lambda: canvas_shot(browser).count(YELLOW) > cursor + 100, 20, "the echo drawn in the page")
        self.wait_for_the_canvas_to_be_the_session(browser, session_id, int(row[0]), whole=True)

    def test_an_nx_resume_while_the_tab_shows_the_session(self) -> None:
        """An NX client resuming the session takes it, as from another client: the tab ends and says so."""
        self.attach("--name", "taken back")
        self.screen.wait_for_colour(RED, 20000, timeout=60)
        session_id, _row = self.only_session()
        browser = self.logged_in()
        self.open_in_browser(browser)
        wait_for(lambda: self.status(session_id) == "Suspended", 30, "the suspension")
        self.screen.wait_for_colour((0, 0, 0), 800 * 600 - 100, timeout=30)  # the first client is gone

        self.attach("--resume", session_id)
        self.screen.wait_for_colour(RED, 20000, timeout=60)
        self.assertEqual(self.status(session_id), "Running")
        browser.wait(lambda: browser.find("#viewer").get_attribute("data-state") == "disconnected", 30,
                     "the tab to end")
        wait_for(lambda: not programs_of(self.user.entry.pw_uid), 15, "the tab's x11vnc to end")
        self.assertIn("browser viewer of " + self.user.name + " ends: The session was resumed elsewhere.",
                      self.gateway.log())
        directory = os.path.join(self.gateway.state_dir, "sessions", session_id)
        wait_for(lambda: not [n for n in os.listdir(directory) if n.startswith("view-")], 15,
                 "the viewer's socket to go")

    def test_a_viewer_started_with_its_page_ends_when_the_page_never_connects(self) -> None:
        """The viewer's x11vnc starts when the page is asked for (POST /view/open), before its WebSocket; a
        page that never opens one leaves nothing running: the viewer stops after 15 s."""
        client = self.attach("--name", "prepared")
        self.screen.wait_for_colour(RED, 20000, timeout=60)
        session_id, _row = self.only_session()
        browser = self.logged_in()
        self.open_button(browser)
        handle = browser.find("form[action='/view/open'] input[name='handle']").get_attribute("value")
        csrf = browser.find("input[name='csrf']").get_attribute("value")
        status = browser.driver.execute_async_script("""
            const done = arguments[arguments.length - 1];
            fetch('/view/open', {method: 'POST', body: new URLSearchParams({csrf: arguments[0], handle: arguments[1]})})
              .then((a) => done(a.status));""", csrf, handle)
        self.assertEqual(status, 200)
        wait_for(lambda: sorted(programs_of(self.user.entry.pw_uid).values()) == ["x11vnc"], 20,
                 "the viewer's x11vnc, started with its page")
        self.finished(client, 30)  # opening takes the session from its NX client, as the click did
        wait_for(lambda: not programs_of(self.user.entry.pw_uid), 40, "the unclaimed viewer to stop")
        self.assertEqual(self.status(session_id), "Suspended")
        # ...and the session still opens in the page afterwards.
        self.open_in_browser(browser)
        self.wait_for_the_canvas_to_be_the_session(browser, session_id, int(_row[0]), whole=True)

    def admin_user(self) -> Any:
        """A fresh member of the admin group (of the portal and of the shadow policy)."""
        subprocess.run(["groupadd", "-f", ADMINS], check=True)
        self.addCleanup(subprocess.run, ["groupdel", ADMINS], check=False)
        admin = create_user()
        self.addCleanup(admin.remove)
        subprocess.run(["usermod", "-aG", ADMINS, admin.name], check=True)
        return admin

    def shadow_from_the_admin_page(self, answer: str) -> tuple[Browser, str, Any, Any]:
        """The owner's session on her NX client; an admin clicks "Shadow" on the admin page and
        the owner answers the dialog in her session with the key ``answer``."""
        client = self.attach("--name", "watched")
        self.screen.wait_for_colour(RED, 20000, timeout=60)
        session_id, _row = self.only_session()
        admin = self.admin_user()
        browser = self.logged_in(admin)
        browser.get(self.base + "/admin")
        browser.wait(lambda: browser.find_all("form[action='/view/shadow'] button"), 30, "a Shadow button")[0].click()
        self.screen.wait_for_colour(TK_GREY, 2000, timeout=30)  # the owner is asked, on her own screen
        # Meanwhile the admin's page says that the owner is being asked (issue 25: a bare "Connecting…").
        self.assertIn("Asking the session's owner", browser.find("#viewer-status").text)
        time.sleep(0.5)
        self.screen.xdotool("key", answer)
        return browser, session_id, client, admin

    def test_admin_shadows_with_the_owners_consent(self) -> None:
        browser, session_id, client, admin = self.shadow_from_the_admin_page("a")
        browser.wait(lambda: (shot := canvas_shot(browser)) is not None and shot.count(RED) > 20000, 60,
                     "the owner's session drawn in the admin's page")
        # The owner keeps her session: a shadow takes nothing over.
        self.assertIsNone(client.poll())
        self.assertEqual(self.status(session_id), "Running")
        self.assertIn(f"shadow attach: {admin.name} from 127.0.0.1 watches {session_id} of {self.user.name}",
                      self.gateway.log())
        self.assertNotIn(session_id, browser.source)
        # A new window size does not resume a shadow again (that would ask the owner again).
        browser.driver.set_window_size(900, 640)
        time.sleep(2.0)  # past the page's 0.7 s wait for the window to keep still
        self.assertEqual(browser.driver.execute_script("return window.nxgateViewer.resizes;"), 0)
        self.assertEqual(browser.find("#viewer").get_attribute("data-state"), "connected")
        # A shadow ends with its tab (it is not suspended), and the audit says so, not the shadow agent's
        # "Please check the state of your network and retry." on losing its client (issue 25).
        status = browser.find("#viewer-status").text
        self.assertIn("Closing this tab ends the shadow", status)
        self.assertNotIn("suspends", status)
        browser.quit()
        wait_for(lambda: "shadow detach" in self.gateway.log(), 30, "the shadow's end")
        ended = [line for line in self.gateway.log().splitlines() if "ended (terminated" in line]
        self.assertTrue(ended and "its viewer left: the browser went away" in ended[-1], ended)
        self.assertNotIn("check the state of your network", ended[-1])
        self.assertEqual(self.status(session_id), "Running")

    def test_the_admins_page_shows_the_owners_whole_screen(self) -> None:
        """Issue 23: the viewer's screen is the watched screen's size, so the shadow shows it 1:1 (it was a
        stretched, cropped part of it: nxagent without a window manager stretched it over the browser's size)."""
        browser, session_id, _client, _admin = self.shadow_from_the_admin_page("a")
        # The owner's notice (issue 25) reaches the shadow as an NX image update, whose encoding is lossy:
        # a few units off in a colour channel here and there, around its text.
        self.wait_for_the_canvas_to_be_the_session(browser, session_id, int(self.only_session()[1][0]), whole=True,
                                                   tolerance=12)


    def test_owner_refuses_the_admins_shadow(self) -> None:
        browser, session_id, client, _admin = self.shadow_from_the_admin_page("r")
        browser.wait(lambda: browser.find("#viewer").get_attribute("data-state") == "refused", 30, "the refusal")
        self.assertIn(f"refused by user: {self.user.name}", browser.find("#viewer-status").text)
        self.assertEqual(browser.find("#viewer-status").value_of_css_property("color"), "rgba(170, 0, 0, 1)")
        shot = canvas_shot(browser)
        self.assertTrue(shot is None or shot.count(RED) == 0, "the refused page drew the session")
        self.assertIsNone(client.poll())
        self.assertEqual(self.status(session_id), "Running")

    def test_another_user_gets_nothing(self) -> None:
        client = self.attach("--name", "not yours")
        self.screen.wait_for_colour(RED, 20000, timeout=60)
        session_id, _row = self.only_session()
        owner = self.logged_in()
        self.open_button(owner)
        handle = owner.find("form[action='/view/open'] input[name='handle']").get_attribute("value")
        owner_cookie = "; ".join(f"{c['name']}={c['value']}" for c in owner.cookies())

        other_user = create_user()
        self.addCleanup(other_user.remove)
        other = self.logged_in(other_user)
        other_cookie = "; ".join(f"{c['name']}={c['value']}" for c in other.cookies())

        # The owner's handle means nothing in another login: no ticket, no page.
        status, _body = other.driver.execute_async_script(FETCH_TICKET, handle)
        self.assertEqual(status, 404)
        other.get(self.base + "/")
        csrf = other.find("input[name='csrf']").get_attribute("value")
        answer = other.driver.execute_async_script("""
            const done = arguments[arguments.length - 1];
            fetch('/view/open', {method: 'POST', body: new URLSearchParams({csrf: arguments[0], handle: arguments[1]})})
              .then(async (a) => done([a.status, await a.text()]));""", csrf, handle)
        self.assertEqual(answer[0], 404)
        self.assertNotIn("canvas", answer[1])

        # A forged ticket, the owner's ticket with the other's cookie, then replayed, a foreign Origin.
        self.assertIn(" 403 ", handshake(self.base, "A" * 43, other_cookie))
        status, body = owner.driver.execute_async_script(FETCH_TICKET, handle)
        self.assertEqual(status, 200, body)
        ticket = json.loads(body)["ticket"]
        self.assertIn(" 403 ", handshake(self.base, ticket, other_cookie))
        self.assertIn(" 403 ", handshake(self.base, ticket, owner_cookie))  # used up by the refusal
        status, body = owner.driver.execute_async_script(FETCH_TICKET, handle)
        fresh = json.loads(body)["ticket"]
        self.assertIn(" 403 ", handshake(self.base, fresh, owner_cookie, origin="https://evil.example"))
        self.assertIn(" 403 ", handshake(self.base, fresh, owner_cookie))  # one try per ticket
        status, body = owner.driver.execute_async_script(FETCH_TICKET, handle)
        self.assertIn(" 403 ", handshake(self.base, json.loads(body)["ticket"], None))  # no login cookie
        # Without the CSRF header there is no ticket at all.
        answer = owner.driver.execute_async_script("""
            const done = arguments[arguments.length - 1];
            fetch('/view/ticket', {method: 'POST', body: new URLSearchParams({handle: arguments[0]})})
              .then((a) => done(a.status));""", handle)
        self.assertEqual(answer, 403)

        # Through all that the session stayed where it was.
        self.assertEqual(self.status(session_id), "Running")
        self.assertIsNone(client.poll())
        log = self.gateway.log()
        for why in ("unknown, used or expired ticket", "ticket of another login", "foreign origin"):
            self.assertIn(f"browser viewer WebSocket refused ({why})", log)

    # Issue 25: what is typed in the page arrives in the session exactly ----------------------------

    def typed_into_the_session(self) -> Browser:
        self.attach("--name", "keys")
        self.screen.wait_for_colour(RED, 20000, timeout=60)
        browser = self.logged_in()
        self.open_in_browser(browser)
        self.click_into_xterm(browser)
        return browser

    def enter_and_read(self, browser: Browser, marker: str) -> str:
        """Press Return; the line the session's program read, up to ``marker``'s line."""
        press(browser, "Enter", "Enter", ())
        wait_for(lambda: marker in self.typed(), 30, f"the line {marker!r} in the session's file")
        return self.typed().split("\n")[-2]

    def test_every_printable_ascii_character_arrives(self) -> None:
        from selenium.webdriver.common.action_chains import ActionChains
        from selenium.webdriver.common.keys import Keys

        browser = self.typed_into_the_session()
        ActionChains(browser.driver).send_keys(PRINTABLE_ASCII + "<end>\n").perform()
        wait_for(lambda: "<end>" in self.typed(), 30, "the typed line in the session's file")
        self.assertEqual(self.typed().split("\n")[0], PRINTABLE_ASCII + "<end>")
        # Shift+9 and Shift+0 as explicit key presses: "$((6*7))" arrived as "$6*7".
        chain = ActionChains(browser.driver).send_keys("$")
        for digit in "99":
            chain = chain.key_down(Keys.SHIFT).send_keys(digit).key_up(Keys.SHIFT)
        chain = chain.send_keys("6*7")
        for digit in "00":
            chain = chain.key_down(Keys.SHIFT).send_keys(digit).key_up(Keys.SHIFT)
        chain.send_keys("<shift>\n").perform()
        wait_for(lambda: "<shift>" in self.typed(), 30, "the second line in the session's file")
        self.assertEqual(self.typed().split("\n")[1], "$((6*7))<shift>")

    def test_layouts_and_non_ascii_characters(self) -> None:
        browser = self.typed_into_the_session()
        for layout, keys in LAYOUTS.items():
            text = "".join(keys)
            for character in text:
                press(browser, *keys[character])
            for character in layout:
                press(browser, character, "Minus" if character == "-" else f"Key{character.upper()}", ())
            line = self.enter_and_read(browser, layout)
            self.assertEqual(line, text + layout, f"typed on a {layout} keyboard")
        # A character the keymap has no key for arrives as itself (the viewer on the session's own
        # display gives it a key there) or not at all, never as some other key.
        for key, code in (("a", "KeyA"), ("☃", "KeyS"), ("b", "KeyB")):
            press(browser, key, code, ())
        self.assertIn(self.enter_and_read(browser, "b"), ("a☃b", "ab"))

    # Issue 25: the owner sees that she is watched, and can end it -----------------------------------
    def bounding_box(self, shot: Screenshot, colour: tuple[int, int, int]) -> tuple[int, int, int, int] | None:
        """(left, top, right, bottom) of the pixels of ``colour`` in ``shot``."""
        xs, ys = [], []
        for y in range(0, shot.height, 2):
            for x in range(0, shot.width, 2):
                if shot.pixel(x, y) == colour:
                    xs.append(x)
                    ys.append(y)
        return (min(xs), min(ys), max(xs), max(ys)) if xs else None

    def test_the_owner_sees_the_shadow_and_ends_it_from_the_notice(self) -> None:
        browser, session_id, client, admin = self.shadow_from_the_admin_page("a")
        browser.wait(lambda: (shot := canvas_shot(browser)) is not None and shot.count(RED) > 20000, 60,
                     "the owner's session drawn in the admin's page")
        display = int(self.only_session()[1][0])
        authority = os.path.join(self.gateway.state_dir, "sessions", session_id, "authority")
        # The owner's own framebuffer (xwd on her session's display) shows who watches...
        shot = wait_for(lambda: (found := pixels.grab(f":{display}", authority)).count(NOTICE_AMBER) > 2000 and found,
                        30, "the shadow notice on the owner's screen")
        self.assertIsNotNone(self.bounding_box(shot, NOTICE_RED), "the notice's End button")
        names = [name for _id, name, _rect in pixels.windows(f":{display}", authority)]
        self.assertTrue(any("screen is shared" in name for name in names), names)
        # ...and its End button ends the shadow (a click on the owner's screen, through her session's X server).
        left, top, right, bottom = self.bounding_box(shot, NOTICE_RED)
        env = dict(os.environ, DISPLAY=f":{display}", XAUTHORITY=authority)
        subprocess.run(["xdotool", "mousemove", str((left + right) // 2), str((top + bottom) // 2), "click", "1"],
                       env=env, check=True, timeout=10)
        browser.wait(lambda: browser.find("#viewer").get_attribute("data-state") == "disconnected", 30,
                     "the admin's page to lose the shadow")
        self.assertIn("shadow ended", browser.find("#viewer-status").text.lower())
        wait_for(lambda: f"{self.user.name} ended it from the notice" in self.gateway.log(), 10, "the audit line")
        wait_for(lambda: f"ended by {self.user.name}, the watched session's owner" in self.gateway.log(), 20,
                 "the shadow's end, with its reason, in the log")
        wait_for(lambda: pixels.grab(f":{display}", authority).count(NOTICE_AMBER) == 0, 20, "the notice to go")
        # The owner's session goes on, her client still attached.
        self.assertIsNone(client.poll())
        self.assertEqual(self.status(session_id), "Running")
        del admin

    # Issue 25: the start form and the list -------------------------------------------------------------
    def test_the_start_form_offers_what_is_installed_and_starts_and_opens_in_one_step(self) -> None:
        browser = self.logged_in()
        browser.get(self.base + "/")
        offered = [option.get_attribute("value") for option in browser.find_all("form.start select option")]
        self.assertIn("unix-console", offered)
        for session_type, program in (("unix-gnome", "gnome-session"), ("unix-kde", "startplasma-x11")):
            if shutil.which(program) is None:  # configured by default, not installed here: not offered
                self.assertNotIn(session_type, offered)
        self.assertNotIn("unix-application", offered)  # needs a command line: an NX client's
        # A type that is not offered (a stale form) is refused in the error colour, not the notice's.
        browser.driver.execute_script("""
            const option = document.createElement('option');
            option.value = option.textContent = 'unix-gnome';
            document.querySelector('form.start select').appendChild(option);""")
        browser.find("form.start select option[value=unix-gnome]").click()
        browser.find("form.start button.start-only").click()
        refusal = browser.wait(lambda: browser.find_all("main p.error"), 20, "the refusal")[0]
        self.assertIn("cannot be started here", refusal.text)
        self.assertEqual(refusal.value_of_css_property("color"), "rgba(170, 0, 0, 1)")
        self.assertEqual(browser.find_all("main p.notice"), [])
        self.assertEqual(self.sessions(), {})

        # "Start and open": one click, and the page shows the new session.
        browser.get(self.base + "/")
        browser.find("form.start input[name=name]").send_keys("one click")
        browser.find("form.start select option[value=unix-console]").click()
        browser.find("form.start button.start-open").click()
        browser.wait(lambda: canvas_shot(browser) and canvas_shot(browser).count(RED) > 20000, 60,
                     "the new session drawn in the page")
        session_id, row = self.only_session()
        self.assertEqual(row[3], "one click")
        self.assertEqual(self.status(session_id), "Running")
        # Back from the viewer: the portal is not sent to the viewer a second time.
        browser.driver.back()
        browser.wait(lambda: browser.find_all("table.sessions"), 20, "the portal again")
        time.sleep(1.0)
        self.assertTrue(browser.url.rstrip("/").endswith(urlsplit(self.base).netloc), browser.url)

    def test_the_list_follows_a_closed_viewer_tab(self) -> None:
        """The portal's tab follows the session without a reload: Suspended while another tab shows it
        (the viewer leaves it resumable by any NX client) and after that tab is closed, then Running
        as soon as an NX client resumes it (the list used to go on saying what it said at loading)."""
        self.attach("--name", "two tabs")
        self.screen.wait_for_colour(RED, 20000, timeout=60)
        session_id, _row = self.only_session()
        browser = self.logged_in()
        viewer_tab = browser.driver.current_window_handle
        self.open_in_browser(browser)
        browser.driver.switch_to.new_window("tab")
        portal_tab = browser.driver.current_window_handle
        browser.get(self.base + "/")
        browser.wait(lambda: browser.find("td.state").text == "Suspended", 15, "the list to say Suspended")
        browser.driver.execute_script("window.notReloaded = true;")
        browser.driver.switch_to.window(viewer_tab)
        browser.driver.close()
        browser.driver.switch_to.window(portal_tab)
        self.assertEqual(self.status(session_id), "Suspended")
        self.attach("--resume", session_id)
        self.screen.wait_for_colour(RED, 20000, timeout=60)
        browser.wait(lambda: browser.find("td.state").text == "Running", 15, "the list to say Running")
        self.assertTrue(browser.driver.execute_script("return window.notReloaded === true;"))

    def test_no_shadow_for_a_suspended_session(self) -> None:
        """Issue 25: the admin page offered Shadow for suspended sessions (there is no screen to watch)."""
        owner = self.logged_in()
        owner.get(self.base + "/")
        owner.find("form.start select option[value=unix-console]").click()
        owner.find("form.start button.start-only").click()
        owner.wait(lambda: "new session was started" in owner.text(), 60, "the session to start")
        session_id, _row = self.only_session()
        self.assertEqual(self.status(session_id), "Suspended")
        admin = self.logged_in(self.admin_user())
        admin.get(self.base + "/admin")
        row = admin.wait(lambda: admin.find_all("tr.session"), 20, "the session on the admin page")[0]
        buttons = [button.text for button in row.find_elements("css selector", "button")]
        self.assertIn("Terminate", buttons)
        self.assertNotIn("Shadow", buttons)

class JailedWebViewerTests(WebViewerBase):
    """A jailed session ([jail] enabled) in the page: its x11vnc runs in the jail's namespaces, reaches the
    jailed agent's display, and the page shows its framebuffer and types into it."""

    options = {**WebViewerBase.options, "jail": {"enabled": "yes"}}

    def grab_session(self, display: int, authority: str) -> Any:
        """xwd in the jailed agent's mount namespace (its display's socket is in the jail's own /tmp)."""
        (agent,) = client_tests.agent_processes(self.user.name)
        result = subprocess.run(["nsenter", "-t", str(agent), "-m", "--", "xwd", "-silent", "-root"],
                                env=dict(os.environ, DISPLAY=f":{display}", XAUTHORITY=authority),
                                capture_output=True, timeout=30)
        if result.returncode != 0:
            raise AssertionError(f"xwd in the jail failed: {result.stderr.decode(errors='replace')}")
        return pixels.parse_xwd(result.stdout)

    def test_a_jailed_session_in_the_page(self) -> None:
        client = self.attach("--name", "jailed")
        self.screen.wait_for_colour(RED, 20000, timeout=60)
        session_id, row = self.only_session()
        browser = self.logged_in()
        self.open_in_browser(browser)
        self.finished(client, 30)
        self.wait_for_the_canvas_to_be_the_session(browser, session_id, int(row[0]), whole=True)
        viewer_programs = programs_of(self.user.entry.pw_uid)
        self.assertEqual(sorted(viewer_programs.values()), ["x11vnc"])
        self.assertEqual(tcp_listeners(viewer_programs), [])
        # x11vnc is in the jail's mount namespace (not the host's) and in a network namespace of its own.
        (pid,) = viewer_programs
        self.assertNotEqual(os.readlink(f"/proc/{pid}/ns/mnt"), os.readlink("/proc/self/ns/mnt"))
        self.assertNotEqual(os.readlink(f"/proc/{pid}/ns/net"), os.readlink("/proc/self/ns/net"))
        self.click_into_xterm(browser)
        from selenium.webdriver.common.action_chains import ActionChains
        ActionChains(browser.driver).send_keys("in the jail 3\n").perform()
        wait_for(lambda: "in the jail 3" in self.typed(), 30, "the typed line in the session's file")
