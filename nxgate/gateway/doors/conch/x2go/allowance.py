"""How much of the gateway one user's X2Go file pushes may take (pure, with a clock).

X2Go's clients push a handful of small files when a session starts: the
PulseAudio cookie, the sshfs key (python-x2go over SFTP, one file at a time;
x2goclient with ``scp -t``).  A logged-in user could otherwise hold SFTP
handles without end (each one memory, and once a descriptor: every file of
the gateway) or write files below ``~/.x2go`` as fast as the link allows.
The caps are far above what the clients do and far below what hurts:

* SFTP handles open at once: :data:`HANDLES_PER_CHANNEL` on one channel,
  :data:`HANDLES_PER_USER` over all of a user's connections;
* files pushed: :data:`FILES_PER_PUSH` and :data:`BYTES_PER_PUSH` on one
  channel (one scp, one SFTP subsystem), :data:`FILES_PER_WINDOW` and
  :data:`BYTES_PER_WINDOW` per user in any :data:`WINDOW` seconds.

The files are written as the user besides (their disk quota applies).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

HANDLES_PER_CHANNEL = 8
HANDLES_PER_USER = 32
FILES_PER_PUSH = 16
BYTES_PER_PUSH = 1024 * 1024
FILES_PER_WINDOW = 64
BYTES_PER_WINDOW = 4 * 1024 * 1024
WINDOW = 600.0


@dataclass
class PushCount:
    """What one channel (one scp, one SFTP subsystem) has pushed so far."""

    files: int = 0
    bytes: int = 0

    def refusal(self, size: int) -> str | None:
        """Why one more file of ``size`` bytes is refused on this channel, or
        None (then it is counted)."""
        if self.files >= FILES_PER_PUSH:
            return f"too many files in one copy (at most {FILES_PER_PUSH})"
        if self.bytes + size > BYTES_PER_PUSH:
            return f"too many bytes in one copy (at most {BYTES_PER_PUSH // 1024} KiB)"
        self.files += 1
        self.bytes += size
        return None


@dataclass
class _Ledger:
    handles: int = 0
    pushed: deque[tuple[float, int]] = field(default_factory=deque)  # (when, size), oldest first


class Allowance:
    """Per user: SFTP handles open now, files pushed in the last window."""

    def __init__(self, now: Callable[[], float]) -> None:
        self.now = now
        self._users: dict[str, _Ledger] = {}

    def take_handle(self, user: str) -> bool:
        ledger = self._users.setdefault(user, _Ledger())
        if ledger.handles >= HANDLES_PER_USER:
            self._tidy(user, ledger)
            return False
        ledger.handles += 1
        return True

    def give_handle(self, user: str) -> None:
        ledger = self._users.get(user)
        if ledger is None or ledger.handles == 0:
            return
        ledger.handles -= 1
        self._tidy(user, ledger)

    def handles(self, user: str) -> int:
        ledger = self._users.get(user)
        return ledger.handles if ledger is not None else 0

    def take_push(self, user: str, size: int) -> str | None:
        """Why a file of ``size`` bytes may not be pushed now, or None (then
        it is counted against the user's window)."""
        ledger = self._users.setdefault(user, _Ledger())
        now = self.now()
        self._forget_old(ledger)
        minutes = f"{WINDOW / 60:g} minutes"
        refusal = None
        if len(ledger.pushed) >= FILES_PER_WINDOW:
            refusal = f"too many files copied (at most {FILES_PER_WINDOW} in {minutes})"
        elif sum(pushed for _, pushed in ledger.pushed) + size > BYTES_PER_WINDOW:
            refusal = f"too many bytes copied (at most {BYTES_PER_WINDOW // (1024 * 1024)} MiB in {minutes})"
        if refusal is None:
            ledger.pushed.append((now, size))
        self._tidy(user, ledger)
        return refusal

    def _forget_old(self, ledger: _Ledger) -> None:
        since = self.now() - WINDOW
        while ledger.pushed and ledger.pushed[0][0] <= since:
            ledger.pushed.popleft()

    def _tidy(self, user: str, ledger: _Ledger) -> None:
        """No entry for a user who holds nothing and pushed nothing lately
        (the table stays as small as the users at work)."""
        self._forget_old(ledger)
        if ledger.handles == 0 and not ledger.pushed:
            self._users.pop(user, None)

    def __len__(self) -> int:
        return len(self._users)
