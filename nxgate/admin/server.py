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
from nxgate.session.model import Session, State
from nxgate.shellsocket import peer_uid

log = Logger(namespace="nxgate.admin")

MAX_REQUEST = 65536


def describe(session: Session) -> dict[str, Any]:
    """A session as the admin sees it (never its cookie)."""
    return {
        "id": session.id, "user": session.user, "type": session.type, "name": session.name,
        "state": session.state.value, "display": session.display, "node": session.server_name,
        "client_address": session.client_address, "since": _iso(session.created), "changed": _iso(session.changed),
        "agent_pid": session.agent_pid, "program_pid": session.app_pid, "geometry": session.geometry,
        "attached_before": session.ever_attached, "failure": session.failure,
        **{key: session.options[key] for key in ("shadow", "remote") if key in session.options},
    }


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
        d.addErrback(lambda failure: {"ok": False, "error": failure.getErrorMessage()})
        d.addCallback(lambda response: self.sendLine(json.dumps(response).encode()))

    async def _handle(self, line: bytes) -> dict[str, Any]:
        try:
            request = json.loads(line)
            command, args = request["command"], request.get("args", {})
        except (ValueError, KeyError, TypeError):
            return {"ok": False, "error": "bad request"}
        handler = getattr(self, f"do_{command}", None)
        if handler is None:
            return {"ok": False, "error": f"unknown command {command!r}"}
        try:
            return {"ok": True, "result": await handler(**args)}
        except (KeyError, TypeError, ValueError) as error:
            return {"ok": False, "error": str(error)}

    def _session(self, id: str) -> Session:
        session = self.gateway.sessions.sessions.get(str(id).upper()[-32:])
        if session is None or not session.state.live:
            raise KeyError(f"no live session {id}")
        return session

    # ------------------------------------------------------------ commands
    async def do_status(self) -> dict[str, Any]:
        manager = self.gateway.sessions
        live = [s for s in manager.sessions.values() if s.state.live]
        return {"version": __version__, "node": self.gateway.config.server_name, "draining": manager.draining,
                "sessions": len(live), "config": self.gateway.config.source,
                "up_since": _iso(self.gateway.started),
                # Writes the store refused (a full disk), retried until it takes them.
                "unsaved_changes": len(manager.unsaved),
                # Agents running in session directories the store did not know at start.
                "unknown_sessions": [{"id": o.session_id, "user": o.user, "display": o.display, "pid": o.agent.pid}
                                     for o in manager.orphans.values()]}

    async def do_sessions(self) -> list[dict[str, Any]]:
        manager = self.gateway.sessions
        return [describe(s) for s in sorted(manager.sessions.values(), key=lambda s: s.created) if s.state.live]

    async def do_show(self, id: str) -> dict[str, Any]:
        return describe(self._session(id))

    async def do_terminate(self, id: str) -> dict[str, Any]:
        session = self._session(id)
        log.info("admin terminates session {id} of {user}", id=session.id, user=session.user,
                 command="terminate", admin="root", audit="admin_action")
        await self.gateway.sessions.terminate_session(session.id, "terminated by the admin")
        return {"id": session.id, "state": "terminated"}

    async def do_suspend(self, id: str) -> dict[str, Any]:
        session = self._session(id)
        log.info("admin suspends session {id} of {user}", id=session.id, user=session.user,
                 command="suspend", admin="root", audit="admin_action")
        if session.state is not State.SUSPENDED:
            await self.gateway.sessions.suspend_session(session.id)
        return {"id": session.id, "state": self.gateway.sessions.sessions[session.id].state.value}

    async def do_drain(self, on: bool) -> dict[str, Any]:
        self.gateway.sessions.draining = bool(on)
        log.info("admin turns draining {state}: {what}", state="on" if on else "off",
                 what="no new sessions" if on else "new sessions welcome", command=f"drain {'on' if on else 'off'}",
                 admin="root", audit="admin_action")
        return {"draining": bool(on)}

    async def do_reload(self) -> dict[str, Any]:
        result = self.gateway.reload()
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
