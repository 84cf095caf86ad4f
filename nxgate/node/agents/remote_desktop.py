"""RDP ("windows") and VNC sessions: what the client asks for, which remote
desktop that means, and how its viewer is started (pure).

Clients send ``--agent_server`` (``host``, ``host:port``; VNC also
``host:display`` and ``host::port``, OpenNX's ``host%3Adisplay`` arrives
decoded), ``--agent_user``, ``--agent_password``, ``--agent_domain``
(reference §2.5 and §6.2).  ``agent_server`` may also name a target the
admin defined; unless ``[remote] allow_any_host`` is on, only targets may be
reached.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import re
from dataclasses import dataclass, field

from nxgate.config import Config, TargetSection
from nxgate.vocabulary.errors import ErrorKind, SessionError
from nxgate.vocabulary.requests import DisplaySettings, RemoteRequest

PROTOCOLS = {"windows": "rdp", "vnc": "vnc"}
DEFAULT_PORTS = {"rdp": 3389, "vnc": 5900}
ENGINES = {"rdp": ("rdpy", "freerdp"), "vnc": ("vnc", "tightvnc")}
PYTHON_ENGINES = {"rdpy": "nxgate.clients.engines.rdp", "vnc": "nxgate.clients.engines.vnc"}
_HOSTNAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,62}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,62}[A-Za-z0-9])?)*")
_FIELD = re.compile(r"[^\x00-\x1f\x7f]{0,256}")

# Windows keyboard layout ids by the NX client's X layout (the part after "/").
KEYBOARD_LAYOUTS = {"us": 0x409, "gb": 0x809, "uk": 0x809, "de": 0x407, "fr": 0x40C, "it": 0x410, "es": 0x40A,
                    "ch": 0x807, "be": 0x80C, "nl": 0x413, "se": 0x41D, "no": 0x414, "dk": 0x406, "fi": 0x40B,
                    "pt": 0x816, "br": 0x416, "pl": 0x415, "cz": 0x405, "hu": 0x40E, "ru": 0x419, "jp": 0x411}


@dataclass(frozen=True)
class RemoteDesktop:
    protocol: str  # rdp or vnc
    host: str
    port: int
    engine: str
    security: str = "tls"
    user: str = ""
    domain: str = ""
    password: str = field(default="", repr=False)
    target: str = ""  # the admin's name for it, if any

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def refused(kind: ErrorKind, text: str) -> SessionError:
    return SessionError(kind, text)


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return False


def _valid_host(host: str) -> bool:
    return _is_ip(host) or bool(_HOSTNAME.fullmatch(host))


def parse_server(protocol: str, text: str) -> tuple[str, int]:
    """``(host, port)`` from an agent_server value."""
    text = text.strip()
    if text.startswith("["):  # [v6]:port
        host, _, rest = text[1:].partition("]")
        port_text = rest.lstrip(":")
        port = int(port_text) if port_text.isdigit() else DEFAULT_PORTS[protocol]
    elif text.count(":") >= 2 and _is_ip(text):
        host, port = text, DEFAULT_PORTS[protocol]  # a bare IPv6 address
    elif "::" in text:
        host, _, port_text = text.partition("::")
        if not port_text.isdigit():
            raise refused(ErrorKind.INVALID_REQUEST, f"Invalid remote desktop address '{text}'.")
        port = int(port_text)
    elif ":" in text:
        host, _, port_text = text.partition(":")
        if not port_text.isdigit():
            raise refused(ErrorKind.INVALID_REQUEST, f"Invalid remote desktop address '{text}'.")
        number = int(port_text)
        # VNC's host:N is display N (port 5900+N); larger numbers are ports.
        port = 5900 + number if protocol == "vnc" and number < 100 else number
    else:
        host, port = text, DEFAULT_PORTS[protocol]
    if not _valid_host(host) or not 0 < port < 65536:
        raise refused(ErrorKind.INVALID_REQUEST, f"Invalid remote desktop address '{text}'.")
    return host, port


def _field(name: str, value: str) -> str:
    if not _FIELD.fullmatch(value):
        raise refused(ErrorKind.INVALID_REQUEST, f"Invalid value for parameter '{name}'.")
    return value


def remote_desktop(session_type: str, request: RemoteRequest | None, config: Config) -> RemoteDesktop:
    """The remote desktop a windows/vnc start asks for, or a SessionError."""
    protocol = PROTOCOLS[session_type]
    settings = config.remote
    if not settings.enabled:
        raise refused(ErrorKind.UNAVAILABLE, f"Session type '{session_type}' is not available on this server.")
    server = request.server.strip() if request is not None else ""
    if request is None or not server:
        raise refused(ErrorKind.INVALID_REQUEST, "No remote desktop given (agent_server is empty).")
    user, domain = _field("agent_user", request.user), _field("agent_domain", request.domain)
    password = request.password
    target = config.targets.get(server.lower())
    if target is not None:
        if target.protocol != protocol:
            raise refused(ErrorKind.INVALID_REQUEST,
                          f"'{server}' is a {target.protocol.upper()} desktop, not {protocol.upper()}.")
        return _from_target(server.lower(), target, config, user, domain, password)
    if not settings.allow_any_host:
        names = ", ".join(f"{name} ({t.protocol})" for name, t in sorted(config.targets.items())) or "none"
        raise refused(ErrorKind.NOT_ALLOWED, f"'{server}' is not a remote desktop this server serves. Available: {names}.")
    host, port = parse_server(protocol, server)
    engine = settings.rdp_engine if protocol == "rdp" else settings.vnc_engine
    return RemoteDesktop(protocol, host, port, engine, settings.rdp_security, user, domain, password)


def _from_target(name: str, target: TargetSection, config: Config, user: str, domain: str,
                 password: str) -> RemoteDesktop:
    protocol = target.protocol
    engine = target.engine or (config.remote.rdp_engine if protocol == "rdp" else config.remote.vnc_engine)
    if engine not in ENGINES[protocol]:
        raise refused(ErrorKind.UNAVAILABLE,
                      f"Target '{name}' has engine {engine}, which does not speak {protocol.upper()}.")
    return RemoteDesktop(
        protocol, target.host, target.port or DEFAULT_PORTS[protocol], engine,
        target.security or config.remote.rdp_security,
        target.user or user, target.domain or domain, target.password or password, name,
    )


ENGINE_LIBRARIES = {"rdpy": "rdpy", "vnc": "vncdotool"}


def missing_engine(desktop: RemoteDesktop) -> str | None:
    """Why this server cannot run the desktop's engine, or None (the Python
    engines need libraries the Debian package leaves optional)."""
    library = ENGINE_LIBRARIES.get(desktop.engine)
    if library is None or importlib.util.find_spec(library) is not None:
        return None
    other = {"rdpy": "freerdp", "vnc": "tightvnc"}[desktop.engine]
    return (f"The {desktop.engine} engine is not installed on this server ({library} is missing); "
            f"the admin can install it or use the {other} engine.")


def keyboard_layout(keyboard: str) -> int:
    """``pc105/de`` -> 0x407, the Windows layout id (US for what we do not know)."""
    layout = keyboard.rsplit("/", 1)[-1].split("(")[0].lower()
    return KEYBOARD_LAYOUTS.get(layout, 0x409)


@dataclass(frozen=True)
class ViewerCommand:
    argv: tuple[str, ...]
    stdin: str = field(repr=False)  # the secret the viewer reads on stdin
    reports_status: bool = False  # a Python engine: two phases, a status line on fd 3


def viewer_command(desktop: RemoteDesktop, display: DisplaySettings, config: Config, python: str) -> ViewerCommand:
    """How the viewer of ``desktop`` is started; secrets go on stdin only."""
    timeout = f"{config.remote.connect_timeout:g}"
    if desktop.engine in PYTHON_ENGINES:
        argv = [python, "-m", PYTHON_ENGINES[desktop.engine], "--host", desktop.host, "--port", str(desktop.port),
                "--geometry", display.geometry, "--keyboard", display.keyboard, "--timeout", timeout,
                "--password-stdin", "--title", f"{desktop.protocol.upper()} {desktop.target or desktop.address}"]
        if desktop.protocol == "rdp":
            argv += ["--user", desktop.user, "--domain", desktop.domain, "--security", desktop.security]
        return ViewerCommand(tuple(argv), desktop.password + "\n", reports_status=True)
    if desktop.engine == "freerdp":
        # /from-stdin:force asks for the password only; user and domain are no secret.
        argv = [config.remote.xfreerdp, f"/v:{desktop.address}", "/cert:ignore", f"/sec:{desktop.security}",
                "/f", f"/kbd:0x{keyboard_layout(display.keyboard):08X}",
                *([f"/u:{desktop.user}"] if desktop.user else []), *([f"/d:{desktop.domain}"] if desktop.domain else []),
                "/from-stdin:force"]
        return ViewerCommand(tuple(argv), desktop.password + "\n")
    argv = [config.remote.xtightvncviewer, "-autopass", "-fullscreen", "-encodings", "tight zrle hextile copyrect",
            f"{desktop.host}::{desktop.port}"]
    return ViewerCommand(tuple(argv), desktop.password + "\n")


FAILURES = {
    "unreachable": "Cannot connect to the remote desktop {address}: {message}",
    "auth": "The remote desktop {address} refused the login: {message}",
    "tls": "Secure connection to the remote desktop {address} failed: {message}",
    "protocol": "The remote desktop {address} broke the protocol: {message}",
    "timeout": "The remote desktop {address} did not answer in time: {message}",
}


def viewer_failure(desktop: RemoteDesktop, status: str) -> SessionError | None:
    """The failure a viewer's status line reports, or None for ``ready``."""
    if status.startswith("ready"):
        return None
    kind, _, message = status.removeprefix("error ").partition(":")
    template = FAILURES.get(kind.strip(), "The remote desktop {address} failed: {message}")
    return refused(ErrorKind.REMOTE_FAILED,
                   template.format(address=desktop.target or desktop.address, message=message.strip() or status))
