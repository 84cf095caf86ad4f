"""Client text made safe to keep, list and log.

Clients send arbitrary bytes: the NX shell decodes them with
``surrogateescape`` (byte-exact, but such strings cannot be encoded as
UTF-8, so SQLite and a UTF-8 log file refuse them), and ``%0A`` in a
parameter decodes to a newline.  :func:`printable` turns such a value into
plain printable text: a byte that is not UTF-8 becomes ``\\xNN`` and a
control or line-breaking character becomes ``\\xNN``/``\\uNNNN``, so a
value can neither break a writer nor start a line of its own in a log, a
listing or the audit file.  Printable text (any script) is kept as it is.
"""

from __future__ import annotations

import unicodedata

# Unicode categories that must not reach a line-oriented file as they are:
# controls (newline, CR, ESC, NEL, ...), surrogates (undecodable bytes) and
# the line/paragraph separators that str.splitlines() breaks on.
_UNSAFE_CATEGORIES = frozenset(("Cc", "Cs", "Zl", "Zp"))


def _escape(char: str) -> str:
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with undecodable bytes and control characters escaped."""
    if text.isascii() and text.isprintable():
        return text  # the usual case, and the cheap one
    return "".join(_escape(char) if unicodedata.category(char) in _UNSAFE_CATEGORIES else char for char in text)



def redact_url(url: str) -> str:
    """``url`` with the password of ``scheme://user:password@host/...``
    shown as ``***``: a database URL may carry one, and logs and error
    messages must not."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, tail = rest.partition("/")
    credentials, at, hostport = authority.rpartition("@")
    if at and ":" in credentials:
        credentials = credentials.split(":", 1)[0] + ":***"
    return f"{scheme}{sep}{credentials}{at}{hostport}{slash}{tail}"
