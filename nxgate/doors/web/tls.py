"""The portal's endpoint: HTTPS with the admin's PEM files or a certificate
generated on first start (like the SSH host keys), plain HTTP only on loopback."""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
import socket

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from twisted.internet.endpoints import quoteStringArgument
from twisted.logger import Logger

from nxgate.doors.conch.hostkeys import ensure_private_dir, write_private_file

log = Logger(namespace="nxgate.web")

CERT_NAME = "portal-cert.pem"
KEY_NAME = "portal-key.pem"
LOOPBACK = ("127.0.0.1", "::1", "localhost")


class WebConfigError(ValueError):
    """A ``[web] listen`` the door refuses to serve."""


def endpoint_options(listen: str) -> tuple[str, dict[str, str]]:
    """``ssl:4443:interface=::1`` -> (``ssl``, {``port``: ``4443``, ``interface``: ``::1``})."""
    kind, _, rest = listen.partition(":")
    options: dict[str, str] = {}
    for part in re.split(r"(?<!\\):", rest) if rest else []:
        key, equals, value = part.replace("\\:", ":").partition("=")
        if equals:
            options[key] = value
        elif "port" not in options:
            options["port"] = part
    return kind.lower(), options


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
