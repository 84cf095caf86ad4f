"""Authenticator logic around PAM (the real PAM runs in the end-to-end tests)."""

from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from nxgate.auth import pam as auth
from nxgate.auth.pam import Authenticator, Verdict


def immediate(reactor, pool, function, *args):
    """Runs 'thread' work synchronously so results are immediate."""
    return defer.maybeDeferred(function, *args)


class LoggableUserTests(SynchronousTestCase):
    def test_user_names_are_shown(self):
        for name in ("bob", "nx-user.1", "_svc", "HOST$", "LOWESTOFT\\mjs04", "bob@example.org", "Bob2"):
            with self.subTest(name=name):
                self.assertEqual(auth.loggable_user(name), name)

    def test_what_cannot_be_a_user_name_is_masked(self):
        for secret in ("hunter2!", "correct horse", "p@ss:word", "Zx9#kd", "a" * 65, "x\ny", "DOM\\a\\b",
                       "-rf", "bad\udcffname", ""):
            with self.subTest(secret=secret):
                self.assertEqual(auth.loggable_user(secret), f"<masked {len(secret)} chars>")


class PrecheckTests(SynchronousTestCase):
    def test_refusals(self):
        self.assertEqual(auth.precheck("", ()), "empty user name")
        self.assertEqual(auth.precheck("a" * 300, ()), "user name too long")
        self.assertEqual(auth.precheck("a\x01b", ()), "control character in user name")
        self.assertEqual(auth.precheck("root", ("root",)), "user is in deny_users")
        self.assertEqual(auth.precheck("root", (), ""), "empty password")
        self.assertEqual(auth.precheck("root", (), "a\0b"), "unacceptable password")
        self.assertEqual(auth.precheck("no-such-user-nxgate", (), "pw"), "no such Unix account")
        self.assertEqual(auth.precheck("bad\udcffname", (), "pw"), "no such Unix account")
        self.assertIsNone(auth.precheck("root", (), "pw"))

    def test_password_responder(self):
        respond = auth.password_responder("pw")
        self.assertEqual(respond([(1, "Password: "), (4, "info")]), ["pw", None])
        self.assertRaises(LookupError, respond, [(2, "OTP: ")])

    def test_resolve_service(self):
        self.assertEqual(auth.resolve_service("definitely-missing-service"), "login")


class AuthenticatorTests(SynchronousTestCase):
    def setUp(self):
        self.clock = Clock()
        self.calls = []
        self.patch(auth.threads, "deferToThreadPool", immediate)

    def make(self, code, message="Authentication failure"):
        def transaction(service, username, respond, host):
            self.calls.append((service, username, respond and respond([(1, "Password:")]), host))
            return code, message

        return Authenticator(self.clock, "nxgate", deny_users=("root",), failed_login_delay=2.0, transaction=transaction)

    def test_granted_is_immediate(self):
        results = []
        self.make(0).password("daemon", "pw", "192.0.2.1").addCallback(results.append)
        self.assertEqual(results[0].verdict, Verdict.GRANTED)
        self.assertEqual(self.calls[0][1:], ("daemon", ["pw"], "192.0.2.1"))

    def test_denial_waits_for_the_delay(self):
        results = []
        self.make(7).password("daemon", "bad", None).addCallback(results.append)
        self.assertEqual(results, [])
        self.clock.advance(1.9)
        self.assertEqual(results, [])
        self.clock.advance(0.2)
        self.assertEqual(results[0].verdict, Verdict.DENIED)
        self.assertIn("Authentication failure (7)", results[0].reason)

    def test_precheck_refusal_never_reaches_pam_and_is_delayed(self):
        results = []
        self.make(0).password("root", "pw", None).addCallback(results.append)
        self.clock.advance(2.0)
        self.assertEqual(results[0].reason, "user is in deny_users")
        self.assertEqual(self.calls, [])

    def test_only_a_refusal_by_policy_is_explained_to_the_client(self):
        """root learns why (the same whatever the password), nobody learns
        whether an account exists or a password was right."""
        authenticator = self.make(7)
        results = []
        for user, password in (("root", "pw"), ("root", ""), ("no-such-user-nxgate", "pw"), ("daemon", "bad")):
            authenticator.password(user, password, None).addCallback(results.append)
        self.clock.advance(2.0)
        self.assertEqual([r.client_note for r in results], [
            "user 'root' may not log in to this server; use an ordinary Unix account",
            "user 'root' may not log in to this server; use an ordinary Unix account",
            "", ""])

    def test_expired_account_or_password_is_explained(self):
        """pam_acct_mgmt's verdict (reached only with the right password) gets
        the same words at every door: NX clients and the browser."""
        notes = []
        for code in (13, 12, 7):
            self.make(code, "expired").password("daemon", "pw", None).addCallback(
                lambda result: notes.append(result.client_note))
        self.clock.advance(2.0)
        self.assertIn("account has expired", notes[0])
        self.assertIn("password has expired", notes[1])
        self.assertEqual(notes[2], "")

    def test_account_check_has_no_conversation(self):
        results = []
        self.make(0).account("daemon", "::1").addCallback(results.append)
        self.assertEqual(self.calls[0][2], None)
        self.assertTrue(results[0].granted)

    def test_transaction_crash_is_an_error_verdict(self):
        def broken(*args):
            raise OSError("libpam exploded")

        a = Authenticator(self.clock, "nxgate", transaction=broken, failed_login_delay=0)
        results = []
        a.password("daemon", "pw", None).addCallback(results.append)
        self.assertEqual(results[0].verdict, Verdict.ERROR)


class AccountLookupOffTheReactorTests(SynchronousTestCase):
    """The user database (NSS: LDAP, sssd) may take seconds: the account
    look-up of every login runs in the PAM thread, not on the reactor."""

    def setUp(self):
        self.clock = Clock()
        self.queued = []
        self.lookups = []
        real = auth.pwd.getpwnam

        def getpwnam(name):
            self.lookups.append(name)
            return real(name)

        def later(reactor, pool, function, *args):
            self.queued.append((function, args))
            return defer.Deferred()

        self.patch(auth.pwd, "getpwnam", getpwnam)
        self.patch(auth.threads, "deferToThreadPool", later)
        self.authenticator = Authenticator(self.clock, "nxgate", deny_users=("root",), failed_login_delay=0,
                                           transaction=lambda *args: (0, "ok"))

    def test_no_lookup_on_the_reactor(self):
        for start in (lambda: self.authenticator.password("daemon", "pw", None),
                      lambda: self.authenticator.conversation("daemon", lambda prompts: [], None),
                      lambda: self.authenticator.account("daemon", None)):
            start()
        self.assertEqual(self.lookups, [])
        self.assertEqual(len(self.queued), 3)
        function, args = self.queued[0]
        self.assertTrue(function(*args).granted)  # what the PAM thread runs
        self.assertEqual(self.lookups, ["daemon"])

    def test_an_unknown_account_is_refused_in_the_thread_without_pam(self):
        self.authenticator.password("no-such-user-nxgate", "pw", None)
        function, args = self.queued[0]
        outcome = function(*args)
        self.assertEqual((outcome.verdict, outcome.reason), (Verdict.DENIED, "no such Unix account"))

    def test_a_refusal_by_policy_takes_no_thread(self):
        results = []
        self.authenticator.password("root", "pw", None).addCallback(results.append)
        self.assertEqual(results[0].reason, "user is in deny_users")
        self.assertEqual((self.queued, self.lookups), ([], []))
