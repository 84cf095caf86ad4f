"""The environment a session's programs start with on this node: a login
environment built from the user's passwd entry and the [sessions] settings
(PAM's own variables are added by the launcher), where the gateway's
D-Bus door is when that is not the system bus, and where the user's
programs share libX11's compose cache."""

from __future__ import annotations

import os
import pwd
import stat
from collections.abc import Mapping

from twisted.logger import Logger

from nxgate.config import DBusSection, SessionsSection
from nxgate.node import files

log = Logger()

#: Where ``nxgate-session`` looks for the gateway's bus (the same name as
#: nxgate.gateway.doors.dbus.wire.BUS_VARIABLE, which the node may not import).
BUS_VARIABLE = "NXGATE_DBUS_ADDRESS"
#: The system bus's well-known addresses: sessions need no word about those.
SYSTEM_BUS = frozenset({"system", "unix:path=/var/run/dbus/system_bus_socket", "unix:path=/run/dbus/system_bus_socket"})


def login_environment(user: pwd.struct_passwd, settings: SessionsSection) -> dict[str, str]:
    """A login environment (PAM's own variables are added by the launcher)."""
    return {
        "HOME": user.pw_dir,
        "USER": user.pw_name,
        "LOGNAME": user.pw_name,
        "SHELL": user.pw_shell or "/bin/sh",
        "PATH": settings.path,
        "LANG": settings.lang,
    }


def bus_environment(dbus: DBusSection, gateway_environ: Mapping[str, str]) -> dict[str, str]:
    """``NXGATE_DBUS_ADDRESS``: the bus the gateway's D-Bus door is on
    (``[dbus] address``, else the gateway's own $DBUS_SYSTEM_BUS_ADDRESS)
    when it is not the system bus, so that ``nxgate-session`` in the session
    reaches the gateway.  Not $DBUS_SYSTEM_BUS_ADDRESS itself: that would take
    every program of the session (network and disk applets, logind's
    clients) off the real system bus."""
    if not dbus.enabled:
        return {}
    address = dbus.address or gateway_environ.get("DBUS_SYSTEM_BUS_ADDRESS", "")
    if not address or address in SYSTEM_BUS:
        return {}
    return {BUS_VARIABLE: address}


#: The directory below the state directory that holds one compose cache
#: directory per user (named by uid).
COMPOSE_CACHES = "compose-cache"


def compose_cache_environment(directory: str | None) -> dict[str, str]:
    """``XCOMPOSECACHE``: where libX11 keeps the compose table it parsed.

    In a UTF-8 locale (the sessions' ``LANG`` falls back to C.UTF-8) every
    Xlib client that opens an input method -- xterm, every Xt and Motif
    program -- parses the en_US.UTF-8 compose table (some 5,700 lines) into its own
    heap: 0.8 MB of private memory each (bench/agent_memory.py's
    ``program_lang_c``).  With a cache directory the first one writes the
    parsed table there and every later one maps that file read-only, so
    the page cache holds one copy for all of the user's sessions.  libX11
    looks in ``~/.compose-cache`` only when that exists; this names a
    directory of the node's own instead, so nothing is written into users'
    homes.  Keys and dead keys compose as before: the table is the same."""
    return {"XCOMPOSECACHE": directory} if directory else {}


def prepare_compose_cache(state_root: str, uid: int, gid: int) -> str | None:
    """The user's compose cache directory, ``<state>/compose-cache/<uid>``,
    made (0700, the user's) if missing; None if it cannot be used (the
    programs then parse the table as they would without it).  Blocking.

    The parent is the gateway's (0711, like ``sessions/``): a user can
    reach their own directory but neither list the others nor rename
    theirs; root never opens what the user puts inside."""
    parent = os.path.join(state_root, COMPOSE_CACHES)
    path = os.path.join(parent, str(uid))
    try:
        try:
            os.mkdir(parent, 0o711)
        except FileExistsError:
            pass
        st = os.lstat(parent)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            log.warn("{path} is not a directory of the gateway's user: sessions get no compose cache", path=parent)
            return None
        if stat.S_IMODE(st.st_mode) != 0o711:
            os.chmod(parent, 0o711)
        try:
            files.make_session_dir(path, uid, gid)
        except FileExistsError:
            st = os.lstat(path)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or stat.S_IMODE(st.st_mode) & 0o077:
                log.warn("{path} is not a private directory of uid {uid}: its sessions get no compose cache",
                         path=path, uid=uid)
                return None
    except OSError as error:
        log.info("no compose cache for uid {uid} ({error})", uid=uid, error=error)
        return None
    return path
