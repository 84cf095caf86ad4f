"""The injected ways of running blocking work."""

import threading

from twisted.internet import reactor
from twisted.trial.unittest import SynchronousTestCase, TestCase

from nxgate import threads


class InlineTests(SynchronousTestCase):
    def test_runs_now_and_returns_a_fired_deferred(self):
        self.assertEqual(self.successResultOf(threads.inline(lambda a, b=0: a + b, 2, b=3)), 5)

    def test_an_exception_becomes_a_failed_deferred(self):
        def broken():
            raise OSError("disk gone")

        self.failureResultOf(threads.inline(broken), OSError)


class InThreadTests(TestCase):
    async def test_runs_off_the_reactor_thread(self):
        here = threading.get_ident()
        where = await threads.in_thread(reactor)(threading.get_ident)
        self.assertNotEqual(where, here)

    async def test_an_exception_reaches_the_caller(self):
        def broken(path):
            raise FileNotFoundError(path)

        with self.assertRaises(FileNotFoundError):
            await threads.in_thread(reactor)(broken, "/nowhere")
