"""The D-Bus door's wire (error names, signals, the session dict) and its life without a bus."""

from __future__ import annotations

import os
import tempfile

from twisted.internet import defer, reactor
from twisted.logger import globalLogPublisher
from twisted.trial.unittest import TestCase

from nxgate.gateway.doors.dbus import wire
from nxgate.gateway.doors.dbus.door import DBusDoor
from nxgate.vocabulary.errors import Kind
from nxgate.vocabulary.results import SessionEvent, SessionView, State


def view(state: State = State.RUNNING, **changes) -> SessionView:
    fields = dict(id="A" * 32, full_id="host-1001-" + "A" * 32, user="alice", type="unix-console", name="work",
                  display=1001, state=state, geometry="800x600", depth=24, render=True, fullscreen=False,
                  rootless=False, encrypted=True, client_address="192.0.2.7", created=1.5, changed=2.5,
                  attached_before=True, agent_pid=42, failure="")
    fields.update(changes)
    return SessionView(**fields)


class WireTests(TestCase):
    def test_not_yours_says_so_in_words_too(self):
        """The NX door shows someone else's session as not found; on D-Bus the
        name says NotYours, and its words agree (issue 25)."""
        from nxgate.vocabulary.errors import SessionError

        theirs = SessionError(Kind.NOT_YOURS, "Could not find session AB.", session_id="AB")
        self.assertEqual(wire.error_message(theirs), "Session AB belongs to another user.")
        gone = SessionError(Kind.NOT_FOUND, "Could not find session AB.", session_id="AB")
        self.assertEqual(wire.error_message(gone), "Could not find session AB.")

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
            if event.get("log_namespace") == "nxgate.gateway.doors.dbus.door":
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
        from nxgate.gateway.doors.dbus.cli import parse

        options = parse(["start", "unix-xfce"])
        self.assertEqual((options.command, options.type, options.name), ("start", "unix-xfce", ""))
        self.assertEqual(parse(["--json", "start", "unix-xfce", "Work"]).name, "Work")


    def test_words_for_what_went_wrong(self):
        """A missing bus, a gateway not on the bus and a refusing policy in
        words (issue 25); the gateway's own refusals keep its words."""
        from nxgate.gateway.doors.dbus.cli import NoBus, explain

        class Refusal(Exception):
            def __init__(self, name: str, message: str) -> None:
                super().__init__(message)
                self.errName, self.message = name, message

        environ = {"DBUS_SYSTEM_BUS_ADDRESS": "unix:path=/x/bus"}
        name, text = explain(NoBus("Failed to connect to any bus address. Last error: 2: No such file or directory."),
                             "system", environ)
        self.assertEqual(name, "org.freedesktop.DBus.Error.NoServer")
        self.assertTrue(text.startswith("cannot reach the system bus at unix:path=/x/bus (there is no bus socket there)"))
        self.assertEqual(explain(NoBus("No valid bus addresses found."), "bogus", {})[1],
                         "'bogus' is not a D-Bus address (such as unix:path=/run/dbus/system_bus_socket).")
        name, text = explain(Refusal("org.freedesktop.DBus.Error.ServiceUnknown", "The name is not activatable"),
                             "system", {})
        self.assertIn("the gateway is not on the system bus at unix:path=/var/run/dbus/system_bus_socket", text)
        self.assertIn("policy must include org.nxgate.Gateway1.conf",
                      explain(Refusal("org.freedesktop.DBus.Error.AccessDenied", "Rejected"), "unix:path=/b", {})[1])
        self.assertEqual(explain(Refusal("org.nxgate.Error.NotFound", "Could not find session X."), "system", {}),
                         ("org.nxgate.Error.NotFound", "Could not find session X."))

    def test_the_bus_is_the_option_then_the_sessions_variable_then_the_system_bus(self):
        from nxgate.gateway.doors.dbus.cli import bus_address

        self.assertEqual(bus_address("unix:path=/a", {"NXGATE_DBUS_ADDRESS": "unix:path=/b"}), "unix:path=/a")
        self.assertEqual(bus_address(None, {"NXGATE_DBUS_ADDRESS": "unix:path=/b"}), "unix:path=/b")
        self.assertEqual(bus_address(None, {}), "system")

    def test_an_empty_list_says_so(self):
        from nxgate.gateway.doors.dbus.cli import render

        self.assertEqual(render("list", [], False), "No sessions.")
        self.assertEqual(render("list", [], True), "[]")


class SessionBusEnvironmentTests(TestCase):
    """What a session learns of the gateway's bus (nxgate.node.environment)."""

    def test_only_a_bus_other_than_the_system_bus_is_named(self):
        from nxgate.config import DBusSection
        from nxgate.node.environment import BUS_VARIABLE, bus_environment

        self.assertEqual(BUS_VARIABLE, wire.BUS_VARIABLE)  # the node's name for what nxgate-session reads
        private = "unix:path=/tmp/bus/socket"
        self.assertEqual(bus_environment(DBusSection(address=private), {}), {BUS_VARIABLE: private})
        self.assertEqual(bus_environment(DBusSection(), {"DBUS_SYSTEM_BUS_ADDRESS": private}), {BUS_VARIABLE: private})
        self.assertEqual(bus_environment(DBusSection(), {}), {})
        self.assertEqual(bus_environment(DBusSection(address="unix:path=/run/dbus/system_bus_socket"), {}), {})
        self.assertEqual(bus_environment(DBusSection(enabled=False, address=private), {}), {})


class DoorChecksTests(TestCase):
    """Issue 22: arguments' lengths first, then the account check, on every call."""

    def make(self, refused=()):
        from nxgate.gateway.auth.pam import AuthResult, Verdict
        from nxgate.vocabulary.caller import Caller

        self.resolved, self.checked, self.done = [], [], []

        async def resolve(uid):
            self.resolved.append(uid)
            return Caller(user="root" if uid == 0 else f"user{uid}", uid=uid, gid=uid, groups=frozenset(),
                          address=f"D-Bus (uid {uid})", door="dbus", admin=uid == 0)

        async def account(user, host):
            self.checked.append(user)
            if user in refused:
                return AuthResult(Verdict.DENIED, user, "the account is locked")
            return AuthResult(Verdict.GRANTED, user, "")

        door = DBusDoor(reactor, sessions=None, resolve=resolve, account=account)
        door.connection = type("Bus", (), {"getConnectionUnixUser": staticmethod(lambda sender: defer.succeed(int(sender[1:])))})()
        return door

    async def work(self, caller):
        self.done.append(caller.user)
        return "ok"

    async def test_a_refused_account_gets_not_allowed_and_nothing_runs(self):
        from nxgate.gateway.doors.dbus.door import BusError

        door = self.make(refused=("user1001",))
        with self.assertRaises(BusError) as caught:
            await door.call(":1001", self.work, ("unix-console", "x"), starts_session=True)
        self.assertEqual(caught.exception.dbusErrorName, "org.nxgate.Error.NotAllowed")
        self.assertEqual((self.checked, self.done), (["user1001"], []))
        self.assertEqual(await door.call(":1002", self.work, ()), "ok")
        # Every call is checked, not only the first of a connection.
        self.assertEqual(await door.call(":1002", self.work, ()), "ok")
        self.assertEqual(self.checked, ["user1001", "user1002", "user1002"])

    async def test_root_administers_unchecked_but_starts_nothing(self):
        from nxgate.gateway.doors.dbus.door import BusError

        door = self.make(refused=("root",))
        self.assertEqual(await door.call(":0", self.work, ("A" * 32,)), "ok")
        with self.assertRaises(BusError):
            await door.call(":0", self.work, ("unix-console", ""), starts_session=True)
        self.assertEqual(self.checked, ["root"])

    async def test_an_overlong_argument_is_refused_before_anything(self):
        from nxgate.gateway.doors.dbus.door import MAX_ARGUMENT, BusError

        door = self.make()
        with self.assertRaises(BusError) as caught:
            await door.call(":1001", self.work, ("unix-console", "é" * (MAX_ARGUMENT + 1)), starts_session=True)
        self.assertEqual(caught.exception.dbusErrorName, "org.nxgate.Error.InvalidRequest")
        self.assertEqual((self.resolved, self.checked, self.done), ([], [], []))


class BoundedConnectionTests(TestCase):
    """The door's bus connection reads a big message's header only."""

    def connection(self):
        from twisted.internet.testing import StringTransport

        from nxgate.gateway.doors.dbus.connection import BoundedConnection

        received = []
        bus = BoundedConnection()
        bus._authenticated = True  # past the line-based authentication
        bus._inbox, bus._skipping = bytearray(), 0
        bus.rawDBusMessageReceived = received.append
        bus.makeConnection = None
        bus.transport = StringTransport()
        return bus, received

    @staticmethod
    def call(name_length, serial=7):
        from txdbus import message

        call = message.MethodCallMessage("/org/nxgate/Gateway1", "StartSession", "org.nxgate.Gateway1",
                                         "org.nxgate.Gateway1", signature="ss", body=["unix-console", "é" * name_length])
        call.sender, call.serial = ":1.42", serial  # as the bus daemon delivers it
        call._marshal(newSerial=False)
        return call.rawMessage

    def test_small_messages_pass_in_any_chunks(self):
        bus, received = self.connection()
        raw = self.call(10, 1) + self.call(20, 2)
        for start in range(0, len(raw), 7):
            bus.dataReceived(raw[start:start + 7])
        self.assertEqual(received, [self.call(10, 1), self.call(20, 2)])

    def test_a_big_message_is_answered_from_its_header_and_its_body_dropped(self):
        from txdbus import message

        bus, received = self.connection()
        big = self.call(100_000, serial=9)
        after = self.call(5, serial=10)
        stream = big + after
        for start in range(0, len(stream), 65536):
            bus.dataReceived(stream[start:start + 65536])
        self.assertEqual(received, [after])
        answer = message.parseMessage(bus.transport.value(), [])
        self.assertEqual((answer.error_name, answer.reply_serial, answer.destination),
                         ("org.nxgate.Error.InvalidRequest", 9, ":1.42"))
        self.assertLessEqual(len(bus._inbox), 0)
