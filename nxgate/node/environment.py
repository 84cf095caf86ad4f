"""The environment a session's programs start with on this node: a login
environment built from the user's passwd entry and the [sessions] settings
(PAM's own variables are added by the launcher), and where the gateway's
D-Bus door is when that is not the system bus."""

from __future__ import annotations

import pwd
from collections.abc import Mapping

from nxgate.config import DBusSection, SessionsSection

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
