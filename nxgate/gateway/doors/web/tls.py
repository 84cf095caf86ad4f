"""The portal's endpoint: HTTPS with the admin's PEM files or a certificate
generated on first start (like the SSH host keys), plain HTTP only on loopback."""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from OpenSSL import crypto
from twisted.internet import ssl
from twisted.internet.endpoints import SSL4ServerEndpoint, quoteStringArgument, serverFromString
from twisted.internet.interfaces import IStreamServerEndpoint
from twisted.logger import Logger
from twisted.python.filepath import FilePath

from nxgate.gateway.doors.keyfiles import ensure_private_dir, write_private_file

log = Logger()

CERT_NAME = "portal-cert.pem"
KEY_NAME = "portal-key.pem"
LOOPBACK = ("127.0.0.1", "::1", "localhost")

#: TLS 1.2 suites the portal offers: Mozilla's "intermediate" list — AEAD
#: only, all with forward secrecy (no CBC, no SHA-1 MACs, no static RSA).
#: The DHE ones need ``dhParameters=``; TLS 1.3 keeps OpenSSL's own (all AEAD).
CIPHERS = ":".join((
    "ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-RSA-AES128-GCM-SHA256",
    "ECDHE-ECDSA-AES256-GCM-SHA384", "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-CHACHA20-POLY1305", "ECDHE-RSA-CHACHA20-POLY1305",
    "DHE-RSA-AES128-GCM-SHA256", "DHE-RSA-AES256-GCM-SHA384",
))
#: The ``ssl:`` options the door understands (Twisted's own names).
SSL_OPTIONS = ("port", "interface", "backlog", "privateKey", "certKey", "extraCertChain", "dhParameters")


class WebConfigError(ValueError):
    """A ``[web] listen`` the door refuses to serve."""


def endpoint_options(listen: str) -> tuple[str, dict[str, str]]:
    """``ssl:4443:interface=::1`` -> (``ssl``, {``port``: ``4443``, ``interface``: ``::1``})."""
    kind, _, rest = listen.partition(":")
    options: dict[str, str] = {}
    for part in _fields(rest) if rest else []:
        key, equals, value = part.partition("=")
        if equals:
            options[key] = value
        elif "port" not in options:
            options["port"] = part
    return kind.lower(), options


def _fields(rest: str) -> list[str]:
    """Split at unescaped colons, undoing :func:`quoteStringArgument` (``\\:`` and ``\\\\``)."""
    fields: list[str] = []
    current: list[str] = []
    escaped = False
    for char in rest:
        if escaped:
            current.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == ":":
            fields.append("".join(current))
            current = []
        else:
            current.append(char)
    fields.append("".join(current))
    return fields


def is_tls(listen: str) -> bool:
    return endpoint_options(listen)[0] == "ssl"


def check_listen(listen: str) -> None:
    """Refuse plain HTTP anywhere but on loopback: a password would cross the network in clear."""
    kind, options = endpoint_options(listen)
    if kind == "ssl":
        return
    if kind in ("tcp", "tcp6"):
        if options.get("interface", "") in LOOPBACK:
            return
        raise WebConfigError(f"[web] listen = {listen}: plain HTTP is served only on a loopback interface "
                             "(interface=127.0.0.1); use ssl:PORT for the network")
    raise WebConfigError(f"[web] listen = {listen}: use ssl:PORT[:interface=ADDRESS] (or tcp on loopback)")


def ensure_certificate(directory: str, host_name: str) -> tuple[str, str]:
    """(certificate, key) paths in ``directory``; a self-signed pair is made
    on first start (blocking: key generation and file writes)."""
    ensure_private_dir(directory)
    cert_path, key_path = os.path.join(directory, CERT_NAME), os.path.join(directory, KEY_NAME)
    if os.path.exists(cert_path) and os.path.exists(key_path):
        return cert_path, key_path
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host_name[:64] or "nxgate")])
    now = datetime.datetime.now(datetime.timezone.utc)
    alt_names: list[x509.GeneralName] = [x509.DNSName(host_name or "localhost"), x509.DNSName("localhost"),
                                         x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=3650))
                   .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .sign(key, hashes.SHA256()))
    for stale in (cert_path, key_path):
        if os.path.exists(stale):
            os.unlink(stale)
    write_private_file(key_path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                   serialization.NoEncryption()))
    with open(cert_path, "wb") as handle:
        handle.write(certificate.public_bytes(serialization.Encoding.PEM))
    log.info("generated the web portal's self-signed certificate {path} (SHA-256 {fingerprint})", path=cert_path,
             fingerprint=certificate.fingerprint(hashes.SHA256()).hex(":"))
    return cert_path, key_path


def server_endpoint(listen: str, certificate: str, private_key: str, directory: str,
                    host_name: str | None = None) -> str:
    """The strports description to serve: ``listen`` with the certificate
    and key added for ``ssl:`` (blocking on first start: see :func:`ensure_certificate`)."""
    check_listen(listen)
    if not is_tls(listen) or "privateKey" in endpoint_options(listen)[1]:
        return listen
    if not certificate:
        certificate, generated_key = ensure_certificate(directory, host_name or socket.getfqdn())
        private_key = private_key or generated_key
    private_key = private_key or certificate
    return (f"{listen}:privateKey={quoteStringArgument(private_key)}"
            f":certKey={quoteStringArgument(certificate)}")


def _pem_certificates(data: bytes) -> list[ssl.Certificate]:
    marker = b"-----END CERTIFICATE-----"
    return [ssl.Certificate.loadPEM(block + marker) for block in data.split(marker) if b"-----BEGIN" in block]


def context_options(certificate: str, private_key: str, chain: str = "", dh_parameters: str = "",
                    ) -> ssl.CertificateOptions:
    """The portal's TLS settings: TLS 1.2 or newer, :data:`CIPHERS` only
    (blocking: reads the PEM files)."""
    with open(private_key, "rb") as handle:
        key = ssl.KeyPair.load(handle.read(), crypto.FILETYPE_PEM)
    with open(certificate, "rb") as handle:
        certificates = _pem_certificates(handle.read())
    if not certificates:
        raise WebConfigError(f"[web] no certificate in {certificate}")
    extra = certificates[1:]
    if chain:
        with open(chain, "rb") as handle:
            extra += _pem_certificates(handle.read())
    return ssl.CertificateOptions(
        privateKey=key.original, certificate=certificates[0].original,
        extraCertChain=[c.original for c in extra] or None,
        dhParameters=ssl.DiffieHellmanParameters.fromFile(FilePath(dh_parameters)) if dh_parameters else None,
        acceptableCiphers=ssl.AcceptableCiphers.fromOpenSSLCipherString(CIPHERS),
        raiseMinimumTo=ssl.TLSVersion.TLSv1_2)


def listening_endpoint(reactor: Any, description: str) -> IStreamServerEndpoint:
    """The endpoint of a :func:`server_endpoint` description: ``ssl:`` with
    :func:`context_options` (Twisted's own ``ssl:`` parser offers TLS 1.2
    CBC suites and knows no cipher option), anything else as strports says."""
    kind, options = endpoint_options(description)
    if kind != "ssl":
        return serverFromString(reactor, description)
    unknown = sorted(set(options) - set(SSL_OPTIONS))
    if unknown:
        raise WebConfigError(f"[web] listen: unknown ssl option(s) {', '.join(unknown)} "
                             f"(known: {', '.join(SSL_OPTIONS[1:])})")
    try:
        port = int(options.get("port", ""))
        backlog = int(options.get("backlog", "50"))
    except ValueError:
        raise WebConfigError(f"[web] listen = {description}: the port and backlog are numbers") from None
    key = options.get("privateKey", "")
    if not key:
        raise WebConfigError("[web] listen: ssl needs a privateKey")
    context = context_options(options.get("certKey") or key, key, options.get("extraCertChain", ""),
                              options.get("dhParameters", ""))
    return SSL4ServerEndpoint(reactor, port, context, backlog=backlog, interface=options.get("interface", ""))
