"""Two byte streams joined end to end, with flow control both ways.

Every relay of nxgate is the same shape: what one end reads, the other
writes; neither end may make the process buffer without bound; an end that
goes away takes the other with it.  The SSH channel to an agent socket
(:mod:`nxgate.streams.relay`), a gateway's TLS stream to a member
(:mod:`nxgate.wire.member_stream`), and a node's TLS stream to the agent
(:mod:`nxgate.wire.node_listener`) all use this one :class:`Splice`.

Back-pressure: each end is given, as the producer that fills its send
buffer, the *reading* of the other end (:class:`Reading`).  Twisted pauses
that producer when the end's buffer passes ``bufferSize`` and resumes it
once drained; so a slow reader on one side stops the reads on the other
side instead of growing memory.  :data:`STREAM_BUFFER` is that threshold:
Twisted's 64 KiB default paused a bulk transfer thousands of times a second.

Half-close: an end that reads EOF but may still be written to (a Unix or
TCP socket, with ``IHalfCloseableProtocol``) has the other end shut its
write side if that end can (``loseWriteConnection``); the splice ends when
both directions have ended, or at once when an end is lost.  An end that
cannot half-close (TLS, an SSH channel) is closed.

The ends are adapters (:class:`TransportEnd` for a Twisted transport, or
anything with the :class:`End` methods); the protocols that own the
connections pass their events on with :meth:`Splice.received`,
:meth:`Splice.eof` and :meth:`Splice.lost`.  Pure flow logic: no reactor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from twisted.internet.interfaces import IPushProducer
from zope.interface import implementer

#: What may wait in an end's send buffer before the other end's reading is paused.
STREAM_BUFFER = 1024 * 1024


class End(Protocol):
    """One end of a splice, as the splice drives it."""

    def write(self, data: bytes) -> None: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def hold(self, producer: IPushProducer) -> None:
        """``producer`` (the other end's reading) is paused while this end's
        send buffer is full."""

    def write_eof(self) -> bool:
        """No more bytes will be written: shut the write side and return
        True, or return False if this end cannot half-close."""

    def close(self) -> None: ...


@implementer(IPushProducer)
class Reading:
    """The reading of ``end`` as the producer that fills another end's send
    buffer.  ``stopProducing`` (the other end is gone) resumes it: an end is
    never left paused, it must still read its peer's goodbye."""

    def __init__(self, end: End) -> None:
        self.end = end

    def pauseProducing(self) -> None:
        self.end.pause_reading()

    def resumeProducing(self) -> None:
        self.end.resume_reading()

    def stopProducing(self) -> None:
        self.end.resume_reading()


class TransportEnd:
    """A Twisted transport (TCP, Unix, TLS) as an :class:`End`."""

    def __init__(self, transport: Any, buffer: int = STREAM_BUFFER) -> None:
        self.transport = transport
        self.holding = False
        set_buffer(transport, buffer)

    def write(self, data: bytes) -> None:
        self.transport.write(data)

    def pause_reading(self) -> None:
        self.transport.pauseProducing()

    def resume_reading(self) -> None:
        self.transport.resumeProducing()

    def hold(self, producer: IPushProducer) -> None:
        self.transport.registerProducer(producer, True)
        self.holding = True

    def _let_go(self) -> None:
        if self.holding:
            self.holding = False
            self.transport.unregisterProducer()

    def write_eof(self) -> bool:
        half_close = getattr(self.transport, "loseWriteConnection", None)  # not on TLS
        if half_close is None:
            return False
        self._let_go()
        half_close()
        return True

    def close(self) -> None:
        # A TLS transport with a producer registered waits for that producer
        # before it closes (a streaming one never finishes): let go of it first.
        self._let_go()
        self.transport.loseConnection()


def set_buffer(transport: Any, size: int = STREAM_BUFFER) -> None:
    """``size`` as the send buffer threshold of ``transport`` and of the TCP
    transport under it when it is TLS (whose own buffer is what fills)."""
    transport.bufferSize = size
    below = getattr(transport, "transport", None)
    if below is not None and hasattr(below, "bufferSize"):
        below.bufferSize = size


class Splice:
    """Ends ``a`` and ``b`` joined: see the module's docstring.

    ``names`` are what the owner calls the two ends in :meth:`received`,
    :meth:`eof` and :meth:`lost`.  ``ended(name)`` is called once, with the
    end that finished the splice (lost, or the last to reach EOF); not
    after :meth:`close`."""

    def __init__(self, a: End, b: End, ended: Callable[[str], None] = lambda name: None,
                 names: tuple[str, str] = ("a", "b")) -> None:
        self.ends = dict(zip(names, (a, b)))
        self.other = {names[0]: names[1], names[1]: names[0]}
        self.ended = ended
        self.eof_from: set[str] = set()
        self.done = False
        self.bytes = dict.fromkeys(names, 0)  # read from each end
        a.hold(Reading(b))
        b.hold(Reading(a))

    def received(self, name: str, data: bytes) -> None:
        """End ``name`` read ``data``: the other end writes it."""
        if self.done:
            return
        self.bytes[name] += len(data)
        self.ends[self.other[name]].write(data)

    def eof(self, name: str) -> None:
        """End ``name`` read EOF but may still be written to."""
        if self.done or name in self.eof_from:
            return
        self.eof_from.add(name)
        if len(self.eof_from) == 2 or not self.ends[self.other[name]].write_eof():
            self._finish(name)

    def lost(self, name: str) -> None:
        """End ``name``'s connection is gone: the other end is closed."""
        if not self.done:
            self._finish(name, gone=name)

    def close(self) -> None:
        """Close both ends (the owner is done with the stream)."""
        if not self.done:
            self._finish("")

    def _finish(self, name: str, gone: str = "") -> None:
        self.done = True
        for each, end in self.ends.items():
            if each != gone:
                end.close()
        if name:
            self.ended(name)
