"""Trust on first use for the gateway's SSH host key.

The file is OpenSSH's ``known_hosts`` format, so a user can inspect it, copy
lines from ``~/.ssh/known_hosts`` or ``ssh-keyscan``, and hashed entries
work too.  Hosts on a port other than 22 are written ``[host]:port`` as
OpenSSH does.

The policy is stricter than OpenSSH's per-key-type check: once any key is
known for a host, a key that matches none of them is refused.  Together with
:func:`preferred_algorithms` (ask first for the key types we know, as
OpenSSH does) a legitimate server always shows a known key, and an attacker
cannot get around a known key by offering another key type.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass

from twisted.conch.client.knownhosts import KnownHostsFile, PlainEntry
from twisted.conch.ssh.keys import FingerprintFormats, Key
from twisted.python.filepath import FilePath

# SSH host key algorithms that use a key of the given type (RFC 8332 for RSA).
_ALGORITHMS_OF_TYPE: dict[bytes, tuple[bytes, ...]] = {
    b"ssh-rsa": (b"rsa-sha2-512", b"rsa-sha2-256", b"ssh-rsa"),
}


def host_entry_name(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def fingerprint(key: Key) -> str:
    return "SHA256:" + key.fingerprint(format=FingerprintFormats.SHA256_BASE64)


class Verdict(enum.Enum):
    KNOWN = "known"
    UNKNOWN = "unknown"
    CHANGED = "changed"


@dataclass(frozen=True)
class HostKeyCheck:
    verdict: Verdict
    message: str


class KnownHosts:
    """The known-hosts file of one connection target."""

    def __init__(self, path: str, host: str, port: int) -> None:
        self.path = path
        self.name = host_entry_name(host, port)

    def _entries(self) -> list:
        if not os.path.exists(self.path):
            return []
        known = KnownHostsFile.fromPath(FilePath(self.path))
        return [entry for entry in known.iterentries() if entry.matchesHost(self.name.encode())]

    def known_key_types(self) -> list[bytes]:
        return [entry.keyType for entry in self._entries() if entry.keyType]

    def check(self, key: Key) -> HostKeyCheck:
        entries = self._entries()
        if any(entry.matchesKey(key) for entry in entries):
            return HostKeyCheck(Verdict.KNOWN, "")
        if entries:
            known = ", ".join(sorted({entry.keyType.decode() for entry in entries}))
            return HostKeyCheck(
                Verdict.CHANGED,
                f"the host key of {self.name} has changed: the server showed {key.sshType().decode()}"
                f" key {fingerprint(key)}, but {self.path} has a different key ({known}) for it."
                " Someone could be intercepting the connection, or the gateway's keys were replaced;"
                f" if you know the new key is right, remove the old line for {self.name} from {self.path}.",
            )
        return HostKeyCheck(Verdict.UNKNOWN, "")

    def add(self, key: Key) -> None:
        """Append the key (plain, not hashed: the file is ours to read)."""
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, mode=0o700, exist_ok=True)
        line = PlainEntry([self.name.encode()], key.sshType(), key, None).toString() + b"\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "ab") as handle:
            handle.write(line)


def preferred_algorithms(supported: list[bytes], known_types: list[bytes]) -> list[bytes]:
    """``supported`` with the algorithms of the known key types first, then
    Ed25519 (Conch lists it last; OpenSSH prefers it to RSA)."""
    first: list[bytes] = []
    for key_type in [*known_types, b"ssh-ed25519"]:
        for algorithm in _ALGORITHMS_OF_TYPE.get(key_type, (key_type,)):
            if algorithm in supported and algorithm not in first:
                first.append(algorithm)
    return first + [algorithm for algorithm in supported if algorithm not in first]
