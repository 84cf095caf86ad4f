"""How a session store fails, for every store behind
:class:`nxgate.store.interface.SessionStore` (SQLite today; other
databases later raise the same): callers handle these without knowing
which database is behind."""

from __future__ import annotations

import errno


class StoreError(Exception):
    """The store cannot do what was asked."""


class StoreUnavailable(StoreError):
    """A read or write failed for a reason that may pass (a full disk, an
    I/O error).  ``reason`` is fit for a client: it names the cause, not
    the file."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason} ({detail})")
        self.reason = reason
        self.detail = detail


class StoreCorrupt(StoreError):
    """The file is not a usable SQLite database; the message says what to do."""


STORAGE_FULL = "the server's storage is full"
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def storage_reason(error: BaseException) -> str:
    """Words for a client about a failure to write state (any layer)."""
    if isinstance(error, StoreUnavailable):
        return error.reason
    if isinstance(error, OSError) and error.errno in _FULL_ERRNOS:
        return STORAGE_FULL
    return str(error) or type(error).__name__
