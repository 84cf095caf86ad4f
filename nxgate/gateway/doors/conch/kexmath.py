"""The arithmetic of SSH key exchanges, as pure functions.

These are the expensive steps of a key exchange (finite-field
Diffie-Hellman, ML-KEM): they run in the key-exchange worker processes
(:mod:`nxgate.gateway.doors.conch.kexworker`), never on the reactor thread, and take
and return only numbers and bytes so that a job crosses a pipe as a line of
JSON.  The transport keeps the cheap parts (hashing, the host-key signature).

Diffie-Hellman is computed with Python's ``pow`` rather than Cryptography's
``DHParameterNumbers.parameters()``, which proves the group's primes on every
call (28 s for an 8192-bit group, 1.5 s for 3072 bits on our machines): the
groups come from our own moduli file or RFC 3526, and are not checked again
per connection, as OpenSSH does not.  The server's exponent is short, as in
OpenSSH: 512 random bits give 256-bit security against discrete-log attacks
on the exponent, which is more than any group we offer provides.
"""

from __future__ import annotations

import hashlib
import secrets
import struct

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import x25519

#: Bits of our ephemeral Diffie-Hellman exponent (twice the 256-bit strength
#: of the strongest cipher and MAC we negotiate).
EXPONENT_BITS = 512

#: mlkem768x25519-sha256: the client's C_INIT is an ML-KEM-768 public key
#: (1184 bytes) followed by an X25519 public key (32 bytes).
MLKEM768_PUBLIC_KEY = 1184
X25519_PUBLIC_KEY = 32


class KexMathError(ValueError):
    """The client's key-exchange value is unusable; the message says why
    (it goes into the log and the disconnect)."""


def check_dh_public(value: int, prime: int) -> None:
    """RFC 4253, section 8: 1 < e < p - 1; also refuse a value with a single
    bit set (a client that chose a trivial exponent, as OpenSSH refuses)."""
    if not 1 < value < prime - 1:
        raise KexMathError("Diffie-Hellman public value out of range")
    if value & (value - 1) == 0:
        raise KexMathError("Diffie-Hellman public value is a power of two")


def dh_server(generator: int, prime: int, client_public: int,
              exponent_bits: int = EXPONENT_BITS) -> tuple[int, int]:
    """Our side of a Diffie-Hellman exchange: (f, K) for the client's ``e``."""
    check_dh_public(client_public, prime)
    bits = min(exponent_bits, prime.bit_length() - 2)
    exponent = secrets.randbits(bits) | (1 << (bits - 1))  # never small
    ours = pow(generator, exponent, prime)
    shared = pow(client_public, exponent, prime)
    if shared <= 1 or shared >= prime - 1:
        raise KexMathError("Diffie-Hellman shared secret is degenerate")
    return ours, shared


def mlkem768x25519_server(client_init: bytes) -> tuple[bytes, bytes]:
    """Our side of mlkem768x25519-sha256 (draft-ietf-sshm-mlkem-hybrid-kex):
    (K as an SSH string, S_REPLY) for the client's C_INIT."""
    from cryptography.hazmat.primitives.asymmetric import mlkem  # Cryptography 48 or later

    if len(client_init) != MLKEM768_PUBLIC_KEY + X25519_PUBLIC_KEY:
        raise KexMathError("hybrid key-exchange value has the wrong length")
    kem_public, curve_public = client_init[:MLKEM768_PUBLIC_KEY], client_init[MLKEM768_PUBLIC_KEY:]
    ours = x25519.X25519PrivateKey.generate()
    try:
        classical = ours.exchange(x25519.X25519PublicKey.from_public_bytes(curve_public))
    except ValueError:
        raise KexMathError("invalid X25519 public key") from None
    try:
        kem_secret, ciphertext = mlkem.MLKEM768PublicKey.from_public_bytes(kem_public).encapsulate()
    except ValueError:
        raise KexMathError("invalid ML-KEM-768 public key") from None
    digest = hashlib.sha256(kem_secret + classical).digest()
    reply = ciphertext + ours.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return struct.pack(">L", len(digest)) + digest, reply
