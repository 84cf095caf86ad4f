"""The command line of ``nxgate-client`` (pure apart from reading $DISPLAY's size).

Usage errors raise :class:`UsageError` (exit code 2) with a message that
says what to change, before anything connects anywhere.
"""

from __future__ import annotations

import argparse
import getpass
import os
import re
import subprocess
from dataclasses import dataclass

from nxgate.client import commands
from nxgate.client.dialogue import (
    ListSessions,
    Request,
    RestoreSession,
    StartSession,
    SuspendSession,
    TerminateSession,
)

DEFAULT_PORT = 4022
DEFAULT_GEOMETRY = (1024, 768)
NX_USER = "nx"
_TARGET = re.compile(r"(?:(?P<user>[^@]+)@)?(?P<host>\[[^\]]+\]|[^:@\[\]]+)(?::(?P<port>\d+))?$")
_GEOMETRY = re.compile(r"(\d{2,5})x(\d{2,5})$")
_TYPE = re.compile(r"[a-z][a-z0-9-]{0,31}$")
_DIMENSIONS = re.compile(rb"dimensions:\s+(\d+)x(\d+) pixels")


class UsageError(Exception):
    pass


@dataclass(frozen=True)
class Options:
    user: str
    host: str
    port: int
    request: Request
    ssh_user: str
    identity: str | None
    known_hosts: str | None  # None: accept any host key
    nxproxy: str
    verbose: bool

    @property
    def legacy_free(self) -> bool:
        """Logging in to SSH as the user himself: NX ``login`` needs nothing."""
        return self.ssh_user != NX_USER

    @property
    def attaches(self) -> bool:
        return isinstance(self.request, (StartSession, RestoreSession))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nxgate-client",
        description="Start, resume, list or terminate NX 3 sessions on an NX server (nxgate, FreeNX, Neatx).",
        epilog="The password comes from $NXGATE_PASSWORD or is asked on the terminal. "
               "Exit codes: 0 ok, 1 NX error, 2 usage error, 3 SSH connection, host key or authentication failure.",
    )
    parser.add_argument("target", metavar="user@host[:port]", help="the Unix user to log in as, and the server")
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument("--list", action="store_true", help="list your suspended and running sessions")
    modes.add_argument("--resume", metavar="ID", help="resume the session with this id and attach to it")
    modes.add_argument("--terminate", metavar="ID", help="terminate the session with this id")
    modes.add_argument("--suspend", metavar="ID", help="suspend the session with this id (wherever it is attached)")
    new = parser.add_argument_group("new sessions (the default mode)")
    new.add_argument("--type", default="unix-console", help="session type (default: %(default)s)")
    new.add_argument("--application", metavar="CMD", help="the program of a unix-application session")
    new.add_argument("--geometry", metavar="WxH", help="session size (default: the size of $DISPLAY's screen)")
    new.add_argument("--name", default="nxgate-client", help="session name (default: %(default)s)")
    new.add_argument("--link", default="lan", choices=("modem", "isdn", "adsl", "wan", "lan"),
                     help="link speed (default: %(default)s)")
    new.add_argument("--keyboard", default="pc105/us", help="keyboard model/layout (default: %(default)s)")
    new.add_argument("--rootless", action="store_true", help="show the windows of a console or application"
                     " session as windows of your desktop")
    new.add_argument("--fullscreen", action="store_true", help="full-screen session")
    ssh = parser.add_argument_group("connection")
    ssh.add_argument("--port", type=int, help=f"SSH port of the server (default: {DEFAULT_PORT})")
    ssh.add_argument("--ssh-user", default=NX_USER,
                     help="SSH login; any other than 'nx' logs in as that user directly (legacy-free)"
                          " (default: %(default)s)")
    ssh.add_argument("--identity", metavar="FILE", help="SSH private key (default for 'nx': the NoMachine key)")
    ssh.add_argument("--known-hosts", metavar="FILE", default=os.path.join("~", ".config", "nxgate", "known_hosts"),
                     help="known host keys; new hosts are added, changed keys refused (default: %(default)s)")
    ssh.add_argument("--accept-any-host-key", action="store_true", help="do not check the host key (tests only)")
    parser.add_argument("--nxproxy", metavar="PATH", default="nxproxy",
                        help="the nxproxy program (default: %(default)s)")
    parser.add_argument("--verbose", "-v", action="store_true", help="show the NX dialogue on stderr")
    return parser


def parse_target(text: str, port_option: int | None) -> tuple[str, str, int]:
    match = _TARGET.match(text)
    if match is None:
        raise UsageError(f"expected user@host[:port], got {text!r}")
    user = match.group("user") or getpass.getuser()
    host = match.group("host").strip("[]")
    port = int(match.group("port")) if match.group("port") else None
    if port is not None and port_option is not None and port != port_option:
        raise UsageError(f"two different ports: {port} in {text!r} and --port {port_option}")
    port = port if port is not None else port_option if port_option is not None else DEFAULT_PORT
    if not 0 < port < 65536:
        raise UsageError(f"bad port {port}")
    return user, host, port


def screen_size(environ: dict[str, str]) -> tuple[int, int]:
    """The size of the $DISPLAY screen, from xdpyinfo; 1024x768 without one."""
    if not environ.get("DISPLAY"):
        return DEFAULT_GEOMETRY
    env = {name: value for name, value in environ.items() if name != "NXGATE_PASSWORD"}
    try:
        result = subprocess.run(["xdpyinfo"], capture_output=True, timeout=10, env=env, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return DEFAULT_GEOMETRY
    match = _DIMENSIONS.search(result.stdout) if result.returncode == 0 else None
    return (int(match.group(1)), int(match.group(2))) if match else DEFAULT_GEOMETRY


def _session_id(text: str, option: str) -> str:
    session_id = commands.normalize_session_id(text)
    if session_id is None:
        raise UsageError(f"{option}: {text!r} is not a session id (32 hexadecimal digits, as --list shows)")
    return session_id


def session_parameters(args: argparse.Namespace, environ: dict[str, str]) -> commands.SessionParameters:
    if not _TYPE.match(args.type):
        raise UsageError(f"--type: {args.type!r} is not a session type (such as unix-console or unix-kde)")
    if args.type == "unix-application" and not (args.application or "").strip():
        raise UsageError("--type unix-application needs --application CMD")
    if args.application is not None and args.type != "unix-application":
        raise UsageError("--application is only for --type unix-application")
    if args.rootless and args.type not in commands.ROOTLESS_TYPES:
        raise UsageError("--rootless is only for unix-console and unix-application sessions")
    if not args.name.strip():
        raise UsageError("--name must not be empty")
    if args.geometry:
        match = _GEOMETRY.match(args.geometry)
        if match is None:
            raise UsageError(f"--geometry: expected WxH such as 1280x800, got {args.geometry!r}")
        width, height = int(match.group(1)), int(match.group(2))
    else:
        width, height = screen_size(environ)
    return commands.SessionParameters(
        name=args.name.strip(), type=args.type, width=width, height=height, link=args.link,
        keyboard=args.keyboard, application=args.application, rootless=args.rootless,
        fullscreen=args.fullscreen,
    )


def parse_options(argv: list[str], environ: dict[str, str]) -> Options:
    """Raises UsageError, or SystemExit for --help and argparse's own errors."""
    args = build_parser().parse_args(argv)
    user, host, port = parse_target(args.target, args.port)
    request: Request
    if args.list:
        request = ListSessions()
    elif args.terminate is not None:
        request = TerminateSession(_session_id(args.terminate, "--terminate"))
    elif args.suspend is not None:
        request = SuspendSession(_session_id(args.suspend, "--suspend"))
    elif args.resume is not None:
        request = RestoreSession(_session_id(args.resume, "--resume"), session_parameters(args, environ))
    else:
        request = StartSession(session_parameters(args, environ))
    if isinstance(request, (StartSession, RestoreSession)) and not environ.get("DISPLAY"):
        raise UsageError("DISPLAY is not set: nxproxy needs an X display to draw the session on")
    if not args.ssh_user:
        raise UsageError("--ssh-user must not be empty")
    identity = os.path.expanduser(args.identity) if args.identity else None
    if identity is not None and not os.path.isfile(identity):
        raise UsageError(f"--identity: no such file: {identity}")
    known_hosts = None if args.accept_any_host_key else os.path.expanduser(args.known_hosts)
    return Options(
        user=user, host=host, port=port, request=request, ssh_user=args.ssh_user, identity=identity,
        known_hosts=known_hosts, nxproxy=args.nxproxy, verbose=args.verbose,
    )
