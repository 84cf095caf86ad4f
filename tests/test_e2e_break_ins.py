"""End to end: the break-ins of issue 22 that worked, tried again.

The real gateway, real PAM and real users the test creates, real clients
(OpenSSH's ``ssh`` as NX clients and users use it, an HTTPS client for the
web login, ``gdbus`` and raw bus connections on a ``dbus-daemon`` of the
test's own, local processes on the OpenSSH mode's shell socket).

PAM evaluations are counted by PAM itself: the gateway's PAM service here
is a stack of the test's own, whose first ``auth`` line (``pam_exec``)
writes the user's name to a file each time ``pam_authenticate`` runs,
before ``common-auth`` checks the password.
"""

from __future__ import annotations

import http.client
import json
import os
import pwd
import re
import secrets
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

from twisted.trial.unittest import SkipTest, TestCase

from tests.harness.gateway import REPO, Gateway
from tests.harness.process import wait_for
from tests.harness.shared import class_fixture
from tests.harness.ssh import NXClient, askpass_env, ssh_argv
from tests.harness.users import NEED_ROOT, create_user, is_root
from tests.harness.web import web_base, web_options

GUESSES = 40
PER_ADDRESS = 10
PAM_STACK = """# nxgate tests (issue 22): count every pam_authenticate, then the usual stack.
auth     optional  pam_exec.so quiet log={log} /usr/bin/printenv PAM_USER
@include common-auth
account  required  pam_nologin.so
@include common-account
@include common-session
"""


class CountingPAM:
    """A PAM service of the test's own that logs each ``pam_authenticate``."""

    def __init__(self) -> None:
        self.name = "nxgate-test-" + secrets.token_hex(4)
        self.directory = tempfile.mkdtemp(prefix="nxgate-pamcount-")
        self.log = os.path.join(self.directory, "evaluations")
        self.path = os.path.join("/etc/pam.d", self.name)
        with open(self.path, "w", encoding="utf-8") as handle:
            handle.write(PAM_STACK.format(log=self.log))

    def evaluations(self, user: str) -> int:
        try:
            with open(self.log, encoding="utf-8", errors="replace") as handle:
                return sum(1 for line in handle if line.strip() == user)
        except FileNotFoundError:
            return 0

    def remove(self) -> None:
        os.unlink(self.path)
        shutil.rmtree(self.directory, ignore_errors=True)


def insecure() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


class WebClient:
    """The portal's login form over HTTPS from a chosen loopback address."""

    def __init__(self, base: str, source: str = "127.0.0.1") -> None:
        parts = urllib.parse.urlsplit(base)
        self.host, self.port, self.source = parts.hostname, parts.port, source

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, bytes, http.client.HTTPMessage]:
        conn = http.client.HTTPSConnection(self.host, self.port, timeout=60, context=insecure(),
                                           source_address=(self.source, 0))
        try:
            conn.request(method, path, body=body, headers=headers or {})
            answer = conn.getresponse()
            return answer.status, answer.read(), answer.headers
        finally:
            conn.close()

    def log_in(self, user: str, password: str) -> tuple[int, bool]:
        """(HTTP status, whether a login cookie came back)."""
        status, _, headers = self.request("GET", "/login")
        assert status == 200, status
        token = re.search(r"nxgate_prelogin=([^;]+)", headers.get("Set-Cookie", "")).group(1)
        body = urllib.parse.urlencode({"csrf": token, "user": user, "password": password}).encode()
        status, _, headers = self.request("POST", "/login", body, {
            "Cookie": f"nxgate_prelogin={token}", "Content-Type": "application/x-www-form-urlencoded"})
        cookies = " ".join(headers.get_all("Set-Cookie") or [])
        return status, bool(re.search(r"nxgate_login=[^;\s]", cookies))


def nx_login(port: int, source: str, user: str, password: str) -> bool:
    """An NX client's login (nx key, then the NX ``login``): True if it got in."""
    client = NXClient(port, extra=["-b", source])
    try:
        client.greet()
        return b"NX> 103 " in client.login(user, password)
    except AssertionError:
        return False
    finally:
        client.close()


def ssh_login(port: int, source: str, user: str, password: str, method: str) -> bool:
    """``ssh user@gateway`` with ``method`` (password or keyboard-interactive): True if it got in."""
    result = subprocess.run(
        ssh_argv(port, user=user, key=None,
                 extra=["-T", "-b", source, "-o", f"PreferredAuthentications={method}",
                        "-o", "NumberOfPasswordPrompts=1", "-o", "KbdInteractiveAuthentication=yes"]),
        input=b"", capture_output=True, timeout=120, env=askpass_env(password))
    return b"HELLO NXSERVER" in result.stdout


class BurstTests(TestCase):
    """Item 1: 40 wrong passwords at once from one address, then the right
    one while they are still in flight; at every door."""

    timeout = 300

    def setUp(self) -> None:
        if not is_root():
            raise SkipTest(NEED_ROOT)
        self.pam, self.gateway = class_fixture(type(self), self.make_fixture)

    def make_fixture(self):
        pam = CountingPAM()
        try:
            gateway = Gateway({**web_options(),
                               "auth": {"pam_service": pam.name, "throttle_per_address": str(PER_ADDRESS),
                                        "throttle_per_account": "20", "throttle_block": "600",
                                        "failed_login_delay": "0.3"}}).start()
        except BaseException:
            pam.remove()
            raise

        def teardown() -> None:
            gateway.stop()
            pam.remove()

        return (pam, gateway), teardown

    def burst(self, attempt, source: str) -> None:
        """``attempt(source, user, password) -> logged in?``: 40 wrong
        passwords at once, the right one once PAM is busy with them."""
        user = create_user()
        self.addCleanup(user.remove)
        self.assertTrue(attempt(source, user.name, user.password), "the right password alone must work")
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=GUESSES + 1) as pool:
            guesses = [pool.submit(attempt, source, user.name, f"wrong-{n}") for n in range(GUESSES)]
            wait_for(lambda: self.pam.evaluations(user.name) >= 1 + PER_ADDRESS or all(g.done() for g in guesses),
                     120, "PAM to be busy with the guesses")
            right = pool.submit(attempt, source, user.name, user.password)
            results = [guess.result() for guess in guesses]
            got_in = right.result()
        elapsed = time.monotonic() - started
        evaluated = self.pam.evaluations(user.name) - 1  # the first, lone login
        print(f"\n    {GUESSES} guesses + the right password from {source}: {evaluated} PAM evaluations, "
              f"{elapsed:.1f} s")
        self.assertEqual(results.count(True), 0)
        self.assertLessEqual(evaluated, PER_ADDRESS)
        self.assertFalse(got_in, "the right password sent in the burst logged in")
        wait_for(lambda: "throttled: too many" in self.gateway.log(), 10, "the throttle in the log")

    def test_web_login(self) -> None:
        base = web_base(self.gateway)
        self.burst(lambda source, user, password: WebClient(base, source).log_in(user, password)[1], "127.0.0.2")

    def test_nx_login_inside_ssh(self) -> None:
        self.burst(lambda source, user, password: nx_login(self.gateway.port, source, user, password), "127.0.0.3")

    def test_ssh_password(self) -> None:
        self.burst(lambda source, user, password: ssh_login(self.gateway.port, source, user, password, "password"),
                   "127.0.0.4")

    def test_ssh_keyboard_interactive(self) -> None:
        self.burst(lambda source, user, password: ssh_login(self.gateway.port, source, user, password,
                                                            "keyboard-interactive"), "127.0.0.5")
