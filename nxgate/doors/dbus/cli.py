"""``nxgate-session``: control the NX session you are in, over the gateway's D-Bus door.

For menus and panel launchers inside a session: the session is the one in
``$NXGATE_SESSION_ID`` (``--id`` names another of yours).  The gateway asks
the bus who you are; nothing here is trusted by it.

    nxgate-session info|suspend|terminate [--id ID] [--json]
    nxgate-session list [--json]
    nxgate-session rename NAME [--id ID]
    nxgate-session start TYPE [NAME]  # a session to resume later from an NX client
    nxgate-session watch          # your sessions' state changes, one JSON line each
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from nxgate.doors.dbus import wire

EXIT_ERROR = 1
EXIT_USAGE = 2


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="nxgate-session", description="Control your NX session.")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--id", default="", help="a session id (default: $NXGATE_SESSION_ID)")
    parser.add_argument("--bus", default="system", help="bus address (default: the system bus)")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, text in (("info", "show the session"), ("suspend", "disconnect, keep the session running"),
                       ("terminate", "end the session"), ("list", "list your sessions"),
                       ("watch", "print your sessions' state changes")):
        commands.add_parser(name, help=text)
    commands.add_parser("rename", help="rename the session").add_argument("name")
    start = commands.add_parser("start", help="start a session of TYPE to resume later from an NX client")
    start.add_argument("type")
    start.add_argument("name", nargs="?", default="")
    return parser.parse_args(argv)


def render(command: str, result: Any, as_json: bool) -> str:
    """What a command prints for its result."""
    if as_json:
        return json.dumps(result, sort_keys=True)
    if command == "list":
        return "\n".join(_line(session) for session in result)
    if isinstance(result, dict):
        return _line(result)
    return str(result)


def _line(session: dict[str, Any]) -> str:
    return (f"{session['id']}  {session['state']:<10} :{session['display']}  {session['type']}  "
            f"{session['name']}  {session['client_address']}")


async def run(reactor: Any, options: argparse.Namespace, out: Any) -> None:
    from txdbus import client

    session_id = options.id or os.environ.get(wire.SESSION_ID_VARIABLE, "")
    if options.command not in ("list", "watch", "start") and not session_id:
        raise UsageError(f"not in an NX session (no {wire.SESSION_ID_VARIABLE}); use --id")
    connection = await client.connect(reactor, options.bus)

    async def call(method: str, signature: str | None = None, *body: Any) -> Any:
        return await connection.callRemote(wire.OBJECT_PATH, method, interface=wire.INTERFACE,
                                           destination=wire.BUS_NAME, signature=signature, body=list(body))

    try:
        if options.command == "watch":
            await _watch(connection, call, out)
            return
        if options.command == "list":
            result: Any = await call("ListSessions")
        elif options.command == "start":
            result = await call("StartSession", "ss", options.type, options.name)
        elif options.command == "info":
            result = await call("GetSession", "s", session_id)
        elif options.command == "rename":
            result = await call("Rename", "ss", session_id, options.name)
        else:
            state = await call(options.command.capitalize(), "s", session_id)
            result = {"id": session_id, "state": state}
            if not options.json:
                result = f"session {session_id}: {state}"
        out.write(render(options.command, result, options.json) + "\n")
        out.flush()
    finally:
        connection.disconnect()


async def _watch(connection: Any, call: Any, out: Any) -> None:
    """Subscribe and print signals until the gateway leaves the bus.  Only
    signals from the name's current owner count: another local user could
    send a look-alike signal to us."""
    from twisted.internet import defer

    owner = await connection.getNameOwner(wire.BUS_NAME)
    done: defer.Deferred[None] = defer.Deferred()

    def signal(msg: Any) -> None:
        out.write(json.dumps({"signal": msg.member, "args": list(msg.body or [])}) + "\n")
        out.flush()

    def owner_changed(msg: Any) -> None:
        name, _old, new = msg.body
        if name == wire.BUS_NAME and new != owner and not done.called:
            done.callback(None)

    await connection.addMatch(signal, sender=owner, path=wire.OBJECT_PATH, interface=wire.INTERFACE)
    await connection.addMatch(owner_changed, interface="org.freedesktop.DBus", member="NameOwnerChanged")
    await call("Subscribe")
    out.write(json.dumps({"subscribed": owner}) + "\n")
    out.flush()
    await done


class UsageError(Exception):
    pass


def main(argv: list[str] | None = None) -> int:
    options = parse(sys.argv[1:] if argv is None else argv)
    from twisted.internet import defer, task

    async def guarded(reactor: Any) -> None:
        try:
            await run(reactor, options, sys.stdout)
        except UsageError as error:
            print(f"nxgate-session: {error}", file=sys.stderr)
            raise SystemExit(EXIT_USAGE) from None
        except Exception as error:
            # A refusal of the gateway: org.nxgate.Error.NotFound and its words.
            name = getattr(error, "errName", None) or type(error).__name__
            text = getattr(error, "message", "") or str(error)
            if options.json:
                print(json.dumps({"error": name, "message": text}))
            print(f"nxgate-session: {name}: {text}", file=sys.stderr)
            raise SystemExit(EXIT_ERROR) from None

    task.react(lambda reactor: defer.ensureDeferred(guarded(reactor)))  # exits with the code
    return 0  # pragma: no cover (react exits)
