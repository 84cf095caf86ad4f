"""What became of a session whose NX stream ended from elsewhere.

The stream does not say: nxproxy logs the same lines whether the session
was suspended, terminated or taken over by another client, and the server
just closes the channel.  So the client asks, as a user would with
``--list``: a second connection lists the user's sessions.  Not listed:
terminated (or its desktop ended); Running: another client took it over;
Suspended: suspended elsewhere (``--suspend``, the portal, D-Bus, an
administrator), unless it runs again a moment later: a client that takes a
session over has it suspended first.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from typing import Any, Protocol

from twisted.internet import defer, task

from nxgate.protocols.nx.listing import ParsedRow

STATUS_TIMEOUT = 20.0  # for one listing
TAKEOVER_CHECK = 0.5  # a suspended session is listed again after this: taken over?
_PROGRAM = re.compile(r"^[\w-]+: ")


class Listing(Protocol):
    """One ``--list`` run on a connection of its own (a ClientRun)."""

    listed: tuple[ParsedRow, ...] | None

    def start(self) -> defer.Deferred[int]: ...

    def finish(self, code: int) -> None: ...


def fate_words(session_id: str, row: ParsedRow | None, problem: str | None, ended_by: str) -> str:
    """What became of a session whose stream ``ended_by`` closed, from its
    row in a fresh listing (None: not listed) or why the listing failed."""
    if problem is not None:
        return (f"{ended_by} closed the connection (asking the server what became of the session failed: "
                f"{problem}; --list shows it)")
    if row is None:
        return "it was terminated (it is no longer on the server)"
    if row.status == "Suspended":
        return f"it was suspended and stays on the server (--resume {session_id} attaches to it again)"
    return "another client took it over (it runs on, attached there)"


class FateQuestion:
    """Asks the server what became of ``session_id``; ``new_listing(errors)``
    makes a listing run whose complaints go to ``errors``."""

    def __init__(self, reactor: Any, new_listing: Callable[[io.StringIO], Listing], session_id: str,
                 ended_by: str) -> None:
        self.reactor = reactor
        self.new_listing = new_listing
        self.session_id = session_id
        self.ended_by = ended_by
        self._listing: Listing | None = None
        self._wait: defer.Deferred[None] | None = None

    async def ask(self) -> str:
        row, problem = await self._row()
        if row is not None and row.status == "Suspended":
            self._wait = task.deferLater(self.reactor, TAKEOVER_CHECK, lambda: None)
            try:
                await self._wait
                again, problem_again = await self._row()
                if problem_again is None:
                    row = again
            except defer.CancelledError:
                pass  # interrupted: what we know will do
            self._wait = None
        return fate_words(self.session_id, row, problem, self.ended_by)

    def cancel(self) -> bool:
        """Stop asking (Ctrl-C); False when nothing was under way."""
        if self._listing is not None:
            self._listing.finish(1)
            return True
        if self._wait is not None:
            self._wait.cancel()
            return True
        return False

    async def _row(self) -> tuple[ParsedRow | None, str | None]:
        """The session's row in a fresh listing (None if it is not there),
        or None and why the listing failed."""
        errors = io.StringIO()
        listing = self._listing = self.new_listing(errors)
        timer = self.reactor.callLater(STATUS_TIMEOUT, listing.finish, 1)
        try:
            code = await listing.start()
        finally:
            self._listing = None
            if timer.active():
                timer.cancel()
        if code != 0 or listing.listed is None:
            said = errors.getvalue().strip().splitlines()
            return None, _PROGRAM.sub("", said[-1]) if said else "interrupted, or no answer in time"
        return next((row for row in listing.listed if row.session_id == self.session_id), None), None
