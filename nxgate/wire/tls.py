"""Mutually authenticated TLS between cluster members.

Every member holds a certificate signed by the cluster CA whose DNS
subjectAltName is its ``[cluster] name``.  Both ends of every connection
present theirs and OpenSSL checks it against the CA (and its dates); what a
peer *is* then comes from its certificate only, never from anything it says
on the wire:

* the dialling side names the member it wants (:meth:`ClusterTLS.client`)
  and service_identity checks the certificate names exactly it;
* the accepting side reads the names out of the verified certificate
  (:func:`peer_names`) and decides whether one is a member it serves.

Wildcard names are refused: one certificate must not speak for several
members.  TLS 1.3 only: both ends are ours.

:func:`make_ca` and :func:`make_cert` are for admins without a PKI of their
own (``nxgate-admin cluster ca|cert``); certificates made with openssl work
the same as long as they carry the member's name as a DNS subjectAltName.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from OpenSSL import SSL, crypto
from service_identity import CertificateError, VerificationError
from service_identity.hazmat import DNSPattern
from service_identity.pyopenssl import extract_patterns, verify_hostname
from twisted.internet.interfaces import IOpenSSLClientConnectionCreator, IOpenSSLServerConnectionCreator
from twisted.internet.ssl import CertificateOptions, TLSVersion
from twisted.logger import Logger
from zope.interface import implementer

from nxgate.wire.records import whole_writes

log = Logger()

CA_CERT, CA_KEY = "ca.pem", "ca.key"
CA_DAYS, CERT_DAYS = 3650, 825
#: How long a TLS session may be resumed (seconds).  A resumed handshake
#: checks no certificate again (the peer proved it holds the key of a
#: verified one within this time); the peer's *names* are still checked on
#: every connection by both gates (the member list included), and the
#: ticket key lives only in the accepting process's memory (a restart ends
#: every session).  Short, so that a certificate that expires is seen soon.
RESUME_SECONDS = 300

#: X509_V_ERR_* numbers worth a sentence in the log (the rest: the number).
_VERIFY_ERRORS = {
    2: "its issuer is not the cluster CA",
    9: "it is not valid yet",
    10: "it has expired",
    18: "it is self-signed, not signed by the cluster CA",
    19: "its chain ends in a CA that is not the cluster CA",
    20: "it is not signed by the cluster CA",
    21: "it is not signed by the cluster CA",
    26: "it may not be used for this purpose",
}


class PeerRefused(Exception):
    """A peer's verified certificate does not name the member we need."""


def describe_verify_error(errno: int) -> str:
    return _VERIFY_ERRORS.get(errno, f"OpenSSL verify error {errno}")


def _peer_address(connection: SSL.Connection) -> str:
    protocol = connection.get_app_data()
    try:
        peer = protocol.transport.getPeer()
        return f"{peer.host}:{peer.port}"
    except AttributeError:
        return "?"


def _verify(connection: SSL.Connection, certificate: crypto.X509, errno: int, depth: int, ok: int) -> bool:
    """OpenSSL's verdict, logged with the reason when it is no."""
    if not ok:
        subject = certificate.get_subject().CN or "-"
        log.warn("refused a cluster peer's certificate from {peer}: {reason} (subject CN {subject}, depth {depth})",
                 peer=_peer_address(connection), reason=describe_verify_error(errno), subject=subject, depth=depth,
                 errno=errno, event="cluster_peer_refused")
    return bool(ok)


def _read(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def _certificates(path: str) -> list[crypto.X509]:
    """Every certificate in the PEM file ``path`` (a chain, or CAs), in order."""
    try:
        found = x509.load_pem_x509_certificates(_read(path))
    except ValueError as error:
        raise SSL.Error(f"{path}: no PEM certificate can be read ({error})") from None
    return [crypto.X509.from_cryptography(certificate) for certificate in found]


def _options(ca: str, certificate: str, key: str, tickets: bool = False) -> CertificateOptions:
    """Twisted's CertificateOptions for a member: its certificate (and any
    chain after it in the file) and key, the peer's certificate required and
    verified against the cluster CA only (not the system's trust store),
    TLS 1.3 only, no compression (Twisted's default).

    ``tickets`` (the accepting side): TLS 1.3 session tickets, so that a
    gateway opening one stream after another resumes instead of signing and
    verifying certificates again (see :data:`RESUME_SECONDS`)."""
    chain = _certificates(certificate)
    try:
        private_key = crypto.load_privatekey(crypto.FILETYPE_PEM, _read(key))
    except crypto.Error as error:
        raise SSL.Error(f"{key}: the private key cannot be read ({error})") from None
    options = CertificateOptions(privateKey=private_key, certificate=chain[0], extraCertChain=chain[1:],
                                 verify=True, caCerts=_certificates(ca), requireCertificate=True,
                                 raiseMinimumTo=TLSVersion.TLSv1_3, enableSessionTickets=tickets)
    context = options.getContext()  # built once and cached: every connection uses it
    context.set_timeout(RESUME_SECONDS)
    # Same checks as Twisted's (VERIFY_PEER | FAIL_IF_NO_PEER_CERT), but a refusal says why in the log.
    context.set_verify(SSL.VERIFY_PEER | SSL.VERIFY_FAIL_IF_NO_PEER_CERT | SSL.VERIFY_CLIENT_ONCE, _verify)
    return options


def peer_names(connection: SSL.Connection) -> frozenset[str]:
    """The DNS names in the verified peer certificate of ``connection``
    (empty if none, or if one is a wildcard)."""
    certificate = connection.get_peer_certificate()
    if certificate is None:
        return frozenset()
    try:
        patterns = extract_patterns(certificate)
    except CertificateError:
        return frozenset()
    names = [p.pattern.decode("ascii") for p in patterns if isinstance(p, DNSPattern)]
    if any("*" in name for name in names):
        return frozenset()
    return frozenset(names)


@implementer(IOpenSSLClientConnectionCreator, IOpenSSLServerConnectionCreator)
class _Creator:
    """Twisted's connection from the member's options, which knows its TLS
    protocol (the verify callback's log line names the peer's address)."""

    def __init__(self, options: CertificateOptions, resume: SSL.Session | None = None) -> None:
        self.options = options
        self.resume = resume

    def clientConnectionForTLS(self, tls_protocol: Any) -> SSL.Connection:
        connection = self.options.clientConnectionForTLS(tls_protocol)
        connection.set_app_data(tls_protocol)
        whole_writes(connection)
        if self.resume is not None:
            connection.set_session(self.resume)  # offered; the member decides (a full handshake otherwise)
        return connection

    def serverConnectionForTLS(self, tls_protocol: Any) -> SSL.Connection:
        connection = self.options.serverConnectionForTLS(tls_protocol)
        connection.set_app_data(tls_protocol)
        whole_writes(connection)
        return connection


@dataclass
class ClusterTLS:
    """This member's TLS credentials, loaded once (the files are read at
    start; a new certificate needs a restart, like every [cluster] change).

    The contexts are Twisted's ``CertificateOptions``; what a peer *is* is
    decided after the handshake by the gates of :mod:`nxgate.wire.connection`
    (:func:`check_server` when dialling, :func:`peer_names` and the member
    list when accepting)."""

    name: str
    server_options: CertificateOptions
    client_options: CertificateOptions
    #: The last resumable TLS session with each member, by member name.
    sessions: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, name: str, ca: str, certificate: str, key: str) -> ClusterTLS:
        """Raises OSError / SSL.Error with OpenSSL's words if a file is unusable."""
        return cls(name, _options(ca, certificate, key, tickets=True), _options(ca, certificate, key))

    @classmethod
    def from_config(cls, cluster: Any) -> ClusterTLS:
        return cls.load(cluster.name, cluster.ca, cluster.certificate, cluster.key)

    def server(self) -> _Creator:
        return _Creator(self.server_options)

    def client(self, name: str) -> _Creator:
        """For dialling member ``name``: check :func:`check_server` after the
        handshake (Twisted's ``optionsForClientTLS`` would check the name
        too, but it accepts a wildcard and its refusal does not say which
        name the certificate had)."""
        return _Creator(self.client_options, self.sessions.get(name))

    def remember(self, name: str, connection: SSL.Connection) -> None:
        """Keep the session of ``connection`` to member ``name`` for the next
        connection to it (called once the member's first bytes arrived: its
        TLS 1.3 tickets come before them)."""
        self.sessions[name] = connection.get_session()

    def forget(self, name: str) -> None:
        """The member's certificate was refused: offer it no session again."""
        self.sessions.pop(name, None)


def check_server(connection: SSL.Connection, expected: str) -> None:
    """After the handshake on the dialling side: the certificate must name
    ``expected`` (service_identity), else :class:`PeerRefused`."""
    if any("*" in name for name in _all_dns(connection)):
        raise PeerRefused(f"its certificate has a wildcard name, not {expected}")
    try:
        verify_hostname(connection, expected)
    except (VerificationError, CertificateError) as error:
        names = ", ".join(sorted(_all_dns(connection))) or "no DNS name"
        raise PeerRefused(f"its certificate names {names}, not {expected}") from error


def _all_dns(connection: SSL.Connection) -> list[str]:
    certificate = connection.get_peer_certificate()
    if certificate is None:
        return []
    try:
        return [p.pattern.decode("ascii") for p in extract_patterns(certificate) if isinstance(p, DNSPattern)]
    except CertificateError:
        return []


# ------------------------------------------------------- making certificates
def _write(path: str, data: bytes, mode: int) -> None:
    """Write ``data`` to a new file created with ``mode`` (never widened first)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "nxgate cluster"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_ca(directory: str) -> tuple[str, str]:
    """A new cluster CA in ``directory`` (made 0700): ``ca.pem`` (give it to
    every member) and ``ca.key`` (0600; keep it off the members).  Refuses
    to overwrite an existing CA."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder().subject_name(_name("nxgate cluster CA")).issuer_name(_name("nxgate cluster CA"))
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                     crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256()))
    key_path, cert_path = os.path.join(directory, CA_KEY), os.path.join(directory, CA_CERT)
    _write(key_path, _key_pem(key), 0o600)
    _write(cert_path, certificate.public_bytes(serialization.Encoding.PEM), 0o644)
    return cert_path, key_path


def make_cert(name: str, ca_dir: str, out_dir: str | None = None, *, days: int = CERT_DAYS,
              valid_from: datetime.datetime | None = None) -> tuple[str, str]:
    """``NAME.pem`` and ``NAME.key`` (0600) in ``out_dir`` (default: the
    CA's directory): a member certificate naming ``name`` as its DNS
    subjectAltName, for both ends of a connection, signed by the CA in
    ``ca_dir``.  ``valid_from``/``days`` exist for tests of expired ones."""
    from nxgate.config import member_name

    member_name(name)  # ValueError with the rule if it is not a DNS name
    out_dir = out_dir or ca_dir
    with open(os.path.join(ca_dir, CA_CERT), "rb") as handle:
        ca_cert = x509.load_pem_x509_certificate(handle.read())
    with open(os.path.join(ca_dir, CA_KEY), "rb") as handle:
        ca_key = serialization.load_pem_private_key(handle.read(), password=None)
    os.makedirs(out_dir, mode=0o700, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    start = valid_from or datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=5)
    certificate = (
        x509.CertificateBuilder().subject_name(_name(name)).issuer_name(ca_cert.subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(start).not_valid_after(start + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                       critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256()))
    key_path, cert_path = os.path.join(out_dir, f"{name}.key"), os.path.join(out_dir, f"{name}.pem")
    _write(key_path, _key_pem(key), 0o600)
    _write(cert_path, certificate.public_bytes(serialization.Encoding.PEM), 0o644)
    return cert_path, key_path
