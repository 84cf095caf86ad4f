"""Who may open an SSH connection to the gateway, and as whom.

Two kinds of SSH logins exist:

* the shared ``nx`` account with a key from its authorized-keys file (the
  well-known NoMachine key by default): the NX ``login`` command then names
  and authenticates the real user;
* a Unix user logging in as himself ("legacy-free"): with his password or a
  keyboard-interactive PAM conversation, or with a key from his own
  ``~/.ssh/authorized_keys``; the NX shell then starts authenticated.

The checkers return a :class:`Principal`.  They read the client's address
from the credentials (set by :class:`~nxgate.gateway.doors.conch.server.NXUserAuthServer`) to
honour ``from=`` key options and to give PAM its ``PAM_RHOST``, and the
connection's :class:`RepeatedSecrets`, so that one wrong password tried with
two SSH methods (x2goclient: keyboard-interactive, then password) is one
failure for the login throttle.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import pwd
import secrets
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from twisted.conch.error import ValidPublicKey
from twisted.conch.ssh import keys
from twisted.cred.checkers import ICredentialsChecker
from twisted.cred.credentials import ISSHPrivateKey, IUsernamePassword
from twisted.cred.error import UnauthorizedLogin
from twisted.internet import defer, threads
from twisted.logger import Logger
from zope.interface import Interface, implementer

from nxgate.gateway.auth.pam import MAX_PASSWORD_BYTES, AuthResult, Authenticator, Prompt, loggable_user
from nxgate.gateway.doors.conch import authorized_keys
from nxgate.gateway.doors.conch.authorized_keys import AuthorizedKey

log = Logger()

MAX_KEY_FILE_BYTES = 1 << 20

# The public half of the NoMachine key that every NX 3 client ships.
NOMACHINE_PUBLIC_KEY = (
    "ssh-dss AAAAB3NzaC1kc3MAAACBAJe/0DNBePG9dYLWq7cJ0SqyRf1iiZN/IbzrmBvgPTZnBa5FT/0Lcj39sRYt1paAlhchwUmwwIiSZaO"
    "N5JnJOZ6jKkjWIuJ9MdTGfdvtY1aLwDMpxUVoGwEaKWOyin02IPWYSkDQb6cceuG9NfPulS9iuytdx0zIzqvGqfvudtufAAAAFQCwosRXR2Q"
    "A8OSgFWSO6+kGrRJKiwAAAIEAjgvVNAYWSrnFD+cghyJbyx60AAjKtxZ0r/Pn9k94Qt2rvQoMnGgt/zU0v/y4hzg+g3JNEmO1PdHh/wDPVO"
    "xlZ6Hb5F4IQnENaAZ9uTZiFGqhBO1c8Wwjiq/MFZy3jZaidarLJvVs8EeT4mZcWxwm7nIVD4lRU2wQ2lj4aTPcepMAAACANlgcCuA4wrC+3C"
    "ic9CFkqiwO/Rn1vk8dvGuEQqFJ6f6LVfPfRTfaQU7TGVLk2CzY4dasrwxJ1f6FsT8DHTNGnxELPKRuLstGrFY/PR7KeafeFZDf+fJ3mbX5nx"
    "rld3wi5titTnX+8s4IKv29HJguPvOK/SI7cjzA+SqNfD7qEo8= nomachine-well-known"
)


@dataclass(frozen=True)
class Principal:
    """An authenticated SSH login.

    ``unix_user`` is None for the shared nx account (the NX ``login`` command
    authenticates the real user); otherwise the NX shell starts logged in.
    """

    ssh_user: str
    unix_user: str | None
    method: str


class IKeyboardInteractive(Interface):
    """Credentials for an SSH keyboard-interactive (RFC 4256) PAM conversation."""


@implementer(IKeyboardInteractive)
@dataclass
class KeyboardInteractive:
    username: bytes
    ask: Callable[[Sequence[Prompt]], defer.Deferred[list[str]]]
    remote_address: str | None = None


class RepeatedSecrets:
    """One SSH connection's key for the digests of the secrets it tries.

    The digest of a user and a secret (a password, or the answers of a
    keyboard-interactive conversation) under a key of this connection alone:
    the throttle sees that a failure repeats one it counted, and nothing
    else -- not the secret, and not the same secret on another connection."""

    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)

    def digest(self, user: str, answers: Sequence[str]) -> bytes:
        material = "\0".join([user, *answers]).encode("utf-8", "surrogateescape")
        return hmac.new(self._key, material, hashlib.sha256).digest()


def _digest(credentials: Any, user: str, answers: Sequence[str]) -> bytes | None:
    repeated = getattr(credentials, "repeated_secrets", None)
    return repeated.digest(user, answers) if isinstance(repeated, RepeatedSecrets) and answers else None


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def load_nx_keys(path: str) -> list[AuthorizedKey]:
    """The nx account's keys: from ``path``, or the NoMachine key if empty."""
    if not path:
        parsed, _ = authorized_keys.parse([NOMACHINE_PUBLIC_KEY])
        return parsed
    with open(path, encoding="utf-8") as handle:
        parsed, problems = authorized_keys.parse(handle.read().splitlines())
    for problem in problems:
        log.warn("{path}: {problem}", path=path, problem=problem)
    if not parsed:
        log.warn("{path} holds no usable key: nx logins are impossible", path=path)
    return parsed


def _safe_owner(st: os.stat_result, uid: int) -> bool:
    return st.st_uid in (0, uid) and not st.st_mode & 0o022


def read_user_keys(username: str) -> list[AuthorizedKey]:
    """A user's own ``~/.ssh/authorized_keys``, with OpenSSH's StrictModes.

    The file, ``~/.ssh`` and the home directory must belong to the user (or
    root) and not be writable by group or others; otherwise nobody else
    could have planted a key there, and we ignore the file.
    """
    try:
        entry = pwd.getpwnam(username)
    except (KeyError, UnicodeEncodeError):
        return []
    home = entry.pw_dir
    ssh_dir = os.path.join(home, ".ssh")
    result: list[AuthorizedKey] = []
    for name in ("authorized_keys", "authorized_keys2"):
        path = os.path.join(ssh_dir, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            continue  # the usual case: no such file, nothing to say
        except OSError as error:
            # A link (ELOOP), a permission problem: the user wonders why his
            # key is not taken, the log must say.
            log.warn("ignoring {path}: {error}", path=path, error=error.strerror or str(error))
            continue
        with os.fdopen(fd, "rb") as handle:
            st = os.fstat(handle.fileno())
            if not stat.S_ISREG(st.st_mode):
                log.warn("ignoring {path}: not a regular file", path=path)
                continue
            unsafe = [p for p in (home, ssh_dir) if not _safe_owner(os.stat(p), entry.pw_uid)]
            if not _safe_owner(st, entry.pw_uid) or unsafe:
                log.warn("ignoring {path}: bad ownership or modes", path=path)
                continue
            data = handle.read(MAX_KEY_FILE_BYTES)
        parsed, problems = authorized_keys.parse(data.decode("utf-8", "replace").splitlines())
        for problem in problems:
            log.debug("{path}: {problem}", path=path, problem=problem)
        result.extend(parsed)
    return result


@implementer(ICredentialsChecker)
class _Checker:
    """A cred checker whose check is a coroutine."""

    credentialInterfaces: tuple[Any, ...] = ()
    nx_user = "nx"

    def requestAvatarId(self, credentials: Any) -> defer.Deferred[Principal]:
        return defer.ensureDeferred(self._check(credentials))

    async def _check(self, credentials: Any) -> Principal:
        raise NotImplementedError


class PublicKeyChecker(_Checker):
    """Keys for the nx account and, if enabled, users' own keys."""

    credentialInterfaces = (ISSHPrivateKey,)

    def __init__(
        self,
        reactor: Any,
        nx_user: str,
        nx_keys: list[AuthorizedKey],
        authenticator: Authenticator | None,
        user_keys: Callable[[str], list[AuthorizedKey]] = read_user_keys,
    ) -> None:
        self.reactor = reactor
        self.nx_user = nx_user
        self.nx_keys = nx_keys
        self.authenticator = authenticator
        self.user_keys = user_keys

    async def _check(self, credentials: Any) -> Principal:
        user = _text(credentials.username)
        address = getattr(credentials, "remote_address", None)
        if user == self.nx_user:
            candidates = self.nx_keys
        elif self.authenticator is not None:
            # Reading a home directory may block (NFS): not on the reactor.
            candidates = await threads.deferToThreadPool(
                self.reactor, self.authenticator.pool, self.user_keys, user
            )
        else:
            raise UnauthorizedLogin("user logins are disabled")
        match = self._find(candidates, credentials.blob)
        if match is None:
            raise UnauthorizedLogin("key not authorized")
        refusal = match.refusal(address)
        if refusal is not None:
            log.warn(
                "SSH key for {user!r} from {address} refused: {reason}",
                user=user, address=address, reason=refusal, audit="login_failed",
            )
            raise UnauthorizedLogin(refusal)
        if credentials.signature is None:
            raise ValidPublicKey()
        if not match.key.verify(credentials.signature, credentials.sigData):
            raise UnauthorizedLogin("bad signature")
        if user == self.nx_user:
            return Principal(user, None, "nx-key")
        assert self.authenticator is not None
        result: AuthResult = await self.authenticator.account(user, address)
        _require(result, address, "publickey")
        return Principal(user, user, "publickey")

    @staticmethod
    def _find(candidates: list[AuthorizedKey], blob: bytes) -> AuthorizedKey | None:
        try:
            offered = keys.Key.fromString(blob)
        except keys.BadKeyError:
            return None
        for candidate in candidates:
            if candidate.key == offered:
                return candidate
        return None


class PasswordChecker(_Checker):
    """SSH password logins of Unix users, through PAM (never for nx)."""

    credentialInterfaces = (IUsernamePassword,)

    def __init__(self, nx_user: str, authenticator: Authenticator) -> None:
        self.nx_user = nx_user
        self.authenticator = authenticator

    async def _check(self, credentials: Any) -> Principal:
        user = _text(credentials.username)
        address = getattr(credentials, "remote_address", None)
        if user == self.nx_user:
            raise UnauthorizedLogin("the nx account only takes its key")
        password = _text(credentials.password)
        result = await self.authenticator.password(user, password, address,
                                                   secret=lambda: _digest(credentials, user, [password]))
        _require(result, address, "password")
        return Principal(user, user, "password")


class KeyboardInteractiveChecker(_Checker):
    """SSH keyboard-interactive: PAM's prompts are relayed to the client."""

    credentialInterfaces = (IKeyboardInteractive,)

    def __init__(self, reactor: Any, nx_user: str, authenticator: Authenticator) -> None:
        self.reactor = reactor
        self.nx_user = nx_user
        self.authenticator = authenticator

    async def _check(self, credentials: KeyboardInteractive) -> Principal:
        user = _text(credentials.username)
        if user == self.nx_user:
            raise UnauthorizedLogin("the nx account only takes its key")

        given: list[str] = []

        def respond(prompts: Sequence[Prompt]) -> list[str]:
            # Runs in a PAM thread; waits for the client's answers.  An
            # answer longer than any password ends the conversation before
            # PAM looks at it (the SSH packet allows 256 kB).
            answers = threads.blockingCallFromThread(self.reactor, credentials.ask, prompts)
            if any(len(answer) > MAX_PASSWORD_BYTES for answer in answers):
                raise LookupError("an answer longer than any password")
            given.extend(answer for answer in answers if answer is not None)
            return answers

        # One hidden answer (pam_unix's "Password: ") digests as the password method's does.
        result = await self.authenticator.conversation(user, respond, credentials.remote_address,
                                                       secret=lambda: _digest(credentials, user, given))
        _require(result, credentials.remote_address, "keyboard-interactive")
        return Principal(user, user, "keyboard-interactive")


class LoginUnavailable(UnauthorizedLogin):
    """A login that could not be checked now (the gateway is out of open
    files): the client is told why, and it is no failed login."""


def _require(result: AuthResult, address: str | None, method: str) -> None:
    if result.granted:
        return
    if result.temporary:
        log.error("SSH login of user {user!r} from {address} ({method}) could not be checked: {reason}",
                  user=loggable_user(result.username), address=address, method=method, reason=result.reason)
        raise LoginUnavailable(result.client_note)
    log.warn(
        "SSH login failed for user {user!r} from {address} ({method}): {reason}",
        user=loggable_user(result.username), address=address, method=method, reason=result.reason,
        audit="login_failed",
    )
    raise UnauthorizedLogin(result.reason)
