"""The log and audit lines of a password login, the same for every door
(NX over SSH, the browser portal): fail2ban and the audit trail read them."""

from __future__ import annotations

from twisted.logger import Logger

from nxgate.gateway.auth.pam import AuthResult, Verdict, loggable_user


def log_refused(log: Logger, label: str, result: AuthResult, address: str, attempt: int) -> None:
    """A refused login (``login_failed`` in the audit log) or a PAM error."""
    if result.verdict is Verdict.ERROR:
        log.error(label + " login error for user {user!r} from {address}: {reason}",
                  user=loggable_user(result.username), address=address, reason=result.reason)
        return
    log.warn(label + " login failed for user {user!r} from {address}: {reason} (attempt {attempt})",
             user=loggable_user(result.username), address=address, reason=result.reason, attempt=attempt,
             audit="login_failed")


def log_granted(log: Logger, label: str, user: str, address: str, method: str) -> None:
    """A login (``login`` in the audit log)."""
    log.info(label + " login: user {user!r} from {address} ({method})", user=user, address=address, method=method,
             audit="login")
