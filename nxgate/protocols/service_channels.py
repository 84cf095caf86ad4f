"""The NX service channels beside the screen, pure and shared by
the server side (the agent's options, the session's services) and the client
(nxgate-client's own nxproxy).

nxcomp carries three service channels; the proxy next to the X clients (the
agent's embedded proxy) *listens* and the proxy next to the X server (the
client's ``nxproxy -S``) *connects* to the real service on the client's
machine (nx-libs 3.5.99.26, measured).  ``media=PORT`` on the agent listens on 127.0.0.1:PORT only.

A Unix socket (``media=unix:/path``) would keep other local users away from
the channel, and nxcomp accepts it, but nx-libs 3.5.99.26 cannot keep it:
the agent's connection watchdog, a forked child, unlinks the socket's path
when it is told to exit right after the client connects, so the listener is
left without a name.  The channels therefore listen on loopback TCP at
FreeNX's ports (display + the nxcomp offset), and each service protects its
own end: sound with a PulseAudio cookie derived from the session cookie
(:func:`sound_cookie`), which only the session's owner (0600 file) and the
client (who got the session cookie in ``NX> 701``) know.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

#: The services a client may ask for, in the order they are listed.
SERVICES = ("sound", "printing", "sharing")

#: service -> (nxcomp option, port offset from the display).  The offsets
#: are nxcomp's own defaults (Misc.cpp) and FreeNX's (nxserver checks that
#: 3000+d, 7000+d and 9000+d are free when it picks a display).
CHANNELS: dict[str, tuple[str, int]] = {
    "sound": ("media", 7000),
    "printing": ("cups", 2000),
    "sharing": ("smb", 3000),
}

#: The length of a PulseAudio authentication cookie.
PULSE_COOKIE_LENGTH = 256


def channel_port(service: str, display: int) -> int | None:
    """The loopback port the session side of ``service``'s channel listens on,
    or None when the display is too high for one (above 65535)."""
    _option, offset = CHANNELS[service]
    port = offset + display
    return port if port <= 65535 else None


def agent_options(services: Iterable[str], display: int) -> list[tuple[str, str]]:
    """The nxcomp options that open the granted services' channels on the
    agent: ``media=7001`` and so on (plain port numbers: no ``:`` or ``,``
    can reach the options line)."""
    options = []
    for service in SERVICES:
        if service in services:
            port = channel_port(service, display)
            if port is not None:
                options.append((CHANNELS[service][0], str(port)))
    return options


def sound_cookie(session_cookie: str) -> bytes:
    """The PulseAudio cookie of a session's sound channel.

    Derived from the session cookie, so the client, which learnt that cookie
    from ``NX> 701``, can make its sound server demand exactly this cookie,
    and a local user on the server who connects to the channel's loopback
    port (which he can) cannot get past the client's sound server without
    it.  A new cookie at every resume gives a new one here too."""
    key = session_cookie.encode()
    blocks = (hmac.new(key, b"nxgate sound %d" % index, hashlib.sha256).digest()
              for index in range(PULSE_COOKIE_LENGTH // 32))
    return b"".join(blocks)
