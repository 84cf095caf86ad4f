"""``nxgate-session``: control the NX session you are in, over the gateway's D-Bus door.

For menus and panel launchers inside a session: the session is the one in
``$NXGATE_SESSION_ID`` (``--id`` names another of yours).  The gateway asks
the bus who you are; nothing here is trusted by it.  The bus is the system
bus unless ``$NXGATE_DBUS_ADDRESS`` (set in sessions by a gateway whose door
is on another bus) or ``--bus`` names one.

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

from nxgate.gateway.doors.dbus import wire

EXIT_ERROR = 1
EXIT_USAGE = 2


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="nxgate-session", description="Control your NX session.")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--id", default="", help="a session id (default: $NXGATE_SESSION_ID)")
    parser.add_argument("--bus", default=None,
                        help=f"bus address (default: ${wire.BUS_VARIABLE}, which the gateway sets in sessions when "
                             "its door is on another bus; else the system bus)")
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
        return "\n".join(_line(session) for session in result) if result else "No sessions."
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
    try:
        connection = await client.connect(reactor, bus_address(options.bus, os.environ))
    except Exception as error:  # txdbus: ConnectError, or a bare Exception for a bad address
        raise NoBus(str(error)) from None

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


class NoBus(Exception):
    """The bus could not be reached at all (txdbus's words in the message)."""


#: The D-Bus error names whose own words mean nothing to a user in a session.
NO_SERVER = "org.freedesktop.DBus.Error.NoServer"
_NOT_ON_THE_BUS = ("org.freedesktop.DBus.Error.ServiceUnknown", "org.freedesktop.DBus.Error.NameHasNoOwner")
_ACCESS_DENIED = "org.freedesktop.DBus.Error.AccessDenied"


def bus_address(option: str | None, environ: dict[str, str] | Any) -> str:
    """--bus, else $NXGATE_DBUS_ADDRESS (the gateway's bus, set in its
    sessions), else the system bus (txdbus reads $DBUS_SYSTEM_BUS_ADDRESS)."""
    return option or environ.get(wire.BUS_VARIABLE) or "system"


def _where(address: str, environ: dict[str, str] | Any) -> str:
    if address == "system":
        return "the system bus at " + environ.get("DBUS_SYSTEM_BUS_ADDRESS", "unix:path=/var/run/dbus/system_bus_socket")
    return f"the bus at {address}"


def explain(error: Exception, address: str, environ: dict[str, str] | Any) -> tuple[str, str]:
    """(an error name, a sentence) for what went wrong: the gateway's refusal
    in its own words, and plain words for a bus that is not there, a gateway
    that is not on it, or a bus policy that refuses the call."""
    if isinstance(error, NoBus):
        text = str(error)
        if "No valid bus addresses" in text:
            return NO_SERVER, f"{address!r} is not a D-Bus address (such as unix:path=/run/dbus/system_bus_socket)."
        reason = ("there is no bus socket there" if "No such file" in text
                  else "nothing listens there" if "refused" in text else text.rstrip("."))
        return NO_SERVER, (f"cannot reach {_where(address, environ)} ({reason}), over which nxgate-session talks to "
                           f"the gateway: is dbus-daemon running? (--bus ADDRESS or ${wire.BUS_VARIABLE} names "
                           "another bus.)")
    name = getattr(error, "errName", None) or type(error).__name__
    text = (getattr(error, "message", "") or str(error)).strip()
    if name in _NOT_ON_THE_BUS:
        return name, (f"the gateway is not on {_where(address, environ)} ({wire.BUS_NAME} has no "
                      "owner): nxgate is not running there, or its [dbus] door is off or on another bus.")
    if name == _ACCESS_DENIED:
        return name, (f"{_where(address, environ)} refused the call: its policy must include "
                      f"{wire.BUS_NAME}.conf (in /etc/dbus-1/system.d).")
    return name, text


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
            # A refusal of the gateway (org.nxgate.Error.NotFound and its words), or no bus.
            name, text = explain(error, bus_address(options.bus, os.environ), os.environ)
            if options.json:
                print(json.dumps({"error": name, "message": text}))
            print(f"nxgate-session: {text} ({name})", file=sys.stderr)
            raise SystemExit(EXIT_ERROR) from None

    task.react(lambda reactor: defer.ensureDeferred(guarded(reactor)))  # exits with the code
    return 0  # pragma: no cover (react exits)
