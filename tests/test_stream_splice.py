"""The one splice every relay uses (nxgate.streams.splice): bytes both ways,
back-pressure both ways, half-close, and an end that goes away; with
StringTransports standing in for the two connections.  The real ones are
flooded by tests/test_e2e_sessions.py RelayTests and tests/test_cluster_wire.py."""

from __future__ import annotations

from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase

from nxgate.streams.splice import STREAM_BUFFER, Splice, TransportEnd


class HalfCloseable(StringTransport):
    """A socket transport: it can shut its write side alone."""

    write_closed = False

    def loseWriteConnection(self) -> None:
        self.write_closed = True


class SpliceTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.a, self.b = HalfCloseable(), HalfCloseable()
        self.ended: list[str] = []
        self.splice = Splice(TransportEnd(self.a), TransportEnd(self.b), self.ended.append)

    def test_bytes_go_across_both_ways(self) -> None:
        self.splice.received("a", b"up")
        self.splice.received("b", b"down")
        self.assertEqual((self.a.value(), self.b.value()), (b"down", b"up"))
        self.assertEqual(self.splice.bytes, {"a": 2, "b": 4})

    def test_a_full_end_pauses_the_reading_of_the_other_both_ways(self) -> None:
        self.assertEqual((self.a.bufferSize, self.b.bufferSize), (STREAM_BUFFER, STREAM_BUFFER))
        self.assertTrue(self.a.streaming and self.b.streaming)
        self.b.producer.pauseProducing()  # what Twisted does when b's send buffer is full
        self.assertEqual((self.a.producerState, self.b.producerState), ("paused", "producing"))
        self.b.producer.resumeProducing()  # drained
        self.assertEqual(self.a.producerState, "producing")
        self.a.producer.pauseProducing()
        self.assertEqual((self.a.producerState, self.b.producerState), ("producing", "paused"))
        self.a.producer.resumeProducing()
        self.assertEqual(self.b.producerState, "producing")

    def test_an_end_is_never_left_paused(self) -> None:
        self.b.producer.pauseProducing()
        self.b.producer.stopProducing()  # b is gone: a must still read its peer's goodbye
        self.assertEqual(self.a.producerState, "producing")

    def test_half_close_goes_across_and_the_other_way_goes_on(self) -> None:
        self.splice.eof("a")
        self.assertTrue(self.b.write_closed)
        self.assertFalse(self.a.disconnecting or self.b.disconnecting)
        self.splice.received("b", b"answer after the question ended")
        self.assertEqual(self.a.value(), b"answer after the question ended")
        self.assertEqual(self.ended, [])
        self.splice.eof("b")  # both directions ended: both closed
        self.assertTrue(self.a.disconnecting and self.b.disconnecting)
        self.assertEqual(self.ended, ["b"])

    def test_an_end_that_cannot_half_close_is_closed(self) -> None:
        tls = StringTransport()  # no loseWriteConnection, as TLS
        splice = Splice(TransportEnd(HalfCloseable()), TransportEnd(tls), self.ended.append)
        splice.eof("a")
        self.assertTrue(tls.disconnecting)
        self.assertIsNone(tls.producer)  # let go first: a TLS transport would wait for it
        self.assertEqual(self.ended, ["a"])

    def test_an_end_that_is_lost_closes_the_other_once(self) -> None:
        self.splice.lost("b")
        self.assertTrue(self.a.disconnecting)
        self.assertFalse(self.b.disconnecting)  # gone already
        self.splice.lost("a")
        self.splice.received("a", b"late")
        self.assertEqual(self.ended, ["b"])
        self.assertEqual(self.b.value(), b"")
