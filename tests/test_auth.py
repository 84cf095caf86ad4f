"""Authenticator logic around PAM (the real PAM runs in the end-to-end tests)."""

import pwd

from twisted.cred.error import UnauthorizedLogin
from twisted.internet import defer
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase, TestCase

from nxgate.gateway.auth import pam as auth
from nxgate.node import pamlib
from nxgate.gateway.auth.pam import Authenticator, Verdict
from nxgate.gateway.auth.throttle import Outcome, Throttle
from tests.harness.clock import FakeReactor


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
        self.assertEqual(pamlib.resolve_service("definitely-missing-service"), "login")


class ShellAndLockTests(SynchronousTestCase):
    """Issue 22: accounts that must not log in whatever proves who they are."""

    def test_no_login_shells(self):
        self.assertIn("does not allow logins", auth.shell_refusal("/usr/sbin/nologin"))
        self.assertIn("does not allow logins", auth.shell_refusal("/bin/false"))
        self.assertIn("not an executable", auth.shell_refusal("/no/such/shell"))
        self.assertIsNone(auth.shell_refusal("/bin/sh"))
        self.assertIsNone(auth.shell_refusal(""))
        self.assertIn("does not allow logins", auth.account_refusal("nobody"))

    def test_a_locked_password_locks_a_bare_mark_does_not(self):
        import spwd  # noqa: F401 (the module lock_refusal reads)
        entries = {"locked": "!$6$salt$hash", "never": "!", "cloud": "!*", "twice": "!!", "open": "$6$salt$hash",
                   "solaris": "*LK*$6$x"}

        class Entry:
            def __init__(self, hashed):
                self.sp_pwdp = hashed

        self.patch(spwd, "getspnam", lambda name: Entry(entries[name]))
        self.assertEqual({name: auth.lock_refusal(name) for name in entries}, {
            "locked": "the account is locked", "never": None, "cloud": None, "twice": None, "open": None,
            "solaris": "the account is locked"})


class AuthenticatorTests(SynchronousTestCase):
    def setUp(self):
        self.clock = FakeReactor()
        self.calls = []
        self.patch(auth.threads, "deferToThreadPool", immediate)
        # "daemon" stands for any existing account; its nologin shell is
        # another test's business (ShellAndLockTests).
        self.patch(auth, "shell_refusal", lambda shell: None)

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


class BurstTests(SynchronousTestCase):
    """Issue 22: 40 guesses and the right password sent at once from one
    address; PAM answers only after all of them have arrived."""

    def setUp(self):
        self.clock = FakeReactor()
        self.pending = []
        self.patch(auth, "shell_refusal", lambda shell: None)

        def later(reactor, pool, function, *args):
            d = defer.Deferred()
            self.pending.append((d, args))
            return d

        self.patch(auth.threads, "deferToThreadPool", later)
        throttle = Throttle(self.clock, per_address=10, per_account=20, window=300, block=600)
        self.authenticator = Authenticator(self.clock, "nxgate", failed_login_delay=2.0, throttle=throttle)

    def answer(self):
        """PAM's verdicts, in order: only "right" is the password."""
        for d, (username, respond, _host) in self.pending:
            right = respond([(1, "Password:")]) == ["right"]
            d.callback(auth.AuthResult(Verdict.GRANTED if right else Verdict.DENIED, username, "" if right else "PAM"))
        self.pending.clear()

    def test_a_burst_reaches_pam_at_most_limit_times_and_the_right_password_is_refused(self):
        results = []
        for n in range(40):
            self.authenticator.password("daemon", f"guess{n}", "192.0.2.1").addCallback(results.append)
        self.authenticator.conversation("daemon", lambda prompts: ["right"], "192.0.2.1").addCallback(results.append)
        self.assertEqual(len(self.pending), 10)
        self.answer()
        self.clock.advance(2.0)
        self.assertEqual(len(results), 41)
        self.assertFalse(any(result.granted for result in results))
        self.assertEqual(sum(result.reason.startswith("throttled") for result in results), 31)
        # Blocked now: the right password is refused without PAM.
        self.authenticator.password("daemon", "right", "192.0.2.1").addCallback(results.append)
        self.assertEqual(self.pending, [])
        self.clock.advance(2.0)
        self.assertIn("too many failed logins for this address", results[-1].reason)

    def test_the_right_password_in_flight_with_the_guesses_is_refused_when_they_blocked_the_address(self):
        results = []
        self.authenticator.password("daemon", "right", "192.0.2.1").addCallback(results.append)
        for n in range(9):
            self.authenticator.password("daemon", f"guess{n}", "192.0.2.1")
        self.pending.append(self.pending.pop(0))  # PAM answers the right password last
        self.authenticator.throttle.failed("192.0.2.1", "daemon")  # one more guess, from before
        self.answer()
        self.assertEqual(results, [])  # a refusal waits as long as a wrong password
        self.clock.advance(2.0)
        self.assertFalse(results[0].granted)
        self.assertTrue(results[0].reason.startswith("throttled"))

    def test_a_pam_crash_frees_its_place(self):
        for _ in range(10):
            self.authenticator.password("daemon", "x", "192.0.2.1")
        for d, _ in self.pending:
            d.errback(RuntimeError("PAM thread died"))
        self.pending.clear()
        self.authenticator.password("daemon", "x", "192.0.2.1")
        self.assertEqual(len(self.pending), 1)


class AccountLookupOffTheReactorTests(SynchronousTestCase):
    """The user database (NSS: LDAP, sssd) may take seconds: the account
    look-up of every login runs in the PAM thread, not on the reactor."""

    def setUp(self):
        self.clock = FakeReactor()
        self.queued = []
        self.lookups = []
        real = pwd.getpwnam

        def getpwnam(name):
            self.lookups.append(name)
            return real(name)

        def later(reactor, pool, function, *args):
            self.queued.append((function, args))
            return defer.Deferred()

        self.patch(pwd, "getpwnam", getpwnam)
        self.patch(auth, "shell_refusal", lambda shell: None)  # "daemon": any existing account
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


class KeyboardInteractiveAnswerTests(TestCase):
    """Issue 22: an SSH keyboard-interactive answer longer than any password
    ends the conversation before PAM sees it (a real PAM thread here)."""

    async def test_an_overlong_answer_never_reaches_pam(self):
        from twisted.cred.error import UnauthorizedLogin
        from twisted.internet import reactor

        from nxgate.gateway.doors.conch.checkers import KeyboardInteractive, KeyboardInteractiveChecker

        seen = []

        def transaction(service, username, respond, host):
            try:
                seen.append(respond([(1, "Password: ")]))
            except LookupError as error:  # pamlib turns it into PAM_CONV_ERR
                seen.append(str(error))
                return 19, "Conversation error"
            return 0, "ok"

        self.patch(auth, "account_refusal", lambda username: None)
        authenticator = Authenticator(reactor, "nxgate", failed_login_delay=0, transaction=transaction)
        authenticator.start()
        self.addCleanup(authenticator.stop)
        checker = KeyboardInteractiveChecker(reactor, "nx", authenticator)
        for answer, granted in (("x" * (auth.MAX_PASSWORD_BYTES + 1), False), ("right", True)):
            credentials = KeyboardInteractive(b"alice", lambda prompts, a=answer: defer.succeed([a]), "192.0.2.1")
            if granted:
                self.assertEqual((await checker.requestAvatarId(credentials)).unix_user, "alice")
            else:
                with self.assertRaises(UnauthorizedLogin):
                    await checker.requestAvatarId(credentials)
        self.assertEqual(seen, ["an answer longer than any password", ["right"]])


class OneTypoOneFailureTests(SynchronousTestCase):
    """x2goclient tries keyboard-interactive, then password, with the same typo on one connection."""

    def setUp(self):
        self.clock = FakeReactor()
        self.patch(auth, "shell_refusal", lambda shell: None)
        self.patch(auth, "account_refusal", lambda username: None)
        self.patch(auth.threads, "deferToThreadPool", immediate)
        from nxgate.gateway.doors.conch import checkers

        self.checkers = checkers
        self.throttle = Throttle(self.clock, per_address=5, per_account=10, window=300, block=600)

        def transaction(service, username, respond, host):
            return (0, "ok") if respond([(1, "Password: ")]) == ["right"] else (7, "Authentication failure")

        self.authenticator = Authenticator(self.clock, "nxgate", failed_login_delay=0, transaction=transaction,
                                           throttle=self.throttle)
        self.patch(checkers.threads, "blockingCallFromThread", lambda reactor, ask, prompts: ask(prompts).result)

    def failures(self, key="192.0.2.1", table=None):
        record = (table or self.throttle.addresses).records.get(key)
        return len(record.failures) if record else 0

    def typo(self, connection, secret="typo"):
        """One typo as x2goclient (libssh's userAuthWithPass) sends it: keyboard-interactive, then password."""
        from twisted.cred.credentials import UsernamePassword

        kbd = self.checkers.KeyboardInteractive(b"alice", lambda prompts: defer.succeed([secret]), "192.0.2.1")
        password = UsernamePassword(b"alice", secret.encode())
        password.remote_address = "192.0.2.1"
        for credentials, checker in (
                (kbd, self.checkers.KeyboardInteractiveChecker(self.clock, "nx", self.authenticator)),
                (password, self.checkers.PasswordChecker("nx", self.authenticator))):
            credentials.repeated_secrets = connection
            outcome = []
            checker.requestAvatarId(credentials).addBoth(outcome.append)
            self.assertIsInstance(outcome[0], Failure)
            outcome[0].trap(UnauthorizedLogin)

    def test_the_same_typo_with_two_methods_is_one_failure(self):
        self.typo(self.checkers.RepeatedSecrets())
        self.assertEqual((self.failures(), self.failures("alice", self.throttle.accounts)), (1, 1))

    def test_four_typos_lock_nothing_and_the_fifth_locks_the_address(self):
        for _ in range(4):
            self.typo(self.checkers.RepeatedSecrets())
        self.assertEqual(self.failures(), 4)
        self.assertIsNone(self.throttle.blocked("192.0.2.1", "alice"))
        self.typo(self.checkers.RepeatedSecrets())
        self.assertEqual(self.throttle.blocked("192.0.2.1", "alice")[0], "address")

    def test_another_secret_or_another_connection_counts_again(self):
        connection = self.checkers.RepeatedSecrets()
        self.typo(connection, "typo")
        self.typo(connection, "other typo")
        self.typo(self.checkers.RepeatedSecrets(), "typo")
        self.assertEqual(self.failures(), 3)

    def test_the_digest_is_the_connections_own(self):
        one, two = self.checkers.RepeatedSecrets(), self.checkers.RepeatedSecrets()
        self.assertEqual(one.digest("alice", ["typo"]), one.digest("alice", ["typo"]))
        self.assertNotEqual(one.digest("alice", ["typo"]), two.digest("alice", ["typo"]))
        self.assertNotEqual(one.digest("alice", ["typo"]), one.digest("bob", ["typo"]))
        self.assertNotIn(b"typo", one.digest("alice", ["typo"]))

    def test_a_repeated_secret_still_counts_as_pending_and_a_block_still_refuses_it(self):
        digest = self.checkers.RepeatedSecrets().digest("alice", ["typo"])
        for _ in range(5):
            self.assertIsNone(self.throttle.begin("192.0.2.9", "alice"))
        self.assertEqual(self.throttle.begin("192.0.2.9", "alice").pending, 5)
        for _ in range(5):
            self.throttle.end("192.0.2.9", "alice", Outcome.FAILED, digest)
        self.assertEqual(self.failures("192.0.2.9"), 1)
        self.throttle.failed("192.0.2.9", "alice")
        self.assertIsNone(self.throttle.blocked("192.0.2.9", "alice"))
