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


class Sound:
    name = "sound"

    def __init__(self, context: Context) -> None:
        self.context = context

    def cookie_path(self, session: Any) -> str:
        return os.path.join(self.context.session_dir(session), COOKIE_NAME)

    def environment(self, session: Any) -> dict[str, str]:
        port = channels.channel_port("sound", session.display)
        if port is None:
            return {}
        return {"PULSE_SERVER": f"tcp:127.0.0.1:{port}", "PULSE_COOKIE": self.cookie_path(session)}

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
