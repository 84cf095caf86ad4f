"""What a client asks for in ``startsession``/``restoresession`` (pure).

Real clients send dozens of parameters (reference §2.5); most matter to the
client only.  Here we pick out what shapes the session, validate every value
that will reach nxagent's options line or a command line, and refuse bad
values with a clear ``NX> 597`` rather than passing them on: a comma or colon
smuggled into ``keyboard`` would otherwise add options of its own.
Unknown parameters are ignored; missing ones get Neatx's defaults.

A ``startsession`` never takes its session id or display from the client:
the server chooses both (a random id, the first free display), as FreeNX and
Neatx do; FreeNX even overrides a client's ``display`` with its own.  Real
clients send ``--id`` only to restore or attach and ``--display`` only to
attach (nxcl sends ``0`` there), so refusing them on a start could only
break a client; they are reported in :attr:`StartRequest.ignored` and the
gateway logs that it ignored them.
"""

from __future__ import annotations

import re
import shlex

from nxgate.protocols.nx import errors
from nxgate.protocols.nx.errors import NXError
from nxgate.protocols.nx.params import Params
from nxgate.vocabulary.display_bounds import depth_problem, size_problem
from nxgate.vocabulary.requests import DisplaySettings, RemoteRequest, RestoreRequest, ShadowRequest, StartRequest
from nxgate.safetext import printable

# X geometry: WxH with an optional window position (+X+Y, -X-Y, ...).  A size
# of 0 means "not given": Remmina sends 0x0 for "use the window size".
_GEOMETRY = re.compile(r"(\d{1,5})x(\d{1,5})(?:[+-]-?\d{1,5}[+-]-?\d{1,5})?")
_SCREENINFO = re.compile(r"(\d{1,5})x(\d{1,5})x(\d{1,2})((?:\+[a-z]+)*)")
_SIZE = re.compile(r"(\d{1,4})M")
_SAFE_WORD = re.compile(r"[A-Za-z0-9_./()+-]{1,64}")  # nothing that is special in an options line
_TYPE = re.compile(r"[a-z][a-z0-9-]{0,31}")
_ID = re.compile(r"[0-9A-F]{32}")
LINKS = ("modem", "isdn", "adsl", "wan", "lan")
CLIPBOARD = ("both", "client", "server", "none")
MAX_NAME = 128
MAX_APPLICATION = 4096
# startsession parameters whose values the server chooses itself.
SERVER_CHOSEN = ("id", "display")
REMOTE_KEYS = ("agent_server", "agent_user", "agent_domain", "agent_password")
#: The parameters that ask for a service beside the screen (reference §2.5,
#: client sources and logs): NoMachine 3.x sends ``--media="1"
#: --mediahelper="esd"`` and ``--samba``; OpenNX ``--samba``, ``--cups``,
#: ``--media`` (always "0" in early versions) and with media its helper,
#: ``esd`` or (newer, the default) ``pa``/``pa-RATE[-mono]``; nxcl, Remmina
#: and the gnx-style clients a fixed ``--media="0"``.  FreeNX's nxnode reads
#: the same three.
SERVICE_PARAMETERS = (("media", "sound"), ("cups", "printing"), ("samba", "sharing"), ("smb", "sharing"))
_YES = ("1", "true", "yes", "on")


def invalid(name: str, value: str, why: str) -> NXError:
    # The value goes back to the client in an NX> line: %0A must not end it.
    shown = printable(value if len(value) <= 80 else value[:77] + "...")
    return NXError(errors.BAD_PARAMETERS, f"Error: Invalid value '{shown}' for parameter '{name}': {why}.")


def _flag(params: Params, name: str, default: bool) -> bool:
    given = params.get(name, "").strip()
    value = given.lower()
    if value == "":
        return default
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise invalid(name, given, "expected 0 or 1")  # as the client wrote it


def _choice(params: Params, name: str, choices: tuple[str, ...], default: str) -> str:
    given = params.get(name, "").strip()
    value = given.lower() or default
    if value not in choices:
        raise invalid(name, given, "expected one of " + ", ".join(choices))
    return value


def _size(params: Params, name: str, default: str) -> str:
    value = params.get(name, "").strip() or default
    match = _SIZE.fullmatch(value)
    if match is None or not 0 <= int(match.group(1)) <= 1024:
        raise invalid(name, value, "expected a size such as 16M")
    return value


def _word(name: str, value: str, default: str) -> str:
    value = value.strip() or default
    if not _SAFE_WORD.fullmatch(value):
        raise invalid(name, value, "unexpected characters")
    return value


def _window_size(params: Params) -> tuple[int, int, bool]:
    """(width, height, fullscreen) from ``--geometry``; 0x0 if not given.

    Clients send ``WxH``, ``WxH+X+Y`` (NoMachine), ``fullscreen`` (nxcl,
    older OpenNX), ``available`` (older OpenNX: a window as large as the
    client's work area) or ``0x0`` (Remmina without a custom size).  For
    ``available`` the client's screen size is asked for and the client's
    window manager fits the window into its work area; nxagent (resize=1)
    then takes the window's size."""
    text = params.get("geometry", "").strip()
    if not text or text.lower() == "available":
        return 0, 0, False
    if text.lower() == "fullscreen":
        return 0, 0, True
    match = _GEOMETRY.fullmatch(text)
    if match is None:
        raise invalid("geometry", text, "expected WxH, WxH+X+Y, fullscreen or available")
    width, height = int(match.group(1)), int(match.group(2))
    return (width, height, False) if width and height else (0, 0, False)


def display_settings(params: Params) -> DisplaySettings:
    """The display part of a start or restore request.

    FreeNX's rule: the session's size comes from ``--geometry``;
    ``--screeninfo`` (the client's screen, ``WxHxD[+render][+fullscreen]``)
    gives the depth and RENDER, and the size only when the geometry says
    nothing, is ``available`` or asks for the full screen.  A full-screen
    session gets the client's whole screen whatever size is written here:
    nxagent sizes it from the client's display, and the list shows what
    nxagent reports (:mod:`nxgate.node.agents.agentlog`)."""
    width, height, fullscreen = _window_size(params)
    fullscreen = _flag(params, "fullscreen", False) or fullscreen
    depth, render = 24, True
    screeninfo = params.get("screeninfo", "").strip()
    if screeninfo:
        match = _SCREENINFO.fullmatch(screeninfo)
        if match is None:
            raise invalid("screeninfo", screeninfo, "expected WxHxD[+render]")
        depth = int(match.group(3))
        render = "+render" in match.group(4)
        if "+fullscreen" in match.group(4):
            fullscreen = True
        screen_width, screen_height = int(match.group(1)), int(match.group(2))
        if screen_width and screen_height and (fullscreen or not width):
            width, height = screen_width, screen_height
    problem = depth_problem(depth)
    if problem is not None:
        raise invalid("screeninfo", screeninfo, problem)
    if not width:
        width, height = 800, 600
    problem = size_problem(width, height)
    if problem is not None:
        raise invalid("geometry", params.get("geometry", "") or screeninfo, problem)
    keyboard = params.get("keyboard", "").strip() or params.get("kbtype", "")
    return DisplaySettings(
        geometry=f"{width}x{height}",
        fullscreen=fullscreen,
        depth=depth,
        render=render,
        keyboard=_word("keyboard", keyboard, "pc105/us"),
        link=_choice(params, "link", LINKS, "lan"),
        cache=_size(params, "cache", "16M"),
        images=_size(params, "images", "64M"),
        clipboard=_choice(params, "clipboard", CLIPBOARD, "both"),
        client=_word("client", params.get("client", ""), "unknown"),
        backingstore=params.get("backingstore", "1").strip().lower() not in ("0", "never", "off"),
    )


def start_request(params: Params) -> StartRequest:
    """Validate a ``startsession``; raises NXError for bad or missing values."""
    given_type = params.get("type", "").strip()
    session_type = given_type.lower()
    if not session_type:
        raise NXError(errors.GENERIC_ERROR, "Error: Session type missing.", last_operation_failed=True)
    if not _TYPE.fullmatch(session_type):
        raise invalid("type", given_type, "not a session type")
    name = " ".join(params.get("session", "").split())[:MAX_NAME] or session_type
    application: tuple[str, ...] = ()
    if session_type == "unix-application":
        text = params.get("application", "").strip()
        if not text:
            raise NXError(
                errors.GENERIC_ERROR,
                "Error: Session type unix-application, but missing application.",
                last_operation_failed=True,
            )
        if len(text) > MAX_APPLICATION or "\0" in text:
            raise invalid("application", text, "too long or contains NUL")
        try:
            application = tuple(shlex.split(text))
        except ValueError as error:
            raise invalid("application", text, str(error)) from None
    rootless = _flag(params, "rootless", False) and not _flag(params, "virtualdesktop", False)
    return StartRequest(
        type=session_type,
        name=name,
        display=display_settings(params),
        encrypted=_flag(params, "encryption", True),
        rootless=rootless and session_type in ("unix-application", "unix-console"),
        application=application,
        ignored=tuple((key, params[key]) for key in SERVER_CHOSEN if params.get(key, "").strip()),
        remote=remote_request(params),
        services=services(params),
    )


def services(params: Params) -> frozenset[str]:
    """The services the client asks for.  Anything but a yes is a no: an
    odd value there only costs the client its sound, never its session.

    Sound is asked for only by a client whose sound server speaks
    PulseAudio's protocol: with ``--mediahelper="esd"`` (NoMachine 3.x's
    nxesd, older OpenNX) the client's end of the media channel is an ESD
    server, which a session's PulseAudio clients cannot talk to."""
    wanted = {service for key, service in SERVICE_PARAMETERS if params.get(key, "").strip().lower() in _YES}
    if params.get("mediahelper", "").strip().lower() == "esd":
        wanted.discard("sound")
    return frozenset(wanted)


def remote_request(params: Params) -> RemoteRequest | None:
    """The agent_* values of a start, raw (the service validates them for
    the remote desktop types); None when the client sent none."""
    if not any(key in params for key in REMOTE_KEYS):
        return None
    return RemoteRequest(server=params.get("agent_server", ""), user=params.get("agent_user", ""),
                         domain=params.get("agent_domain", ""), password=params.get("agent_password", ""))


def restore_request(params: Params) -> RestoreRequest:
    """Validate a ``restoresession``."""
    return RestoreRequest(session_id=session_id(params, "id", "restore", "sessionid"),
                          display=display_settings(params),
                          encrypted=params.get("encryption", "1").strip() != "0",
                          services=services(params))


def shadow_request(params: Params) -> ShadowRequest:
    """Validate an ``attachsession`` (shadowing)."""
    target = session_id(params, "id", "sessionid")
    view_only = params.get("viewonly", "") == "1" or params.get("shadowmode", "") == "0"
    return ShadowRequest(target_id=target, display=display_settings(params), view_only=view_only)


def session_id(params: Params, *keys: str) -> str:
    """The bare 32-hex id a client names, from the first key present.

    Clients send the bare id; some send the full ``host-display-ID`` form,
    whose last 32 characters are the id.
    """
    for key in keys:
        value = params.get(key, "").strip()
        if value:
            candidate = value[-32:].upper()
            if _ID.fullmatch(candidate):
                return candidate
            raise invalid(key, value, "not a session id")
    raise NXError(errors.GENERIC_ERROR, "Error: No session id given.", last_operation_failed=True)
