"""End to end: Remmina's X2Go plugin (Debian's remmina-plugin-x2go 1.4.29) against nxgate.

The plugin runs pyhoca-cli with the password saved in the profile (Remmina
keeps it encrypted with the secret of its remmina.pref when no keyring
answers, as under this Xvfb).  What it does is checked as a user sees it:
the session starts and its window is drawn -- outside Remmina's tab, which
keeps saying "Connecting" -- with the agent's own picture; when Remmina
quits, the session is left behind, listed to X2Go clients.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess

from cryptography.hazmat.primitives.ciphers import Cipher, modes
from twisted.trial.unittest import SkipTest

try:
    from cryptography.hazmat.decrepit.ciphers.algorithms import TripleDES
except ImportError:  # cryptography < 43
    from cryptography.hazmat.primitives.ciphers.algorithms import TripleDES  # type: ignore[no-redef]

from tests.harness import pixels
from tests.harness.process import stop, wait_for
from tests.test_e2e_x2go import _STARTED, PASSWORD, X2GoCase


def remmina_password(password: str, secret: bytes) -> str:
    """A password as Remmina stores it without a keyring: 3DES-CBC with the
    first 24 bytes of its secret as the key and the next 8 as the IV, its
    terminating NUL and zeros up to a multiple of 8 bytes, in base64."""
    data = password.encode() + b"\0"
    data += b"\0" * (-len(data) % 8)
    encryptor = Cipher(TripleDES(secret[:24]), modes.CBC(secret[24:32])).encryptor()
    return base64.b64encode(encryptor.update(data) + encryptor.finalize()).decode()


class RemminaX2GoPluginTests(X2GoCase):
    def setUp(self) -> None:
        super().setUp()
        if shutil.which("remmina") is None or not os.path.exists(
                "/usr/lib/x86_64-linux-gnu/remmina/plugins/remmina-plugin-x2go.so"):
            raise SkipTest("Remmina's X2Go plugin is not installed (apt-get install remmina remmina-plugin-x2go)")

    def test_a_saved_password_starts_a_session_shown_outside_the_tab_and_left_running(self):
        secret = os.urandom(32)
        os.makedirs(os.path.join(self.home, ".config", "remmina"))
        os.makedirs(os.path.join(self.home, ".local", "share", "remmina"))
        with open(os.path.join(self.home, ".config", "remmina", "remmina.pref"), "w") as handle:
            handle.write(f"[remmina_pref]\nsecret={base64.b64encode(secret).decode()}\n")
        profile = os.path.join(self.home, ".local", "share", "remmina", "gw.remmina")
        with open(profile, "w") as handle:
            handle.write(f"[remmina]\nname=gw\nprotocol=X2GO\nserver=127.0.0.1:{self.gateway.port}\n"
                         f"username={self.user.name}\npassword={remmina_password(PASSWORD, secret)}\n"
                         "command=TERMINAL\nresolution_mode=2\nresolution_width=800\nresolution_height=600\n"
                         "clipboard=both\naudio=pulse\n")
        # A PulseAudio cookie on the client and the profile's sound (``audio``) set to pulse: the plugin's
        # pyhoca-cli pushes the cookie and takes the session's sound back (a profile without it gets
        # ``--sound none``).  The plugin has no settings for folders or printing.
        os.makedirs(os.path.join(self.home, ".config", "pulse"))
        with open(os.path.join(self.home, ".config", "pulse", "cookie"), "wb") as handle:
            handle.write(os.urandom(256))
        before = len(self.gateway.log())
        log = os.path.join(self.home, "remmina.log")
        with open(log, "wb") as handle:
            remmina = subprocess.Popen(["remmina", "-c", profile],
                                       env=dict(self.env(), XDG_RUNTIME_DIR=self.home, LANG="C.UTF-8"),
                                       stdin=subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT)
        self.clients.append(remmina)

        def started() -> str | None:
            found = _STARTED.findall(self.gateway.log()[before:])
            return found[-1][0] if found else None

        try:
            name = wait_for(started, 120, "Remmina's pyhoca-cli to start a session")
        except AssertionError:
            raise AssertionError(f"no session: {self.read(log)[-3000:]}\n{self.gateway.log()[before:][-2000:]}") from None
        self.assertRegex(name, r"_stRTERMINAL_dp24$")
        try:
            wait_for(lambda: "the client takes its sound back" in self.gateway.log()[before:]
                     and "the client's PulseAudio cookie is in place" in self.gateway.log()[before:], 60,
                     "the sound route and the client's cookie")
        except AssertionError:
            argv = subprocess.run(["pgrep", "-a", "-f", "pyhoca-cli"], capture_output=True, text=True).stdout
            raise AssertionError(f"{argv}\n{self.read(log)[-3000:]}\n{self.gateway.log()[before:][-3000:]}") from None
        self.assertGreaterEqual(self.window_equal(name, f"{self.user.name}@"), 0.99)
        # The window is not in Remmina's tab: Remmina's own window stays small, the session's is a top window.
        remmina_windows = [rect for _, title, rect in pixels.windows(self.screen.name) if title == "gw"]
        session_window = pixels.find_window(self.screen.name, f"{self.user.name}@", min_size=50)
        self.assertTrue(remmina_windows and session_window)
        self.assertFalse(any(r.x <= session_window.x and session_window.x + session_window.width <= r.x + r.width
                             and r.y <= session_window.y and session_window.y + session_window.height <= r.y + r.height
                             for r in remmina_windows))

        stop(remmina)
        wait_for(lambda: self.listed().get(name) in ("R", "S"), 30, "the session listed after Remmina quit")
        self.assertTrue(self.agent_running(name))
