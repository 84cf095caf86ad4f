"""The door's bus connection: txdbus's, with a receive path that a big
message cannot stall.

txdbus keeps what it has received in a ``bytes`` object that it copies
for every chunk (``buffer = buffer + data``): a 28 MB message arriving in
64 kB reads copies gigabytes on the reactor thread, and then txdbus
decodes every string in it before the door sees a single argument
(issue 22: one ``StartSession`` with a 28 MB name stalled every door for
seconds).  Here the incoming bytes go to a ``bytearray``, and a message
whose header announces more than ``max_message`` bytes is answered with
an ``org.nxgate.Error.InvalidRequest`` from its header alone (when it is a
method call) while its remaining bytes are dropped, unread, as they come.
"""

from __future__ import annotations

import struct
from typing import Any

from twisted.internet import defer
from twisted.internet.error import ConnectError
from twisted.logger import Logger
from txdbus import client, endpoints, error, marshal, message

log = Logger()

_FIXED_HEADER = 16  # endianness, type, flags, version, body length, serial, header array length
_METHOD_CALL = 1
_MEMBER, _SENDER = 3, 7


def message_length(header: bytes | bytearray) -> tuple[int, int]:
    """(the whole message's length, its header's length without padding)
    from the first 16 bytes of a D-Bus message."""
    endian = "<" if header[:1] == b"l" else ">"
    body_length, = struct.unpack_from(endian + "I", header, 4)
    fields_length, = struct.unpack_from(endian + "I", header, 12)
    header_length = _FIXED_HEADER + fields_length
    return header_length + (-header_length % 8) + body_length, header_length


class BoundedConnection(client.DBusClientConnection):
    """A :class:`txdbus.client.DBusClientConnection` with a linear receive
    buffer and a bound on the size of a message."""

    max_message = 64 * 1024
    refused_name = "org.nxgate.Error.InvalidRequest"

    def connectionMade(self) -> None:
        self._inbox = bytearray()
        self._skipping = 0
        super().connectionMade()

    def dataReceived(self, data: bytes) -> None:
        if not self._authenticated:
            super().dataReceived(data)  # the short line-based authentication
            return
        if self._buffer:  # what came with the end of the authentication
            self._inbox += self._buffer
            self._buffer = b""
        if self._skipping:
            dropped = min(self._skipping, len(data))
            self._skipping -= dropped
            data = data[dropped:]
        self._inbox += data
        while len(self._inbox) >= _FIXED_HEADER and not self._skipping:
            length, header_length = message_length(self._inbox)
            if length > self.max_message:
                if header_length > self.max_message:
                    log.warn("D-Bus: dropped a message with a {size}-byte header", size=header_length)
                elif len(self._inbox) < header_length:
                    return  # its header fields are needed for the answer
                else:
                    self._refuse(length, bytes(self._inbox[:header_length]))
                taken = min(length, len(self._inbox))
                del self._inbox[:taken]
                self._skipping = length - taken
                continue
            if len(self._inbox) < length:
                return
            raw = bytes(self._inbox[:length])
            del self._inbox[:length]
            self.rawDBusMessageReceived(raw)

    def _refuse(self, length: int, header: bytes) -> None:
        """Answer a too-big method call from its header (the body is never read)."""
        try:
            _, fields = marshal.unmarshal(message._headerFormat, header, 0, header[:1] == b"l")
        except (error.MarshallingError, struct.error, IndexError, ValueError) as problem:
            log.warn("D-Bus: dropped a {size}-byte message with a bad header: {problem}", size=length,
                     problem=str(problem))
            return
        named = dict(fields[6])
        sender, member = named.get(_SENDER, "?"), named.get(_MEMBER, "?")
        log.warn("D-Bus: refused a {size}-byte message from {sender} ({member}): larger than {limit} bytes",
                 size=length, sender=sender, member=member, limit=self.max_message)
        if fields[1] == _METHOD_CALL and sender != "?":
            self.sendMessage(message.ErrorMessage(
                self.refused_name, fields[5], destination=sender, signature="s",
                body=[f"The message is larger than {self.max_message} bytes."]))


class _Factory(client.DBusClientFactory):
    protocol = BoundedConnection


def connect(reactor: Any, address: str) -> defer.Deferred[BoundedConnection]:
    """:func:`txdbus.client.connect` with :class:`BoundedConnection`: the
    bus's endpoints tried in turn until one takes."""
    factory = _Factory()
    ready = factory.getConnection()
    remaining = list(endpoints.getDBusEndpoints(reactor, address))
    if not remaining:
        return defer.fail(ConnectError(string=f"no usable address in {address!r}"))

    def try_next(failure: Any) -> None:
        if remaining:
            remaining.pop(0).connect(factory).addErrback(try_next)
        else:
            ready.errback(ConnectError(string=f"cannot reach the bus: {failure.getErrorMessage()}"))

    try_next(None)
    return ready
