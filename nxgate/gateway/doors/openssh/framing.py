"""The framing between ``nxgate-shell`` and the gateway's local socket (pure).

In the OpenSSH deployment mode sshd runs ``nxgate-shell`` for the nx
account; it carries the NX conversation to the gateway over a Unix socket
and, after ``bye``, gets a connection to the session's agent, so that it
can hand the bulk stream to ``nxcopy`` and leave Python out of the way.
Every message is one type byte, a 4-byte big-endian length and a payload:

* ``H`` shell -> gateway, first: a JSON object, ``{"remote": "<client IP
  address>"}`` (``remote`` may be left out when sshd did not say); anything
  else is refused (see :func:`parse_hello`)
* ``D`` both ways: conversation bytes
* ``E`` shell -> gateway: the client sent EOF
* ``S`` gateway -> shell: JSON ``{"leftover"}`` — switch to the raw stream
  on the connection to the agent that came with it (SCM_RIGHTS, sent with
  the frame or before it); ``leftover`` (base64) are stream bytes the client
  sent after ``bye`` that must reach the agent first
* ``X`` gateway -> shell: the conversation is over; payload: exit status
"""

from __future__ import annotations

import ipaddress
import json
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass

HELLO, DATA, EOF, SWITCH, EXIT = b"H", b"D", b"E", b"S", b"X"
MAX_FRAME = 1 << 20
MAX_HELLO = 4096
_SCOPE = re.compile(r"[A-Za-z0-9_.-]{1,32}")
_HEADER = struct.Struct(">cI")


class FramingError(Exception):
    pass


def frame(kind: bytes, payload: bytes = b"") -> bytes:
    return _HEADER.pack(kind, len(payload)) + payload


class HelloError(ValueError):
    """A hello the gateway refuses; the message quotes none of its bytes."""


@dataclass(frozen=True)
class Hello:
    """What the shell says about its client.

    ``claimed_address`` is only a claim: the shell socket is open to every
    local user, who may write what they like.  It is kept only when it is an
    IP address (so it cannot carry a newline or other text into the logs).
    """

    claimed_address: str | None


def parse_hello(payload: bytes) -> Hello:
    """The hello frame's payload, checked; raises :class:`HelloError`."""
    if len(payload) > MAX_HELLO:
        raise HelloError(f"hello longer than {MAX_HELLO} bytes")
    try:
        message = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise HelloError("hello is not JSON") from None
    if not isinstance(message, dict):
        raise HelloError("hello is not a JSON object")
    remote = message.get("remote")
    if remote is None:
        return Hello(None)
    if not isinstance(remote, str):
        raise HelloError('"remote" in the hello is not a string')
    try:
        address = ipaddress.ip_address(remote)
    except ValueError:
        raise HelloError('"remote" in the hello is not an IP address') from None
    # ipaddress takes any text after '%' as an IPv6 scope.
    scope = getattr(address, "scope_id", None)
    if scope is not None and not _SCOPE.fullmatch(scope):
        raise HelloError('"remote" in the hello has a bad IPv6 scope')
    return Hello(str(address))


def hello_payload(remote: str | None) -> bytes:
    """The shell's hello; ``remote`` is left out unless it is an IP address."""
    message = {"remote": remote} if remote else {}
    payload = json.dumps(message).encode()
    try:
        parse_hello(payload)
    except HelloError:
        payload = b"{}"
    return payload


class Deframer:
    """Splits a byte stream into (kind, payload) frames."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> Iterator[tuple[bytes, bytes]]:
        self._buffer += data
        while len(self._buffer) >= _HEADER.size:
            kind, length = _HEADER.unpack_from(self._buffer)
            if length > MAX_FRAME or kind not in (HELLO, DATA, EOF, SWITCH, EXIT):
                raise FramingError(f"bad frame {kind!r} of {length} bytes")
            if len(self._buffer) < _HEADER.size + length:
                return
            payload = bytes(self._buffer[_HEADER.size : _HEADER.size + length])
            del self._buffer[: _HEADER.size + length]
            yield kind, payload
