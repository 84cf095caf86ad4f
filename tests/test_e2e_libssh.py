"""End to end: a libssh-based NX client, as Remmina's NX plugin is.

tests/clients/libssh_nx.c is built here against Debian's libssh (0.10) and
used the way Remmina uses libssh: it logs in as nx with an RSA key and no
client configuration, asks for a shell without a pty, speaks the NX
dialogue and, after ``bye``, relays the channel to a local TCP port where
nxproxy connects and draws the session on an Xvfb.

Debian's libssh has no DSA, so such a client cannot use the NoMachine key:
the admin lists the user's RSA key for the nx account (README, "Remmina and
other libssh clients"), which this test does with its own key.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

from twisted.trial.unittest import SkipTest

from tests.harness.gateway import REPO
from tests.harness.net import free_port
from tests.harness.process import stop
from tests.harness.ssh import NXClient, SessionInfo, start_nxproxy
from tests.test_e2e_operations import ADMIN
from tests.test_e2e_sessions import RED, START, SessionTestCase

CLIENT_SOURCE = os.path.join(REPO, "tests", "clients", "libssh_nx.c")
LIBSSH_HEADER = "/usr/include/libssh/libssh.h"


def build_client(directory: str) -> str:
    """Compile the libssh client; skip (with the reason) without gcc or libssh-dev."""
    compiler = shutil.which("gcc")
    if compiler is None:
        raise SkipTest("gcc is missing: the libssh client cannot be built (make install installs it)")
    if not os.path.exists(LIBSSH_HEADER):
        raise SkipTest(f"{LIBSSH_HEADER} is missing: install libssh-dev (make install does)")
    binary = os.path.join(directory, "libssh_nx")
    build = subprocess.run([compiler, "-O2", "-Wall", "-Wextra", "-Werror", "-o", binary, CLIENT_SOURCE, "-lssh"],
                           capture_output=True, text=True)
    if build.returncode != 0:
        raise AssertionError(f"building {CLIENT_SOURCE} failed: {build.stderr}")
    return binary


class LibsshClientTests(SessionTestCase):
    """A gateway whose nx keys file starts as the shipped one (the NoMachine key)."""

    client_binary = ""
    rsa_key = ""
    nx_keys = ""

    def make_fixture(self):
        directory = tempfile.mkdtemp(prefix="nxgate-libssh-")
        try:
            type(self).client_binary = build_client(directory)
            type(self).rsa_key = os.path.join(directory, "id_rsa")
            # PEM ("BEGIN RSA PRIVATE KEY"): Remmina's NX plugin takes no other identity file.
            subprocess.run(["ssh-keygen", "-q", "-t", "rsa", "-b", "3072", "-m", "PEM", "-N", "",
                            "-C", "remmina-user", "-f", self.rsa_key], check=True)
            type(self).nx_keys = os.path.join(directory, "nx_authorized_keys")
            shutil.copy(os.path.join(REPO, "conf", "nx_authorized_keys"), self.nx_keys)
            type(self).options = {"ssh": {"nx_authorized_keys": self.nx_keys}}
            fixture, teardown = SessionTestCase.make_fixture(self)
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise

        def both():
            teardown()
            shutil.rmtree(directory, ignore_errors=True)

        return fixture, both

    def libssh_client(self) -> tuple[NXClient, int]:
        """The client connecting as nx; and the port it relays the session on after bye."""
        relay_port = free_port()
        client = NXClient(self.gateway.port, argv=[self.client_binary, "127.0.0.1", str(self.gateway.port), "nx",
                                                   self.rsa_key, str(relay_port)])
        self.addCleanup(client.close)
        return client, relay_port

    def greet(self, client: NXClient) -> bytes:
        try:
            return client.greet()
        except AssertionError as error:
            client.process.wait(10)
            raise AssertionError(f"{error}; the libssh client said {client.stderr()!r}") from None

    def list_key_as_the_admin(self) -> None:
        """README, "Remmina and other libssh clients": append, then reload."""
        with open(self.rsa_key + ".pub") as public, open(self.nx_keys, "a") as listed:
            listed.write(public.read())
        result = subprocess.run([*ADMIN, "--socket", os.path.join(self.gateway.state_dir, "admin.sock"), "reload"],
                                capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONPATH=REPO))
        self.assertEqual(result.returncode, 0, result.stderr)

    def test_listed_rsa_key_logs_in_with_no_client_setting_and_gets_a_picture(self):
        # Not listed yet: refused by the gateway (not by libssh for want of server-sig-algs).
        client, _ = self.libssh_client()
        self.assertEqual(client.process.wait(30), 3)
        self.assertIn(b"public key login failed: Access denied", client.stderr())

        self.list_key_as_the_admin()
        client, relay_port = self.libssh_client()
        self.assertIn(b"HELLO NXSERVER - Version 3.5.0 - GPL", self.greet(client))
        self.assertIn(b"NX> 103 Welcome to: nxgate.test", client.login(self.user.name, self.user.password))
        client.prompt()
        reply = client.command(START.format(name="remmina", type="unix-console", extra=""), timeout=60)
        self.assertIn(b"NX> 710 Session status: running", reply, reply)
        info = SessionInfo.parse(reply)
        client.send("bye")
        client.expect(b"NX> 999 Bye.\n")
        proxy, _ = start_nxproxy(info, self.screen.name, self.gateway.workdir, relay_port)
        self.addCleanup(stop, proxy, 3)
        self.screen.wait_for_colour(RED, 20000)
        self.assertRegex(self.gateway.log(), r"SSH login of 'nx' from 127\.0\.0\.1 \(nx-key\)")
        stop(proxy, 3)
        self.wait_status(info.session_id, "Suspended")
