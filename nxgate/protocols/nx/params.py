"""NX command parameters, both ways (one codec for the server and the client):
``--key="value" --key="value" ...``.

Real clients differ (reference §2.5): OpenNX URL-escapes some characters as
``%XX``, Remmina sends raw values that may themselves contain ``"``, nxcl
sends empty values, keys come in any order and unknown keys are common.
This parser accepts all of it and refuses only text that is not a parameter
list at all.

A quoted value ends at the first ``"`` that is followed by whitespace and the
next ``--key=`` or by the end of the line, so a raw password such as
``pa"ss`` survives.  Unquoted values (``--key=value``) end at whitespace.
``%XX`` escapes are decoded in every value; other ``%`` signs are kept.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping

from nxgate.protocols.nx.errors import bad_parameters

_KEY = re.compile(r"--([A-Za-z][A-Za-z0-9_-]*)=")
_QUOTED_END = re.compile(r'"(?=\s+--[A-Za-z][A-Za-z0-9_-]*=|\s*$)')
_UNQUOTED = re.compile(r"[^\s]*")
_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")

# OpenNX's UrlEsc set plus '%' (so that a literal '%' survives decoding).
_ESCAPED = frozenset(' "%\'$`\\&:')

# Values never to be shown in echoes, logs or error messages.
SECRET_KEYS = frozenset({"agent_password", "password", "cookie"})


class Params(Mapping[str, str]):
    """An immutable, case-insensitive mapping of parsed parameters.

    Its ``repr`` masks secret values so that a parameter set can be logged.
    """

    def __init__(self, items: Mapping[str, str] | None = None) -> None:
        self._items = {k.lower(): v for k, v in (items or {}).items()}

    def __getitem__(self, key: str) -> str:
        return self._items[key.lower()]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def masked(self) -> dict[str, str]:
        return {k: ("***" if k in SECRET_KEYS else v) for k, v in self._items.items()}

    def __repr__(self) -> str:
        return f"Params({self.masked()!r})"


def unescape(value: str) -> str:
    """Decode ``%XX`` escapes; the result keeps undecodable bytes escaped."""

    def byte(match: re.Match[str]) -> str:
        return chr(int(match.group(1), 16))

    decoded = _ESCAPE.sub(byte, value)
    # Escapes denote bytes; OpenNX escapes UTF-8 text byte by byte.
    try:
        return decoded.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return decoded


def escape(value: str) -> str:
    """``%XX``-escape what could break a quoted parameter value."""
    out = []
    for char in value:
        if char in _ESCAPED or ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"%{ord(char):02X}")
        else:
            out.append(char)
    return "".join(out)


def format_params(pairs: Iterable[tuple[str, str]]) -> str:
    return " ".join(f'--{key}="{escape(value)}"' for key, value in pairs)


def parse_params(text: str) -> Params:
    """Parse a parameter list; raise :class:`NXError` 597 if it is not one."""
    items: dict[str, str] = {}
    pos = 0
    length = len(text)
    while True:
        while pos < length and text[pos].isspace():
            pos += 1
        if pos >= length:
            return Params(items)
        key_match = _KEY.match(text, pos)
        if key_match is None:
            raise bad_parameters(mask_secrets(text))
        key = key_match.group(1).lower()
        pos = key_match.end()
        if text.startswith('"', pos):
            end_match = _QUOTED_END.search(text, pos + 1)
            if end_match is None:
                raise bad_parameters(mask_secrets(text))
            raw = text[pos + 1 : end_match.start()]
            pos = end_match.end()
        else:
            unquoted = _UNQUOTED.match(text, pos)
            assert unquoted is not None  # the pattern matches the empty string
            raw = unquoted.group(0)
            pos = unquoted.end()
        items[key] = unescape(raw)


_SECRET_VALUE = re.compile(
    r'(--(?:%s)=)("[^"]*(?:"(?!\s+--[A-Za-z]|\s*$)[^"]*)*"|\S*)'
    % "|".join(sorted(SECRET_KEYS)),
    re.IGNORECASE,
)


def mask_secrets(text: str) -> str:
    """Replace the values of secret parameters in a raw command line."""
    return _SECRET_VALUE.sub(lambda m: m.group(1) + '"***"', text)
