"""The command line of ``nxgate-client`` (pure apart from reading $DISPLAY's size).

Usage errors raise :class:`UsageError` (exit code 2) with a message that
says what to change, before anything connects anywhere.
"""

from __future__ import annotations

import argparse
import dataclasses
import getpass
import os
import re
import subprocess
from dataclasses import dataclass

from nxgate.clients.nx.sharing import parse_share
from nxgate.protocols.nx import client_commands as commands
from nxgate.protocols.nx.client_dialogue import (
    ListSessions,
    Request,
    ATTACHING,
    RestoreSession,
    ShadowSession,
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
# A host name, an IPv4 address or a bracketed IPv6 one; the server checks it properly.
_HOST = r"(?:\[[0-9A-Fa-f:.]+\]|[^\s:\[\]\x00-\x1f\x7f]+)"
_RDP_SERVER = re.compile(_HOST + r"(?::\d{1,5})?$")
_VNC_SERVER = re.compile(_HOST + r"(?:::?\d{1,5})?$")
PASSWORD_VARIABLE = "NXGATE_PASSWORD"
REMOTE_PASSWORD_VARIABLE = "NXGATE_REMOTE_PASSWORD"
PASSWORD_VARIABLES = (PASSWORD_VARIABLE, REMOTE_PASSWORD_VARIABLE)


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
    # The prompt for the remote desktop's password, when it must be asked
    # (it is not in $NXGATE_REMOTE_PASSWORD); see with_remote_password.
    remote_password_prompt: str | None = None
    # --sound: the local sound server to play the session's sound on ("" for
    # libpulse's default); None without --sound.
    sound_server: str | None = None
    # --print: the local print server the session prints on (a CUPS at
    # host[:port] or its socket; "" for CUPS's own default); None without --print.
    print_server: str | None = None
    # --share NAME=PATH: the folders to share with the session (name -> folder).
    shares: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def legacy_free(self) -> bool:
        """Logging in to SSH as the user himself: NX ``login`` needs nothing."""
        return self.ssh_user != NX_USER

    @property
    def attaches(self) -> bool:
        return isinstance(self.request, ATTACHING)

    def with_remote_password(self, password: str) -> Options:
        """These options with the remote desktop password the user typed."""
        request = self.request
        assert isinstance(request, StartSession) and request.params.remote is not None
        remote = dataclasses.replace(request.params.remote, password=password)
        params = dataclasses.replace(request.params, remote=remote)
        return dataclasses.replace(self, request=StartSession(params), remote_password_prompt=None)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nxgate-client",
        usage="%(prog)s [options] user@host[:port]",
        description="Start, resume, list or terminate NX 3 sessions on an NX server (nxgate, FreeNX, Neatx); "
                    "shadow a running session; reach RDP and VNC desktops through the server.",
        epilog="The password comes from $NXGATE_PASSWORD or is asked on the terminal; that of an RDP or VNC "
               "desktop from $NXGATE_REMOTE_PASSWORD or is asked too (never give a password on the command line). "
               "Exit codes: 0 ok, 1 NX error, 2 usage error, 3 SSH connection, host key or authentication failure.",
    )
    # Optional for argparse only: "--shadow alice@host" must not take the target for an id (see _parse).
    parser.add_argument("target", metavar="user@host[:port]", nargs="?",
                        help="the Unix user to log in as, and the server")
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument("--list", action="store_true", help="list your suspended and running sessions")
    modes.add_argument("--resume", metavar="ID", help="resume the session with this id and attach to it")
    modes.add_argument("--terminate", metavar="ID", help="terminate the session with this id")
    modes.add_argument("--suspend", metavar="ID", help="suspend the session with this id (wherever it is attached)")
    modes.add_argument("--shadow", metavar="ID", nargs="?", const="",
                       help="watch or help in a running session (yours, or another user's if the server allows);"
                            " without ID: the only one there is, or choose from the list")
    modes.add_argument("--rdp", metavar="HOST[:PORT]",
                       help="a Windows desktop over RDP, through the server; or the name of one the admin defined")
    modes.add_argument("--vnc", metavar="HOST[:DISPLAY]",
                       help="a VNC desktop through the server (HOST::PORT for a port number);"
                            " or the name of one the admin defined")
    new = parser.add_argument_group("new sessions (the default mode)")
    new.add_argument("--type", help="session type (default: unix-console)")
    new.add_argument("--application", metavar="CMD", help="the program of a unix-application session")
    new.add_argument("--geometry", metavar="WxH", help="session size (default: the size of $DISPLAY's screen)")
    new.add_argument("--name", default="nxgate-client", help="session name (default: %(default)s)")
    new.add_argument("--link", default="lan", choices=("modem", "isdn", "adsl", "wan", "lan"),
                     help="link speed (default: %(default)s)")
    new.add_argument("--keyboard", default="pc105/us", help="keyboard model/layout (default: %(default)s)")
    new.add_argument("--rootless", action="store_true", help="show the windows of a console or application"
                     " session as windows of your desktop")
    new.add_argument("--fullscreen", action="store_true", help="full-screen session")
    new.add_argument("--view-only", action="store_true", help="with --shadow: only watch, never type or click")
    new.add_argument("--remote-user", metavar="USER",
                     help="with --rdp: log in as USER (without: the host's own login screen)")
    new.add_argument("--domain", metavar="DOMAIN", help="with --rdp: the Windows domain of --remote-user")
    ssh = parser.add_argument_group("connection")
    ssh.add_argument("--port", type=int, help=f"SSH port of the server (default: {DEFAULT_PORT})")
    ssh.add_argument("--ssh-user", default=NX_USER,
                     help="SSH login; any other than 'nx' logs in as that user directly (legacy-free)"
                          " (default: %(default)s)")
    ssh.add_argument("--identity", metavar="FILE", help="SSH private key (default for 'nx': the NoMachine key)")
    ssh.add_argument("--known-hosts", metavar="FILE", default=os.path.join("~", ".config", "nxgate", "known_hosts"),
                     help="known host keys; new hosts are added, changed keys refused (default: %(default)s)")
    ssh.add_argument("--accept-any-host-key", action="store_true", help="do not check the host key (tests only)")
    services = parser.add_argument_group("sound, printing and folders")
    services.add_argument("--sound", action="store_true",
                          help="play the session's sound here and let it record from this microphone "
                               "(PulseAudio or PipeWire's Pulse server)")
    services.add_argument("--sound-server", metavar="SERVER", default="",
                          help="with --sound: the local sound server, as PULSE_SERVER names it "
                               "(default: the one your programs use)")
    services.add_argument("--print", action="store_true", dest="print_",
                          help="let the session print on this machine's printers (its CUPS queues)")
    services.add_argument("--print-server", metavar="SERVER", default="",
                          help="with --print: the local CUPS, host[:port] or its socket path "
                               "(default: $CUPS_SERVER, else the local scheduler)")
    services.add_argument("--share", metavar="NAME=PATH", action="append", default=[],
                          help="share this folder with the session, where it appears as ~/MyShares/NAME "
                               "(repeatable; a private Samba serves it for the session)")
    parser.add_argument("--nxproxy", metavar="PATH", default="nxproxy",
                        help="the nxproxy program (default: %(default)s)")
    parser.add_argument("--verbose", "-v", action="store_true", help="show the NX dialogue on stderr")
    return parser


def _parse(argv: list[str]) -> argparse.Namespace:
    """argparse, and the target back where it belongs when ``--shadow`` (whose
    id is optional) swallowed it."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.target is None:
        if args.shadow and commands.normalize_session_id(args.shadow) is None:
            args.target, args.shadow = args.shadow, ""
        else:
            parser.error("the following arguments are required: user@host[:port]")
    return args


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
    env = {name: value for name, value in environ.items() if name not in PASSWORD_VARIABLES}
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


def _session_type(args: argparse.Namespace) -> str:
    """--type, or the type that --rdp, --vnc or --shadow mean."""
    implied = commands.RDP if args.rdp is not None else commands.VNC if args.vnc is not None else \
        commands.SHADOW if args.shadow is not None else None
    if implied is None:
        return args.type or "unix-console"
    if args.type is not None and args.type != implied:
        raise UsageError(f"--type {args.type} does not go with --{'rdp' if implied == commands.RDP else implied}")
    return implied


def remote_desktop(args: argparse.Namespace, environ: dict[str, str]) -> tuple[commands.RemoteDesktop | None, bool]:
    """The RDP or VNC host, and whether its password must still be asked."""
    if args.remote_user is not None and args.rdp is None:
        raise UsageError("--remote-user is only for --rdp (VNC knows passwords only)")
    if args.domain is not None and args.rdp is None:
        raise UsageError("--domain is only for --rdp")
    if args.rdp is None and args.vnc is None:
        return None, False
    server = (args.rdp if args.rdp is not None else args.vnc).strip()
    pattern, form = (_RDP_SERVER, "HOST[:PORT]") if args.rdp is not None else (_VNC_SERVER, "HOST[:DISPLAY]")
    if not pattern.match(server):
        raise UsageError(f"--{'rdp' if args.rdp is not None else 'vnc'}: expected {form} or a name, got {server!r}")
    user = (args.remote_user or "").strip()
    if args.remote_user is not None and not user:
        raise UsageError("--remote-user must not be empty")
    # RDP without a user shows the host's login screen: nothing to ask.
    wanted = args.vnc is not None or bool(user)
    password = environ.get(REMOTE_PASSWORD_VARIABLE) if wanted else None
    remote = commands.RemoteDesktop(server, user, (args.domain or "").strip(), password or "")
    return remote, wanted and password is None


def session_parameters(args: argparse.Namespace, environ: dict[str, str]) -> commands.SessionParameters:
    session_type = _session_type(args)
    if not _TYPE.match(session_type):
        raise UsageError(f"--type: {session_type!r} is not a session type (such as unix-console or unix-kde)")
    if session_type == "unix-application" and not (args.application or "").strip():
        raise UsageError("--type unix-application needs --application CMD")
    if args.application is not None and session_type != "unix-application":
        raise UsageError("--application is only for --type unix-application")
    if args.rootless and session_type not in commands.ROOTLESS_TYPES:
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
        name=args.name.strip(), type=session_type, width=width, height=height, link=args.link,
        keyboard=args.keyboard, application=args.application, rootless=args.rootless,
        fullscreen=args.fullscreen, media=args.sound, cups=args.print_, samba=bool(args.share),
    )


def parse_options(argv: list[str], environ: dict[str, str]) -> Options:
    """Raises UsageError, or SystemExit for --help and argparse's own errors."""
    args = _parse(argv)
    user, host, port = parse_target(args.target, args.port)
    if args.view_only and args.shadow is None:
        raise UsageError("--view-only is only for --shadow")
    remote, ask_password = remote_desktop(args, environ)
    request: Request
    if args.list:
        request = ListSessions()
    elif args.terminate is not None:
        request = TerminateSession(_session_id(args.terminate, "--terminate"))
    elif args.suspend is not None:
        request = SuspendSession(_session_id(args.suspend, "--suspend"))
    elif args.resume is not None:
        request = RestoreSession(_session_id(args.resume, "--resume"), session_parameters(args, environ))
    elif args.shadow is not None:
        session_id = _session_id(args.shadow, "--shadow") if args.shadow else None
        request = ShadowSession(session_id, session_parameters(args, environ), args.view_only)
    else:
        params = session_parameters(args, environ)
        request = StartSession(dataclasses.replace(params, remote=remote) if remote is not None else params)
    if isinstance(request, ATTACHING) and not environ.get("DISPLAY"):
        raise UsageError("DISPLAY is not set: nxproxy needs an X display to draw the session on")
    if not args.ssh_user:
        raise UsageError("--ssh-user must not be empty")
    identity = os.path.expanduser(args.identity) if args.identity else None
    if identity is not None and not os.path.isfile(identity):
        raise UsageError(f"--identity: no such file: {identity}")
    known_hosts = None if args.accept_any_host_key else os.path.expanduser(args.known_hosts)
    if args.sound_server and not args.sound:
        raise UsageError("--sound-server is only for --sound")
    if args.sound and not isinstance(request, ATTACHING):
        raise UsageError("--sound is for a session you start, resume or shadow")
    if args.print_server and not args.print_:
        raise UsageError("--print-server is only for --print")
    if args.print_ and not isinstance(request, ATTACHING):
        raise UsageError("--print is for a session you start, resume or shadow")
    if args.print_server:
        from nxgate.clients.nx.printing import PrintingError, parse_server

        try:
            parse_server(args.print_server)
        except PrintingError as problem:
            raise UsageError(str(problem)) from None
    shares: dict[str, str] = {}
    for text in args.share:
        try:
            name, path = parse_share(text)
        except ValueError as problem:
            raise UsageError(f"--share: {problem}") from None
        if name in shares:
            raise UsageError(f"--share: {name!r} is given twice")
        shares[name] = path
    if shares and not isinstance(request, (StartSession, RestoreSession)):
        raise UsageError("--share is for a session you start or resume")
    return Options(
        user=user, host=host, port=port, request=request, ssh_user=args.ssh_user, identity=identity,
        known_hosts=known_hosts, nxproxy=args.nxproxy, verbose=args.verbose,
        remote_password_prompt=f"Password for the remote desktop {remote.server}: " if ask_password and remote else None,
        sound_server=args.sound_server if args.sound else None,
        print_server=args.print_server if args.print_ else None, shares=shares,
    )
