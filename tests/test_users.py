"""The caller a login becomes: looked up once, in a thread, before any
command runs; commands typed ahead wait for it in their order."""

from __future__ import annotations

import grp
import os
import pwd

from twisted.internet import defer
from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase

from nxgate.conversation import Conversation
from nxgate.nx.shell import Reply, ShellSettings
from nxgate.users import group_names, resolve_caller

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
        conversation = Conversation(MemoryReactorClock(), ShellSettings("gw"), transport, "192.0.2.1", None,
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
        conversation = Conversation(MemoryReactorClock(), ShellSettings("gw"), transport, "192.0.2.1", None,
                                    commands, preauthenticated_user="no-such-user-nxgate")
        conversation.start()
        conversation.data_received(b'hello NXCLIENT - Version 3.2.0\nlogin\nlistsession --status="running"\n')
        self.assertEqual(commands.calls, [])
        self.assertIn(b"NX> 500 ERROR: Internal error.", transport.data)
        self.flushLoggedErrors(KeyError)
