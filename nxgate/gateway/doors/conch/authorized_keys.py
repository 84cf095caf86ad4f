"""Reading ``authorized_keys`` files, options included.

A key line may carry OpenSSH options.  Since the gateway only ever offers
the NX shell, options that restrict forwarding, ptys or X11 are already
satisfied.  Options we cannot honour make the key unusable here rather than
silently more powerful: a key limited to ``command="rsync ..."`` must not
open a desktop.  ``from=`` and ``expiry-time=`` are honoured.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass

from twisted.conch.ssh import keys

# Options that only take away what the gateway never gives anyway.
_HARMLESS = frozenset(
    {
        "restrict",
        "no-agent-forwarding",
        "no-port-forwarding",
        "no-pty",
        "no-user-rc",
        "no-x11-forwarding",
        "no-touch-required",
        "verify-required",
        "pty",
        "agent-forwarding",
        "port-forwarding",
        "x11-forwarding",
        "user-rc",
        "permitopen",
        "permitlisten",
        "environment",
        "tunnel",
    }
)
_KEY_TYPE = re.compile(r"(ssh-|ecdsa-|sk-)[A-Za-z0-9@.-]+")
_OPTION = re.compile(r'([A-Za-z0-9-]+)(?:="((?:[^"\\]|\\.)*)")?')


@dataclass(frozen=True)
class AuthorizedKey:
    key: keys.Key
    options: tuple[tuple[str, str | None], ...]
    line: int

    def refusal(self, remote_address: str | None, now: float | None = None) -> str | None:
        """Why this key may not be used from ``remote_address``, or None."""
        for name, value in self.options:
            if name in _HARMLESS:
                continue
            if name == "from":
                if remote_address is None or not address_matches(remote_address, value or ""):
                    return f"from= does not allow {remote_address}"
            elif name == "expiry-time":
                if value is None or _expired(value, now):
                    return "key expired (expiry-time)"
            else:
                return f"option {name!r} cannot be honoured by the NX gateway"
        return None


def split_options(text: str) -> tuple[list[tuple[str, str | None]], str]:
    """Split a leading option list off a key line; returns (options, rest)."""
    options: list[tuple[str, str | None]] = []
    pos = 0
    while True:
        match = _OPTION.match(text, pos)
        if match is None:
            raise ValueError("bad option list")
        value = match.group(2)
        options.append((match.group(1).lower(), value.replace('\\"', '"') if value is not None else None))
        pos = match.end()
        if text.startswith(",", pos):
            pos += 1
            continue
        rest = text[pos:]
        if not rest[:1].isspace():
            raise ValueError("bad option list")
        return options, rest.strip()


def parse(lines: Iterable[str]) -> tuple[list[AuthorizedKey], list[str]]:
    """Parse authorized_keys text into keys and a list of problems."""
    result: list[AuthorizedKey] = []
    problems: list[str] = []
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        options: list[tuple[str, str | None]] = []
        try:
            if not _KEY_TYPE.match(line):
                options, line = split_options(line)
            key_type, blob = line.split()[:2]
            key = keys.Key.fromString(f"{key_type} {blob}".encode())
        except (ValueError, keys.BadKeyError) as exc:
            problems.append(f"line {number}: {exc or 'unreadable key'}")
            continue
        result.append(AuthorizedKey(key, tuple(options), number))
    return result, problems


def address_matches(address: str, patterns: str) -> bool:
    """OpenSSH ``from=`` semantics for addresses: wildcards, CIDR, ``!`` negation.

    Host names are not resolved (as with ``UseDNS no``); a negated match
    always wins.
    """
    allowed = False
    for pattern in filter(None, (p.strip() for p in patterns.split(","))):
        negated = pattern.startswith("!")
        pattern = pattern.lstrip("!")
        if "/" in pattern:
            try:
                hit = ipaddress.ip_address(address) in ipaddress.ip_network(pattern, strict=False)
            except ValueError:
                hit = False
        else:
            hit = fnmatch.fnmatchcase(address, pattern)
        if hit and negated:
            return False
        allowed = allowed or hit
    return allowed


def _expired(value: str, now: float | None) -> bool:
    digits = value.strip()
    formats = {8: "%Y%m%d", 12: "%Y%m%d%H%M", 14: "%Y%m%d%H%M%S"}
    if len(digits) not in formats or not digits.isdigit():
        return True
    limit = time.mktime(time.strptime(digits, formats[len(digits)]))
    return (time.time() if now is None else now) >= limit
