"""Nothing on the reactor waits on a user database or scans /proc.

An NSS look-up (``pwd``, ``grp``, name resolution) may go to LDAP or a DNS
server and wait seconds; a scan of ``/proc`` (its process list, a
process's descriptors, ``/proc/net/*``, the mount table) grows with the
machine (163 ms for ``/proc/net/unix`` at 50,000 sockets).  Either on the
reactor's thread stalls every door and every session at once.  Such work
goes through the injected ``blocking`` (:mod:`nxgate.threads`).

:class:`ReactorGuard` makes each of them fail loudly when it is called on
the reactor's thread, and the tests drive the session service's paths with
a real reactor and its thread pool: a start, a start for later, a resume,
a shadow of one's own session (with its notice), the admin's status, a
listing and a terminate.  A new look-up or scan on one of those paths
fails them.  Reading one process's own files (``/proc/PID/stat``) is no
scan and stays allowed: it costs the same on any machine.
"""

from __future__ import annotations

import builtins
import grp
import io
import os
import pwd
import signal
import socket
import threading
import traceback
from typing import Any

from twisted.internet import defer, reactor, task
from twisted.trial.unittest import TestCase

from nxgate.config import Config, SessionsSection, ShadowSection
from nxgate.node import files, shadow_sessions
from nxgate.node.service import SessionService
from nxgate.threads import in_thread
from nxgate.vocabulary.caller import Caller
from nxgate.vocabulary.requests import DisplaySettings, RestoreRequest, ShadowRequest, StartRequest
from tests.harness.stores import inline_store
from tests.test_sessions_manager import READY, STARTED, SUSPENDED, FakeLauncher, FakeNotifier, short_state_dir

#: NSS: the account, group and host databases (files, LDAP, SSSD, DNS...).
NSS = ((pwd, ("getpwnam", "getpwuid", "getpwall")), (grp, ("getgrnam", "getgrgid", "getgrall")),
       (os, ("getgrouplist",)), (socket, ("getaddrinfo", "gethostbyname", "gethostbyname_ex", "gethostbyaddr",
                                          "getfqdn", "getnameinfo")))


def _scan(path: Any) -> bool:
    """Whether reading ``path`` is a /proc scan: a table that grows with
    the machine (/proc/net/*, mount tables), not one process's own file."""
    try:
        path = os.fsdecode(path)
    except TypeError:
        return False  # a descriptor
    return path.startswith("/proc/") and ("/net/" in path or path.endswith(("/mountinfo", "/mounts")))


def _listing(path: Any) -> bool:
    """Whether listing ``path`` is a /proc scan: the processes, or a process's descriptors."""
    try:
        path = os.fsdecode(path).rstrip("/")
    except TypeError:
        return False
    return path == "/proc" or (path.startswith("/proc/") and path.endswith("/fd"))


class ReactorGuard:
    """While installed (``test.patch``), an NSS look-up or a /proc scan on
    the reactor's thread is recorded with where it came from, and raises."""

    class OnReactor(Exception):
        """Blocking work on the reactor's thread."""

    def __init__(self, test: TestCase, reactor_thread: int) -> None:
        self.found: list[str] = []
        self.thread = reactor_thread
        for module, names in NSS:
            for name in names:
                if hasattr(module, name):
                    test.patch(module, name, self._guarded(f"{module.__name__}.{name}", getattr(module, name),
                                                           lambda *args, **kwargs: True))
        for module, name in ((builtins, "open"), (io, "open"), (os, "open")):
            test.patch(module, name, self._guarded("open of /proc", getattr(module, name),
                                                   lambda path, *args, **kwargs: _scan(path)))
        for name in ("listdir", "scandir"):
            test.patch(os, name, self._guarded(f"os.{name} of /proc", getattr(os, name),
                                               lambda path=".", *args, **kwargs: _listing(path)))

    def _guarded(self, what: str, real: Any, watched: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() == self.thread and watched(*args, **kwargs):
                ours = [frame for frame in traceback.extract_stack()[:-1] if "/nxgate/" in frame.filename]
                where = "".join(traceback.format_list(ours[-6:]))
                self.found.append(f"{what}{args[:1]!r} on the reactor:\n{where}")
                raise self.OnReactor(f"{what} on the reactor's thread")
            return real(*args, **kwargs)

        return call


class GuardTests(TestCase):
    """The guard sees what it must (else the service tests could not fail)."""

    def test_a_look_up_or_a_scan_on_the_reactor_is_caught_and_off_it_is_not(self):
        guard = ReactorGuard(self, threading.get_ident())
        for blocked in (lambda: pwd.getpwuid(0), lambda: grp.getgrgid(0), lambda: os.listdir("/proc"),
                        lambda: open("/proc/net/unix").close(), lambda: os.listdir("/proc/self/fd")):
            self.assertRaises(ReactorGuard.OnReactor, blocked)
        self.assertEqual(len(guard.found), 5)
        open("/proc/self/stat").close()  # one process's own file: no scan
        os.listdir("/tmp")
        self.assertEqual(len(guard.found), 5)
        done = []
        thread = threading.Thread(target=lambda: done.append((pwd.getpwuid(0), os.listdir("/proc"))))
        thread.start()
        thread.join()
        self.assertTrue(done)
        self.assertEqual(len(guard.found), 5)


class ServicePathsTests(TestCase):
    """The session service on the real reactor, its blocking work in the
    reactor's thread pool, its agents stand-ins whose log lines the test
    gives, with the guard installed."""

    timeout = 60

    def setUp(self):
        layout = files.StateLayout(short_state_dir(self))
        layout.prepare()
        sessions = SessionsSection(display_base=3900, display_limit=20, connect_timeout=30, agent_start_timeout=20)
        self.me = pwd.getpwuid(os.getuid())
        config = Config(sessions=sessions, types={"unix-console": ("true",)},
                        shadow=ShadowSection(console_display="", allow_own=True))
        self.store = inline_store(layout.database)
        self.addCleanup(self.store.close)
        self.launcher = FakeLauncher(self)
        self.notices: list[defer.Deferred] = []

        def run(request, timeout):  # the shadow notice: it stays up until the shadow ends
            self.notices.append(defer.Deferred())
            return self.notices[-1]

        self.launcher.run = run
        self.launcher.stop = lambda: None  # no spares here
        self.signals: list[int] = []
        self.service = SessionService(reactor, config, self.store.deferred, layout, notifier=FakeNotifier(),
                                      launcher=self.launcher, blocking=in_thread(reactor),
                                      send_signal=lambda process, signum: self.signals.append(signum) or True,
                                      listens=lambda pid, port: True)
        self.service.shadow = shadow_sessions.ShadowService(self.service, config, in_thread(reactor))
        self.addCleanup(self._end_all)
        self.caller = Caller(self.me.pw_name, self.me.pw_uid, self.me.pw_gid, frozenset(), "192.0.2.1")
        self.guard = ReactorGuard(self, threading.get_ident())

    async def _end_all(self):
        for notice in self.notices:
            if not notice.called:
                notice.callback(shadow_sessions.NOTICE_GONE)
        for session_id in list(self.service.sessions):
            self.service.displays.release(self.service.sessions[session_id].display)
            self.service.lifecycle._cancel_connect_timer(self.service.runtime[session_id])
        self.service.stopService()  # the stand-in agents are killed next: nobody watches them any more
        await self.service.writer.flush()

    async def until(self, predicate, what: str):
        for _ in range(500):
            if predicate():
                return
            await task.deferLater(reactor, 0.01, lambda: None)
        self.assertNothingOnTheReactor()  # what the guard stopped is why it never came
        self.fail(f"timed out waiting for {what}")

    async def started(self, work) -> tuple[str, Any]:
        """Run ``work`` (a start) to its end, saying READY for its new agent."""
        before = set(self.service.sessions)
        pending = defer.ensureDeferred(work)
        await self.until(lambda: set(self.service.sessions) - before and self.launcher.requests, "the agent")
        (session_id,) = set(self.service.sessions) - before
        await self.until(lambda: self.service.sessions[session_id].agent_pid, "the agent's pid")
        self.service._agent_line(session_id, READY)
        return session_id, await pending

    def assertNothingOnTheReactor(self):
        self.assertEqual(self.guard.found, [], "\n\n".join(self.guard.found))

    async def test_start_resume_status_list_terminate(self):
        request = StartRequest(type="unix-console", name="t", display=DisplaySettings(), encrypted=True,
                               rootless=False)
        session_id, ready = await self.started(self.service.start(self.caller, request))
        self.assertEqual(ready.view.id, session_id)
        self.service._agent_line(session_id, STARTED)
        self.service._agent_line(session_id, SUSPENDED)
        resumed = defer.ensureDeferred(self.service.restore(self.caller, RestoreRequest(
            session_id, DisplaySettings(), encrypted=True)))
        await self.until(lambda: signal.SIGHUP in self.signals, "the resume's SIGHUP")
        self.service._agent_line(session_id, "Session: Resuming session at 'now'.")
        self.service._agent_line(session_id, READY)
        await resumed
        admin = Caller("root", 0, 0, frozenset(), "192.0.2.1", admin=True)
        await self.service.status(admin)
        await self.service.list(self.caller)
        terminated = defer.ensureDeferred(self.service.terminate(self.caller, session_id))
        self.service._agent_line(session_id, "Session: Session terminated at 'now'.")
        await terminated
        self.assertNothingOnTheReactor()

    async def test_start_for_later(self):
        session_id, view = await self.started(self.service.start_for_later(self.caller, "unix-console", "later"))
        self.assertEqual(view.id, session_id)
        self.assertNothingOnTheReactor()

    async def test_a_shadow_of_ones_own_session_and_its_notice(self):
        request = StartRequest(type="unix-console", name="t", display=DisplaySettings(), encrypted=True,
                               rootless=False)
        session_id, _ = await self.started(self.service.start(self.caller, request))
        self.service._agent_line(session_id, STARTED)  # running and attached: a shadow target
        targets = await self.service.shadow_targets(self.caller)
        self.assertEqual([t.id for t in targets], [session_id])
        shadow_id, ready = await self.started(self.service.attach_shadow(
            self.caller, ShadowRequest(session_id, DisplaySettings(), view_only=True)))
        self.assertEqual(ready.view.type, "shadow")
        self.assertNothingOnTheReactor()
