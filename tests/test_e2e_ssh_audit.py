"""End to end: the real ``ssh-audit`` (PyPI, in requirements.txt) on the real gateway (issue 22, point 6).

The default configuration must show no failure and no warning but one:
``ssh-audit`` 3.3 and later warn "does not provide protection against
post-quantum attacks" on every classical key exchange, and we keep X25519
(and 3072-bit group exchange) because the clients we must serve have
nothing better: OpenSSH before 9.9 (Debian 12's 9.2 included), libssh
(Remmina) and nxgate-client (Conch's client has no ML-KEM).  The one
post-quantum hybrid Conch has, mlkem768x25519-sha256, comes first.

``[ssh] legacy_algorithms = yes`` brings back what nxssh needs; an OpenSSH
client restricted to nxssh-era algorithms is refused by default and logs in
with the switch on.  The connection-rate note (DHEat by connection count) is
skipped with ``--skip-rate-test``: throttling whole connections per address
is not the transport's business (issue 27's other half).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from twisted.trial.unittest import SkipTest, TestCase

from tests.harness.process import wait_for
from tests.harness.gateway import REPO, Gateway
from tests.harness.ssh import ssh_argv
from tests.harness.users import NEED_ROOT, is_root

NOT_PQ_SAFE = "does not provide protection against post-quantum attacks"
#: Classical key exchanges kept on purpose (see above).
CLASSICAL_KEPT = {"curve25519-sha256", "curve25519-sha256@libssh.org", "diffie-hellman-group-exchange-sha256"}
#: What nxssh (OpenSSH 3.x/4.x code) can speak: SHA-1 Diffie-Hellman, SHA-1 RSA host signatures, CBC, hmac-sha1.
NXSSH_ERA = ["-o", "KexAlgorithms=diffie-hellman-group14-sha1", "-o", "HostKeyAlgorithms=ssh-rsa",
             "-o", "Ciphers=aes128-cbc", "-o", "MACs=hmac-sha1"]


def audit(port: int) -> dict:
    """ssh-audit's JSON report of 127.0.0.1:``port``."""
    result = subprocess.run(
        [sys.executable, "-m", "ssh_audit", "--json", "--skip-rate-test", "--timeout", "30", "-p", str(port),
         "127.0.0.1"],
        capture_output=True, timeout=300, env=dict(os.environ, PYTHONPATH=os.pathsep.join(
            filter(None, [REPO, os.environ.get("PYTHONPATH")]))))
    if b"No module named ssh_audit" in result.stderr:
        raise AssertionError("ssh-audit is not installed in the tests' environment: pip install -r requirements.txt")
    try:
        return json.loads(result.stdout)
    except ValueError:
        raise AssertionError(f"ssh-audit gave no report (exit {result.returncode}): "
                             f"{result.stdout[-2000:]!r} {result.stderr[-2000:]!r}") from None


def findings(report: dict, level: str) -> dict[str, list[str]]:
    """``{"kex curve25519-sha256": [notes]}`` of one level ("warn" or "fail")."""
    found = {}
    for section in ("kex", "key", "enc", "mac"):
        for entry in report.get(section, []):
            notes = entry.get("notes", {}).get(level)
            if notes:
                found[f"{section} {entry['algorithm']}"] = notes
    return found


def names(report: dict, section: str) -> list[str]:
    return [entry["algorithm"] for entry in report.get(section, [])]


class SSHAuditTests(TestCase):
    timeout = 600

    def setUp(self) -> None:
        if not is_root():
            raise SkipTest(NEED_ROOT)

    def gateway(self, ssh_options: dict[str, str] | None = None) -> Gateway:
        gateway = Gateway({"ssh": ssh_options} if ssh_options else None).start()
        self.addCleanup(gateway.stop)
        return gateway

    def test_the_default_configuration_passes(self) -> None:
        report = audit(self.gateway().port)
        self.assertTrue(report.get("kex"), report)
        self.assertEqual(findings(report, "fail"), {})
        warnings = findings(report, "warn")
        self.assertEqual({name: notes for name, notes in warnings.items() if notes != [NOT_PQ_SAFE]}, {})
        self.assertLessEqual({name.split(" ", 1)[1] for name in warnings}, CLASSICAL_KEPT)
        self.assertEqual(names(report, "kex")[0], "mlkem768x25519-sha256")
        self.assertNotIn("ssh-rsa", names(report, "key"))
        self.assertEqual(report.get("cves"), [])
        # Compression only after authentication: plain zlib would inflate a client's bomb before login.
        self.assertEqual(report.get("compression"), ["none", "zlib@openssh.com"])

    def test_legacy_algorithms_bring_back_what_nxssh_needs(self) -> None:
        report = audit(self.gateway({"legacy_algorithms": "yes"}).port)
        for section, name in (("key", "ssh-rsa"), ("kex", "diffie-hellman-group14-sha1"),
                              ("kex", "diffie-hellman-group-exchange-sha1"), ("enc", "aes128-cbc"),
                              ("enc", "3des-cbc"), ("mac", "hmac-sha1"), ("mac", "hmac-md5")):
            self.assertIn(name, names(report, section))

    def test_an_nxssh_era_client_needs_the_legacy_switch(self) -> None:
        gateway = self.gateway()
        argv = ssh_argv(gateway.port, extra=["-T", *NXSSH_ERA])
        refused = subprocess.run(argv, input=b"", capture_output=True, timeout=60)
        self.assertNotIn(b"HELLO NXSERVER", refused.stdout)
        self.assertEqual(refused.returncode, 255)
        # The admin learns why, and what to do.
        # The client may be gone a moment before the gateway has written its line.
        wait_for(lambda: "no key exchange method in common" in gateway.log(), 10, "the refusal in the log")
        self.assertIn("legacy_algorithms", gateway.log())
        argv = ssh_argv(self.gateway({"legacy_algorithms": "yes"}).port, extra=["-T", *NXSSH_ERA])
        served = subprocess.run(argv, input=b"", capture_output=True, timeout=60)
        self.assertIn(b"HELLO NXSERVER", served.stdout, served.stderr)
