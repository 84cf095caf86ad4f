"""``nxgate-client --sound``'s pactl runs beside the reactor, never on it
(issue 23: no blocking on the reactor).

A stand-in ``pactl`` (a real child process) answers only once the reactor
has done something while it waits: a client that ran pactl synchronously
would never get that answer.  The real pactl with a real sound server is in
tests.test_e2e_sound.ClientSoundTests.
"""

from __future__ import annotations

import os
import stat
import sys

from twisted.internet import defer, reactor
from twisted.trial.unittest import TestCase

from nxgate.clients.nx import sound

FAKE_PACTL = """#!{python}
import os, sys, time
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "calls"), "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\\n")
while not os.path.exists(os.path.join(here, "go")):  # the reactor's sign that it runs meanwhile
    time.sleep(0.02)
if "unload-module" in sys.argv:
    sys.exit(0)
if os.path.exists(os.path.join(here, "refuse")):
    print("Failure: Module initialization failed", file=sys.stderr)
    sys.exit(1)
print("42")
"""


class PactlBesideTheReactorTests(TestCase):
    timeout = 60

    def setUp(self) -> None:
        self.bin = os.path.abspath(self.mktemp())
        os.makedirs(self.bin)
        path = os.path.join(self.bin, "pactl")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(FAKE_PACTL.format(python=sys.executable))
        os.chmod(path, stat.S_IRWXU)
        self.private = os.path.abspath(self.mktemp())
        os.makedirs(self.private, mode=0o700)
        self.environ = {"PATH": self.bin + os.pathsep + os.defpath}

    def go_later(self) -> None:
        reactor.callLater(0.2, lambda: open(os.path.join(self.bin, "go"), "w").close())

    def calls(self) -> list[str]:
        with open(os.path.join(self.bin, "calls"), encoding="utf-8") as handle:
            return handle.read().splitlines()

    @defer.inlineCallbacks
    def test_load_and_unload_while_the_reactor_runs(self):
        local = sound.LocalSound(reactor, "unix:/run/pulse/native", self.private, self.environ)
        self.go_later()
        port = yield defer.ensureDeferred(local.open("0123456789abcdef0123456789abcdef"))
        self.assertEqual(local.module, "42")
        cookie = os.path.join(self.private, f"sound-cookie-{port}")
        self.assertEqual(os.stat(cookie).st_mode & 0o777, 0o600)
        yield defer.ensureDeferred(local.close())
        self.assertFalse(os.path.exists(cookie))
        load, unload = self.calls()
        self.assertTrue(load.startswith(f"--server unix:/run/pulse/native load-module module-native-protocol-tcp "
                                        f"port={port} listen=127.0.0.1 auth-anonymous=0"), load)
        self.assertEqual(unload, "--server unix:/run/pulse/native unload-module 42")

    @defer.inlineCallbacks
    def test_a_refusal_is_a_sound_error_in_the_servers_words(self):
        open(os.path.join(self.bin, "refuse"), "w").close()
        local = sound.LocalSound(reactor, "", self.private, self.environ)
        self.go_later()
        with self.assertRaises(sound.SoundError) as raised:
            yield defer.ensureDeferred(local.open("0123456789abcdef0123456789abcdef"))
        self.assertIn("refused the NX sound port: Failure: Module initialization failed", str(raised.exception))

    @defer.inlineCallbacks
    def test_a_pactl_that_never_answers_is_killed(self):
        self.patch(sound, "PACTL_TIMEOUT", 0.5)
        local = sound.LocalSound(reactor, "", self.private, self.environ)  # no "go": it waits for ever
        with self.assertRaises(sound.SoundError) as raised:
            yield defer.ensureDeferred(local.open("0123456789abcdef0123456789abcdef"))
        self.assertIn("pactl did not answer within 0.5 seconds", str(raised.exception))

    @defer.inlineCallbacks
    def test_without_pactl(self):
        local = sound.LocalSound(reactor, "", self.private, {"PATH": self.private})
        with self.assertRaises(sound.SoundError) as raised:
            yield defer.ensureDeferred(local.open("0123456789abcdef0123456789abcdef"))
        self.assertIn("cannot run pactl: pactl not found", str(raised.exception))
