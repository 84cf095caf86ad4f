"""The caller a login becomes: looked up once, in a thread, before any
command runs; commands typed ahead wait for it in their order."""

from __future__ import annotations

import grp
import os
import pwd

from twisted.internet import defer
from twisted.logger import globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase

from nxgate.gateway.doors.conversation import Conversation
from nxgate.protocols.nx.server_dialogue import Reply, DialogueSettings
from nxgate.users import UserDirectory, group_names, resolve_caller
from tests.harness.clock import FakeReactor

ME = pwd.getpwuid(os.getuid())


class ResolveTests(SynchronousTestCase):
    def test_uid_gid_and_group_names(self):
        caller = resolve_caller(ME.pw_name, "192.0.2.1", "198.51.100.7", "nx-conch")
        self.assertEqual((caller.user, caller.uid, caller.gid), (ME.pw_name, ME.pw_uid, ME.pw_gid))
        self.assertEqual((caller.address, caller.local_address, caller.door), ("192.0.2.1", "198.51.100.7", "nx-conch"))
        self.assertIn(grp.getgrgid(ME.pw_gid).gr_name, caller.groups)
        self.assertFalse(caller.admin)

    def test_supplementary_groups_come_from_the_group_list(self):
        expected = {grp.getgrgid(gid).gr_name for gid in os.getgrouplist(ME.pw_name, ME.pw_gid)}
        self.assertEqual(group_names(ME.pw_name, ME.pw_gid), expected)

    def test_an_unknown_account(self):
        self.assertRaises(KeyError, resolve_caller, "no-such-user-nxgate", "x")


class Transport:
    def __init__(self):
        self.data = b""
        self.closed = False

    def write(self, data):
        self.data += data

    def close(self):
        self.closed = True


class Commands:
    def __init__(self):
        self.calls = []

    async def execute(self, caller, command, params, progress):
        self.calls.append((caller.user, caller.uid, command))
        return Reply((f"NX> 999 did {command}",))


class ConversationCallerTests(SynchronousTestCase):
    def test_commands_wait_for_the_lookup_and_keep_their_order(self):
        lookups = []

        def blocking(function, *args):
            lookups.append((function, args))
            return pending

        pending: defer.Deferred = defer.Deferred()
        commands = Commands()
        transport = Transport()
        conversation = Conversation(FakeReactor(), DialogueSettings("gw"), transport, "192.0.2.1", None,
                                    commands, preauthenticated_user=ME.pw_name, door="nx-openssh",
                                    blocking=blocking)
        conversation.start()
        conversation.data_received(b'hello NXCLIENT - Version 3.2.0\nlogin\nlistsession --status="running"\n'
                                   b'suspend --sessionid="x"\n')
        self.assertEqual(len(lookups), 1)  # once per login, off the reactor thread
        self.assertEqual(lookups[0][1], (ME.pw_name, "192.0.2.1", "127.0.0.1", "nx-openssh"))
        self.assertEqual(commands.calls, [])  # nothing runs before the caller is known
        pending.callback(resolve_caller(*lookups[0][1]))
        self.assertEqual(commands.calls, [(ME.pw_name, ME.pw_uid, "listsession"), (ME.pw_name, ME.pw_uid, "suspend")])
        self.assertEqual(len(lookups), 1)
        self.assertLess(transport.data.index(b"did listsession"), transport.data.index(b"did suspend"))

    def test_a_failed_lookup_is_an_internal_error(self):
        commands = Commands()
        transport = Transport()
        conversation = Conversation(FakeReactor(), DialogueSettings("gw"), transport, "192.0.2.1", None,
                                    commands, preauthenticated_user="no-such-user-nxgate")
        conversation.start()
        conversation.data_received(b'hello NXCLIENT - Version 3.2.0\nlogin\nlistsession --status="running"\n')
        self.assertEqual(commands.calls, [])
        self.assertIn(b"NX> 500 ERROR: Internal error.", transport.data)
        self.flushLoggedErrors(KeyError)

    def test_a_user_database_that_cannot_tell_is_a_temporary_failure_and_the_next_command_looks_again(self):
        """The gateway out of files when it looks the account up after the
        login: the client hears the same "try again" as a login that could
        not be checked, no internal error, and the next command asks NSS again."""
        from nxgate.users import AccountsUnavailable

        answers = [AccountsUnavailable(24, "the user database could not be read: the gateway is out of open files")
                   for _ in range(2)]  # at the login, and again for the first command

        def blocking(function, *args):
            if answers:
                return defer.fail(answers.pop())
            return defer.maybeDeferred(function, *args)

        commands = Commands()
        transport = Transport()
        conversation = Conversation(FakeReactor(), DialogueSettings("gw"), transport, "192.0.2.1", None,
                                    commands, preauthenticated_user=ME.pw_name, blocking=blocking)
        conversation.start()
        conversation.data_received(b'hello NXCLIENT - Version 3.2.0\nlogin\nlistsession --status="running"\n')
        self.assertEqual(commands.calls, [])
        self.assertIn(b"NX> 503 ERROR: The server cannot check logins right now (it is out of open files); please"
                      b" try again in a minute.", transport.data)
        self.assertNotIn(b"Internal error", transport.data)
        conversation.data_received(b'listsession --status="running"\n')
        self.assertEqual(commands.calls, [(ME.pw_name, ME.pw_uid, "listsession")])
        self.assertEqual(self.flushLoggedErrors(), [])

    def test_a_right_password_past_the_users_connection_cap_is_refused_with_the_reason(self):
        from nxgate.gateway.auth.pam import AuthResult, Verdict

        class Granting:
            def password(self, user, password, address):
                return defer.succeed(AuthResult(Verdict.GRANTED, user, ""))

        claimed = []

        def claim(user):
            claimed.append(user)
            return None if len(claimed) > 1 else "user alice has 2 connections to this server open already"

        transport = Transport()
        conversation = Conversation(FakeReactor(), DialogueSettings("gw"), transport, "192.0.2.1", Granting(),
                                    Commands(), claim=claim, blocking=lambda function, *args: defer.Deferred())
        conversation.start()
        conversation.data_received(b"hello NXCLIENT - Version 3.2.0\nlogin\nalice\nsecret\n")
        self.assertIn(b"NX> 503 ERROR: User alice has 2 connections to this server open already.", transport.data)
        self.assertNotIn(b"NX> 103", transport.data)
        conversation.data_received(b"login\nalice\nsecret\n")
        self.assertIn(b"NX> 103 Welcome to: gw user: alice", transport.data)
        self.assertEqual(claimed, ["alice", "alice"])


class Counting:
    """A ``blocking`` that runs the work at once and counts the calls."""

    def __init__(self):
        self.calls = []

    def __call__(self, function, *args):
        self.calls.append((function.__name__, args))
        return defer.maybeDeferred(function, *args)


class DirectoryTests(SynchronousTestCase):
    def setUp(self):
        self.clock = FakeReactor(1000.0)
        self.blocking = Counting()
        self.users = UserDirectory(self.blocking, ttl=60, now=self.clock)

    def test_lookups_run_through_blocking_and_are_cached_for_the_ttl(self):
        self.assertEqual(self.successResultOf(self.users.lookup(ME.pw_name)).pw_uid, ME.pw_uid)
        self.assertEqual(self.successResultOf(self.users.by_uid(ME.pw_uid)).pw_name, ME.pw_name)
        self.clock.advance(59)
        self.successResultOf(self.users.lookup(ME.pw_name))
        self.successResultOf(self.users.by_uid(ME.pw_uid))
        self.assertEqual(self.blocking.calls, [("account", (ME.pw_name,)), ("getpwuid", (ME.pw_uid,))])
        self.clock.advance(2)  # past the 60 seconds: asked again
        self.successResultOf(self.users.lookup(ME.pw_name))
        self.assertEqual(len(self.blocking.calls), 3)
        self.users.forget()
        self.successResultOf(self.users.by_uid(ME.pw_uid))
        self.assertEqual(len(self.blocking.calls), 4)

    def test_a_failed_lookup_is_logged_and_not_cached(self):
        events = []
        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        self.failureResultOf(self.users.lookup("no-such-user-nxgate"), KeyError)
        self.failureResultOf(self.users.lookup("no-such-user-nxgate"), KeyError)
        self.assertEqual(len(self.blocking.calls), 2)
        self.assertTrue([e for e in events if e.get("log_namespace") == "nxgate.users"
                         and e.get("value") == "no-such-user-nxgate"])

    def test_an_unexpected_failure_is_logged_with_its_traceback(self):
        def broken(function, *args):
            return defer.fail(OSError("nss is down"))

        users = UserDirectory(broken, now=self.clock)
        self.failureResultOf(users.by_uid(12345), OSError)
        self.assertEqual(len(self.flushLoggedErrors(OSError)), 1)

    def test_an_answer_that_comes_late(self):
        pending = defer.Deferred()
        users = UserDirectory(lambda function, *args: pending, now=self.clock)
        d = users.lookup(ME.pw_name)
        self.assertNoResult(d)
        pending.callback(ME)
        self.assertIs(self.successResultOf(d), ME)
        self.assertIs(self.successResultOf(users.lookup(ME.pw_name)), ME)  # cached: the stale Deferred is not reused
