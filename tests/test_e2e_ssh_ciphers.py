"""End to end: the real OpenSSH client with each AES-GCM cipher against the
real gateway (nxgate.wire.ssh_etm's AEAD framing, written from OpenSSH's
PROTOCOL and RFC 5647: these tests are its interoperability check), with a
rekeying every 2 KB so that keys and nonces change under way, on a
connection that also takes the default cipher choice.  nxgate-client's own
choice (AES-GCM too) is checked against the gateway in tests.test_e2e_client
and against sshd in tests.test_e2e_openssh."""

from __future__ import annotations

from twisted.trial.unittest import SkipTest, TestCase

from tests.harness.gateway import user_and_gateway
from tests.harness.shared import class_fixture
from tests.harness.ssh import NXClient
from tests.harness.users import NEED_ROOT, is_root


class OpenSSHCipherTests(TestCase):
    def setUp(self) -> None:
        if not is_root():
            raise SkipTest(NEED_ROOT)
        self.user, self.gateway = class_fixture(type(self), user_and_gateway)

    def converse(self, *options: str) -> str:
        """An NX login and 40 commands with ``ssh -v`` and ``options``; its debug output."""
        client = NXClient(self.gateway.port, extra=["-v", "-o", "RekeyLimit=2K", *options])
        self.addCleanup(client.close)
        client.greet()
        self.assertIn(b"NX> 103", client.login(self.user.name, self.user.password))
        client.prompt()
        for _ in range(40):
            self.assertIn(b"NX> 503", client.command("nosuchcommand " + "x" * 200))
        client.process.stdin.close()
        client.process.wait(30)
        return client.stderr().decode(errors="replace")

    def assert_cipher(self, debug: str, cipher: str) -> None:
        for way in ("server->client", "client->server"):
            self.assertIn(f"kex: {way} cipher: {cipher} MAC: <implicit>", debug)
        self.assertGreaterEqual(debug.count("SSH2_MSG_KEXINIT received"), 3)  # rekeyed under way

    def test_aes256_gcm(self) -> None:
        self.assert_cipher(self.converse("-c", "aes256-gcm@openssh.com"), "aes256-gcm@openssh.com")

    def test_aes128_gcm(self) -> None:
        self.assert_cipher(self.converse("-c", "aes128-gcm@openssh.com"), "aes128-gcm@openssh.com")

    def test_a_client_preferring_ctr_keeps_it_with_its_etm_mac(self) -> None:
        debug = self.converse("-c", "aes128-ctr,aes256-gcm@openssh.com", "-o", "MACs=hmac-sha2-256-etm@openssh.com")
        for way in ("server->client", "client->server"):
            self.assertIn(f"kex: {way} cipher: aes128-ctr MAC: hmac-sha2-256-etm@openssh.com", debug)
