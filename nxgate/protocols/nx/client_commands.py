"""The NX command lines the client sends (pure).

Values go on the wire as ``--key="value"``.  Servers differ in how they
parse them (reference §2.5): Neatx accepts only ``--key="[^"]*"`` tokens,
FreeNX turns the line into ``key=value&key=value`` and decodes a few
``%XX`` escapes, nxgate decodes every ``%XX``.  OpenNX's answer, which all of
them understand, is to send every character that could end a value or mean
something to a shell or to an options line as ``%XX``; we do the same, and
also escape control characters, which would otherwise end the command line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from nxgate.protocols.nx.params import format_params

CLIENT_VERSION = "3.5.0"
HELLO = f"hello NXCLIENT - Version {CLIENT_VERSION}"
_VERSION_3 = re.compile(r"3\.\d+\.\d+")


def hello(server_version: str | None) -> str:
    """``hello`` with the server's own 3.x version, as Remmina and OpenNX do:
    Neatx accepts nothing but its exact version."""
    version = (server_version or "").split("-")[0]
    if not _VERSION_3.fullmatch(version):
        version = CLIENT_VERSION
    return f"hello NXCLIENT - Version {version}"

_SESSION_ID = re.compile(r"[0-9A-F]{32}")

# Session types whose windows can be shown rootless (reference §2.5, Neatx, OpenNX).
ROOTLESS_TYPES = frozenset({"unix-console", "unix-application"})
# The session types of a remote desktop (reference §2.5, §6.2): RDP and VNC.
RDP, VNC, SHADOW = "windows", "vnc", "shadow"


@dataclass(frozen=True)
class RemoteDesktop:
    """The RDP or VNC host of a ``windows``/``vnc`` session.

    ``server`` is what the server gets as ``agent_server``: ``host[:port]``
    for RDP, ``host:display`` or ``host::port`` for VNC, or the name of a
    target the admin defined."""

    server: str
    user: str = ""
    domain: str = ""
    password: str = field(default="", repr=False)

    def pairs(self, session_type: str) -> list[tuple[str, str]]:
        """What OpenNX sends (reference §2.5): for RDP the domain, and user and
        password only when logging in as someone (no user: the host's own
        login screen); for VNC the password only."""
        if session_type == VNC:
            return [("agent_server", self.server), ("agent_password", self.password)]
        pairs = [("agent_server", self.server), ("agent_domain", self.domain)]
        if self.user:
            pairs += [("agent_user", self.user), ("agent_password", self.password)]
        return pairs


@dataclass(frozen=True)
class SessionParameters:
    """What ``startsession`` and ``restoresession`` say about the session and
    this client's screen."""

    name: str = "nxgate-client"
    type: str = "unix-console"
    width: int = 1024
    height: int = 768
    depth: int = 24
    link: str = "lan"
    keyboard: str = "pc105/us"
    application: str | None = None
    rootless: bool = False
    fullscreen: bool = False
    remote: RemoteDesktop | None = None  # for windows and vnc sessions
    media: bool = False  # sound through the NX media channel (--sound)
    cups: bool = False  # printing through the NX cups channel (--print)
    samba: bool = False  # folder sharing through the NX smb channel (--share)

    def pairs(self) -> list[tuple[str, str]]:
        pairs = [("session", self.name), ("type", self.type)]
        if self.remote is not None and self.type in (RDP, VNC):
            pairs += self.remote.pairs(self.type)
        pairs.append(("geometry", f"{self.width}x{self.height}"))
        if self.type != SHADOW:  # no client sends one to attach (Remmina, OpenNX)
            pairs.append(("screeninfo", f"{self.width}x{self.height}x{self.depth}+render"))
        pairs += [
            ("link", self.link),
            ("keyboard", self.keyboard),
            ("encryption", "1"),
            ("cache", "16M"),
            ("images", "64M"),
            ("backingstore", "1"),
            ("media", "1" if self.media else "0"),
            *((("samba", "1"),) if self.samba else ()),
            ("client", "linux"),
        ]
        if self.cups:  # as OpenNX sends it; only when asked, like FreeNX's nxnode reads it
            pairs.append(("cups", "1"))
        if self.application is not None:
            pairs.append(("application", self.application))
        if self.rootless and self.type in ROOTLESS_TYPES:
            pairs.append(("rootless", "1"))
        if self.fullscreen:
            pairs.append(("fullscreen", "1"))
        return pairs


def normalize_session_id(text: str) -> str | None:
    """The bare 32-hex id from what a user typed: the id itself or the full
    ``host-display-ID`` form that ``NX> 700`` shows; None if it is neither."""
    candidate = text.strip().upper()[-32:]
    if not _SESSION_ID.fullmatch(candidate):
        return None
    if len(text.strip()) > 32 and text.strip()[-33] != "-":
        return None
    return candidate


def start_command(params: SessionParameters) -> str:
    return "startsession " + format_params(params.pairs())


def restore_command(session_id: str, params: SessionParameters) -> str:
    return "restoresession " + format_params([("id", session_id), *params.pairs()])


def attach_command(session_id: str, display: str, params: SessionParameters, view_only: bool = False) -> str:
    """Shadow a session: its id and display from the shadow listing, as
    Remmina and OpenNX send them (reference §2.5; nxgate looks the display up
    itself), and this client's own display settings.  ``viewonly`` asks for
    watching only, whatever the server would allow."""
    pairs = [("id", session_id), ("display", display), *params.pairs()]
    if view_only:
        pairs.append(("viewonly", "1"))
    return "attachsession " + format_params(pairs)


def list_command() -> str:
    return "listsession " + format_params([("status", "suspended,running")])


def list_shadow_command() -> str:
    """Only the type, as OpenNX and Remmina send it (reference §2.4)."""
    return "listsession " + format_params([("type", SHADOW)])


def terminate_command(session_id: str) -> str:
    return "terminate " + format_params([("sessionid", session_id)])


def suspend_command(session_id: str) -> str:
    return "suspend " + format_params([("sessionid", session_id)])


def addmount_command(session_id: str, port: int, share: str, username: str, password: str, computer: str) -> str:
    """One shared folder, as OpenNX sends it after ``NX> 710`` (reference §6):
    the server mounts it as ``~/MyShares/<share>``."""
    return "addmount " + format_params([
        ("port", str(port)), ("username", username), ("password", password), ("share", share),
        ("computername", computer), ("session_id", session_id), ("dir", f"$(SHARES)/{share}"),
    ])
