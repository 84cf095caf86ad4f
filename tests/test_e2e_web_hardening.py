"""End to end: the web door's answers to bad requests, and its TLS offer (issue 22 point 6).

The real gateway (``twistd nxgate``) with ``[web]`` on an HTTPS port;
requests go out exactly as written (``http.client``, so that ``%00``
reaches the server as such) and the TLS handshakes are Debian's
``openssl s_client``.  Checked: a path with a NUL (or bytes that are not
UTF-8) gets a 400 and no traceback in the log; Twisted's own error pages
(404, 405/501, 413, the WebSocket refusals) carry the portal's security
headers and no ``Server: TwistedWeb``; TLS 1.2 offers only AEAD suites
with forward secrecy, TLS 1.3 works, TLS 1.1 does not.

The certificate matters for the cipher checks: the gateway's generated
one is ECDSA, so an ``ECDHE-RSA-*`` suite fails with it whatever the
cipher list says.  One class serves an RSA certificate (the RSA suites),
the other the generated ECDSA one (the ECDSA suites), so that each CBC
check can fail without the fix.
"""

from __future__ import annotations

import datetime
import http.client
import os
import shutil
import ssl
import subprocess
import tempfile
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from twisted.trial.unittest import SkipTest, TestCase

from tests.harness.gateway import Gateway
from tests.harness.shared import class_fixture
from tests.harness.web import web_base, web_options

#: The headers of the portal's own pages that every answer must carry.
SECURITY = ("content-security-policy", "x-content-type-options", "x-frame-options", "referrer-policy",
            "strict-transport-security", "cross-origin-opener-policy")
CBC_RSA = ("ECDHE-RSA-AES128-SHA", "ECDHE-RSA-AES256-SHA", "ECDHE-RSA-AES128-SHA256", "ECDHE-RSA-AES256-SHA384",
           "DHE-RSA-AES128-SHA", "AES128-SHA", "AES256-SHA", "AES128-SHA256", "AES128-GCM-SHA256")
CBC_ECDSA = ("ECDHE-ECDSA-AES128-SHA", "ECDHE-ECDSA-AES256-SHA", "ECDHE-ECDSA-AES128-SHA256",
             "ECDHE-ECDSA-AES256-SHA384")


def insecure() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def ask(base: str, method: str, path: str, body: bytes | None = None,
        headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """One request with the path sent byte for byte: (status, headers in lower case, body)."""
    host, port = base.removeprefix("https://").rsplit(":", 1)
    connection = http.client.HTTPSConnection(host, int(port), context=insecure(), timeout=30)
    try:
        connection.putrequest(method, path, skip_accept_encoding=True)
        for name, value in (headers or {}).items():
            connection.putheader(name, value)
        if body is not None:
            connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        answer = connection.getresponse()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
    finally:
        connection.close()


def handshake(base: str, *args: str) -> str:
    """The cipher ``openssl s_client`` agreed on, or "" when the handshake failed."""
    port = base.rsplit(":", 1)[1]
    result = subprocess.run(["openssl", "s_client", "-connect", f"127.0.0.1:{port}", "-servername", "localhost",
                             *args], input=b"", capture_output=True, timeout=30)
    for line in result.stdout.decode(errors="replace").splitlines():
        if ", Cipher is " in line:
            cipher = line.rsplit(" ", 1)[1]
            return "" if cipher == "(NONE)" or result.returncode else cipher
    return ""


def rsa_certificate(directory: str) -> tuple[str, str]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
                   .not_valid_after(now + datetime.timedelta(days=2))
                   .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
                   .sign(key, hashes.SHA256()))
    cert_path, key_path = os.path.join(directory, "rsa-cert.pem"), os.path.join(directory, "rsa-key.pem")
    with open(cert_path, "wb") as handle:
        handle.write(certificate.public_bytes(serialization.Encoding.PEM))
    with open(os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as handle:
        handle.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    return cert_path, key_path


class _WebGateway(TestCase):
    rsa = False

    def setUp(self) -> None:
        if os.geteuid() != 0:
            raise SkipTest("the gateway runs as root")
        if shutil.which("openssl") is None:
            raise SkipTest("no openssl command")
        self.gateway, self.base = class_fixture(type(self), self.make_fixture)

    def make_fixture(self) -> tuple[tuple[Gateway, str], Any]:
        more: dict[str, str] = {}
        directory = tempfile.mkdtemp(prefix="nxgate-test-rsa-")

        def teardown() -> None:
            gateway.stop()
            shutil.rmtree(directory, ignore_errors=True)

        if self.rsa:
            more["certificate"], more["private_key"] = rsa_certificate(directory)
        gateway = Gateway(web_options(**more)).start()
        try:
            base = web_base(gateway)
        except BaseException:
            teardown()
            raise
        return (gateway, base), teardown


class BadRequestTests(_WebGateway):
    def portal_headers(self) -> dict[str, str]:
        status, headers, _ = ask(self.base, "GET", "/login")
        self.assertEqual(status, 200)
        for name in SECURITY:
            self.assertIn(name, headers)
        return headers

    def assert_like_portal(self, status_headers: tuple[int, dict[str, str], bytes], *codes: int) -> None:
        status, headers, body = status_headers
        self.assertIn(status, codes, body[:200])
        portal = self.portal_headers()
        for name in SECURITY:
            self.assertEqual(headers.get(name), portal[name], f"{name} of the {status} answer")
        self.assertNotIn("server", headers, "the Server header names Twisted's version")
        self.assertNotIn(b"Twisted", body)

    def test_nul_path_is_a_clean_400(self) -> None:
        """The issue's request, 20 times: 400 each, with the headers, and the
        log gains no traceback and no line at all: access lines are at debug
        level, where an admin turns them on."""
        before = self.gateway.log()
        for _ in range(20):
            self.assert_like_portal(ask(self.base, "GET", "/static/portal.js%00.css"), 400, 404)
        self.assert_like_portal(ask(self.base, "GET", "/static/%ff%fe"), 400, 404)
        self.assert_like_portal(ask(self.base, "GET", "/view/ws%00"), 400, 404)
        self.assertEqual(ask(self.base, "GET", "/static/portal.js")[0], 200)  # the file itself still comes
        added = self.gateway.log()[len(before):]
        self.assertNotIn("Traceback", added)
        self.assertNotIn("#critical", added)
        self.assertNotIn("Could not decode", added)
        self.assertEqual([line for line in added.splitlines() if "portal.js%00" in line], [])

    def test_not_found(self) -> None:
        self.assert_like_portal(ask(self.base, "GET", "/no/such/page"), 404)
        self.assert_like_portal(ask(self.base, "GET", "/static/nothing.js"), 404)

    def test_unsupported_method(self) -> None:
        self.assert_like_portal(ask(self.base, "DELETE", "/login"), 405, 501)
        self.assert_like_portal(ask(self.base, "PUT", "/login", b"x"), 405, 501)

    def test_body_too_large(self) -> None:
        self.assert_like_portal(ask(self.base, "POST", "/login", b"user=" + b"x" * (64 << 10),
                                    {"Content-Type": "application/x-www-form-urlencoded"}), 413)

    def test_websocket_refusals(self) -> None:
        upgrade = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
                   "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
        self.assert_like_portal(ask(self.base, "GET", "/view/ws?ticket=made-up", headers=upgrade), 403)
        self.assert_like_portal(ask(self.base, "GET", "/view/ws?ticket=made-up"), 400)

    def test_redirect_and_portal_page(self) -> None:
        self.assert_like_portal(ask(self.base, "GET", "/"), 303)
        self.assert_like_portal(ask(self.base, "GET", "/login"), 200)


class CipherTestsRSA(_WebGateway):
    rsa = True

    def test_no_cbc_or_static_rsa_in_tls12(self) -> None:
        for cipher in CBC_RSA:
            self.assertEqual(handshake(self.base, "-tls1_2", "-cipher", cipher), "", cipher)

    def test_gcm_and_chacha_work(self) -> None:
        for cipher in ("ECDHE-RSA-AES128-GCM-SHA256", "ECDHE-RSA-AES256-GCM-SHA384", "ECDHE-RSA-CHACHA20-POLY1305"):
            self.assertEqual(handshake(self.base, "-tls1_2", "-cipher", cipher), cipher)

    def test_tls13_as_it_is_and_no_tls11(self) -> None:
        self.assertEqual(handshake(self.base, "-tls1_3"), "TLS_AES_256_GCM_SHA384")
        self.assertEqual(handshake(self.base, "-tls1_1", "-cipher", "ALL:@SECLEVEL=0"), "")


class CipherTestsECDSA(_WebGateway):
    def test_no_cbc_in_tls12(self) -> None:
        for cipher in CBC_ECDSA:
            self.assertEqual(handshake(self.base, "-tls1_2", "-cipher", cipher), "", cipher)

    def test_gcm_works(self) -> None:
        for cipher in ("ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-ECDSA-AES256-GCM-SHA384",
                       "ECDHE-ECDSA-CHACHA20-POLY1305"):
            self.assertEqual(handshake(self.base, "-tls1_2", "-cipher", cipher), cipher)
