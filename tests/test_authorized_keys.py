"""authorized_keys parsing: options that restrict are honoured or refuse the key."""

import os
import pwd
import shutil
import tempfile
import time

from twisted.conch.ssh import keys
from twisted.logger import formatEvent, globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase

from nxgate.gateway.doors.conch import authorized_keys as ak
from nxgate.gateway.doors.conch import checkers
from nxgate.gateway.doors.conch.checkers import NOMACHINE_PUBLIC_KEY

ED = keys.Key.fromString(
    b"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl test"
)
ED_LINE = ED.toString("openssh").decode()


class ParseTests(SynchronousTestCase):
    def test_plain_and_comments(self):
        parsed, problems = ak.parse(["# comment", "", ED_LINE + " comment here", NOMACHINE_PUBLIC_KEY])
        self.assertEqual(problems, [])
        self.assertEqual([k.key.sshType() for k in parsed], [b"ssh-ed25519", b"ssh-dss"])
        self.assertEqual(parsed[0].line, 3)

    def test_options(self):
        line = 'from="10.0.0.0/8,!10.1.2.3",no-pty,command="echo \\"hi\\"" ' + ED_LINE
        (key,), problems = ak.parse([line])
        self.assertEqual(problems, [])
        self.assertEqual(dict(key.options), {"from": "10.0.0.0/8,!10.1.2.3", "no-pty": None, "command": 'echo "hi"'})

    def test_bad_lines_are_reported_not_fatal(self):
        parsed, problems = ak.parse(["ssh-ed25519 notbase64", "junk", 'from="x ' + ED_LINE, ED_LINE])
        self.assertEqual(len(parsed), 1)
        self.assertEqual(len(problems), 3)

    def test_harmless_options_allow(self):
        (key,), _ = ak.parse(["restrict,no-port-forwarding,no-agent-forwarding " + ED_LINE])
        self.assertIsNone(key.refusal("192.0.2.1"))

    def test_command_refuses(self):
        (key,), _ = ak.parse(['command="rsync --server" ' + ED_LINE])
        self.assertIn("command", key.refusal("192.0.2.1"))

    def test_from(self):
        (key,), _ = ak.parse(['from="192.0.2.*,10.0.0.0/8,!10.9.9.9" ' + ED_LINE])
        self.assertIsNone(key.refusal("192.0.2.7"))
        self.assertIsNone(key.refusal("10.1.1.1"))
        self.assertIsNotNone(key.refusal("10.9.9.9"))
        self.assertIsNotNone(key.refusal("198.51.100.1"))
        self.assertIsNotNone(key.refusal(None))

    def test_expiry(self):
        (key,), _ = ak.parse(['expiry-time="20200101" ' + ED_LINE])
        self.assertIsNotNone(key.refusal("192.0.2.1"))
        self.assertIsNone(key.refusal("192.0.2.1", now=time.mktime((2019, 1, 1, 0, 0, 0, 0, 0, -1))))

    def test_address_matches_ipv6(self):
        self.assertTrue(ak.address_matches("::1", "::1"))
        self.assertTrue(ak.address_matches("2001:db8::5", "2001:db8::/32"))
        self.assertFalse(ak.address_matches("2001:db9::5", "2001:db8::/32"))


class ReadUserKeysTests(SynchronousTestCase):
    """A user's own authorized_keys that is not taken says why in the log;
    only a missing file is silent."""

    def setUp(self):
        self.checkers = checkers
        self.home = tempfile.mkdtemp(prefix="nxgate-keys-")
        self.addCleanup(shutil.rmtree, self.home)
        os.chmod(self.home, 0o755)
        os.mkdir(os.path.join(self.home, ".ssh"), 0o700)
        entry = pwd.getpwuid(os.getuid())
        fake = pwd.struct_passwd((entry.pw_name, "x", entry.pw_uid, entry.pw_gid, "", self.home, "/bin/sh"))
        self.patch(checkers.pwd, "getpwnam", lambda name: fake)
        self.events = []
        globalLogPublisher.addObserver(self.events.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.events.append)

    def warnings(self):
        return [formatEvent(e) for e in self.events if e.get("log_level").name == "warn"]

    def test_a_missing_file_is_silent(self):
        self.assertEqual(self.checkers.read_user_keys("someone"), [])
        self.assertEqual(self.warnings(), [])

    def test_a_link_is_refused_and_logged(self):
        target = os.path.join(self.home, "keys")
        with open(target, "w") as handle:
            handle.write(NOMACHINE_PUBLIC_KEY + "\n")
        os.symlink(target, os.path.join(self.home, ".ssh", "authorized_keys"))
        self.assertEqual(self.checkers.read_user_keys("someone"), [])
        (warning,) = self.warnings()
        self.assertIn("authorized_keys", warning)

    def test_a_fifo_is_refused_and_logged(self):
        os.mkfifo(os.path.join(self.home, ".ssh", "authorized_keys2"))
        self.assertEqual(self.checkers.read_user_keys("someone"), [])
        (warning,) = self.warnings()
        self.assertIn("not a regular file", warning)
