"""Framing between nxgate-shell and the gateway."""

from twisted.trial.unittest import SynchronousTestCase

from nxgate.gateway.doors.openssh import framing as sp


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


class HelloTests(SynchronousTestCase):
    def test_address_is_kept_only_when_it_is_an_ip_address(self):
        self.assertEqual(sp.parse_hello(b'{"remote": "192.0.2.1"}'), sp.Hello("192.0.2.1"))
        self.assertEqual(sp.parse_hello(b'{"remote": "2001:DB8::1"}'), sp.Hello("2001:db8::1"))
        self.assertEqual(sp.parse_hello(b'{"remote": "fe80::1%eth0"}'), sp.Hello("fe80::1%eth0"))
        self.assertEqual(sp.parse_hello(b"{}"), sp.Hello(None))
        self.assertEqual(sp.parse_hello(b'{"remote": null, "future": 1}'), sp.Hello(None))

    def test_malformed_hellos_are_refused(self):
        for payload in (b"[]", b'["remote"]', b"42", b'"x"', b"not json", b"\xff{}", b'{"remote": 7}',
                        b'{"remote": ["192.0.2.1"]}', b'{"remote": "unknown"}',
                        b'{"remote": "203.0.113.9\\nnxgate#info forged"}', b'{"remote": "fe80::1%\\nforged"}',
                        b'{"remote": "' + b"1" * 5000 + b'"}'):
            with self.subTest(payload=payload[:60]):
                error = self.assertRaises(sp.HelloError, sp.parse_hello, payload)
                self.assertNotIn("forged", str(error))

    def test_shell_sends_only_an_address(self):
        self.assertEqual(sp.parse_hello(sp.hello_payload("198.51.100.4")), sp.Hello("198.51.100.4"))
        for remote in (None, "", "unknown", "1.2.3.4\nx"):
            self.assertEqual(sp.parse_hello(sp.hello_payload(remote)), sp.Hello(None))
