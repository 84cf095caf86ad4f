"""Admission limits and display allocation, each alone (no manager)."""

from __future__ import annotations

import os
import tempfile

from twisted.trial.unittest import TestCase

from nxgate.config import Config, SessionsSection
from nxgate.node import displays
from nxgate.node.displays import DisplayAllocator, NoFreeDisplay
from nxgate.vocabulary.model import Session, State
from nxgate.vocabulary.caller import Caller
from nxgate.vocabulary.errors import Kind, SessionError
from nxgate.limits import Limits


def session(user: str, state: State = State.RUNNING) -> Session:
    return Session(id=user + str(id(object())), user=user, uid=1000, gid=1000, type="unix-desktop", name="x",
                   display=1, server_name="n", cookie="c", created=0.0, changed=0.0, state=state)


class LimitsTests(TestCase):
    def setUp(self):
        self.config = Config(sessions=SessionsSection(max_sessions=3, max_sessions_per_user=1),
                             limits={"user.bob": 2, "group.staff": 0, "group.few": 1})
        self.limits = Limits(lambda: self.config)
        self.alice = Caller(user="alice", uid=1000, gid=1000)

    def refused(self, caller, sessions):
        error = self.assertRaises(SessionError, self.limits.check, caller, sessions)
        self.assertEqual(error.kind, Kind.LIMIT_REACHED)
        return error.message

    def test_per_user_then_per_group_then_total(self):
        self.limits.check(self.alice, [session("bob"), session("alice", State.TERMINATED)])
        self.assertEqual(self.refused(self.alice, [session("alice")]), "Server capacity: reached for user: alice")
        staff = Caller(user="alice", uid=1000, gid=1000, groups=frozenset({"staff", "few"}))
        self.limits.check(staff, [session("alice")])  # group 0 means no limit
        self.assertEqual(self.limits.user_limit("bob"), 2)
        self.assertIn("maximum number", self.refused(staff, [session("a"), session("b"), session("c")]))

    def test_draining_refuses_everyone_and_counts_as_capacity(self):
        self.limits.draining = True
        self.assertIn("maintenance", self.refused(self.alice, []))
        self.assertTrue(self.limits.at_capacity(self.alice, []))
        self.limits.draining = False
        self.assertFalse(self.limits.at_capacity(self.alice, []))

    def test_placement_is_the_local_node(self):
        self.assertEqual(self.limits.node_for(self.alice), self.config.server_name)


class DisplayAllocatorTests(TestCase):
    real_display_available = staticmethod(displays.display_available)
    real_abstract_x_displays = staticmethod(displays.abstract_x_displays)

    def setUp(self):
        claims = tempfile.mkdtemp()
        self.addCleanup(__import__("shutil").rmtree, claims)
        claim = displays.claim_display
        self.patch(displays, "claim_display", lambda n, directory=claims: claim(n, directory))
        for n in range(3300, 3304):
            self.addCleanup(displays.release_display, n)
        for n in range(3300, 3310):
            self.addCleanup(displays.release_display, n)
        self.patch(displays, "display_available", lambda n, abstract=(): n != 3301)
        self.patch(displays, "abstract_x_displays", lambda: {})
        self.held = []
        self.allocator = DisplayAllocator(lambda: (3300, 4), lambda: self.held)

    def test_skips_held_and_busy_displays_and_runs_out(self):
        self.held = [3300]
        self.assertEqual(self.allocator.allocate(), 3302)  # 3301: its X display is in use
        self.held.append(3302)
        self.assertEqual(self.allocator.allocate(), 3303)
        self.held.append(3303)
        # 3301 is somebody else's: it does not count against the 4 of the range.
        self.assertEqual(self.allocator.allocate(), 3304)
        self.held.append(3304)
        self.assertRaises(NoFreeDisplay, self.allocator.allocate)

    def test_the_same_displays_of_others_are_a_warning_once(self):
        from twisted.logger import capturedLogs

        levels = []
        for held in ([3300], [3300, 3302], [3300, 3302, 3303]):  # :3301 stays somebody else's
            self.held = held
            with capturedLogs() as events:
                self.allocator.allocate()
            levels += [event["log_level"].name for event in events if "passed over" in event["log_format"]]
        self.assertEqual(levels, ["warn", "debug", "debug"])

    def test_passing_over_others_displays_is_bounded(self):
        self.patch(displays, "MAX_FOREIGN", 5)
        tried = []
        self.patch(displays, "display_available", lambda n, abstract=(): tried.append(n) and False)
        self.assertRaises(NoFreeDisplay, self.allocator.allocate)
        self.assertEqual(tried, list(range(3300, 3305)))

    def test_abstract_x_sockets_are_seen(self):
        table = os.path.join(tempfile.mkdtemp(), "unix")
        self.addCleanup(__import__("shutil").rmtree, os.path.dirname(table))
        with open(table, "w") as handle:
            handle.write("Num       RefCount Protocol Flags    Type St Inode Path\n"
                         "0000000000000000: 00000002 00000000 00010000 0001 01 4711 @/tmp/.X11-unix/X3301\n"
                         "0000000000000000: 00000003 00000000 00000000 0001 03 4712 @/tmp/.X11-unix/X3301\n"
                         "0000000000000000: 00000002 00000000 00010000 0001 01 4713 /tmp/.X11-unix/X3302\n"
                         "0000000000000000: 00000002 00000000 00010000 0001 01 4714 @/tmp/.X11-unix/X33x\n"
                         "0000000000000000: 00000002 00000000 00010000 0001 01 4715\n")
        self.assertEqual(self.real_abstract_x_displays(table), {3301: {4711, 4712}})
        self.patch(displays, "display_available", self.real_display_available)
        self.assertFalse(displays.display_available(3301, {3301: {4711}}))
