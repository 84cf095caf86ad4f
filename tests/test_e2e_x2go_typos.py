"""End to end: one wrong password in an X2Go client is one failure for the login throttle.

x2goclient's libssh tries keyboard-interactive and then the password
method with the same password (tests/harness/libssh.py plays it with
Debian's libssh, the library x2goclient links).  Against the real gateway,
real PAM and a real user, with the throttle set to block an address after
five failures: four typos (eight SSH attempts) lock nothing, the right
password then logs in; five typos lock the address, and the right password
is then refused -- the count equals the typos.
"""

from __future__ import annotations

from twisted.trial.unittest import SkipTest, TestCase

from tests.harness.gateway import Gateway
from tests.harness.libssh import password_login
from tests.harness.users import NEED_ROOT, create_user, is_root

PASSWORD = "Typo-e2e-Pw-5521"


class OneTypoOneFailureTests(TestCase):
    timeout = 300

    def setUp(self) -> None:
        if not is_root():
            raise SkipTest(NEED_ROOT)
        self.user = create_user(password=PASSWORD)
        self.addCleanup(self.user.remove)
        self.gateway = Gateway({"auth": {"throttle_per_address": "5", "throttle_per_account": "100",
                                         "failed_login_delay": "0.1"}}).start()
        self.addCleanup(self.gateway.stop)

    def login(self, password: str) -> tuple[bool, list[str]]:
        return password_login("127.0.0.1", self.gateway.port, self.user.name, password)

    def test_four_typos_lock_nothing_and_five_lock_the_address(self):
        for _ in range(4):
            self.assertEqual(self.login("Typo-e2e-Pw-5512"), (False, ["keyboard-interactive", "password"]))
        self.assertEqual(self.login(PASSWORD), (True, ["keyboard-interactive"]))
        log = self.gateway.log()
        self.assertEqual(log.count("(keyboard-interactive): PAM: Authentication failure"), 4)
        self.assertEqual(log.count("failed with the secret it failed with before on this connection"), 4)
        self.assertNotIn("login throttling: blocking", log)

        for _ in range(5):  # the success cleared the failures
            self.assertFalse(self.login("Typo-e2e-Pw-5512")[0])
        self.assertIn("login throttling: blocking the address", self.gateway.log())
        # The right password is refused now: the address is blocked (the log holds back the repeated
        # "login failed" lines after a few a minute: the block's own line says it).
        self.assertEqual(self.login(PASSWORD), (False, ["keyboard-interactive", "password"]))
