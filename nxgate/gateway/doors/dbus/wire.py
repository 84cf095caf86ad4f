"""What the D-Bus door says on the bus, as pure functions of the session vocabulary.

Names, the error name of each refusal kind, a session as an ``a{sv}`` dict,
and which signal a state change is.  No bus and no Twisted here: the door
(:mod:`nxgate.gateway.doors.dbus.door`) and the ``nxgate-session`` command share it.
"""

from __future__ import annotations

from typing import Any

from nxgate.vocabulary.errors import ErrorKind, SessionError
from nxgate.vocabulary.results import SessionEvent, SessionView, State

BUS_NAME = "org.nxgate.Gateway1"
OBJECT_PATH = "/org/nxgate/Gateway1"
INTERFACE = "org.nxgate.Gateway1"
ERROR_PREFIX = "org.nxgate.Error."

#: In a session's environment: its id (see nxgate.host.processes).
SESSION_ID_VARIABLE = "NXGATE_SESSION_ID"
#: In a session's environment when the gateway's door is on a bus other than
#: the default system bus: that bus's address, for ``nxgate-session`` (see
#: nxgate.node.environment, which sets it).
BUS_VARIABLE = "NXGATE_DBUS_ADDRESS"


def error_name(kind: ErrorKind) -> str:
    """``org.nxgate.Error.NotFound`` for NOT_FOUND, and so on for every kind.

    Unlike the NX door and the admin socket, NOT_YOURS keeps its own name
    (``NotYours``): desktop tools tell "gone" from "not
    yours".  Ids are 128 random bits, so this tells nothing to someone who
    does not already hold the id."""
    return ERROR_PREFIX + "".join(part.capitalize() for part in kind.value.split("_"))


def error_message(error: SessionError) -> str:
    """The words that go with :func:`error_name`.  The session manager gives
    NOT_YOURS the words of NOT_FOUND ("Could not find session"), which the NX
    door needs; here the name already says NotYours, so the words say it too."""
    if error.kind is ErrorKind.NOT_YOURS:
        return f"Session {error.session_id} belongs to another user." if error.session_id \
            else "The session belongs to another user."
    return error.message


def describe(view: SessionView) -> dict[str, Any]:
    """A session as ``a{sv}``: strings, ints, bools and doubles only (no cookie:
    a view never holds one)."""
    return {
        "id": view.id, "full_id": view.full_id, "user": view.user, "type": view.type, "name": view.name,
        "state": view.shown_state, "lost": bool(view.lost), "display": view.display, "node": view.node,
        "client_address": view.client_address, "created": float(view.created), "changed": float(view.changed),
        "geometry": view.geometry, "attached_before": bool(view.attached_before), "encrypted": bool(view.encrypted),
        "agent_pid": view.agent_pid, "failure": view.failure,
    }


#: Every signal the interface has: name -> D-Bus signature of its arguments.
SIGNALS: dict[str, str] = {
    "StateChanged": "sss",        # id, old state ("" when created), new state: every change
    "SessionCreated": "sss",      # id, user, type
    "SessionRunning": "ss",       # id, client address: the first client attached
    "SessionSuspended": "s",      # id
    "SessionResumed": "ss",       # id, client address it was resumed from
    "SessionTerminated": "ss",    # id, reason
    "SessionFailed": "ss",        # id, reason
}


def signals_for(event: SessionEvent) -> list[tuple[str, list[Any]]]:
    """The signals (name, arguments) one state change gives, the generic
    StateChanged first."""
    view, new = event.view, event.new
    found: list[tuple[str, list[Any]]] = [("StateChanged", [view.id, event.old.value if event.old else "", new.value])]
    if event.old is None:
        found.append(("SessionCreated", [view.id, view.user, view.type]))
    elif new is State.RUNNING:
        found.append(("SessionResumed" if event.attached_before else "SessionRunning", [view.id, view.client_address]))
    elif new is State.SUSPENDED:
        found.append(("SessionSuspended", [view.id]))
    elif new is State.TERMINATED:
        found.append(("SessionTerminated", [view.id, view.failure]))
    elif new is State.FAILED:
        found.append(("SessionFailed", [view.id, view.failure]))
    return found
