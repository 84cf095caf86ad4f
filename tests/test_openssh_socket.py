"""The shell socket learns who connected without blocking the reactor: the
peer's account is looked up through the user directory (a thread), and the
frames nxgate-shell sends meanwhile wait, in order."""

from __future__ import annotations

import pwd
import struct
from types import SimpleNamespace

from twisted.internet import defer
from twisted.trial.unittest import SynchronousTestCase

from nxgate.gateway.doors.openssh import framing
from nxgate.gateway.doors.openssh.socket import OpenSSHDoorProtocol
from nxgate.gateway.auth.pam import AuthResult, Verdict
from nxgate.users import UserDirectory

UID = 4321  # not root's: root is refused before any look-up


def account(name):
    """A ``blocking`` whose look-up answers at once with the account ``name``."""
    def blocking(function, *args):
        return defer.succeed(SimpleNamespace(pw_name=name, pw_uid=args[0]))
    return blocking


class PeerSocket:
    def __init__(self, uid):
        self.uid = uid

    def getsockopt(self, level, option, size):
        return struct.pack("3i", 4242, self.uid, self.uid)


class Transport:
    def __init__(self, uid):
        self.socket = PeerSocket(uid)
        self.data = b""
        self.closed = False

    def write(self, data):
        self.data += data

    def loseConnection(self):
        self.closed = True


class Conversation:
    def __init__(self, preauthenticated, address):
        self.preauthenticated = preauthenticated
        self.address = address
        self.received = []

    def start(self):
        self.received.append("start")

    def data_received(self, data):
        self.received.append(data)

    def eof_received(self):
        self.received.append("eof")

    def connection_lost(self):
        pass


class Authenticator:
    """The account check: grants everyone but ``refused``."""

    def __init__(self, refused=()):
        self.refused = refused
        self.checked = []

    def account(self, username, remote_host):
        self.checked.append(username)
        if username in self.refused:
            return defer.succeed(AuthResult(Verdict.DENIED, username, "the account is locked"))
        return defer.succeed(AuthResult(Verdict.GRANTED, username, ""))


class Gateway:
    def __init__(self, blocking, nx_user="nx", user_logins=True, refused=()):
        self.config = SimpleNamespace(ssh=SimpleNamespace(nx_user=nx_user, user_logins=user_logins))
        self.users = UserDirectory(blocking)
        self.authenticator = Authenticator(refused)
        self.conversations = []

    def conversation(self, transport, address, preauthenticated, relay_factory, door, logged_in=None, claim=None):
        conversation = Conversation(preauthenticated, address)
        self.conversations.append(conversation)
        return conversation


class ShellSocketTests(SynchronousTestCase):
    def connect(self, blocking, uid=None, **gateway):
        self.gateway = Gateway(blocking, **gateway)
        self.transport = Transport(UID if uid is None else uid)
        protocol = OpenSSHDoorProtocol(self.gateway)
        protocol.makeConnection(self.transport)
        return protocol

    def test_frames_wait_for_the_lookup_and_keep_their_order(self):
        lookups = []

        def late(function, *args):
            lookups.append((function, args))
            return pending

        pending: defer.Deferred = defer.Deferred()
        protocol = self.connect(late)
        self.assertEqual(lookups, [(pwd.getpwuid, (UID,))])
        protocol.dataReceived(framing.frame(framing.HELLO, framing.hello_payload("192.0.2.9"))
                              + framing.frame(framing.DATA, b"hello NXCLIENT\n")[:3])
        protocol.dataReceived(framing.frame(framing.DATA, b"hello NXCLIENT\n")[3:]
                              + framing.frame(framing.DATA, b"login\n") + framing.frame(framing.EOF))
        self.assertEqual(self.gateway.conversations, [])  # nothing runs before the account is known
        pending.callback(SimpleNamespace(pw_name="alice", pw_uid=UID))
        (conversation,) = self.gateway.conversations
        self.assertEqual(conversation.preauthenticated, "alice")
        self.assertEqual(conversation.received, ["start", b"hello NXCLIENT\n", b"login\n", "eof"])
        protocol.dataReceived(framing.frame(framing.DATA, b"bye\n"))
        self.assertEqual(conversation.received[-1], b"bye\n")
        self.assertFalse(self.transport.closed)

    def test_the_nx_account_gets_the_nx_login(self):
        protocol = self.connect(account("nx"))
        protocol.dataReceived(framing.frame(framing.HELLO, framing.hello_payload("192.0.2.9")))
        (conversation,) = self.gateway.conversations
        self.assertEqual((conversation.preauthenticated, conversation.address), (None, "192.0.2.9"))

    def test_an_unknown_uid_is_refused(self):
        def unknown(function, *args):
            return defer.fail(KeyError(args[0]))

        protocol = self.connect(unknown, uid=54321)
        protocol.dataReceived(framing.frame(framing.HELLO, framing.hello_payload(None)))
        self.assertTrue(self.transport.closed)
        self.assertEqual(self.gateway.conversations, [])

    def test_root_is_refused_without_a_lookup(self):
        calls = []
        self.connect(lambda *call: calls.append(call), uid=0)
        self.assertTrue(self.transport.closed)
        self.assertEqual(calls, [])

    def test_user_logins_off_refuses_other_users(self):
        self.connect(account("alice"), user_logins=False)
        self.assertTrue(self.transport.closed)
        self.assertFalse(self.connect(account("nx"), user_logins=False).done)

    def test_a_flood_before_the_lookup_is_dropped(self):
        protocol = self.connect(lambda function, *args: defer.Deferred())
        chunk = framing.frame(framing.DATA, b"x" * (framing.MAX_FRAME // 2))
        for _ in range(3):
            protocol.dataReceived(chunk)
        self.assertTrue(self.transport.closed)
        self.assertEqual(self.gateway.conversations, [])

    def test_a_user_whose_account_may_not_log_in_gets_no_conversation(self):
        """Issue 22: the kernel's word on who connected is no account check."""
        protocol = self.connect(account("mallory"), refused=("mallory",))
        protocol.dataReceived(framing.frame(framing.HELLO, framing.hello_payload(None)))
        self.assertEqual(self.gateway.authenticator.checked, ["mallory"])
        self.assertEqual(self.gateway.conversations, [])
        self.assertTrue(self.transport.closed)
        self.assertIn(b"NX> 500 ERROR: this account may not log in", self.transport.data)
        self.connect(account("alice"), refused=("mallory",)).dataReceived(
            framing.frame(framing.HELLO, framing.hello_payload(None)))
        self.assertEqual(self.gateway.conversations[0].preauthenticated, "alice")
        self.assertEqual(self.gateway.authenticator.checked, ["alice"])
