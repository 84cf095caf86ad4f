"""A reload reads and checks the config file off the reactor, then applies
it on the reactor in one step; a bad file (or an unreadable key file)
changes nothing."""

from __future__ import annotations

import os
import tempfile

from twisted.internet import defer
from twisted.trial.unittest import SynchronousTestCase

from nxgate import config as configuration
from nxgate.gateway.root import Gateway, read_config
from nxgate.threads import inline


class Stub:
    """The parts of a Gateway that ``reload`` uses."""

    def __init__(self, blocking, source):
        self.blocking = blocking
        self.config = configuration.Config(source=source)
        self.applied = []

    def apply(self, new, nx_keys):
        self.applied.append((new, nx_keys))
        return {"ok": True, "source": new.source, "restart_needed_for": []}


class ReloadTests(SynchronousTestCase):
    def write(self, text):
        fd, path = tempfile.mkstemp(suffix=".conf")
        self.addCleanup(os.unlink, path)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        return path

    def test_the_file_is_read_through_blocking_and_applied_when_it_answers(self):
        path = self.write("[auth]\nfailed_login_delay = 1\n")
        calls = []

        def late(function, *args):
            calls.append((function, args))
            return pending

        pending: defer.Deferred = defer.Deferred()
        gateway = Stub(late, path)
        d = Gateway.reload(gateway)
        self.assertEqual(calls, [(read_config, (path,))])
        self.assertNoResult(d)
        self.assertEqual(gateway.applied, [])  # nothing changes until the file is read and checked
        pending.callback(read_config(path))
        self.assertTrue(self.successResultOf(d)["ok"])
        ((new, nx_keys),) = gateway.applied
        self.assertEqual(new.auth.failed_login_delay, 1)
        self.assertTrue(nx_keys)  # the NoMachine key, as no file is named

    def test_a_bad_file_is_refused_and_nothing_is_applied(self):
        gateway = Stub(inline, self.write("[auth]\nfailed_login_delay = soon\n"))
        answer = self.successResultOf(Gateway.reload(gateway))
        self.assertFalse(answer["ok"])
        self.assertIn("failed_login_delay", answer["problems"][0])
        self.assertEqual(gateway.applied, [])

    def test_an_unreadable_key_file_is_a_problem_not_a_half_applied_reload(self):
        path = self.write("[ssh]\nnx_authorized_keys = /nonexistent/nxgate-keys\n")
        self.assertRaises(configuration.ConfigError, read_config, path)
        gateway = Stub(inline, path)
        answer = self.successResultOf(Gateway.reload(gateway))
        self.assertEqual(answer["ok"], False)
        self.assertIn("[ssh] nx_authorized_keys: cannot read /nonexistent/nxgate-keys", answer["problems"][0])
        self.assertEqual(gateway.applied, [])

    def test_an_unexpected_failure_is_not_swallowed(self):
        gateway = Stub(lambda function, *args: defer.fail(RuntimeError("boom")), "/nowhere")
        self.failureResultOf(Gateway.reload(gateway), RuntimeError)
