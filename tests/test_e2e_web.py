"""End to end: the browser portal in a real browser (issue 15).

The real gateway with ``[web]`` on, real PAM users, real nxagent sessions,
and Debian's Chromium (headless, driven by chromedriver through Selenium)
clicking through the pages as a user would: login (a wrong password
refused, then throttled), the list with thumbnails whose pixels are checked
against the agent's framebuffer, starting an xterm session, terminating it,
a tampered CSRF token, a second user trying the first one's URLs, the admin
page's live thumbnails, logout and the idle timeout.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import time
import urllib.error
import urllib.request
import secrets
import socket
from typing import Any

from twisted.trial.unittest import SkipTest, TestCase

from nxgate.gateway.doors.admin.cli import request as admin_request
from tests.harness import browser as browsers
from tests.harness import pixels
from tests.harness.gateway import Gateway
from tests.harness.pixels import Pattern
from tests.harness.process import wait_for
from tests.harness.shared import class_fixture
from tests.harness.ssh import Attachment, NXClient, SessionInfo
from tests.harness.users import NEED_ROOT, TestUser, create_user, is_root
from tests.harness.web import web_base, web_options
from tests.harness.x11 import ClientScreen, Screenshot

RED = (255, 0, 0)
START = ('startsession --session="{name}" --type="unix-console" --geometry="800x600" '
         '--screeninfo="800x600x24+render" --link="lan" --encryption="1" --cache="16M" --images="64M" '
         '--keyboard="pc105/us" --client="linux" --media="0" --backingstore="1"')

THUMB_JS = """
var img = arguments[0], r = img.getBoundingClientRect();
return [r.left + img.clientLeft, r.top + img.clientTop, img.naturalWidth, img.naturalHeight, img.complete];
"""


class Fixture:
    """Three users (alice and bob ordinary, carol for the throttle), an admin
    in a group of her own, one gateway with the portal on, and an Xvfb as
    the screen of an NX client (sessions that had a client have a picture)."""

    def __init__(self, idle_timeout: str = "900") -> None:
        self.group = "nxtweb" + secrets.token_hex(3)
        subprocess.run(["groupadd", self.group], check=True)
        self.users: dict[str, TestUser] = {}
        try:
            for who in ("alice", "bob", "carol", "admin"):
                self.users[who] = create_user()
            subprocess.run(["usermod", "-aG", self.group, self.users["admin"].name], check=True)
            self.gateway = Gateway({**web_options(admin_groups=self.group, idle_timeout=idle_timeout,
                                                  thumbnail_ttl="2"),
                                    "auth": {"failed_login_delay": "0.2", "throttle_per_account": "3",
                                             "throttle_per_address": "1000"},
                                    "sessions": {"display_base": "940", "display_limit": "40"},
                                    "types": {"unix-console": "xterm -bg #ff0000 -fg #ffff00 -geometry 60x15+10+10"},
                                    }).start()
            self.screen = ClientScreen(800, 600)
        except BaseException:
            self.remove()
            raise
        self.base = web_base(self.gateway)
        self.admin_socket = os.path.join(self.gateway.state_dir, "admin.sock")

    def remove(self) -> None:
        if hasattr(self, "gateway"):
            try:
                for session in self.sessions():
                    admin_request(self.admin_socket, "terminate", id=session["id"])
            except OSError as error:  # a gateway that died: its log says why; stop what is left
                print(f"web fixture: cannot end the sessions: {error}")
            self.gateway.stop()
        if hasattr(self, "screen"):
            self.screen.close()
        for user in self.users.values():
            user.remove()
        subprocess.run(["groupdel", self.group], check=False)

    def sessions(self, user: str | None = None) -> list[dict[str, Any]]:
        answer = admin_request(self.admin_socket, "sessions")
        return [s for s in answer["result"] if user is None or s["user"] == user]

    def audit(self) -> list[dict[str, Any]]:
        with open(os.path.join(self.gateway.state_dir, "audit.log"), encoding="utf-8") as handle:
            return [json.loads(line) for line in handle if line.strip()]


def insecure() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def fetch(url: str, cookie: str | None = None, data: bytes | None = None) -> tuple[int, bytes, dict[str, str]]:
    """A plain HTTP request outside the browser (another program with a stolen or made-up URL)."""
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect, urllib.request.HTTPSHandler(context=insecure()))
    request = urllib.request.Request(url, data=data, headers={"Cookie": cookie} if cookie else {})
    try:
        with opener.open(request, timeout=30) as answer:
            return answer.status, answer.read(), dict(answer.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read(), dict(error.headers)


def scaled(frame: Screenshot, width: int, height: int) -> Screenshot:
    """``frame`` at ``width`` x ``height``, nearest pixel (pixel x of the
    thumbnail shows pixel x*W//w of the screen), as the test reckons it."""
    out = bytearray()
    for y in range(height):
        for x in range(width):
            out += bytes(frame.pixel(x * frame.width // width, y * frame.height // height)) + b"\xff"
    return Screenshot(width, height, bytes(out))


def matching(a: Screenshot, b: Screenshot, tolerance: int = 0) -> float:
    """The share of pixels that are the same in two pictures of one size."""
    same = sum(1 for y in range(a.height) for x in range(a.width)
               if max(abs(p - q) for p, q in zip(a.pixel(x, y), b.pixel(x, y))) <= tolerance)
    return same / (a.width * a.height)


class WebTestCase(TestCase):
    timeout = 240
    idle_timeout = "900"

    def setUp(self) -> None:
        if not is_root():
            raise SkipTest(NEED_ROOT)
        why = browsers.available()
        if why:
            raise SkipTest(why)
        self.fixture: Fixture = class_fixture(type(self), self.make_fixture)
        self.base = self.fixture.base

    def make_fixture(self) -> tuple[Fixture, Any]:
        fixture = Fixture(self.idle_timeout)
        return fixture, fixture.remove

    def browser(self) -> browsers.Browser:
        browser = browsers.Browser()
        self.addCleanup(browser.quit)
        return browser

    def logged_in(self, who: str) -> browsers.Browser:
        browser = self.browser()
        user = self.fixture.users[who]
        browser.login(self.base, user.name, user.password)
        browser.wait(lambda: browser.find_all("nav .who"), what=f"{who}'s portal")
        return browser

    def start_session(self, browser: browsers.Browser, who: str, name: str) -> dict[str, Any]:
        """Start an xterm session with the portal's form; its admin record."""
        before = {s["id"] for s in self.fixture.sessions(self.fixture.users[who].name)}
        browser.get(self.base + "/")
        browser.find("form.start input[name=name]").send_keys(name)
        browser.find("form.start select[name=type] option[value=unix-console]").click()
        browser.find("form.start button[type=submit]").click()
        browser.wait(lambda: "new session was started" in browser.text(), 60, "the session to start")
        fresh = [s for s in self.fixture.sessions(self.fixture.users[who].name) if s["id"] not in before]
        self.assertEqual(len(fresh), 1)
        return fresh[0]

    def nx_session(self, who: str, name: str, keep: bool = False) -> dict[str, Any]:
        """A console session started by an NX client and drawn on its screen;
        then the client goes away (unless ``keep``): its admin record."""
        user = self.fixture.users[who]
        client = NXClient(self.fixture.gateway.port)
        self.addCleanup(client.close)
        client.greet()
        self.assertIn(b"NX> 103 ", client.login(user.name, user.password))
        client.prompt()
        reply = client.command(START.format(name=name), timeout=60)
        self.assertIn(b"NX> 710 Session status: running", reply, reply)
        info = SessionInfo.parse(reply)
        attachment = Attachment(client, info, self.fixture.screen.name, self.fixture.gateway.workdir)
        self.addCleanup(attachment.detach)
        self.fixture.screen.wait_for_colour(RED, 20000)
        if not keep:
            attachment.detach()
        state = "running" if keep else "suspended"
        return wait_for(lambda: next((s for s in self.fixture.sessions(user.name)
                                      if s["id"] == info.session_id and s["state"] == state), None), 30,
                        f"the session to be {state}")

    def row(self, browser: browsers.Browser, name: str) -> Any:
        for row in browser.find_all("tr.session"):
            if row.find_element("css selector", ".name").text == name:
                return row
        return None

    def authority(self, session: dict[str, Any]) -> str:
        return os.path.join(self.fixture.gateway.state_dir, "sessions", session["id"], "authority")

    def thumbnail_shows(self, browser: browsers.Browser, name: str, session: dict[str, Any]) -> float:
        """How closely the thumbnail drawn in the page matches the agent's framebuffer, scaled."""
        image = self.row(browser, name).find_element("css selector", "img.thumb")
        left, top, width, height, complete = browser.driver.execute_script(THUMB_JS, image)
        if not complete or not width:
            return 0.0
        shot = browser.screenshot()
        frame = pixels.grab(f":{session['display']}", self.authority(session))
        drawn = pixels.crop(shot, pixels.Rect(round(left), round(top), width, height))
        if (drawn.width, drawn.height) != (width, height):
            return 0.0
        return matching(drawn, scaled(frame, width, height))


class PortalTests(WebTestCase):
    def test_wrong_password_refused_then_throttled(self) -> None:
        carol = self.fixture.users["carol"]
        browser = self.browser()
        for attempt in range(3):
            browser.login(self.base, carol.name, "wrong-" + str(attempt))
            browser.wait(lambda: browser.find_all("p.error"), what="the refusal")
            self.assertIn("Login failed", browser.find("p.error").text)
            self.assertNotIn("nxgate_login", {c["name"] for c in browser.cookies()})
        browser.login(self.base, carol.name, carol.password)  # the right one, now too late
        browser.wait(lambda: browser.find_all("p.error"), what="the refusal")
        self.assertIn("Too many failed logins", browser.find("p.error").text)
        self.assertNotIn("nxgate_login", {c["name"] for c in browser.cookies()})
        events = [(e["event"], e.get("reason", "")) for e in self.fixture.audit() if e.get("user") == carol.name]
        self.assertEqual([e for e, _ in events].count("login_failed"), 4)
        self.assertIn("login_throttled", [e for e, _ in events])
        self.assertIn("web login failed for user", self.fixture.gateway.log())

    def test_domain_style_name_is_refused_cleanly(self) -> None:
        """``DOMAIN\\user`` reaches PAM untouched and is logged escaped, as at the NX door."""
        browser = self.browser()
        browser.login(self.base, "LOWESTOFT\\mjs04", "secret")
        browser.wait(lambda: browser.find_all("p.error"), what="the refusal")
        self.assertIn("Login failed", browser.find("p.error").text)
        self.assertEqual(browser.find("input[name=user]").get_attribute("value"), "LOWESTOFT\\mjs04")
        wait_for(lambda: "LOWESTOFT" in self.fixture.gateway.log(), 5, "the refusal in the log")
        self.assertIn("web login failed for user 'LOWESTOFT\\\\mjs04' from 127.0.0.1", self.fixture.gateway.log())

    def test_expired_password_is_named(self) -> None:
        """The right password, expired: the user learns why (as NX clients do), not "wrong password"."""
        user = create_user()
        self.addCleanup(user.remove)
        subprocess.run(["chage", "-d", "0", user.name], check=True)  # must change it at the next login
        browser = self.browser()
        browser.login(self.base, user.name, user.password)
        browser.wait(lambda: browser.find_all("p.error"), what="the refusal")
        self.assertIn("password has expired", browser.find("p.error").text)
        self.assertNotIn("nxgate_login", {c["name"] for c in browser.cookies()})

    def test_start_xterm_and_see_its_thumbnail(self) -> None:
        browser = self.browser()
        alice = self.fixture.users["alice"]
        started = time.monotonic()
        browser.login(self.base, alice.name, alice.password)
        browser.wait(lambda: "My sessions" in browser.find("h2").text, what="the portal")
        login_seconds = time.monotonic() - started
        self.assertLess(login_seconds, 30)
        cookie = {c["name"]: c for c in browser.cookies()}["nxgate_login"]
        self.assertEqual((cookie["httpOnly"], cookie["secure"], cookie["sameSite"]), (True, True, "Strict"))

        started = self.start_session(browser, "alice", "web-xterm")
        self.assertEqual((started["type"], started["state"]), ("unix-console", "waiting"))
        self.assertEqual(self.row(browser, "web-xterm").find_element("css selector", ".state").text, "Suspended")
        self.assertIn("no picture yet", self.row(browser, "web-xterm").text)  # no client has drawn it yet
        # A session from the office's NX client has a screen: a test card on it
        # (a wrong scale or crop moves its cells).
        session = self.nx_session("alice", "office")
        frame = pixels.grab(f":{session['display']}", self.authority(session))
        pixels.paint_root(f":{session['display']}", self.authority(session), Pattern(frame.width, frame.height),
                          self.fixture.gateway.workdir)
        wait_for(lambda: pixels.grab(f":{session['display']}", self.authority(session)).colours() > 4, 30,
                 "the test card on the session's screen")
        browser.get(self.base + "/")
        share = browser.wait(lambda: (lambda s: s if s > 0.99 else None)(
            self.thumbnail_shows(browser, "office", session)), 20, "the thumbnail to show the session's screen")
        self.assertGreater(share, 0.99)
        browser.save_screenshot(os.path.join(self.fixture.gateway.workdir, "portal.png"))
        source = browser.source
        for secret in (session["id"], cookie["value"], f":{session['display']}"):
            self.assertNotIn(secret, source)
        self.assertEqual([e for e in browser.console_errors() if "Content Security Policy" in e], [])
        self.assertIn(("login", alice.name),
                      [(e["event"], e.get("user")) for e in self.fixture.audit()])

    def test_terminate_from_the_portal(self) -> None:
        browser = self.logged_in("alice")
        session = self.start_session(browser, "alice", "to-terminate")
        self.row(browser, "to-terminate").find_element("css selector", "button.terminate").click()
        browser.wait(lambda: "session was terminated" in browser.text(), 30, "the terminate to be done")
        self.assertIsNone(self.row(browser, "to-terminate"))
        self.assertNotIn(session["id"], [s["id"] for s in self.fixture.sessions()])

    def test_suspend_a_running_session_from_the_portal(self) -> None:
        """The NX client at the office is still attached; the portal suspends
        it there (the session is Suspended, its client gone)."""
        session = self.nx_session("alice", "at-the-office", keep=True)
        browser = self.logged_in("alice")
        row = self.row(browser, "at-the-office")
        self.assertEqual(row.find_element("css selector", ".state").text, "Running")
        row.find_element("css selector", "button.suspend").click()
        browser.wait(lambda: "session was suspended" in browser.text(), 30, "the suspend")
        self.assertEqual(self.row(browser, "at-the-office").find_element("css selector", ".state").text, "Suspended")
        self.assertEqual([s["state"] for s in self.fixture.sessions() if s["id"] == session["id"]], ["suspended"])

    def test_tampered_csrf_token_is_refused(self) -> None:
        browser = self.logged_in("alice")
        session = self.start_session(browser, "alice", "csrf-target")
        button = self.row(browser, "csrf-target").find_element("css selector", "button.terminate")
        browser.driver.execute_script(
            "arguments[0].form.querySelector('input[name=csrf]').value = 'forged';", button)
        button.click()
        browser.wait(lambda: "did not come from the portal" in browser.text(), 20, "the refusal")
        self.assertIn(session["id"], [s["id"] for s in self.fixture.sessions()])
        # Without the login cookie (a request from another site, or another program) nothing happens either.
        handle = self.handle_of(browser, "csrf-target")
        status, _, _ = fetch(self.base + "/act", data=f"op=terminate&handle={handle}&csrf=x".encode())
        self.assertEqual(status, 403)
        self.assertIn(session["id"], [s["id"] for s in self.fixture.sessions()])

    def test_oversized_request_is_refused_unread(self) -> None:
        host, port = self.base.removeprefix("https://").split(":")
        with socket.create_connection((host, int(port)), timeout=20) as raw:
            with insecure().wrap_socket(raw, server_hostname=host) as conn:
                conn.sendall(b"POST /login HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded"
                             b"\r\nContent-Length: 100000000\r\n\r\n" + b"x" * 65536)
                answer = b""
                while b"\r\n\r\n" not in answer and (chunk := conn.recv(4096)):
                    answer += chunk
        self.assertTrue(answer.startswith(b"HTTP/1.1 413 "), answer[:200])

    def handle_of(self, browser: browsers.Browser, name: str) -> str:
        browser.get(self.base + "/")
        return self.row(browser, name).find_element("css selector", "input[name=handle]").get_attribute("value")

    def test_second_user_cannot_reach_the_first_ones_session(self) -> None:
        session = self.nx_session("alice", "alice-private")
        alice = self.logged_in("alice")
        handle = self.handle_of(alice, "alice-private")
        thumb = self.row(alice, "alice-private").find_element("css selector", "img.thumb").get_attribute("src")
        alice.wait(lambda: fetch(thumb, self.cookie_header(alice))[0] == 200, 20, "alice's own thumbnail")

        bob = self.logged_in("bob")
        self.assertNotIn("alice-private", bob.text())
        bob_cookie = self.cookie_header(bob)
        status, body, _ = fetch(thumb, bob_cookie)
        self.assertEqual(status, 404)
        self.assertNotIn(b"PNG", body)
        self.assertEqual(fetch(thumb)[0], 404)  # nobody's cookie
        # Alice's handle with Bob's cookie and his own valid CSRF token, at every door that takes one
        # (the viewer's, where it is mounted: otherwise there is nothing at /view to answer).
        csrf = bob.find("form.start input[name=csrf]").get_attribute("value")
        for path in ("/view/open", "/view/ticket", "/view/shadow", "/act", "/admin/act"):
            status, body, _ = fetch(self.base + path, bob_cookie,
                                    f"csrf={csrf}&handle={handle}&op=terminate&purpose=open".encode())
            self.assertIn(status, (403, 404), (path, body[:300]))
            self.assertNotIn(b"ticket\"", body)
                # Bob posts Alice's handle with his own valid CSRF token, from his own page.
        bob.driver.execute_script("""
            var form = document.querySelector('form.start');
            form.querySelector('input[name=op]').value = 'terminate';
            var h = document.createElement('input'); h.type = 'hidden'; h.name = 'handle'; h.value = arguments[0];
            form.appendChild(h); form.submit();""", handle)
        bob.wait(lambda: "No such session" in bob.text(), 20, "the refusal")
        bob.get(self.base + "/admin")
        bob.wait(lambda: "admin groups" in bob.text(), 20, "the admin page's refusal")
        self.assertIn(session["id"], [s["id"] for s in self.fixture.sessions(self.fixture.users["alice"].name)])

    @staticmethod
    def cookie_header(browser: browsers.Browser) -> str:
        return "; ".join(f"{c['name']}={c['value']}" for c in browser.cookies())

    def test_admin_page_shows_everyone_with_live_thumbnails(self) -> None:
        session = self.nx_session("alice", "watched")
        admin = self.logged_in("admin")
        admin.get(self.base + "/admin")
        admin.wait(lambda: self.row(admin, "watched"), 20, "alice's session on the admin page")
        row = self.row(admin, "watched")
        self.assertIn(self.fixture.users["alice"].name, row.text)
        self.assertIn("nxgate.test", row.text)
        # The screen changes; the page, not reloaded, follows within a few seconds.
        for colour in ("#00ff00", "#ff00ff"):
            subprocess.run(["xsetroot", "-solid", colour], check=True,
                           env=dict(os.environ, DISPLAY=f":{session['display']}",
                                    XAUTHORITY=self.authority(session)))
            admin.wait(lambda: self.thumbnail_shows(admin, "watched", session) > 0.99, 20,
                       f"the admin's thumbnail to turn {colour}")
        admin.save_screenshot(os.path.join(self.fixture.gateway.workdir, "admin.png"))
        # The admin terminates it.
        self.row(admin, "watched").find_element("css selector", "button.terminate").click()
        admin.wait(lambda: "session was terminated" in admin.text(), 30, "the terminate")
        self.assertNotIn(session["id"], [s["id"] for s in self.fixture.sessions()])

    def test_admin_page_fits_a_1280_pixel_window(self) -> None:
        """Issue 25: at 1280 px the table overflowed and the first row's Terminate was cut off."""
        session = self.nx_session("alice", "a session with a rather long name to show", keep=True)
        self.addCleanup(admin_request, self.fixture.admin_socket, "terminate", id=session["id"])
        admin = self.logged_in("admin")  # 1280 x 900
        admin.get(self.base + "/admin")
        admin.wait(lambda: admin.find_all("tr.session img.thumb"), 20, "the admin page with a picture")
        admin.wait(lambda: admin.driver.execute_script("return document.querySelector('img.thumb').complete;"), 20,
                   "the picture to load")
        admin.save_screenshot(os.path.join(self.fixture.gateway.workdir, "admin-1280.png"))
        width = admin.driver.execute_script("return document.documentElement.clientWidth;")
        self.assertLessEqual(width, 1280)
        overflow = admin.driver.execute_script("return document.documentElement.scrollWidth;")
        self.assertLessEqual(overflow, width, "the page scrolls sideways")
        first = admin.find_all("tr.session")[0]
        for button in first.find_elements("css selector", "button"):
            left, top, button_width, height = admin.element_box(button)
            self.assertLessEqual(left + button_width, width, f"{button.text} is cut off")
        self.assertIn("Terminate", [b.text for b in first.find_elements("css selector", "button")])

    def test_admin_drains_the_node(self) -> None:
        admin = self.logged_in("admin")
        admin.get(self.base + "/admin")
        admin.find("button.drain").click()
        self.addCleanup(lambda: admin_request(self.fixture.admin_socket, "drain", on=False))
        admin.wait(lambda: "This node is draining" in admin.text(), 20, "the drain")
        self.assertTrue(admin_request(self.fixture.admin_socket, "status")["result"]["draining"])
        alice = self.logged_in("alice")
        self.assertIn("No new session can be started now", alice.find("p.capacity").text)
        self.assertEqual(alice.find_all("form.start"), [])
        # A form kept from before the drain is refused by the service all the same.
        csrf = alice.find("nav form input[name=csrf]").get_attribute("value")
        cookie = "; ".join(f"{c['name']}={c['value']}" for c in alice.cookies())
        status, body, _ = fetch(self.base + "/act", cookie, f"csrf={csrf}&op=start&type=unix-console".encode())
        self.assertEqual(status, 403, body[:300])
        self.assertEqual(self.fixture.sessions(self.fixture.users["alice"].name), [])
        admin.get(self.base + "/admin")
        admin.find("button.drain").click()  # now "Stop draining"
        admin.wait(lambda: "accepts new sessions again" in admin.text(), 20, "the end of the drain")
        self.assertFalse(admin_request(self.fixture.admin_socket, "status")["result"]["draining"])

    def test_logout(self) -> None:
        browser = self.logged_in("bob")
        cookie = self.cookie_header(browser)
        self.assertEqual(fetch(self.base + "/", cookie)[0], 200)
        browser.find("nav button.logout").click()
        browser.wait(lambda: browser.find_all("form[action='/login']"), 20, "the login page")
        self.assertNotIn("nxgate_login", {c["name"] for c in browser.cookies()})
        status, _, headers = fetch(self.base + "/", cookie)  # the old cookie is dead on the server too
        self.assertEqual((status, headers.get("Location")), (303, "/login"))
        self.assertIn("logout", [e["event"] for e in self.fixture.audit()])


class IdleTimeoutTests(WebTestCase):
    idle_timeout = "5"

    def test_idle_login_ends(self) -> None:
        browser = self.logged_in("alice")
        cookie = "; ".join(f"{c['name']}={c['value']}" for c in browser.cookies())
        time.sleep(3)
        self.assertEqual(fetch(self.base + "/", cookie)[0], 200)  # activity restarts the clock
        time.sleep(6)
        browser.get(self.base + "/")
        browser.wait(lambda: browser.find_all("form[action='/login']"), 20, "the login page")
        status, _, headers = fetch(self.base + "/", cookie)
        self.assertEqual((status, headers.get("Location")), (303, "/login"))
