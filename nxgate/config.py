"""The gateway's configuration: one INI file, loaded into frozen dataclasses.

Every option is declared once, as a dataclass field with its default and a
converter in the field metadata.  Loading collects *all* problems (unknown
sections and keys, bad values, duplicates) with their line numbers and raises
one :class:`ConfigError`, so an admin fixes the file in one go and the gateway
never starts on a half-understood configuration (Buildbot's
``config/master.py`` idea).

The reader is our own small INI parser rather than ``configparser`` because
the error messages need line numbers and we want no interpolation surprises.

Comments: a line whose first character is ``#`` or ``;``, and the rest of a
value from a ``;`` or ``#`` that follows whitespace (``heartbeat = 2   ; seconds``).
A ``;`` or ``#`` with no whitespace before it belongs to the value, so
``url = postgresql://nxgate:pa;ss#1@db/nxgate`` keeps its password; a value
that needs `` ;`` or `` #`` itself (after a space) cannot be written inline —
put such a password in a ``password_file``.
The values of ``[types]`` are command lines and are taken whole: there a
``#`` or ``;`` is an argument (``xterm -bg #ff0000``), never a comment.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import shlex
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from nxgate.safetext import redact_url

Converter = Callable[[str], Any]


class ConfigError(Exception):
    """Raised with every problem found; ``problems`` lists them one per line."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("invalid configuration:\n  " + "\n  ".join(problems))
        self.problems = problems


# ------------------------------------------------------------------ converters
def integer(low: int, high: int) -> Converter:
    def convert(text: str) -> int:
        try:
            value = int(text, 10)
        except ValueError:
            raise ValueError(f"expected a whole number from {low} to {high}") from None
        if not low <= value <= high:
            raise ValueError(f"expected a whole number from {low} to {high}")
        return value

    return convert


def number(low: float, high: float) -> Converter:
    def convert(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"expected a number from {low:g} to {high:g}") from None
        if not low <= value <= high:
            raise ValueError(f"expected a number from {low:g} to {high:g}")
        return value

    return convert


_TRUE = {"yes", "true", "on", "1"}
_FALSE = {"no", "false", "off", "0"}


def boolean(text: str) -> bool:
    lowered = text.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError("expected yes or no")


def words(text: str) -> tuple[str, ...]:
    """A list separated by spaces or commas."""
    return tuple(word for word in re.split(r"[\s,]+", text) if word)


def parse_max_startups(text: str) -> tuple[int, int, int]:
    """``start:rate:full`` (or a single number: a hard limit) as three
    integers; a clear error for anything else."""
    parts = text.strip().split(":")
    try:
        numbers = [int(part) for part in parts]
    except ValueError:
        raise ValueError(f"expected start:rate:full (e.g. 100:30:200) or a number, not {text!r}") from None
    if len(numbers) == 1:
        numbers = [numbers[0], 100, numbers[0]]
    if len(numbers) != 3:
        raise ValueError(f"expected start:rate:full (e.g. 100:30:200) or a number, not {text!r}")
    start, rate, full = numbers
    if not 1 <= start <= full or not 1 <= rate <= 100 or full > 1_000_000:
        raise ValueError(f"need 1 <= start <= full and a rate of 1-100 percent, not {text!r}")
    return start, rate, full


def parse_networks(words: Iterable[str]) -> tuple[Any, ...]:
    """Addresses or networks (``192.0.2.10``, ``10.0.0.0/8``, ``2001:db8::/32``)."""
    networks = []
    for word in words:
        try:
            networks.append(ipaddress.ip_network(word, strict=False))
        except ValueError:
            raise ValueError(f"not an address or network: {word!r}") from None
    return tuple(networks)


def max_startups(text: str) -> str:
    """``start:rate:full`` (OpenSSH's MaxStartups) or one number, checked here."""
    parse_max_startups(text)
    return text.strip()


def networks(text: str) -> tuple[str, ...]:
    """Addresses or networks separated by spaces or commas, checked here."""
    given = words(text)
    parse_networks(given)
    return given


def one_of(*choices: str) -> Converter:
    def convert(text: str) -> str:
        if text not in choices:
            raise ValueError("expected one of " + ", ".join(choices))
        return text

    return convert


def text(value: str) -> str:
    return value


def nonempty(value: str) -> str:
    if not value:
        raise ValueError("must not be empty")
    return value


_NX_VERSION = re.compile(r"3\.\d{1,2}\.\d{1,4}")


def nx_version(value: str) -> str:
    if not _NX_VERSION.fullmatch(value):
        raise ValueError("expected an NX 3 protocol version such as 3.5.0")
    return value


def path(value: str) -> str:
    """A file system path; relative paths are resolved against the config file."""
    return value  # resolved in load(), which knows the file's directory


def option(default: Any, convert: Converter, doc: str, *, is_path: bool = False,
           shown: Callable[[str], str] = repr) -> Any:
    """``shown``: how a bad value is quoted in the error (a URL's password is not)."""
    return field(default=default, metadata={"convert": convert, "doc": doc, "path": is_path, "shown": shown})


# --------------------------------------------------------------------- schema
@dataclass(frozen=True)
class ServerSection:
    listen: str = option("tcp:4022:backlog=1024", nonempty, "Twisted endpoint the SSH server listens on")
    server_name: str = option("", text, "host name shown to clients (default: this host's FQDN)")
    state_dir: str = option("/var/lib/nxgate", nonempty, "host keys, session store and session directories", is_path=True)
    protocol_version: str = option("3.5.0", nx_version, "NX protocol version in the greeting (keep below 4)")
    log_level: str = option("info", one_of("debug", "info", "warn", "error"), "lowest level written to the log")
    log_rotated_files: int = option(10, integer(1, 1000), "rotated files of twistd's --logfile kept (it rotates "
                                    "at 1 MB): gateway.log.1 ... gateway.log.N")
    shell_socket: str = option("", text, "Unix socket for nxgate-shell, the OpenSSH mode (empty: off)", is_path=True)
    audit_log: str = option("", text, "the audit log, one JSON line per event (empty: audit.log in state_dir)",
                            is_path=True)
    admin_socket: str = option("", text, "root-only socket for nxgate-admin (empty: admin.sock in state_dir)",
                               is_path=True)
    # Before authentication (issue 26; nxgate.gateway.doors.preauth): every door.
    login_grace_time: float = option(30.0, number(1, 3600), "seconds from a connection's first byte to its "
                                     "authentication, on every door (SSH, HTTPS, cluster port, shell socket)")
    max_startups_per_address: int = option(10, integer(1, 1_000_000), "unauthenticated connections one address "
                                           "(IPv6: one /64) may hold at once, over all doors")
    max_startups: str = option("100:30:200", max_startups, "start:rate:full, on each door: from start "
                               "unauthenticated connections on refuse rate% of new ones (or displace an idle one), "
                               "rising to all at full")
    fd_reserve: int = option(128, integer(16, 1_000_000), "file descriptors kept for running sessions, PAM "
                             "and the store: the doors take no one within this many of the limit")
    penalty_noauth: float = option(1.0, number(0, 3600), "penalty seconds for a connection that ends "
                                   "before authenticating")
    penalty_grace: float = option(10.0, number(0, 3600), "penalty seconds for a connection closed at "
                                  "login_grace_time")
    penalty_min: float = option(15.0, number(1, 86400), "penalty seconds an address owes before it is refused")
    penalty_max: float = option(600.0, number(1, 86400), "longest refusal of a penalized address")
    preauth_exempt: tuple[str, ...] = option((), networks, "addresses or networks (a load balancer, an office "
                                             "NAT) without the per-address cap and penalties")
    # After authentication (nxgate.gateway.doors.user_connections): every door.
    max_connections_per_user: int = option(32, integer(0, 1_000_000), "authenticated connections one user may "
                                           "hold at once over all doors (SSH logins as oneself, NX logins, the "
                                           "shell socket, browser viewers' WebSockets; 0: no cap)")


@dataclass(frozen=True)
class SSHSection:
    nx_user: str = option("nx", nonempty, "SSH account that NX clients log in as with the nx key")
    nx_authorized_keys: str = option("", text, "authorized keys for nx_user (empty: the NoMachine key)", is_path=True)
    user_logins: bool = option(True, boolean, "let users log in to SSH as themselves (legacy-free)")
    login_grace_time: int = option(120, integer(5, 3600), "seconds for SSH user authentication once the key "
                                   "exchange is done (the whole of it: [server] login_grace_time)")
    max_auth_tries: int = option(6, integer(1, 100), "failed SSH authentications before disconnect")
    max_channels: int = option(4, integer(1, 100), "session channels open at once per connection")
    legacy_algorithms: bool = option(False, boolean, "also offer SHA-1, CBC, MD5 and 8192-bit DH (NoMachine's nxssh)")
    kex_workers: int = option(2, integer(1, 64), "processes that compute SSH key exchanges")
    kex_per_source: int = option(4, integer(1, 1000), "SSH key exchanges pending at once per client address")
    kex_max_pending: int = option(32, integer(2, 100000), "SSH key exchanges pending in all (random drop from half)")


@dataclass(frozen=True)
class AuthSection:
    pam_service: str = option("nxgate", nonempty, "PAM service name (falls back to 'login' if missing)")
    deny_users: tuple[str, ...] = option(("root",), words, "users who may never log in")
    failed_login_delay: float = option(2.0, number(0, 60), "minimum seconds before a failed login is answered")
    max_login_attempts: int = option(3, integer(1, 20), "failed NX logins per connection before it is closed")
    login_timeout: float = option(60.0, number(1, 3600), "seconds from connect to a successful NX login")
    pam_threads: int = option(16, integer(1, 256), "threads that run PAM conversations")
    throttle_per_address: int = option(10, integer(0, 100000), "failed logins from one address that block it (0: off)")
    throttle_per_account: int = option(20, integer(0, 100000), "failed logins for one account that block it (0: off)")
    throttle_window: float = option(300.0, number(1, 86400), "seconds in which those failures count")
    throttle_block: float = option(600.0, number(1, 86400), "seconds a blocked address or account is refused")


@dataclass(frozen=True)
class ShellSection:
    idle_timeout: float = option(600.0, number(1, 86400), "seconds without a command before the NX shell closes")
    max_line_length: int = option(16384, integer(256, 1048576), "longest accepted command line in bytes")


@dataclass(frozen=True)
class SessionsSection:
    display_base: int = option(1000, integer(1, 60000), "first X display number used for sessions (agent port 4000+N)")
    display_limit: int = option(200, integer(1, 10000), "how many display numbers from display_base may be used")
    max_sessions: int = option(200, integer(0, 100000), "live sessions on this server (0: no limit)")
    max_sessions_per_user: int = option(10, integer(0, 10000), "live sessions per user (0: no limit)")
    agent_start_timeout: float = option(30.0, number(1, 600), "seconds for nxagent to become ready")
    connect_timeout: float = option(120.0, number(5, 3600), "seconds for a client to connect after start before the session ends")
    suspend_timeout: float = option(20.0, number(1, 600), "seconds for a running session to suspend (take-over)")
    terminate_timeout: float = option(10.0, number(1, 600), "seconds for nxagent to end before it is killed")
    expire_suspended_after: float = option(0.0, number(0, 1e6), "hours after which suspended sessions end (0: never)")
    history_days: float = option(7.0, number(0, 3650), "days that ended sessions stay in the store and their logs are kept")
    store_backup_interval: float = option(3600.0, number(0, 1e7),
                                          "seconds between online backups of the session store (0: none)")
    allow_unencrypted: bool = option(False, boolean, "let clients use unencrypted sessions (agent port open to them)")
    nxagent: str = option("nxagent", nonempty, "the nxagent program")
    agent_extra_options: tuple[str, ...] = option((), words, "extra nxagent command line options")
    published_applications: tuple[str, ...] = option(
        ("/etc/x2go/applications", "/usr/share/applications"), words,
        "directories whose .desktop files (and those of their subdirectories) X2Go clients' published-applications"
        " mode lists and may start")
    use_xsession: bool = option(True, boolean, "start desktops through the system's X session script")
    xsession: str = option("/etc/X11/Xsession", nonempty, "the system's X session script")
    path: str = option("/usr/local/bin:/usr/bin:/bin:/usr/games", nonempty, "PATH of session programs")
    lang: str = option("C.UTF-8", nonempty, "LANG when PAM sets none")


@dataclass(frozen=True)
class JailSection:
    enabled: bool = option(False, boolean, "run sessions in their own mount, PID and IPC namespaces (bubblewrap)")
    groups: tuple[str, ...] = option((), words, "jail only members of these groups (empty: every user)")
    types: tuple[str, ...] = option((), words, "jail only these session types (empty: every unix-* type)")
    bwrap: str = option("/usr/bin/bwrap", nonempty, "the bubblewrap program")
    memory_max: str = option("", text, "cgroup v2 memory.max of a jailed session (empty: no limit)")
    cpu_max: str = option("", text, "cgroup v2 cpu.max of a jailed session, e.g. '100000 100000' (empty: none)")
    pids_max: int = option(0, integer(0, 1000000), "cgroup v2 pids.max of a jailed session (0: no limit)")


@dataclass(frozen=True)
class ShadowSection:
    enabled: bool = option(True, boolean, "let users shadow (watch or help in) running sessions")
    allow_own: bool = option(True, boolean, "users may shadow their own other sessions, without being asked")
    allow_others: str = option("admins", one_of("nobody", "admins", "everyone"),
                               "who may shadow other users' sessions")
    admin_groups: tuple[str, ...] = option(("nxadmin",), words, "members of these groups are shadowing admins")
    ask_owner: bool = option(True, boolean, "ask the owner before someone else watches her session")
    ask_owner_for_admins: bool = option(True, boolean, "ask the owner when an admin wants to watch, too")
    interactive: bool = option(True, boolean, "viewers may use keyboard and mouse (no: always view-only)")
    consent_timeout: float = option(30.0, number(5, 600), "seconds the owner has to answer")
    console_display: str = option(":0", text, "the machine's local display that may be shadowed (empty: none)")
    dialog_python: str = option("/usr/bin/python3", nonempty, "Python with tkinter that shows the consent dialog")


@dataclass(frozen=True)
class RemoteSection:
    enabled: bool = option(True, boolean, "serve the NX session types windows (RDP) and vnc")
    allow_any_host: bool = option(False, boolean, "users may name any host (no: only the [target NAME] sections)")
    rdp_engine: str = option("rdpy", one_of("rdpy", "freerdp"), "default RDP engine")
    vnc_engine: str = option("vnc", one_of("vnc", "tightvnc"), "default VNC engine")
    rdp_security: str = option("tls", one_of("tls", "nla", "rdp"), "default RDP security")
    connect_timeout: float = option(15.0, number(1, 120), "seconds to reach and log in to a remote desktop")
    xfreerdp: str = option("xfreerdp", nonempty, "the FreeRDP program (freerdp engine)")
    xtightvncviewer: str = option("xtightvncviewer", nonempty, "the TightVNC viewer (tightvnc engine)")


@dataclass(frozen=True)
class MetricsSection:
    listen: str = option("", text, "Twisted endpoint for the Prometheus /metrics page (empty: off)")


@dataclass(frozen=True)
class DBusSection:
    enabled: bool = option(True, boolean, "offer org.nxgate.Gateway1 on the system bus (no bus: a warning, no more)")
    address: str = option("", text, "bus address (empty: DBUS_SYSTEM_BUS_ADDRESS, else the system bus)")
    admin_groups: tuple[str, ...] = option(("nxadmin",), words, "members of these groups act on every session")


@dataclass(frozen=True)
class X2GoSection:
    enabled: bool = option(True, boolean, "let X2Go clients (x2goclient, pyhoca-cli) log in to the SSH port as"
                           " themselves and use their sessions (needs [ssh] user_logins)")


_STORE_SCHEMES = ("sqlite", "postgresql", "postgres", "mysql", "mariadb")


def redacted_url(value: str) -> str:
    return repr(redact_url(value))


def store_url(value: str) -> str:
    """``sqlite:`` (the state directory's file), ``sqlite:/PATH``,
    ``postgresql://USER@HOST[:PORT]/DB`` or ``mysql://USER@HOST[:PORT]/DB``."""
    scheme = value.split(":", 1)[0].lower()
    if scheme not in _STORE_SCHEMES or ":" not in value:
        raise ValueError("expected sqlite:, postgresql://USER@HOST[:PORT]/DATABASE or mysql://USER@HOST[:PORT]/DATABASE")
    if scheme != "sqlite" and not value.split(":", 1)[1].startswith("//"):
        raise ValueError(f"expected {scheme}://USER@HOST[:PORT]/DATABASE")
    return value


@dataclass(frozen=True)
class StoreSection:
    url: str = option("sqlite:", store_url, "where sessions are stored: sqlite: (a file in state_dir, nothing to set "
                      "up), postgresql://USER@HOST[:PORT]/DB or mysql://USER@HOST[:PORT]/DB (shared by a cluster)",
                      shown=redacted_url)
    password_file: str = option("", text, "file holding the database password (empty: none, or the URL's)",
                                is_path=True)


@dataclass(frozen=True)
class ServicesSection:
    """What may travel beside the screen (issue 14): the admin's switch per
    service.  A client that asks for a switched-off service gets the session
    without it, not an error (README "Sound, printing and folders")."""

    sound: bool = option(True, boolean, "carry the session's sound to the client (NX media channel, --media)")
    printing: bool = option(True, boolean, "let the session print on the client's printers (NX cups channel, --cups)")
    sharing: bool = option(True, boolean, "mount the client's shared folders in the session (NX smb channel, --samba)")


@dataclass(frozen=True)
class WebSection:
    listen: str = option("", text, "Twisted endpoint of the browser portal, e.g. ssl:4443 (empty: off; tcp: only "
                         "on a loopback interface)")
    certificate: str = option("", text, "PEM certificate for HTTPS (empty: a self-signed one in state_dir/web)",
                              is_path=True)
    private_key: str = option("", text, "PEM private key of the certificate (empty: generated with it)", is_path=True)
    admin_groups: tuple[str, ...] = option(("nxadmin",), words, "members of these groups see the admin page")
    idle_timeout: float = option(900.0, number(5, 86400), "seconds without a request before a browser login ends")
    thumbnail_ttl: float = option(3.0, number(0.5, 300), "seconds a session thumbnail is kept before it is redrawn")
    max_viewers: int = option(4, integer(1, 64), "browser viewers one user may have open at once")


@dataclass(frozen=True)
class TargetSection:
    """A remote desktop the admin defines: ``[target NAME]``."""

    protocol: str = option("rdp", one_of("rdp", "vnc"), "rdp or vnc")
    host: str = option("", nonempty, "host name or address")
    port: int = option(0, integer(0, 65535), "port (0: 3389 for RDP, 5900 for VNC)")
    engine: str = option("", one_of("", "rdpy", "freerdp", "vnc", "tightvnc"), "engine (empty: [remote]'s default)")
    security: str = option("", one_of("", "tls", "nla", "rdp"), "RDP security (empty: [remote]'s default)")
    user: str = option("", text, "fixed RDP user (empty: the client's)")
    domain: str = option("", text, "fixed RDP domain (empty: the client's)")
    password: str = option("", text, "fixed password (empty: the client's); keep this file root-only")


_MEMBER_NAME = re.compile(r"(?=.{1,253}\Z)[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*")
CLUSTER_ROLES = frozenset({"gateway", "node"})


def member_name(value: str) -> str:
    """A cluster member's name: a DNS name, because the member's certificate
    carries it as a DNS subjectAltName and peers check it there."""
    if not _MEMBER_NAME.fullmatch(value):
        raise ValueError("expected a DNS name in lower case, such as node-a or node-a.example.org")
    return value


def roles(value: str) -> frozenset[str]:
    given = frozenset(words(value.lower()))
    if not given or not given <= CLUSTER_ROLES:
        raise ValueError("expected gateway, node or both (separated by a comma)")
    return given


def host_port(value: str) -> str:
    """``host:port`` (``[v6]:port`` for IPv6) as other members dial it."""
    host, colon, port = value.rpartition(":")
    if not colon or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError("expected host:port, such as 10.0.0.1:7022")
    return value


@dataclass(frozen=True)
class ClusterConfig:
    """``[cluster]``: this machine as one member of several (issue 13).

    Absent, :attr:`Config.cluster` is None and the gateway is one box as
    before.  Members talk over mutually authenticated TLS
    (:mod:`nxgate.wire.tls`): ``certificate`` must name ``name`` as a DNS
    subjectAltName and be signed by ``ca``."""

    name: str = option("", member_name, "this member's name, as in its certificate's DNS subjectAltName")
    roles: frozenset[str] = option(CLUSTER_ROLES, roles, "gateway (SSH/NX front door), node (runs sessions), or both")
    listen: str = option("", text, "Twisted endpoint of the node's control and stream listener (TLS added by nxgate)")
    address: str = option("", text, "host:port other members dial to reach this one's listener")
    ca: str = option("", text, "PEM certificate of the cluster CA", is_path=True)
    certificate: str = option("", text, "PEM certificate of this member, signed by the CA", is_path=True)
    key: str = option("", text, "PEM private key of this member (keep it 0600)", is_path=True)
    heartbeat: float = option(2.0, number(0.1, 3600), "seconds between heartbeats; a member silent for 3 is down")
    weight: float = option(1.0, number(0, 1000), "this member's placement weight (0: no new sessions)")


def _check_cluster(filename: str, cluster: ClusterConfig, given: set[str], problems: list[str]) -> None:
    """What single options cannot say: the required ones, the listener of a
    node, and the PEM files being there (a member that cannot prove who it
    is must not start believing it is part of the cluster).  Options that were
    given but wrong are reported once, by the converter, not as missing too."""
    for key in ("name", "ca", "certificate", "key"):
        if not getattr(cluster, key) and key not in given:
            problems.append(f"{filename}: [cluster] needs {key}")
    if "node" in cluster.roles:
        for key in ("listen", "address"):
            if not getattr(cluster, key):
                problems.append(f"{filename}: [cluster] needs {key} on a member with role node")
    if cluster.address:
        try:
            host_port(cluster.address)
        except ValueError as exc:
            problems.append(f"{filename}: [cluster] address = {cluster.address!r}: {exc}")
    for key in ("ca", "certificate", "key"):
        value = getattr(cluster, key)
        if value and not os.path.isfile(value):
            problems.append(f"{filename}: [cluster] {key} = {value}: no such file")


DEFAULT_TYPES: dict[str, tuple[str, ...]] = {
    "unix-console": ("xterm",),
    "unix-xfce": ("startxfce4",),
    "unix-gnome": ("gnome-session",),
    "unix-kde": ("startplasma-x11",),
    "unix-default": (),  # the user's ~/.xsession or the system default
}
_TYPE_NAME = re.compile(r"unix-[a-z0-9][a-z0-9-]{0,30}")


@dataclass(frozen=True)
class Config:
    server: ServerSection = ServerSection()
    ssh: SSHSection = SSHSection()
    auth: AuthSection = AuthSection()
    shell: ShellSection = ShellSection()
    sessions: SessionsSection = SessionsSection()
    shadow: ShadowSection = ShadowSection()
    jail: JailSection = JailSection()
    remote: RemoteSection = RemoteSection()
    metrics: MetricsSection = MetricsSection()
    dbus: DBusSection = DBusSection()
    x2go: X2GoSection = X2GoSection()
    store: StoreSection = StoreSection()
    # [cluster]: None when absent (one box, as before issue 13).
    cluster: ClusterConfig | None = None
    services: ServicesSection = ServicesSection()
    web: WebSection = WebSection()
    # Remote desktops by name, from [target NAME] sections.
    targets: dict[str, TargetSection] = field(default_factory=dict)
    # Session limits by user and group: "user.NAME" / "group.NAME" -> count.
    limits: dict[str, int] = field(default_factory=dict)
    # Session types: name -> command (argv).  unix-application runs the
    # client's --application; an empty command disables a type.
    types: dict[str, tuple[str, ...]] = field(default_factory=lambda: dict(DEFAULT_TYPES))
    source: str = "<built-in defaults>"
    # [server] options given on twistd's command line (--port, --state-dir):
    # they win over the file, also when the file is reloaded.
    overrides: dict[str, str] = field(default_factory=dict)
    # This host's FQDN, looked up once when the config is made (at load,
    # and again only by a reload), because socket.getfqdn() may ask DNS and
    # server_name is read on the reactor thread at every session start.
    # Empty when [server] server_name is given.
    host_name: str = field(default="", compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.server.server_name and not self.host_name:
            object.__setattr__(self, "host_name", socket.getfqdn().lower())

    @property
    def server_name(self) -> str:
        """The configured server_name, else this host's FQDN (resolved once)."""
        return self.server.server_name or self.host_name

    def replace(self, **sections: Any) -> Config:
        return dataclasses.replace(self, **sections)


def _section_fields() -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(Config)
            if f.name not in ("source", "types", "targets", "limits", "overrides", "host_name", "cluster")]


def with_overrides(config: Config, **server_options: str | None) -> Config:
    """``config`` with [server] values from the command line (empty ones are
    not given).  They are remembered in ``overrides`` so that a reload of the
    file applies them again instead of reporting them as changes."""
    given = {key: value for key, value in server_options.items() if value}
    if not given:
        return config
    return dataclasses.replace(config, server=dataclasses.replace(config.server, **given),
                               overrides={**config.overrides, **given})


# Settings the running gateway cannot change: where it listens and keeps its
# state, its sockets and log files, the PAM thread pool, the SSH checkers.
RESTART_NEEDED = (
    ("server", "listen"), ("server", "state_dir"), ("server", "shell_socket"), ("server", "admin_socket"),
    ("server", "audit_log"), ("auth", "pam_threads"), ("ssh", "user_logins"), ("metrics", "listen"),
    ("dbus", "enabled"), ("dbus", "address"), ("x2go", "enabled"), ("store", "url"), ("store", "password_file"),
    ("web", "listen"), ("web", "certificate"), ("web", "private_key"),
    ("ssh", "legacy_algorithms"), ("ssh", "kex_workers"), ("ssh", "kex_per_source"), ("ssh", "kex_max_pending"),
)


def restart_needed(running: Config, reloaded: Config) -> list[str]:
    """The settings that differ between the running config and a reloaded
    one (with the running one's command-line overrides applied again) but
    only take effect after a restart, as ``[section] option``."""
    reloaded = with_overrides(reloaded, **running.overrides)
    changed = [f"[{section}] {name}" for section, name in RESTART_NEEDED
               if getattr(getattr(running, section), name) != getattr(getattr(reloaded, section), name)]
    if running.cluster != reloaded.cluster:  # who this member is, its listener and its keys
        changed.append("[cluster]")
    return changed


_LIMIT_KEY = re.compile(r"(user|group)\.[A-Za-z0-9_.$@-]{1,64}")


def _load_limits(filename: str, values: dict[str, tuple[int, str]], problems: list[str]) -> dict[str, int]:
    """The free-form ``[limits]`` section: ``user.NAME = N`` and ``group.NAME = N``."""
    limits: dict[str, int] = {}
    for key, (number_, value) in values.items():
        if not _LIMIT_KEY.fullmatch(key):
            problems.append(f"{filename}:{number_}: [limits] {key}: keys look like user.NAME or group.NAME")
            continue
        try:
            limits[key] = integer(0, 100000)(value)
        except ValueError as exc:
            problems.append(f"{filename}:{number_}: [limits] {key} = {value!r}: {exc}")
    return limits


def _load_types(filename: str, values: dict[str, tuple[int, str]], problems: list[str]) -> dict[str, tuple[str, ...]]:
    """The free-form ``[types]`` section: ``unix-NAME = command line``."""
    types = dict(DEFAULT_TYPES)
    for key, (number_, value) in values.items():
        if key == "unix-application" or not _TYPE_NAME.fullmatch(key):
            problems.append(f"{filename}:{number_}: [types] {key}: type names look like unix-NAME"
                            " (unix-application runs the client's command and cannot be set)")
            continue
        try:
            types[key] = tuple(shlex.split(value))
        except ValueError as exc:
            problems.append(f"{filename}:{number_}: [types] {key} = {value!r}: {exc}")
    return types


# --------------------------------------------------------------------- reader
_SECTION = re.compile(r"\[\s*([A-Za-z0-9_.-]+(?:\s+[A-Za-z0-9_.-]+)?)\s*\]")
_ASSIGN = re.compile(r"([A-Za-z0-9_.-]+)\s*[=:](.*)")
#: An inline comment: ``;`` or ``#`` at the start of a value or after whitespace.
_INLINE_COMMENT = re.compile(r"(?:^|\s)[;#]")


#: Sections whose values are command lines, read whole (no inline comments).
VERBATIM_SECTIONS = frozenset({"types"})


def strip_comment(value: str) -> str:
    """A value without its inline comment (see the module's docstring)."""
    return _INLINE_COMMENT.split(value, 1)[0].strip()


def parse_ini(lines: list[str], source: str) -> tuple[dict[str, dict[str, tuple[int, str]]], list[str]]:
    """Split INI text into ``{section: {key: (line number, value)}}`` plus problems."""
    result: dict[str, dict[str, tuple[int, str]]] = {}
    problems: list[str] = []
    section: str | None = None
    for number_, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        match = _SECTION.fullmatch(line)
        if match:
            section = " ".join(match.group(1).lower().split())
            result.setdefault(section, {})
            continue
        match = _ASSIGN.fullmatch(line)
        if match is None:
            problems.append(f"{source}:{number_}: cannot read this line: {line!r}")
            continue
        if section is None:
            problems.append(f"{source}:{number_}: option outside any [section]")
            continue
        key, value = match.group(1).lower(), match.group(2)
        value = value.strip() if section in VERBATIM_SECTIONS else strip_comment(value)
        if key in result[section]:
            problems.append(f"{source}:{number_}: [{section}] {key} given twice (first on line {result[section][key][0]})")
            continue
        result[section][key] = (number_, value)
    return result, problems


def _convert(filename: str, name: str, cls: type, values: dict[str, tuple[int, str]], base: str,
             problems: list[str]) -> Any:
    """One section's values, converted and checked, as an instance of ``cls``."""
    options = {f.name: f for f in dataclasses.fields(cls)}
    converted: dict[str, Any] = {}
    for key, (number_, value) in values.items():
        opt = options.get(key)
        if opt is None:
            problems.append(f"{filename}:{number_}: [{name}] unknown option '{key}'")
            continue
        try:
            result = opt.metadata["convert"](value)
        except ValueError as exc:
            problems.append(f"{filename}:{number_}: [{name}] {key} = {opt.metadata['shown'](value)}: {exc}")
            continue
        if opt.metadata["path"] and result:
            result = os.path.normpath(os.path.join(base, result))
        converted[key] = result
    if cls is TargetSection and not converted.get("host") and "host" not in values:
        problems.append(f"{filename}: [{name}] needs a host")
        return None
    return cls(**converted)


def load(filename: str | None) -> Config:
    """Load and validate a config file; ``None`` gives the built-in defaults."""
    if filename is None:
        return Config()
    try:
        with open(filename, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"{filename}: cannot read: {exc}"]) from None
    base = os.path.dirname(os.path.abspath(filename))
    parsed, problems = parse_ini(lines, filename)
    sections: dict[str, Any] = {"types": _load_types(filename, parsed.pop("types", {}), problems), "targets": {},
                                "limits": _load_limits(filename, parsed.pop("limits", {}), problems)}
    known = {f.name: f for f in _section_fields()}
    for name, values in parsed.items():
        if name.startswith("target "):
            target = _convert(filename, name, TargetSection, values, base, problems)
            if target is not None:
                sections["targets"][name.split(" ", 1)[1]] = target
            continue
        if name == "cluster":
            cluster = _convert(filename, name, ClusterConfig, values, base, problems)
            _check_cluster(filename, cluster, set(values), problems)
            sections["cluster"] = cluster
            continue
        section_field = known.get(name)
        if section_field is None:
            first = min((n for n, _ in values.values()), default=0)
            problems.append(f"{filename}: unknown section [{name}] (known: {', '.join(known)}, cluster, types, limits, target NAME)"
                            + (f", near line {first}" if first else ""))
            continue
        section = _convert(filename, name, type(section_field.default), values, base, problems)
        if section is not None:
            sections[name] = section
    if problems:
        raise ConfigError(problems)
    return Config(source=filename, **sections)


def describe_listen(endpoint: str) -> str:
    """Where a Twisted server endpoint listens, in words for the start-up
    log ("all interfaces, port 4022"): a newcomer must see at once that the
    default is reachable from the network."""
    kind, _, rest = endpoint.partition(":")
    if kind.lower() not in ("tcp", "tcp6", "ssl"):
        return endpoint
    port, interface = "", ""
    for part in re.split(r"(?<!\\):", rest):
        key, equals, value = part.replace("\\:", ":").partition("=")
        if equals and key == "interface":
            interface = value
        elif equals and key == "port":
            port = value
        elif not equals and not port:
            port = part
    if interface in ("", "0.0.0.0", "::"):
        where = "all interfaces" + (" (IPv6 and IPv4)" if kind.lower() == "tcp6" or interface == "::" else "")
    elif interface in ("127.0.0.1", "::1", "localhost"):
        where = f"{interface} only (this machine)"
    else:
        where = interface
    return f"{where}, port {port}"


def describe() -> str:
    """Every option with its default and meaning, as a commented INI text."""
    out: list[str] = []
    for section_field in _section_fields():
        out.append(f"[{section_field.name}]")
        for opt in dataclasses.fields(type(section_field.default)):
            default = opt.default
            if isinstance(default, tuple):
                default = " ".join(default)
            elif isinstance(default, bool):
                default = "yes" if default else "no"
            out.append(f"# {opt.metadata['doc']}")
            out.append(f"#{opt.name} = {default}")
        out.append("")
    out.append("[types]")
    out.append("# session types and their commands (unix-application runs the client's --application)")
    for name, argv in DEFAULT_TYPES.items():
        out.append(f"#{name} = {shlex.join(argv)}")
    return "\n".join(out) + "\n"
