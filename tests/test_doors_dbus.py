"""The D-Bus door's wire (error names, signals, the session dict) and its life without a bus."""

from __future__ import annotations

import os
import tempfile

from twisted.internet import reactor
from twisted.logger import globalLogPublisher
from twisted.trial.unittest import TestCase

from nxgate.doors.dbus import wire
from nxgate.doors.dbus.door import DBusDoor
from nxgate.sessions.errors import Kind
from nxgate.sessions.results import SessionEvent, SessionView, State


def view(state: State = State.RUNNING, **changes) -> SessionView:
    fields = dict(id="A" * 32, full_id="host-1001-" + "A" * 32, user="alice", type="unix-console", name="work",
                  display=1001, state=state, geometry="800x600", depth=24, render=True, fullscreen=False,
                  rootless=False, encrypted=True, client_address="192.0.2.7", created=1.5, changed=2.5,
                  attached_before=True, agent_pid=42, failure="")
    fields.update(changes)
    return SessionView(**fields)


class WireTests(TestCase):
    def test_every_kind_has_a_valid_distinct_error_name(self):
        names = {kind: wire.error_name(kind) for kind in Kind}
        self.assertEqual(names[Kind.NOT_YOURS], "org.nxgate.Error.NotYours")
        self.assertEqual(names[Kind.NOT_FOUND], "org.nxgate.Error.NotFound")
        self.assertEqual(names[Kind.LIMIT_REACHED], "org.nxgate.Error.LimitReached")
        self.assertEqual(len(set(names.values())), len(Kind))
        for name in names.values():
            self.assertRegex(name, r"^org\.nxgate\.Error\.[A-Z][A-Za-z]+$")

    def test_the_session_dict_has_only_bus_friendly_values_and_no_secret(self):
        described = wire.describe(view())
        self.assertEqual(described["state"], "running")
        self.assertEqual(described["display"], 1001)
        self.assertNotIn("cookie", described)
        for value in described.values():
            self.assertIsInstance(value, (str, int, float, bool))

    def test_signals_name_each_change(self):
        def names(event):
            return [(name, args) for name, args in wire.signals_for(event)]

        self.assertEqual(names(SessionEvent(view(State.CREATED), None)),
                         [("StateChanged", ["A" * 32, "", "created"]),
                          ("SessionCreated", ["A" * 32, "alice", "unix-console"])])
        self.assertEqual(names(SessionEvent(view(), State.WAITING, attached_before=False))[1],
                         ("SessionRunning", ["A" * 32, "192.0.2.7"]))
        self.assertEqual(names(SessionEvent(view(), State.WAITING, attached_before=True))[1],
                         ("SessionResumed", ["A" * 32, "192.0.2.7"]))
        self.assertEqual(names(SessionEvent(view(State.SUSPENDED), State.SUSPENDING))[1],
                         ("SessionSuspended", ["A" * 32]))
        self.assertEqual(names(SessionEvent(view(State.TERMINATED, failure="user request"), State.TERMINATING))[1],
                         ("SessionTerminated", ["A" * 32, "user request"]))
        self.assertEqual(names(SessionEvent(view(State.FAILED, failure="boom"), State.STARTING))[1],
                         ("SessionFailed", ["A" * 32, "boom"]))
        self.assertEqual(len(names(SessionEvent(view(State.SUSPENDING), State.RUNNING))), 1)
        for name, args in wire.signals_for(SessionEvent(view(State.CREATED), None)):
            self.assertEqual(len(args), len(wire.SIGNALS[name]))


class NoBusTests(TestCase):
    def test_without_a_bus_the_door_warns_once_and_stays_off(self):
        missing = os.path.join(tempfile.mkdtemp(), "no_bus_here")
        door = DBusDoor(reactor, sessions=None, resolve=None, address=f"unix:path={missing}")
        warnings = []

        def observe(event):
            if event.get("log_namespace") == "nxgate.dbus":
                warnings.append(event)

        globalLogPublisher.addObserver(observe)
        self.addCleanup(globalLogPublisher.removeObserver, observe)
        door.startService()
        self.addCleanup(door.stopService)

        def check(ready):
            self.assertFalse(ready)
            self.assertEqual(len(warnings), 1)
            self.assertEqual(warnings[0]["log_level"].name, "warn")
            self.assertIsNone(door.connection)
            door.session_changed(SessionEvent(view(), State.WAITING))  # observers still called: nothing happens

        return door.ready.addCallback(check)


class CommandLineTests(TestCase):
    def test_start_takes_a_type_and_an_optional_name(self):
        from nxgate.doors.dbus.cli import parse

        options = parse(["start", "unix-xfce"])
        self.assertEqual((options.command, options.type, options.name), ("start", "unix-xfce", ""))
        self.assertEqual(parse(["--json", "start", "unix-xfce", "Work"]).name, "Work")
