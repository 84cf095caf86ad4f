"""Framing between nxgate-shell and the gateway."""

from twisted.trial.unittest import SynchronousTestCase

from nxgate import shellproto as sp


class FramingTests(SynchronousTestCase):
    def test_round_trip_split_anywhere(self):
        stream = sp.frame(sp.HELLO, b'{"remote": "192.0.2.1"}') + sp.frame(sp.DATA, b"hello\n") + sp.frame(sp.EOF)
        deframer = sp.Deframer()
        frames = [frame for byte in stream for frame in deframer.feed(bytes([byte]))]
        self.assertEqual(frames, [(sp.HELLO, b'{"remote": "192.0.2.1"}'), (sp.DATA, b"hello\n"), (sp.EOF, b"")])

    def test_bad_frames(self):
        self.assertRaises(sp.FramingError, list, sp.Deframer().feed(b"Q\x00\x00\x00\x00"))
        self.assertRaises(sp.FramingError, list, sp.Deframer().feed(b"D\xff\xff\xff\xff"))

    def test_partial_frame_waits(self):
        deframer = sp.Deframer()
        self.assertEqual(list(deframer.feed(sp.frame(sp.DATA, b"abcdef")[:-2])), [])
        self.assertEqual(list(deframer.feed(b"ef")), [(sp.DATA, b"abcdef")])
