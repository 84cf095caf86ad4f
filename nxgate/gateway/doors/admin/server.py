"""The admin socket: newline-delimited JSON requests from ``nxgate-admin``.

Only root may use it: the socket file is 0600 and the kernel's peer
credentials (SO_PEERCRED) are checked for every connection.  Every request
that changes something is in the audit log.
"""

from __future__ import annotations

import json
import time
from typing import Any

from twisted.internet import defer, protocol
from twisted.logger import Logger
from twisted.protocols.basic import LineOnlyReceiver

from nxgate import __version__
from nxgate.vocabulary.caller import Caller
from nxgate.vocabulary.errors import Kind, SessionError
from nxgate.vocabulary.results import MemberView, SessionView
from nxgate.gateway.auth.peercred import peer_uid
from nxgate.gateway.membership import no_links

log = Logger()

MAX_REQUEST = 65536

#: Who the admin socket acts as: root, on every user's sessions.
ADMIN = Caller(user="root", uid=0, gid=0, address="admin socket", door="admin", admin=True)


def describe(session: SessionView) -> dict[str, Any]:
    """A session as the admin sees it (a view never holds its cookie)."""
    return {
        "id": session.id, "user": session.user, "type": session.type, "name": session.name,
        "state": session.shown_state, "display": session.display, "node": session.node,
        "client_address": session.client_address, "since": _iso(session.created), "changed": _iso(session.changed),
        "agent_pid": session.agent_pid, "program_pid": session.program_pid, "geometry": session.geometry,
        "attached_before": session.attached_before, "failure": session.failure,
        **{key: session.options[key] for key in ("shadow", "remote") if key in session.options},
    }


def describe_member(member: MemberView, now: float) -> dict[str, Any]:
    """A cluster member as ``nxgate-admin nodes`` shows it."""
    return {
        "name": member.name, "address": member.address, "roles": list(member.roles), "state": member.state,
        "sessions": member.sessions, "load": member.load, "last_heartbeat": _iso(member.last_heartbeat),
        "seconds_since_heartbeat": round(max(0.0, now - member.last_heartbeat), 1), "drained": member.drained,
        "weight": member.weight, "cpus": member.cpus, "free_memory": member.free_memory,
        "up_since": _iso(member.started),
    }


def error_answer(error: SessionError, asked_for: str) -> dict[str, Any]:
    """The JSON answer for a refusal of the session service: its kind, and
    words for the admin (never NX wire text).  A session of someone else is
    no such thing to the admin either way: both say "no live session"."""
    if error.kind in (Kind.NOT_FOUND, Kind.NOT_YOURS):
        return {"ok": False, "error": f"no live session {asked_for}", "kind": Kind.NOT_FOUND.value}
    return {"ok": False, "error": error.message, "kind": error.kind.value}


def _iso(timestamp: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(timestamp))


class AdminProtocol(LineOnlyReceiver):
    delimiter = b"\n"
    MAX_LENGTH = MAX_REQUEST

    def __init__(self, gateway: Any) -> None:
        self.gateway = gateway

    def connectionMade(self) -> None:
        uid = peer_uid(self.transport)
        if uid != 0:
            log.warn("refused an admin connection from uid {uid}", uid=uid)
            self.transport.loseConnection()

    def lineReceived(self, line: bytes) -> None:
        d = defer.ensureDeferred(self._handle(line))
        d.addErrback(self._unexpected)
        d.addCallback(lambda response: self.sendLine(json.dumps(response).encode()))

    @staticmethod
    def _unexpected(failure: Any) -> dict[str, Any]:
        log.failure("admin request failed", failure)
        return {"ok": False, "error": "internal error (see the server log)", "kind": Kind.INTERNAL.value}

    async def _handle(self, line: bytes) -> dict[str, Any]:
        invalid = Kind.INVALID_REQUEST.value
        try:
            request = json.loads(line)
            command, args = request["command"], request.get("args", {})
        except (ValueError, KeyError, TypeError):
            return {"ok": False, "error": "bad request", "kind": invalid}
        handler = getattr(self, f"do_{command}", None) if isinstance(command, str) else None
        if handler is None:
            return {"ok": False, "error": f"unknown command {command!r}", "kind": invalid}
        try:
            return {"ok": True, "result": await handler(**args)}
        except SessionError as error:
            return error_answer(error, str(args.get("id", "")) if isinstance(args, dict) else "")
        except (KeyError, TypeError, ValueError) as error:
            return {"ok": False, "error": str(error), "kind": invalid}

    @staticmethod
    def _id(id: Any) -> str:
        """The bare id of an id or a full ``host-display-ID``."""
        return str(id).upper()[-32:]

    # ------------------------------------------------------------ commands
    async def do_status(self) -> dict[str, Any]:
        status = await self.gateway.api.status(ADMIN)
        # A cluster member answers with its member name (sessions carry it too).
        node = self.gateway.api.name or self.gateway.config.server_name
        return {"version": __version__, "node": node, "draining": status.draining,
                "sessions": status.live, "config": self.gateway.config.source,
                "up_since": _iso(self.gateway.started),
                # Writes the store refused (a full disk), retried until it takes them.
                "unsaved_changes": status.unsaved_changes,
                # Agents running in session directories the store did not know at start.
                "unknown_sessions": [{"id": u.id, "user": u.user, "display": u.display, "pid": u.agent_pid}
                                     for u in status.unknown_sessions],
                # Displays held by others (X locks, abstract X sockets): new sessions pass them over.
                "held_displays": [{"display": h.display, "users": list(h.users), "holds": list(h.holds)}
                                  for h in status.held_displays],
                # Issue 26: connections not authenticated yet, over every door, and the descriptors.
                **_preauth_status(self.gateway)}

    async def do_sessions(self) -> list[dict[str, Any]]:
        listing = await self.gateway.api.list(ADMIN)
        return [describe(view) for view in listing.sessions]

    async def do_show(self, id: str) -> dict[str, Any]:
        return describe(await self.gateway.api.show(ADMIN, self._id(id)))

    async def do_terminate(self, id: str) -> dict[str, Any]:
        sessions = self.gateway.api
        session = await sessions.show(ADMIN, self._id(id))
        log.info("admin terminates session {id} of {user}", id=session.id, user=session.user,
                 command="terminate", admin="root", audit="admin_action")
        await sessions.terminate(ADMIN, session.id, "terminated by the admin")
        return {"id": session.id, "state": "terminated"}

    async def do_suspend(self, id: str) -> dict[str, Any]:
        sessions = self.gateway.api
        session = await sessions.show(ADMIN, self._id(id))
        log.info("admin suspends session {id} of {user}", id=session.id, user=session.user,
                 command="suspend", admin="root", audit="admin_action")
        view = await sessions.suspend(ADMIN, session.id)
        return {"id": view.id, "state": view.state.value}

    async def do_drain(self, on: bool, node: str | None = None) -> dict[str, Any]:
        if node is not None:
            return await self._drain_member(str(node), bool(on))
        on = await self.gateway.api.set_draining(ADMIN, bool(on))
        log.info("admin turns draining {state}: {what}", state="on" if on else "off",
                 what="no new sessions" if on else "new sessions welcome", command=f"drain {'on' if on else 'off'}",
                 admin="root", audit="admin_action")
        return {"draining": bool(on)}

    async def _drain_member(self, node: str, on: bool) -> dict[str, Any]:
        """A cluster member drained (no new sessions placed there) in the shared store."""
        if not await self.gateway.membership.drain(node, on):
            raise ValueError(f"no cluster member {node!r} (nxgate-admin nodes lists them)")
        log.info("admin turns draining of member {node} {state}", node=node, state="on" if on else "off",
                 command=f"drain --node {node}{'' if on else ' --off'}", admin="root", audit="admin_action")
        return {"node": node, "drained": on}

    async def do_nodes(self) -> list[dict[str, Any]]:
        """The members, each node's state as this gateway's link to it has it; a single box: its one node."""
        members = await self.gateway.membership.views(getattr(self.gateway.api, "links", no_links))
        now = time.time()
        return [describe_member(member, now) for member in members]

    async def do_reload(self) -> dict[str, Any]:
        result = await self.gateway.reload()
        log.info("admin reloads the configuration: {outcome}", outcome="applied" if result["ok"] else "refused",
                 command="reload", admin="root", reason="; ".join(result.get("problems", [])),
                 audit="admin_action")
        if not result["ok"]:
            raise ValueError("the configuration has problems; the running one stays:\n  "
                             + "\n  ".join(result["problems"]))
        return result


class AdminFactory(protocol.Factory):
    noisy = False

    def __init__(self, gateway: Any) -> None:
        self.gateway = gateway

    def buildProtocol(self, addr: Any) -> AdminProtocol:
        return AdminProtocol(self.gateway)


def _preauth_status(gateway: Any) -> dict[str, Any]:
    """``nxgate-admin status``'s lines about the doors' guard (nxgate.gateway.doors.guard): the
    process's real count of open files (``/proc/self/fd``; the limit itself when none is left to
    list them) of its limit now (``getrlimit``, as ``prlimit`` may have changed it; a limit below twice
    the reserve leaves users' file work none, not a negative number), how often users'
    file work was refused to keep the reserve, and the users' authenticated connections."""
    guard = getattr(gateway, "guard", None)
    if guard is None:
        return {}
    now = guard.status()
    return {"unauthenticated_connections": now["unauthenticated"],
            "penalized_addresses": now["penalized_sources"],
            "refused_connections": sum(now["refused"].values()),
            "open_files": f"{now['open_files']} of {now['file_limit']} (the doors keep {now['fd_reserve']} free;"
                          f" the files of logged-in users stop at {max(0, now['file_limit'] - 2 * now['fd_reserve'])})",
            "refused_user_files": now.get("refused_user_files", 0),
            "user_connections": f"{now['user_connections']} connections of {now['users_connected']} users (the most of one user:"
                                f" {now['most_connections_of_one_user']}; at most {now['max_connections_per_user']}"
                                " each, 0: no cap)",
            "refused_user_connections": now["refused_user_connections"]}
