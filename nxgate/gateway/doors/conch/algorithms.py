"""Which SSH algorithms the gateway offers, and which Diffie-Hellman groups.

Two sets.  The default one is what current clients (OpenSSH 6.5 and later,
libssh 0.9 and later with Remmina, PuTTY 0.75 and later, nxgate-client) use,
with nothing that ``ssh-audit`` reports as weak: no SHA-1, no CBC, no 3DES,
no NIST curves, no MD5, MACs only in encrypt-then-MAC mode.  The
``[ssh] legacy_algorithms`` set adds back what NoMachine's nxssh (OpenSSH
3.x/4.x code) and other clients of that age need: SHA-1 host signatures
(``ssh-rsa``), group exchange and group 14 with SHA-1, CBC ciphers and the
SHA-1/MD5 MACs, and group-exchange moduli from 2048 up to 8192 bits for
clients that insist.

Each list is in order of preference and keeps only what the installed Conch
and Cryptography implement (ML-KEM needs Cryptography 48).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from nxgate.wire.ssh_etm import AEAD_CIPHERS, ETM_MACS

# Key exchanges: the post-quantum hybrid first, then X25519 (every client of
# the last ten years), then group exchange with SHA-256 for clients without
# either.
MODERN_KEX = (
    b"mlkem768x25519-sha256",
    b"curve25519-sha256",
    b"curve25519-sha256@libssh.org",
    b"diffie-hellman-group-exchange-sha256",
)
LEGACY_KEX = MODERN_KEX + (
    b"ecdh-sha2-nistp256",
    b"ecdh-sha2-nistp384",
    b"ecdh-sha2-nistp521",
    b"diffie-hellman-group-exchange-sha1",
    b"diffie-hellman-group14-sha1",
)
MODERN_HOST_KEY_ALGORITHMS = (b"ssh-ed25519", b"rsa-sha2-512", b"rsa-sha2-256")
LEGACY_HOST_KEY_ALGORITHMS = MODERN_HOST_KEY_ALGORITHMS + (b"ssh-rsa",)
MODERN_CIPHERS = (*AEAD_CIPHERS, b"aes256-ctr", b"aes192-ctr", b"aes128-ctr")
LEGACY_CIPHERS = MODERN_CIPHERS + (b"aes256-cbc", b"aes192-cbc", b"aes128-cbc", b"3des-cbc")
MODERN_MACS = tuple(ETM_MACS)
LEGACY_MACS = MODERN_MACS + (b"hmac-sha2-512", b"hmac-sha2-256", b"hmac-sha1", b"hmac-md5")

#: Group-exchange moduli we serve (bits): 3072 gives 128-bit strength, as
#: X25519; 4096 is the most a key exchange may cost us by default (an
#: 8192-bit exchange costs about 16 times a 3072-bit one, the DHEat attack).
#: A client asking for more (OpenSSH asks 7680 or 8192 for AES-256) gets
#: 3072 bits unless its minimum is higher: up to 4096 by default, up to 8192
#: with legacy algorithms (which also serve 2048 to a client whose maximum
#: is below 3072).
MODERN_MODULI = (3072, 4096, 3072)
LEGACY_MODULI = (2048, 8192, 3072)


@dataclass(frozen=True)
class AlgorithmPolicy:
    """The lists one transport offers, and the group-exchange bounds."""

    kex: tuple[bytes, ...]
    host_key_algorithms: tuple[bytes, ...]
    ciphers: tuple[bytes, ...]
    macs: tuple[bytes, ...]
    smallest_modulus: int
    largest_modulus: int
    #: The size served to a client whose ideal is larger (0: its ideal).
    preferred_modulus: int

    def offered_kex(self, implemented: Sequence[bytes], have_moduli: bool) -> list[bytes]:
        """Our key exchanges that Conch implements; no group exchange without moduli."""
        return [name for name in self.kex if name in implemented
                and (have_moduli or b"group-exchange" not in name)]

    def offered_host_key_algorithms(self, for_keys: Sequence[bytes]) -> list[bytes]:
        """Signature algorithms of our host keys (Conch's list for them), in our order."""
        return [name for name in self.host_key_algorithms if name in for_keys]


def policy(legacy: bool) -> AlgorithmPolicy:
    if legacy:
        return AlgorithmPolicy(LEGACY_KEX, LEGACY_HOST_KEY_ALGORITHMS, LEGACY_CIPHERS, LEGACY_MACS, *LEGACY_MODULI)
    return AlgorithmPolicy(MODERN_KEX, MODERN_HOST_KEY_ALGORITHMS, MODERN_CIPHERS, MODERN_MACS, *MODERN_MODULI)


class NoGroup(Exception):
    """No group fits the client's request within our bounds (the message says why)."""


def choose_group(primes: Mapping[int, Sequence[tuple[int, int]]], minimum: int, ideal: int, maximum: int,
                 smallest: int, largest: int, preferred: int = 0,
                 choice: random.Random | None = None) -> tuple[int, int]:
    """(generator, prime) for a group-exchange request (RFC 4419).

    The size is the one of ours nearest to the client's ``ideal`` (or to
    ``preferred`` if that is smaller) within both the client's [minimum,
    maximum] and our [smallest, largest]; on a tie the smaller.  Conch would take the nearest to ``ideal`` whatever the bounds,
    i.e. 8192 bits for anyone who asks.  ``primes`` maps sizes to groups, as
    Conch's moduli reader gives them (sizes rounded up: 3072, not 3071).
    """
    low, high = max(minimum, smallest), min(maximum, largest)
    sizes = [size for size in primes if low <= size <= high and primes[size]]
    if not sizes:
        raise NoGroup(f"no Diffie-Hellman group between {minimum} and {maximum} bits "
                      f"(this gateway offers {smallest} to {largest})")
    target = min(ideal, preferred) if preferred else ideal
    size = min(sizes, key=lambda bits: (abs(bits - target), bits))
    return (choice or random).choice(list(primes[size]))


#: The KEXINIT name-lists, in their order on the wire (RFC 4253, 7.1), and what each is called in the log.
KEXINIT_LISTS = ("key exchange method", "host key algorithm", "cipher", "cipher", "MAC", "MAC",
                 "compression", "compression")


def unmatched(client: Sequence[Sequence[bytes]], ours: Sequence[Sequence[bytes]]) -> list[str]:
    """For the log of a failed negotiation: each kind of algorithm where the
    client's list (KEXINIT order) and ours have nothing in common, with what
    the client offered."""
    problems = []
    for kind, theirs, mine in zip(KEXINIT_LISTS, client, ours):
        if not set(theirs) & set(mine):
            offered = b",".join(theirs)[:300].decode("ascii", "replace")
            problem = f"no {kind} in common (the client offers {offered})"
            if problem not in problems:
                problems.append(problem)
    return problems
