"""Authentication of Unix users through PAM, run off the reactor thread.

Every PAM transaction here runs in a dedicated thread pool, so a slow PAM
stack (``pam_unix``'s failure delay, LDAP, 2FA) never stalls the reactor.
One code path (:func:`nxgate.node.pamlib.authenticate`) serves the three ways in:

* an NX ``login`` or an SSH ``password`` request (the conversation answers
  hidden prompts with the password),
* SSH ``keyboard-interactive`` (each prompt goes to the SSH client), and
* an account-only check for users who logged in with their own SSH key.

Every transaction runs ``pam_acct_mgmt`` so that expired or locked accounts
are refused, and sets ``PAM_RHOST``.  We never call ``pam_setcred`` here: in
the gateway process it could change *our* groups (``pam_group``).

User names and passwords are passed as the exact bytes the client sent;
nothing is quoted, split or interpreted, so ``DOMAIN\\user`` or a password
with ``$()`` reach PAM untouched.
"""

from __future__ import annotations

import enum
import os
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from twisted.internet import defer, task, threads
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool

from nxgate import metrics
from nxgate.descriptors import PAM_HEADROOM, short_of_files
from nxgate.node import pamlib
from nxgate.node.pamlib import (PAM_PROMPT_ECHO_OFF, PAM_PROMPT_ECHO_ON, PAM_SUCCESS, Prompt, Responder, encode,
                                resolve_service)
from nxgate.gateway.auth.throttle import Outcome, Throttle
from nxgate.users import AccountsUnavailable, account

log = Logger()

MAX_USERNAME_BYTES = 256
MAX_PASSWORD_BYTES = 4096


_NAME = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}"
_DOMAIN = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}"
#: What a user name can look like: POSIX and Samba names (``bob``,
#: ``host$``), ``DOMAIN\user`` and ``user@example.org``.
_USER_NAME = re.compile(rf"(?:{_DOMAIN}\\)?{_NAME}\$?|{_NAME}@{_DOMAIN}")


def loggable_user(username: str) -> str:
    """``username`` as the log may show it.

    A user who types the password at the ``User:`` prompt sends it as the
    user name; it must not end up in the log (or the audit log).  What
    cannot be a user name is shown only by its length.
    """
    if _USER_NAME.fullmatch(username):
        return username
    return f"<masked {len(username)} chars>"


class Verdict(enum.Enum):
    GRANTED = "granted"
    DENIED = "denied"
    ERROR = "error"


DENIED_USER = "user is in deny_users"
PAM_NEW_AUTHTOK_REQD = 12
PAM_ACCT_EXPIRED = 13
EXPIRED_NOTES = {
    PAM_ACCT_EXPIRED: "this account has expired; ask your administrator",
    PAM_NEW_AUTHTOK_REQD: "the password has expired; change it (log in on the console or with ssh) first",
}
#: What every door tells a user whose login could not be checked because
#: the gateway ran out of open files (not a wrong password: try again).
TEMPORARY_NOTE = "the server cannot check logins right now (it is out of open files); please try again in a minute"


@dataclass(frozen=True)
class AuthResult:
    """A PAM verdict.  ``reason`` is for the log only, never for the client."""

    verdict: Verdict
    username: str
    reason: str
    code: int = 0  # PAM's return code, when PAM answered
    #: An ERROR that says nothing about the password and passes (the gateway
    #: was out of open files): the user is told to try again.
    temporary: bool = False

    @property
    def granted(self) -> bool:
        return self.verdict is Verdict.GRANTED

    @property
    def client_note(self) -> str:
        """What the client may learn beyond "wrong password or login".

        A refusal by policy (``deny_users``, root by default), and an expired
        account or password (every door shows the same words).  The first is
        decided from the name alone, before any password or account lookup,
        so saying it tells nobody whether an account exists or a password
        was right, and it saves a newcomer trying root from guessing.
        """
        if self.verdict is Verdict.ERROR and self.temporary:
            return TEMPORARY_NOTE
        if self.verdict is Verdict.DENIED and self.reason == DENIED_USER:
            return f"user '{self.username}' may not log in to this server; use an ordinary Unix account"
        if self.verdict is Verdict.DENIED and self.code in EXPIRED_NOTES:
            # pam_acct_mgmt runs only after the password was right: the note
            # tells the account's owner what to do, as sshd and login do.
            return EXPIRED_NOTES[self.code]
        return ""


def precheck(username: str, deny_users: Sequence[str], password: str | None = None) -> str | None:
    """Why a login must be refused without asking PAM, or None."""
    return policy_refusal(username, deny_users, password) or account_refusal(username)


def policy_refusal(username: str, deny_users: Sequence[str], password: str | None = None) -> str | None:
    """The part of :func:`precheck` decided from the request alone: cheap,
    so it runs on the reactor and a refused request never takes a PAM thread."""
    # Lengths first, on the bare string (characters <= bytes): a name or a
    # password of megabytes must cost nothing before it is refused.
    if len(username) > MAX_USERNAME_BYTES:
        return "user name too long"
    if password is not None and len(password) > MAX_PASSWORD_BYTES:
        return "unacceptable password"
    raw = encode(username)
    if not raw:
        return "empty user name"
    if len(raw) > MAX_USERNAME_BYTES:
        return "user name too long"
    if any(byte < 0x20 or byte == 0x7F for byte in raw):
        return "control character in user name"
    if username in deny_users:
        return DENIED_USER
    if password is not None:
        secret = encode(password)
        if not secret:
            return "empty password"  # never let 'nullok' accounts in remotely
        if len(secret) > MAX_PASSWORD_BYTES or b"\0" in secret:
            return "unacceptable password"
    return None


def account_refusal(username: str) -> str | None:
    """The part of :func:`precheck` that asks the user database (NSS: files,
    but also LDAP or sssd, which may take seconds), so it runs in the PAM
    thread, never on the reactor."""
    try:
        entry = account(username)
    except KeyError:
        return "no such Unix account"
    except UnicodeEncodeError:
        return "user name is not valid UTF-8"
    return shell_refusal(entry.pw_shell) or lock_refusal(username)


#: Login shells that mean "this account does not log in" (nobody, daemons).
NO_LOGIN_SHELLS = frozenset({"nologin", "false"})


def shell_refusal(shell: str) -> str | None:
    """Why an account whose login shell is ``shell`` may not log in, or None.

    sshd gives such an account nothing but its shell's "not available"
    message; here a login would start a desktop, so it is refused, as is a
    shell that does not exist (an LDAP account meant for other machines).
    An empty shell means /bin/sh, as for login(1)."""
    if not shell:
        return None
    if os.path.basename(shell) in NO_LOGIN_SHELLS:
        return f"the account's shell {shell} does not allow logins"
    if not os.access(shell, os.X_OK):
        return f"the account's shell {shell} is not an executable program"
    return None


def lock_refusal(username: str) -> str | None:
    """"the account is locked" when its shadow entry holds a password hash
    behind a ``!`` (``usermod -L``, ``passwd -l`` of an account that had a
    password).

    pam_unix's account check does not look at that mark (a locked account
    only fails its *password*), so logins that prove themselves otherwise —
    a key, the kernel's word on a local socket or bus — would get in.  A
    bare ``!``, ``!!`` or ``!*`` (an account made without a password, as
    cloud-init's key-only users are) locks nothing that ever existed and is
    not taken as a lock.  Without the right to read the shadow entry (a
    gateway not run as root) nothing is said."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # spwd goes in 3.13; we run 3.11 (Debian 12)
            import spwd
        entry = spwd.getspnam(username)
    except (ImportError, KeyError, PermissionError, OSError):
        return None
    hashed = entry.sp_pwdp
    if (hashed.startswith("!") and hashed.lstrip("!")[:1] not in ("", "*")) or hashed.startswith("*LK*"):
        return "the account is locked"
    return None




def password_responder(password: str) -> Responder:
    """Answer hidden prompts with the password; refuse anything else.

    A PAM stack that asks a visible question (an OTP, say) cannot be served
    by a bare password, so we stop rather than send the password there.
    """

    def respond(prompts: Sequence[Prompt]) -> list[str | None]:
        answers: list[str | None] = []
        for style, _text in prompts:
            if style == PAM_PROMPT_ECHO_ON:
                raise LookupError("PAM asked a visible question during password login")
            answers.append(password if style == PAM_PROMPT_ECHO_OFF else None)
        return answers

    return respond


def _out_of_files(username: str, said: str, code: int = 0) -> AuthResult:
    return AuthResult(Verdict.ERROR, username, f"PAM could not check the login: the gateway is out of open files"
                                               f" ({said})", code, temporary=True)


class Authenticator:
    """PAM for the gateway: passwords, conversations and account checks.

    Results that deny access arrive no sooner than ``failed_login_delay``
    seconds after the request, whatever PAM itself did, to slow down
    password guessing on every path.
    """

    def __init__(
        self,
        reactor,  # type: ignore[no-untyped-def]
        service: str,
        deny_users: Sequence[str] = (),
        threads: int = 16,
        failed_login_delay: float = 2.0,
        transaction: Callable[[str, str, Responder | None, str | None], tuple[int, str]] = pamlib.authenticate,
        throttle: Throttle | None = None,
    ) -> None:
        self.reactor = reactor
        self.service = resolve_service(service)
        self.deny_users = tuple(deny_users)
        self.failed_login_delay = failed_login_delay
        self.throttle = throttle
        self._transaction = transaction
        self.pool = ThreadPool(minthreads=0, maxthreads=threads, name="nxgate-pam")

    def start(self) -> None:
        self.pool.start()

    def stop(self) -> None:
        self.pool.stop()

    def password(self, username: str, password: str, remote_host: str | None,
                 secret: Callable[[], bytes | None] = lambda: None) -> defer.Deferred[AuthResult]:
        """``secret``: the digest of the password for the throttle (a failure
        with a digest it counted before is not counted again)."""
        return self._login(username, remote_host, lambda: policy_refusal(username, self.deny_users, password),
                           password_responder(password), secret)

    def conversation(self, username: str, respond: Responder, remote_host: str | None,
                     secret: Callable[[], bytes | None] = lambda: None) -> defer.Deferred[AuthResult]:
        """Authenticate with an interactive conversation (``respond`` runs in
        the PAM thread and may block on the client); ``secret`` is asked when
        PAM has answered (the digest of the client's answers)."""
        return self._login(username, remote_host, lambda: policy_refusal(username, self.deny_users), respond, secret)

    def _login(self, username: str, remote_host: str | None, policy: Callable[[], str | None],
               respond: Responder, secret: Callable[[], bytes | None] = lambda: None) -> defer.Deferred[AuthResult]:
        """One login attempt, counted by the throttle from its start to its
        answer (so that a burst sent at once cannot outrun the count)."""
        key = username if len(username) <= MAX_USERNAME_BYTES else None  # a huge name is no table key
        refusal = self.throttle.begin(remote_host, key) if self.throttle is not None else None
        if refusal is not None:
            metrics.login("throttled")
            return self._run(username, refusal.describe(), None, remote_host)
        started = self.reactor.seconds()
        try:
            result = self._evaluate(username, policy(), respond, remote_host)
        except BaseException:
            self._settle(username, key, remote_host, None)
            raise
        # Settled when PAM answers; a refusal still waits for the delay,
        # also a right password refused by the throttle (no faster answer).
        result.addBoth(self._settled, username, key, remote_host, secret)
        return result.addCallback(self._delay_denial, started)

    def _settled(self, outcome: AuthResult | Failure, username: str, key: str | None,
                 remote_host: str | None, secret: Callable[[], bytes | None]) -> AuthResult | Failure:
        if isinstance(outcome, Failure):
            self._settle(username, key, remote_host, None)
            return outcome
        return self._settle(username, key, remote_host, outcome, secret() if outcome.verdict is Verdict.DENIED else None)

    def _settle(self, username: str, key: str | None, remote_host: str | None,
                outcome: AuthResult | None, secret: bytes | None = None) -> AuthResult | None:
        """Tell the throttle (and the metrics) how a login went; a success
        that ran beside guesses which got its address or account blocked
        is refused after all."""
        if self.throttle is None:
            if outcome is not None:
                metrics.login(outcome.verdict.value)
            return outcome
        if outcome is None:
            self.throttle.end(remote_host, key, Outcome.VOID)
            return None
        kind = {Verdict.GRANTED: Outcome.GRANTED, Verdict.DENIED: Outcome.FAILED}.get(outcome.verdict, Outcome.VOID)
        if kind is Outcome.FAILED and secret is not None and self.throttle.repeats(remote_host, key, secret):
            log.info("login of {user!r} from {address} failed with the secret it failed with before on this connection"
                     " (another SSH method): one failure, counted once", user=loggable_user(username),
                     address=remote_host)
        refusal, started = self.throttle.end(remote_host, key, kind, secret)
        for blocked in started:
            log.warn("login throttling: blocking the {kind} of {user!r} from {address}", kind=blocked,
                     user=loggable_user(username), address=remote_host, reason="throttled", audit="login_throttled")
        if refusal is not None:
            log.warn("login throttling: the right password for {user!r} from {address} came while its {kind} "
                     "was blocked; refused", user=loggable_user(username), address=remote_host, kind=refusal.kind)
            metrics.login("throttled")
            return AuthResult(Verdict.DENIED, outcome.username, refusal.describe())
        metrics.login(outcome.verdict.value)
        return outcome

    def account(self, username: str, remote_host: str | None) -> defer.Deferred[AuthResult]:
        """Account checks only, for users who proved themselves with a key."""
        return self._run(username, policy_refusal(username, self.deny_users), None, remote_host)

    def _run(
        self, username: str, refusal: str | None, respond: Responder | None, remote_host: str | None
    ) -> defer.Deferred[AuthResult]:
        """``refusal`` comes from the reactor-side checks (throttle, policy);
        the account look-up and PAM run in the PAM thread pool."""
        started = self.reactor.seconds()
        return self._evaluate(username, refusal, respond, remote_host).addCallback(self._delay_denial, started)

    def _evaluate(self, username: str, refusal: str | None, respond: Responder | None,
                  remote_host: str | None) -> defer.Deferred[AuthResult]:
        """The verdict, undelayed: ``refusal`` or the PAM thread's."""
        if refusal is not None:
            return defer.succeed(AuthResult(Verdict.DENIED, username, refusal))
        result = threads.deferToThreadPool(self.reactor, self.pool, self._attempt, username, respond, remote_host)
        result.addErrback(lambda failure: AuthResult(Verdict.ERROR, username, failure.getErrorMessage()))
        return result

    def _attempt(self, username: str, respond: Responder | None, remote_host: str | None) -> AuthResult:
        """In the PAM thread: the account look-up, then the PAM transaction.

        A gateway out of open files gets "not found" from NSS and "Module
        is unknown" or "Authentication failure" from PAM whatever the
        password: such a verdict is a temporary error (the throttle does
        not count it, the user is told to try again), never a denial."""
        try:
            refusal = account_refusal(username)
        except AccountsUnavailable as error:
            return AuthResult(Verdict.ERROR, username, f"the account could not be looked up: {error.strerror}",
                              temporary=True)
        if refusal is not None:
            return AuthResult(Verdict.DENIED, username, refusal)
        try:
            result = self._verdict(username, *self._transaction(self.service, username, respond, remote_host))
        except OSError as error:  # pam_start failed: its configuration or modules could not be read
            if short_of_files(PAM_HEADROOM):
                return _out_of_files(username, str(error))
            raise
        if not result.granted and short_of_files(PAM_HEADROOM):
            return _out_of_files(username, result.reason, result.code)
        return result

    @staticmethod
    def _verdict(username: str, code: int, message: str) -> AuthResult:
        if code == PAM_SUCCESS:
            return AuthResult(Verdict.GRANTED, username, "")
        return AuthResult(Verdict.DENIED, username, f"PAM: {message} ({code})", code)

    def _delay_denial(self, result: AuthResult, started: float) -> defer.Deferred[AuthResult] | AuthResult:
        if result.granted:
            return result
        remaining = self.failed_login_delay - (self.reactor.seconds() - started)
        if remaining <= 0:
            return result
        return task.deferLater(self.reactor, remaining, lambda: result)

