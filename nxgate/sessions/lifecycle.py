"""The session life cycle: what each operation may do in each state, and
how background work is watched.

Two written tables drive a session.  :data:`nxgate.session.model.TRANSITIONS`
says where the agent's own events (its log lines) take it.
:data:`OPERATIONS` says what a request from outside (restore, suspend,
terminate, and the gateway's own "listen again") does in each live state,
with every refusal written out, so no (operation, state) pair is decided by
an ``if`` chain nobody reads as a whole; a test checks the table is full.

Serialisation.  Restore, suspend, start (from registration until ready)
and listen-again hold the session's ``DeferredLock`` and look the state up
again once they hold it.  Terminate never queues behind them: it pre-empts
(the session may hang, which is why it is being ended), and the waiting
operation's waiters fail with :class:`SessionEnded`, which each turns into
its own clean failure.  The internal end paths (agent exit, expiry, the
connect timeout, a stolen port) use the same unlocked terminate.

Fire-and-forget work (an end triggered by an agent event, a program start
after the first attach, ...) goes through :func:`background`, so a failure
is logged with the session it belongs to instead of vanishing in an
unreferenced Deferred.
"""

from __future__ import annotations

import enum
from collections.abc import Coroutine
from typing import Any

from twisted.internet import defer
from twisted.logger import Logger

from nxgate.session.model import State

log = Logger(namespace="nxgate.session")


class SessionEnded(Exception):
    """The session ended while an operation waited for it."""


class WaitTimeout(Exception):
    """The session did not reach a state in time; the text says which."""


class Op(str, enum.Enum):
    RESTORE = "restore"
    SUSPEND = "suspend"
    TERMINATE = "terminate"
    LISTEN_AGAIN = "listen_again"  # a resumed agent that suspended itself before its client came


class Action(str, enum.Enum):
    RESUME = "resume"                                  # SIGHUP until it listens, with a fresh cookie
    WAIT_SUSPENDED_THEN_RESUME = "wait_then_resume"    # a suspend is under way: let it finish first
    TAKE_OVER = "take_over"                            # attached elsewhere: suspend it there, then resume
    TAKE_OVER_IF_ATTACHED = "take_over_if_attached"    # TAKE_OVER once a client was ever attached, else REFUSE
    SIGHUP_AND_WAIT = "sighup_and_wait"                # suspend: SIGHUP, wait for SUSPENDED
    NOTHING = "nothing"                                # already where the operation leads
    TERMINATE = "terminate"                            # SIGTERM, again, then SIGKILL
    REFUSE = "refuse"                                  # wrong state: the caller hears which


L = State
#: What each operation does in each live state.  Ended states are not
#: listed: an ended session is not found by any operation.
OPERATIONS: dict[Op, dict[State, Action]] = {
    Op.RESTORE: {
        L.SUSPENDED: Action.RESUME,
        L.SUSPENDING: Action.WAIT_SUSPENDED_THEN_RESUME,
        # A session that never had a client is still on its way to its
        # first one: taking it over would steal a start in progress.
        L.RUNNING: Action.TAKE_OVER_IF_ATTACHED,
        L.WAITING: Action.TAKE_OVER_IF_ATTACHED,
        L.RESUMING: Action.TAKE_OVER_IF_ATTACHED,
        L.CREATED: Action.REFUSE,
        L.STARTING: Action.REFUSE,
        L.TERMINATING: Action.REFUSE,
    },
    Op.SUSPEND: {
        L.RUNNING: Action.SIGHUP_AND_WAIT,
        L.SUSPENDED: Action.NOTHING,
        L.CREATED: Action.REFUSE,
        L.STARTING: Action.REFUSE,
        L.WAITING: Action.REFUSE,
        L.SUSPENDING: Action.REFUSE,
        L.RESUMING: Action.REFUSE,
        L.TERMINATING: Action.REFUSE,
    },
    Op.TERMINATE: {state: Action.TERMINATE for state in State if state.live},
    Op.LISTEN_AGAIN: {
        # Only while the client it was resumed for may still come (the caller checks the timer).
        L.SUSPENDED: Action.RESUME,
        L.CREATED: Action.NOTHING,
        L.STARTING: Action.NOTHING,
        L.WAITING: Action.NOTHING,
        L.RUNNING: Action.NOTHING,
        L.SUSPENDING: Action.NOTHING,
        L.RESUMING: Action.NOTHING,
        L.TERMINATING: Action.NOTHING,
    },
}


def action(op: Op, state: State, ever_attached: bool = False) -> Action:
    """What ``op`` does to a session in ``state`` (conditional entries resolved)."""
    chosen = OPERATIONS[op][state]
    if chosen is Action.TAKE_OVER_IF_ATTACHED:
        return Action.TAKE_OVER if ever_attached else Action.REFUSE
    return chosen


class Background:
    """Fire-and-forget work, each with an errback that logs.

    The Deferreds still running are kept, so stopping can see (and tests
    can check) what is in flight."""

    def __init__(self) -> None:
        self.running: set[defer.Deferred[Any]] = set()

    def __call__(self, work: Coroutine[Any, Any, Any], what: str, session_id: str | None = None) -> defer.Deferred[Any]:
        deferred = defer.ensureDeferred(work)
        if deferred.called:
            return deferred.addErrback(self._failed, what, session_id)
        self.running.add(deferred)

        def done(result: Any) -> Any:
            self.running.discard(deferred)
            return result

        return deferred.addBoth(done).addErrback(self._failed, what, session_id)

    @staticmethod
    def _failed(failure: Any, what: str, session_id: str | None) -> None:
        log.failure("session {id}: {what} failed", failure, id=session_id or "-", what=what)
