"""``nxgate-admin``: look at and act on a running gateway (as root).

    nxgate-admin [--socket PATH] [--json] sessions | show ID | terminate ID |
                 suspend ID | drain on|off | reload | status  [--json]
    nxgate-admin nodes [--json] | drain --node NAME [--off]     (a cluster)
    nxgate-admin cluster ca DIR | cluster cert NAME --ca DIR [--out DIR]

It talks to the gateway's root-only socket (``admin.sock`` in the state
directory unless ``--socket`` or ``--state-dir`` says otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from typing import Any

from nxgate.gateway.doors.admin import render

DEFAULT_STATE_DIR = "/var/lib/nxgate"


def request(path: str, command: str, **args: Any) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(60)
        conn.connect(path)
        conn.sendall(json.dumps({"command": command, "args": args}).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
    if not data:
        raise ConnectionError("the gateway closed the connection (are you root?)")
    return json.loads(data)


SESSION_COLUMNS = [("id", "ID"), ("user", "USER"), ("type", "TYPE"), ("state", "STATE"), ("display", "DISPLAY"),
                   ("since", "SINCE"), ("client_address", "CLIENT"), ("node", "NODE")]


NODE_COLUMNS = [("name", "NAME"), ("address", "ADDRESS"), ("roles", "ROLES"), ("state", "STATE"),
                ("sessions", "SESSIONS"), ("load", "LOAD"), ("last_heartbeat", "LAST HEARTBEAT"),
                ("drained", "DRAINED")]


def show(command: str, result: Any) -> str:
    """The answer to ``command`` for people (see :mod:`nxgate.gateway.doors.admin.render`)."""
    if command == "sessions":
        return render.table(result, SESSION_COLUMNS) if result else "no sessions"
    if command == "nodes":
        return render.table(result, NODE_COLUMNS) if result else "no cluster members have sent a heartbeat yet"
    if command == "status" and isinstance(result, dict):
        return render.status(result)
    if isinstance(result, dict):
        return render.record(result)
    return render.words(result)


def _global_options(parser: argparse.ArgumentParser, suppress: bool = False) -> None:
    def default(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value

    parser.add_argument("--socket", default=default(None),
                        help="the admin socket (default: admin.sock in the state directory)")
    parser.add_argument("--state-dir", default=default(DEFAULT_STATE_DIR))
    parser.add_argument("--json", action="store_true", default=default(False), help="print JSON")


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; the global options go before or after the command
    (``nxgate-admin --json reload`` and ``nxgate-admin reload --json``)."""
    parser = argparse.ArgumentParser(prog="nxgate-admin", description="Look at and act on a running nxgate.")
    _global_options(parser)
    # After the command the same options may appear again; SUPPRESS keeps a
    # value given before the command when they do not.
    common = argparse.ArgumentParser(add_help=False)
    _global_options(common, suppress=True)
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name: str, text: str) -> argparse.ArgumentParser:
        return commands.add_parser(name, help=text, parents=[common])

    command("status", "version, node, draining, session count")
    command("sessions", "all live sessions of all users")
    for name, text in (("show", "one session in detail"), ("terminate", "end a session"),
                       ("suspend", "suspend a session wherever it is attached")):
        command(name, text).add_argument("id")
    drain = command("drain", "refuse new sessions (on) or take them again (off); --node NAME: a cluster member")
    drain.add_argument("state", nargs="?", choices=("on", "off"))
    drain.add_argument("--node", help="drain this cluster member (no new sessions placed there)")
    drain.add_argument("--off", action="store_true", help="with --node: take new sessions again")
    command("nodes", "the cluster's members: address, roles, up or down, sessions, load, drained")
    command("reload", "re-read and validate the config; a bad one changes nothing")
    cluster = command("cluster", "make the cluster's TLS certificates (no gateway needed)")
    made = cluster.add_subparsers(dest="what", required=True)
    made.add_parser("ca", help="a new cluster CA: ca.pem for every member, ca.key kept safe").add_argument("dir")
    cert = made.add_parser("cert", help="NAME.pem and NAME.key (0600) for member NAME, signed by the CA")
    cert.add_argument("name")
    cert.add_argument("--ca", required=True, help="the CA's directory (ca.pem, ca.key)")
    cert.add_argument("--out", help="where to write them (default: the CA's directory)")
    return parser.parse_args(argv)


def cluster_files(args: argparse.Namespace) -> int:
    """``nxgate-admin cluster ca|cert``: files, not a request to the gateway."""
    from nxgate.wire import tls

    try:
        if args.what == "ca":
            made = tls.make_ca(args.dir)
        else:
            made = tls.make_cert(args.name, args.ca, args.out)
    except FileExistsError as error:
        print(f"nxgate-admin: {error.filename} exists already; not overwritten", file=sys.stderr)
        return 1
    except (OSError, ValueError) as error:
        print(f"nxgate-admin: {error}", file=sys.stderr)
        return 1
    for path in made:
        print(path)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    if args.command == "cluster":
        return cluster_files(args)
    if args.command == "drain" and (args.node is None) == (args.state is None):
        print("nxgate-admin: drain on|off (this gateway) or drain --node NAME [--off] (a cluster member)",
              file=sys.stderr)
        return 2
    path = args.socket or os.path.join(args.state_dir, "admin.sock")
    extra: dict[str, Any] = {}
    if args.command in ("show", "terminate", "suspend"):
        extra["id"] = args.id
    elif args.command == "drain" and args.node is not None:
        extra.update(node=args.node, on=not args.off)
    elif args.command == "drain":
        extra["on"] = args.state == "on"
    try:
        response = request(path, args.command, **extra)
    except (OSError, ConnectionError, ValueError) as error:
        print(f"nxgate-admin: cannot talk to the gateway at {path}: {error}", file=sys.stderr)
        return 3
    if args.json and args.command == "nodes" and response.get("ok"):
        print(json.dumps(response["result"], indent=2))  # the list of members itself
    elif args.json:
        print(json.dumps(response, indent=2))
    elif response.get("ok"):
        print(show(args.command, response["result"]))
    else:
        print(f"nxgate-admin: {response.get('error')}", file=sys.stderr)
    return 0 if response.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
