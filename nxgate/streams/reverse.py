"""Reverse streams: connections made inside a session that travel back to
its client's machine (sound to the client's PulseAudio, print jobs to its
printers, files to its shared folders), one path on one box and on a
cluster alike.  This module is the pure part: the words, the numbers, the
lines, and the table of connections that wait for their client.

The path, from the session to the client:

1. **The route.**  The door that holds the client's SSH connection (the X2Go
   door for a client's ``tcpip-forward``, the NX door for
   ``nxgate-client``'s ``service-tunnel@nxgate``) asks the session's node,
   through the node interface like any stream, for the service's *reverse
   listener*: ``open_stream(caller, session_id, StreamKind(service))``
   (:func:`listener_kind`, no number).  The node (:mod:`nxgate.node.reverse`)
   checks that the caller is the session's own user, listens for the
   service on the session's machine, and hands back the *route*: a stream
   that lives as long as the listener.  The gateway's end is
   :class:`nxgate.streams.reverse_route.ReverseRoute`.  One route per
   session and service: a newer one (the client resumed from elsewhere)
   replaces the older, whose stream the node closes.
2. **A connection.**  A program of the session connects to the listener
   (a Unix socket where the program can use one; loopback TCP where it
   cannot: :data:`SERVICES`).  The node lets in only the session user's
   own processes (:mod:`nxgate.host.local_peers`: ``SO_PEERCRED``, or the
   connecting TCP socket found among that user's processes), reads not a
   byte of it, holds it under a number ``n`` (:class:`Waiting`) and writes
   ``connection n`` on the route (:func:`announcement`).
3. **The reverse stream.**  The gateway asks for it with
   ``open_stream(caller, session_id, StreamKind(service, n))``
   (:func:`connection_kind`); the node hands it over once, to the session's
   own user, if ``n`` waits at this session's listener for this service.
   The gateway opens a channel to the client on the SSH connection (X2Go's
   ``forwarded-tcpip``, ``nxgate-client``'s ``service-connection@nxgate``:
   :mod:`nxgate.streams.reverse_channel`) and splices the two
   (:mod:`nxgate.streams.splice`).  A connection nobody takes within
   :data:`PATIENCE` seconds is closed; at most :data:`MAX_WAITING` of a
   session wait at once (the rest are closed at once), so a program that
   floods its listener holds a bounded number of the node's descriptors.

The route carries short lines both ways (:class:`LineReader`): the node's
announcements, and the gateway's settings for the session's side of the
service (:func:`setting`: the PulseAudio cookie the X2Go client pushed).

Words: a *reverse listener* is where a session's programs connect, on the
session's machine; a *route* is the stream that keeps it open and carries
its announcements to the gateway; a *reverse stream* is one connection,
handed to the gateway; a *reverse service* is what they carry (a row of
:data:`SERVICES`).  Adding one (X2Go's folders over sshfs, say) is a row
here and what the node's side of it needs.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from nxgate.vocabulary.streams import StreamKind

#: Seconds a connection may wait for the gateway to take it.
PATIENCE = 15.0
#: Connections of one session that may wait (or be checked) at once, all its services together.
MAX_WAITING = 32
#: The longest line a route carries (a cookie of 256 bytes in hex, and its word).
MAX_LINE = 1024


@dataclass(frozen=True)
class ReverseService:
    """One service that travels back to the client.

    ``word``: the stream kind's word; ``over``: how the session's programs
    reach its listener, ``unix`` (a socket path; the kernel names the peer)
    or ``tcp`` (a loopback port, for programs that can reach nothing else);
    ``settings``: the words of the lines the gateway may send on its route;
    ``what``: words for the log; ``setting``: the ``[services]`` switch that
    turns it on (its word, when empty)."""

    word: str
    over: str
    what: str
    settings: frozenset[str] = frozenset()
    setting: str = ""

    @property
    def switch(self) -> str:
        return self.setting or self.word


SOUND = ReverseService("sound", "unix", "sound", frozenset({"cookie"}))
PRINTING = ReverseService("printing", "unix", "printing")
#: libsmbclient (smbnetfs) connects to a host and port only.
SHARING = ReverseService("sharing", "tcp", "folders")
#: X2Go's shared folders (and its print spool): sshfs's ssh connects to a host and port only.
SSHFS = ReverseService("sshfs", "tcp", "shared folders", setting="sharing")

SERVICES: dict[str, ReverseService] = {service.word: service for service in (SOUND, PRINTING, SHARING, SSHFS)}

#: The length of a PulseAudio cookie (PA_NATIVE_COOKIE_LENGTH).
PULSE_COOKIE_BYTES = 256


class RouteError(ValueError):
    """A line on a route that is not one (too long, an unknown word, a bad value)."""


def listener_kind(service: str) -> StreamKind:
    """The kind that opens a session's reverse listener for ``service`` (its route)."""
    return StreamKind(SERVICES[service].word)


def connection_kind(service: str, number: int) -> StreamKind:
    """The kind of connection ``number`` that waits at the service's listener."""
    return StreamKind(SERVICES[service].word, number)


def service_of(kind: StreamKind) -> ReverseService | None:
    """The reverse service a stream kind names, or None (``agent``, ``view``)."""
    return SERVICES.get(kind.word)


# ------------------------------------------------------------------ lines
def announcement(number: int) -> bytes:
    """Node to gateway: connection ``number`` waits."""
    return f"connection {number}\n".encode()


def read_announcement(line: bytes) -> int:
    """The number of an announcement line (without its newline); RouteError if it is not one."""
    match = re.fullmatch(rb"connection ([0-9]{1,10})", line)
    if match is None:
        raise RouteError(f"not an announcement: {line[:40]!r}")
    return int(match.group(1))


def setting(name: str, value: bytes) -> bytes:
    """Gateway to node: a setting of the service (``cookie``: the client's PulseAudio cookie)."""
    return f"{name} {value.hex()}\n".encode()


def read_setting(line: bytes, service: ReverseService) -> tuple[str, bytes]:
    """(name, value) of a setting line for ``service``; RouteError for
    anything else, or a cookie that is not one (:data:`PULSE_COOKIE_BYTES`)."""
    match = re.fullmatch(rb"([a-z]{1,16}) ((?:[0-9a-f]{2}){1,480})", line)
    if match is None:
        raise RouteError(f"not a setting: {line[:40]!r}")
    name, value = match.group(1).decode(), bytes.fromhex(match.group(2).decode())
    if name not in service.settings:
        raise RouteError(f"{service.word} has no setting {name!r}")
    if name == "cookie" and len(value) != PULSE_COOKIE_BYTES:
        raise RouteError(f"a PulseAudio cookie has {PULSE_COOKIE_BYTES} bytes, not {len(value)}")
    return name, value


class LineReader:
    """Lines out of a byte stream, each at most :data:`MAX_LINE` bytes
    (RouteError past that, before the bytes pile up)."""

    def __init__(self, limit: int = MAX_LINE) -> None:
        self.limit = limit
        self.buffer = b""

    def feed(self, data: bytes) -> list[bytes]:
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        if len(self.buffer) > self.limit or any(len(line) > self.limit for line in lines):
            raise RouteError(f"a line longer than {self.limit} bytes")
        return lines


# ------------------------------------------------------------------ waiting
T = TypeVar("T")


class Waiting(Generic[T]):
    """The connections that wait for the gateway, by session, service and number.

    Each is taken once, and only for the session and service it came to;
    a session holds at most ``cap`` (waiting or still being checked:
    :meth:`admit` counts, :meth:`hold` or :meth:`release` settles).  The
    numbers are this table's own, never reused while it lives."""

    def __init__(self, cap: int = MAX_WAITING, numbers: Iterator[int] | None = None) -> None:
        self.cap = cap
        self.numbers = numbers if numbers is not None else itertools.count(1)
        self.held: dict[int, tuple[str, str, T]] = {}
        self.counts: dict[str, int] = {}

    def count(self, session_id: str) -> int:
        return self.counts.get(session_id, 0)

    def admit(self, session_id: str) -> bool:
        """Room for one more connection of the session (False: close it now)."""
        if self.count(session_id) >= self.cap:
            return False
        self.counts[session_id] = self.count(session_id) + 1
        return True

    def release(self, session_id: str) -> None:
        """An admitted connection went (refused by its check, or gone)."""
        left = self.count(session_id) - 1
        if left > 0:
            self.counts[session_id] = left
        else:
            self.counts.pop(session_id, None)

    def hold(self, session_id: str, service: str, item: T) -> int:
        """An admitted connection waits: its number."""
        number = next(self.numbers) % 2 ** 31 or next(self.numbers)
        self.held[number] = (session_id, service, item)
        return number

    def take(self, session_id: str, service: str, number: int) -> T | None:
        """The connection ``number`` if it waits for this session and service (then never again)."""
        found = self.held.get(number)
        if found is None or found[:2] != (session_id, service):
            return None
        del self.held[number]
        self.release(session_id)
        return found[2]

    def drop(self, session_id: str, service: str | None = None,
             keep: Callable[[int], bool] = lambda number: False) -> list[T]:
        """The waiting connections of a session (of one service), removed: to close."""
        gone = [number for number, (sid, word, _) in self.held.items()
                if sid == session_id and (service is None or word == service) and not keep(number)]
        items = []
        for number in gone:
            items.append(self.held.pop(number)[2])
            self.release(session_id)
        return items
