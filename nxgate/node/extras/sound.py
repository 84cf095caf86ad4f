"""Sound (``--media="1"``): programs in the session play through PulseAudio
and the sound comes out on the client's machine through the NX media channel.

No sound daemon runs in the session.  The agent's media channel listens on
127.0.0.1:7000+display (:mod:`nxgate.protocols.channels`; a Unix socket cannot be kept
there, see its docstring), and on the client's side ``nxproxy -S media=PORT``
connects each channel connection to the client's PulseAudio native-protocol
TCP port.  So the session's programs are PulseAudio clients of the client's
own sound server: ``PULSE_SERVER`` points them at the channel, and
``PULSE_COOKIE`` at a cookie derived from the session cookie, which the
client's sound server demands (``nxgate-client --sound`` sets that up), so
that another local user who connects to the loopback port gets nowhere.
Recording works the same way: a PulseAudio connection carries record streams
as well, so the session's ``parec`` records the client's microphone.

The cookie file is rewritten at each resume (a resume brings a new session
cookie) and removed at suspend and end.

**Sound back over the client's SSH connection** (X2Go's clients: their
``tcpip-forward`` of the session's sound port).  A session that an X2Go
client started (or attached first) and that has no NX media channel gets, in every program's environment, ``PULSE_SERVER`` at
the session's *reverse listener* for sound (:mod:`nxgate.node.reverse`: a
Unix socket, the same path for the session's whole life, that only the
session's user may connect to), ``PULSE_COOKIE`` and, as X2Go's own server
gives its sessions, ``PULSE_CLIENTCONFIG`` (a client configuration in the
session directory naming the same two).  The listener exists while a
client takes the session's sound (its door holds the route); each
connection a program makes there goes to that client's SSH connection as a
reverse stream (:mod:`nxgate.streams.reverse`) and on to the client's own
PulseAudio.  The cookie is the one the client pushed: its door sends it
along the route (the ``cookie`` setting) and it is written here, as the
user, 0600, so it reaches the session's machine whatever machine the
client's door runs on.  Without a client, a program finds no listener and
plays nothing (no sound server is spawned in the session).
"""

from __future__ import annotations

import os
from typing import Any

from twisted.logger import Logger

from nxgate.protocols import channels
from nxgate.node import files
from nxgate.node.extras import Context

log = Logger()

COOKIE_NAME = "pulse-cookie"
#: The clients (``DisplaySettings.client``) that take a session's sound back over their SSH connection.
REVERSE_CLIENTS = frozenset({"x2go"})
#: The PulseAudio client configuration of a session whose sound travels back over SSH.
CLIENT_CONF_NAME = "pulse-client.conf"


class Sound:
    name = "sound"

    def __init__(self, context: Context) -> None:
        self.context = context
        if context.reverse is not None:
            context.reverse.on_setting(self.name, self.setting)

    def cookie_path(self, session: Any) -> str:
        return os.path.join(self.context.session_dir(session), COOKIE_NAME)

    def environment(self, session: Any) -> dict[str, str]:
        port = channels.channel_port("sound", session.display)
        if port is None:
            return {}
        return {"PULSE_SERVER": f"tcp:127.0.0.1:{port}", "PULSE_COOKIE": self.cookie_path(session)}

    def conf_path(self, session: Any) -> str:
        return os.path.join(self.context.session_dir(session), CLIENT_CONF_NAME)

    def reverse_environment(self, session: Any) -> dict[str, str]:
        """The environment of a session without an NX media channel whose
        client takes its sound back over SSH (an X2Go client started it, or
        attached first): the session's reverse listener for sound (see the
        module's docstring).  Other sessions without sound get nothing."""
        if self.context.reverse is None or not self.context.config().services.sound:
            return {}
        if session.options.get("display", {}).get("client") not in REVERSE_CLIENTS:
            return {}
        return {"PULSE_SERVER": f"unix:{self.context.reverse.path(session.id, self.name)}",
                "PULSE_COOKIE": self.cookie_path(session), "PULSE_CLIENTCONFIG": self.conf_path(session)}

    def client_conf(self, session: Any) -> str:
        return (f"default-server = unix:{self.context.reverse.path(session.id, self.name)}\n"
                f"cookie-file = {self.cookie_path(session)}\n"
                "autospawn = no\n")

    async def setting(self, session: Any, name: str, value: bytes) -> None:
        """A route's ``cookie``: the client's PulseAudio cookie (checked for its length), written as the user."""
        if name != "cookie":
            return

        def write() -> None:
            files.write_user_file(self.cookie_path(session), value, session.uid, session.gid)
            files.write_user_file(self.conf_path(session), self.client_conf(session).encode(), session.uid,
                                  session.gid)

        await self.context.blocking(write)
        log.info("session {id} of {user}: the client's PulseAudio cookie is in place", id=session.id,
                 user=session.user)

    async def start(self, session: Any) -> None:
        if channels.channel_port("sound", session.display) is None:
            log.warn("session {id}: display :{display} is too high for a sound channel port", id=session.id,
                     display=session.display)
            return
        files.write_user_file(self.cookie_path(session), channels.sound_cookie(session.cookie), session.uid,
                              session.gid)

    async def stop(self, session: Any) -> None:
        try:
            os.unlink(self.cookie_path(session))
        except FileNotFoundError:
            pass


def make(context: Context) -> Sound:
    return Sound(context)
