"""Housekeeping: what happens to sessions by the clock, not by request.

Once a minute: long-suspended sessions expire, unknown sessions whose agent
ended are forgotten, and records of sessions ended longer than the history
keeps them are pruned (with their logs).  Periodically, the store is backed
up, except while agents run that the store does not know: the old backup
may be the one copy that still knows them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from twisted.application import service
from twisted.internet import defer
from twisted.logger import Logger

from nxgate.config import SessionsSection
from nxgate.loops import SteadyLoop
from nxgate.node.supervisor import AgentSupervisor
from nxgate.node.files import StateLayout
from nxgate.vocabulary.model import Session, State
from nxgate.store.errors import StoreError
from nxgate.store.interface import SessionStore

log = Logger()


class Housekeeping(service.Service):
    def __init__(self, clock: Any, settings: Callable[[], SessionsSection], store: SessionStore,
                 layout: StateLayout, supervisor: AgentSupervisor, sessions: Callable[[], Iterable[Session]],
                 terminate: Callable[[str, str], Coroutine[Any, Any, None]],
                 background: Callable[..., defer.Deferred[Any]], node: Callable[[], str] = lambda: "") -> None:
        """``node``: this cluster member's name ("" on a single box): on a
        shared store it prunes only its own rows (their files are here)."""
        self.clock = clock
        self.node = node
        self.settings = settings
        self.store = store
        self.layout = layout
        self.supervisor = supervisor
        self.sessions = sessions
        self.terminate = terminate
        self.background = background
        self._housekeeping = SteadyLoop(self.run, clock, "housekeeping")
        self._backup = SteadyLoop(self.backup, clock, "the session store's backup")

    def startService(self) -> None:
        super().startService()
        self._housekeeping.start(60, now=False)
        if self.settings().store_backup_interval > 0:
            # Not now: a store that lost its rows must not replace a good backup at once.
            self._backup.start(self.settings().store_backup_interval, now=False)

    def stopService(self) -> None:
        super().stopService()
        for loop in (self._housekeeping, self._backup):
            loop.stop()

    def run(self) -> defer.Deferred[None]:
        """Expire long-suspended sessions, forget ended unknown ones, prune old records."""
        now = self.clock.seconds()
        hours = self.settings().expire_suspended_after
        if hours > 0:
            for session in list(self.sessions()):
                # One started for a later client that never came is as good as suspended.
                waits = session.state is State.SUSPENDED or (session.state is State.WAITING and session.for_later)
                if waits and now - session.changed > hours * 3600:
                    log.info("session {id} of {user} was suspended too long; ending it", id=session.id,
                             user=session.user, audit="session_expire")
                    self.background(self.terminate(session.id, "suspended too long"), "expiring it", session.id)
        self.background(self.supervisor.forget_orphans(), "forgetting ended unknown sessions")
        return self.background(self._prune(now), "pruning the session history")

    async def _prune(self, now: float) -> None:
        try:
            old = await self.store.ended_before(now - self.settings().history_days * 86400, node=self.node() or None)
            for session in old:
                agent_files = self.layout.agent_files(session.id)
                for path in (agent_files.log, agent_files.app_log):
                    try:
                        os.unlink(path)
                    except FileNotFoundError:
                        pass
            await self.store.delete([session.id for session in old])
        except StoreError as error:
            log.warn("housekeeping of the session store postponed: {error}", error=str(error))

    def backup(self) -> defer.Deferred[None]:
        """Copy the store to its backup (a failure waits for the next period)."""
        return self.background(self._backup_now(), "backing up the session store")

    async def _backup_now(self) -> None:
        if self.supervisor.orphans:
            log.warn("session store not backed up: it does not know {count} running session(s), and "
                     "{path} may", count=len(self.supervisor.orphans), path=self.store.backup_path)
            return
        try:
            path = await self.store.backup()
        except (StoreError, OSError) as error:
            log.warn("the session store could not be backed up: {error}", error=str(error))
            return
        log.debug("session store backed up to {path}", path=path)
