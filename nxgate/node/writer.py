"""The ordered write-behind queue between the life cycle and the store.

Memory is authoritative for live sessions; the store follows it.  Each
change is queued (coalesced per session, the newest record kept, in the
order sessions last changed) and written one at a time, so the store sees
the changes in order whether it answers at once (SQLite) or later (a
server).  A write the store cannot take now (a full disk) stays queued and
is tried again every :data:`STORE_RETRY_SECONDS`, so sessions carry on and
end normally meanwhile and the store catches up without a restart once
space returns.  :meth:`StoreWriter.save` never raises.  The first record of
a session is different: :meth:`StoreWriter.insert_first` is awaited by the
start, which is refused when the store refuses it.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.logger import Logger

from nxgate.loops import SteadyLoop
from nxgate.vocabulary.model import Session
from nxgate.store.errors import StoreError, StoreUnavailable
from nxgate.store.interface import SessionStore

log = Logger()

#: How often writes the store refused (a full disk) are tried again.
STORE_RETRY_SECONDS = 5.0


class StoreWriter:
    def __init__(self, store: SessionStore, clock: Any) -> None:
        self.store = store
        #: Records not written yet, oldest change first (the store refused them, or they wait their turn).
        self.unsaved: dict[str, Session] = {}
        self._writing = False
        self._refused = False  # the store said it cannot be written now: wait for the retry
        self._retry = SteadyLoop(self._try_again, clock, "writing kept session changes")

    async def insert_first(self, session: Session, limits: tuple[int, int, int] | None = None) -> str | None:
        """Store a new session's first record (raises StoreError: the start is
        refused).  With ``limits`` (per user, per node, total: a cluster's) the
        store counts and inserts in one step; the limit that refused it, or None."""
        if limits is not None:
            return await self.store.admit(session, *limits)
        await self.store.insert(session)
        return None

    def save(self, session: Session) -> None:
        """Queue ``session``'s latest record; it is written in its turn."""
        self.unsaved.pop(session.id, None)
        self.unsaved[session.id] = session
        if not self._writing and not self._refused:
            self._drain()

    def flush(self) -> defer.Deferred[int]:
        """Try every queued record now, in order; how many were written."""
        self._refused = False
        return self._drain()

    def stop(self) -> None:
        if self._retry.running:
            self._retry.stop()

    def _try_again(self) -> defer.Deferred[int]:
        return self.flush()

    def _drain(self) -> defer.Deferred[int]:
        if self._writing:
            return defer.succeed(0)
        self._writing = True
        d = defer.ensureDeferred(self._write_queue())

        def done(result: Any) -> Any:
            self._writing = False
            return result

        return d.addBoth(done).addErrback(
            lambda failure: (log.failure("writing session changes to the store failed", failure), 0)[1])

    async def _write_queue(self) -> int:
        written = 0
        while self.unsaved:
            session_id, session = next(iter(self.unsaved.items()))
            try:
                await self._write(session)
            except StoreUnavailable as error:
                if not self._refused and not self._retry.running:
                    log.error("the session store cannot be written ({error}); session changes are kept in memory "
                              "and written when it can be (tried every {seconds:g} s)", error=str(error),
                              seconds=STORE_RETRY_SECONDS)
                    self._retry.start(STORE_RETRY_SECONDS, now=False)
                else:
                    log.debug("the session store still cannot be written: {error}", error=str(error))
                self._refused = True
                return written
            except StoreError as error:
                log.error("session {id}: the store refused its record: {error}", id=session_id, error=str(error))
            if self.unsaved.get(session_id) is session:  # else a newer record came meanwhile: its turn is later
                del self.unsaved[session_id]
            written += 1
        if self._retry.running:
            self._retry.stop()
            log.info("the session store can be written again: {count} kept session change(s) written",
                     count=written)
        return written

    async def _write(self, session: Session) -> None:
        try:
            await self.store.update(session)
        except StoreUnavailable:
            raise
        except StoreError:
            await self.store.insert(session)  # its row is gone: memory is authoritative
