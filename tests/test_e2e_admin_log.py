"""End to end: the gateway's log, read as an admin reads it, after a day's normal work.

One real gateway (the portal on, D-Bus on a private system bus), real
users and PAM, real nxagent, nxproxy, x11vnc and a real browser: a session
started with nxgate-client, suspended (the client goes), resumed, watched
by a shadow that then leaves, opened in the browser and its tab closed,
resumed again and terminated; a session started for later in the portal and
terminated without ever being attached.  Nothing of that is for an admin to
act on, so the log holds no warning, error or traceback, and each of those
events is one line at info, in the gateway's words (the agent's, Conch's
and Twisted's per-connection chatter goes to debug).
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from typing import Any

from tests.harness.process import wait_for
from tests.harness.x11 import ClientScreen
from tests.test_e2e_dbus import fixture_with_bus
from tests.test_e2e_web_viewer import RED, WebViewerBase, programs_of

#: A line of the log: its time, what twistd writes in brackets (``namespace#level``) and the text.
LINE = re.compile(r"^\S+ \[(?P<system>[^\]]*)\] (?P<text>.*)$")
#: What must never be in the log of normal work, whatever the line's form.
ALARMS = re.compile(r"#(?:warn|error|critical)\]|Traceback|Unhandled|Got remote error|sending close|connection lost"
                    r"|HTTP/1\.1|nxagent: |Starting factory|Stopping factory")


def levels(log: str) -> dict[str, int]:
    """How many lines of each level (the word after ``#``; ``?`` for a line without one)."""
    counts: dict[str, int] = {}
    for line in log.splitlines():
        match = LINE.match(line)
        level = match.group("system").rpartition("#")[2] if match and "#" in match.group("system") else "?"
        counts[level] = counts.get(level, 0) + 1
    return counts


def about(log: str, session_id: str) -> list[str]:
    """The texts of the lines that name ``session_id``."""
    matches = (LINE.match(line) for line in log.splitlines() if session_id in line)
    return [match.group("text") for match in matches if match]


def free_displays(count: int) -> int:
    """The first of ``count`` display numbers nothing on this machine holds (no lock, no socket,
    no abstract socket), so that no session start meets another's display (which is worth a warning)."""
    with open("/proc/net/unix", encoding="ascii", errors="replace") as handle:
        abstract = set(re.findall(r"@/tmp/\.X11-unix/X(\d+)", handle.read()))
    for first in range(2000, 6000, count):
        if not any(os.path.lexists(f"/tmp/.X{n}-lock") or os.path.lexists(f"/tmp/.X11-unix/X{n}")
                   or str(n) in abstract for n in range(first, first + count)):
            return first
    raise AssertionError("no free range of displays")


class AdminLogTests(WebViewerBase):
    """A gateway whose log the test reads after each step."""

    timeout = 600

    def make_fixture(self) -> Any:
        sessions = {**WebViewerBase.options["sessions"], "display_base": str(free_displays(20)), "display_limit": "20"}
        return fixture_with_bus(self, lambda address: {**WebViewerBase.options, "sessions": sessions,
                                                       "dbus": {"address": address}}, WebViewerBase.make_fixture)

    def setUp(self) -> None:
        super().setUp()
        self.seen = 0

    def step(self, what: str) -> str:
        """The log's lines since the last step (written to the test's directory too, for a reader)."""
        log = self.gateway.log()
        new, self.seen = log[self.seen:], len(log)
        with open(os.path.join(self.gateway.workdir, "steps.log"), "a", encoding="utf-8") as handle:
            handle.write(f"===== {what}: {levels(new)}\n{new}")
        return new

    def test_a_days_normal_work_logs_no_warning_and_one_line_per_event(self) -> None:
        self.step("start-up")
        first = self.attach("--name", "admin log")
        self.screen.wait_for_colour(RED, 20000, timeout=60)
        session_id, _row = self.only_session()
        self.step("started")

        # The client goes: its connection's closing line and the session's suspension, nothing else of it.
        first.send_signal(signal.SIGTERM)
        self.assertEqual(self.finished(first)[0], 0)
        wait_for(lambda: self.status(session_id) == "Suspended", 30, "the suspension")
        time.sleep(2)  # what the agent says after it suspended
        suspended = self.step("suspended (client went)")
        self.assertEqual(about(suspended, session_id), [f"session {session_id} of {self.user.name} suspended "
                                                        "(last client 127.0.0.1)"])

        self.attach("--resume", session_id)
        self.screen.wait_for_colour(RED, 20000, timeout=60)
        self.step("resumed")

        # A shadow comes and goes: its end is the one line of its detach.
        viewer = ClientScreen(800, 600)
        self.addCleanup(viewer.close)
        shadow = self.background(self.argv("--geometry", "800x600", "--shadow", session_id), DISPLAY=viewer.name)
        viewer.wait_for_colour(RED, 20000, timeout=60)
        (shadow_id,) = re.findall(r"watches \w+ of \w+ \(interactive\) as session ([0-9A-F]{32})",
                                  self.step("shadow attached"))
        shadow.send_signal(signal.SIGTERM)
        self.finished(shadow)
        wait_for(lambda: len(self.sessions()) == 1, 30, "the shadow to end")
        time.sleep(2)
        self.assertEqual(about(self.step("shadow ended"), shadow_id), [
            f"shadow detach: {self.user.name} no longer watches {session_id} of {self.user.name}: session {shadow_id}"
            " ended (terminated: its client went away)"])

        # The browser: a login, the view opened and its tab closed (the session suspends again).
        browser = self.logged_in()
        self.step("portal login")
        self.open_in_browser(browser)
        self.step("opened in the browser")
        self.close_the_tab(browser, session_id)
        time.sleep(2)
        self.step("browser tab closed")

        # A session started for later in the portal and terminated before anyone attached.
        browser.get(self.base + "/")
        browser.find("form.start input[name=name]").send_keys("for later")
        browser.find("form.start select[name=type] option[value=unix-console]").click()
        browser.find("form.start button[type=submit]").click()
        browser.wait(lambda: "new session was started" in browser.text(), 60, "the session to start")
        (later_id,) = set(self.sessions()) - {session_id}
        self.assertEqual(len(about(self.step("started for later"), later_id)), 1)
        for row in browser.find_all("tr.session"):
            if row.find_element("css selector", ".name").text == "for later":
                row.find_element("css selector", "button.terminate").click()
        browser.wait(lambda: "session was terminated" in browser.text(), 30, "the terminate")
        wait_for(lambda: len(self.sessions()) == 1, 30, "the session for later to end")
        time.sleep(2)
        self.assertEqual(about(self.step("for-later terminated"), later_id), [
            f"session {later_id} of {self.user.name} ended (terminated: user request (browser))"])

        third = self.attach("--resume", session_id)
        self.screen.wait_for_colour(RED, 20000, timeout=60)
        self.step("resumed again")
        result = self.client("--terminate", session_id)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.finished(third)
        wait_for(lambda: not programs_of(self.user.entry.pw_uid), 15, "the programs to end")
        time.sleep(2)
        self.step("terminated")

        log = self.gateway.log()
        self.assertEqual([line for line in log.splitlines() if ALARMS.search(line)], [])
        # Every SSH connection is two lines: it came and it went (a client's goodbye is no error).
        for peer in set(re.findall(r"SSH connection from (127\.0\.0\.1:\d+)\b", log)):
            self.assertEqual([line.split("] ", 1)[1] for line in log.splitlines() if peer + " " in line + " "],
                             [f"SSH connection from {peer}", f"SSH connection from {peer} closed"])
        # The audit log still has every event, the ones told at debug too.
        with open(os.path.join(self.gateway.state_dir, "audit.log"), encoding="utf-8") as handle:
            audited = [json.loads(line) for line in handle]
        self.assertEqual([entry["event"] for entry in audited if entry.get("session") == shadow_id],
                         ["shadow_attach", "session_start", "session_end", "shadow_detach"])
        self.assertIn("session_start_for_later", [entry["event"] for entry in audited
                                                  if entry.get("session") == later_id])
