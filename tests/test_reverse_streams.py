"""Reverse streams: the pure table and lines (nxgate.streams.reverse), and the node's listeners with the
gateway's route end to end in one process (nxgate.node.reverse, nxgate.streams.reverse_route), on real
sockets: the route announces, the connection is taken once, only the session's user gets in, a flood is
capped, what nobody takes expires, a newer route replaces an older one."""

from __future__ import annotations

import os
import socket
import stat
import tempfile

from twisted.internet import defer, protocol, reactor, task
from twisted.python.failure import Failure
from twisted.trial.unittest import TestCase

from nxgate.node import reverse as node_reverse
from nxgate.node.reverse import ReverseListeners
from nxgate.streams import reverse
from nxgate.streams.reverse import LineReader, RouteError, Waiting
from nxgate.streams.reverse_route import ReverseRoute
from nxgate.threads import inline
from nxgate.vocabulary.caller import Caller
from nxgate.vocabulary.errors import Kind, SessionError
from nxgate.vocabulary.model import Session, State

SID = "A" * 32
OTHER_SID = "B" * 32


class WaitingTests(TestCase):
    def test_a_connection_is_taken_once_and_only_for_its_session_and_service(self):
        waiting: Waiting[str] = Waiting()
        self.assertTrue(waiting.admit(SID))
        number = waiting.hold(SID, "sound", "conn")
        self.assertIsNone(waiting.take(OTHER_SID, "sound", number))
        self.assertIsNone(waiting.take(SID, "printing", number))
        self.assertEqual(waiting.take(SID, "sound", number), "conn")
        self.assertIsNone(waiting.take(SID, "sound", number))
        self.assertEqual(waiting.count(SID), 0)

    def test_a_session_holds_at_most_its_cap(self):
        waiting: Waiting[int] = Waiting(cap=3)
        admitted = [waiting.admit(SID) for _ in range(5)]
        self.assertEqual(admitted, [True, True, True, False, False])
        self.assertTrue(waiting.admit(OTHER_SID))  # another session has its own room
        waiting.release(SID)
        self.assertTrue(waiting.admit(SID))

    def test_drop_gives_back_what_waits(self):
        waiting: Waiting[str] = Waiting()
        for name in ("a", "b"):
            waiting.admit(SID)
            waiting.hold(SID, "sound", name)
        waiting.admit(SID)
        kept = waiting.hold(SID, "printing", "c")
        self.assertEqual(sorted(waiting.drop(SID, "sound")), ["a", "b"])
        self.assertEqual(waiting.count(SID), 1)
        self.assertEqual(waiting.take(SID, "printing", kept), "c")


class LineTests(TestCase):
    def test_lines_and_their_limit(self):
        reader = LineReader(limit=16)
        self.assertEqual(reader.feed(b"connection 1\nconn"), [b"connection 1"])
        self.assertEqual(reader.feed(b"ection 2\n"), [b"connection 2"])
        self.assertRaises(RouteError, reader.feed, b"x" * 17)

    def test_announcements(self):
        self.assertEqual(reverse.read_announcement(reverse.announcement(42).rstrip(b"\n")), 42)
        for bad in (b"connection", b"connection -1", b"connection 1 2", b"connection 12345678901", b"hello 1"):
            self.assertRaises(RouteError, reverse.read_announcement, bad)

    def test_settings_are_the_services_own_and_a_cookie_is_one(self):
        cookie = os.urandom(256)
        line = reverse.setting("cookie", cookie).rstrip(b"\n")
        self.assertEqual(reverse.read_setting(line, reverse.SOUND), ("cookie", cookie))
        self.assertRaises(RouteError, reverse.read_setting, line, reverse.PRINTING)
        short = reverse.setting("cookie", b"x" * 100).rstrip(b"\n")
        self.assertRaisesRegex(RouteError, "256 bytes, not 100", reverse.read_setting, short, reverse.SOUND)
        self.assertRaises(RouteError, reverse.read_setting, b"cookie zz", reverse.SOUND)


class _Lines(protocol.Protocol):
    def __init__(self) -> None:
        self.data = b""
        self.lost = defer.Deferred()

    def dataReceived(self, data: bytes) -> None:
        self.data += data

    def connectionLost(self, reason=None) -> None:
        if not self.lost.called:
            self.lost.callback(None)


def sleep(seconds: float) -> defer.Deferred:
    return task.deferLater(reactor, seconds, lambda: None)


async def until(condition, seconds: float = 5.0) -> None:
    for _ in range(int(seconds / 0.02)):
        if condition():
            return
        await sleep(0.02)
    raise AssertionError("not in time")


async def receive(sock: socket.socket, seconds: float = 5.0) -> bytes:
    """What ``sock`` reads next (b"" at its end), without holding the reactor."""
    sock.setblocking(False)
    for _ in range(int(seconds / 0.02)):
        try:
            return sock.recv(100)
        except BlockingIOError:
            await sleep(0.02)
    raise AssertionError("nothing came")


class ListenerTests(TestCase):
    """The node's listeners on real sockets, this process the session's user (uid 0 when run as root)."""

    def setUp(self) -> None:
        self.directory = tempfile.mkdtemp(prefix="reverse-")
        self.addCleanup(lambda: os.path.isdir(self.directory) and os.rmdir(self.directory))
        self.session = Session(id=SID, user="alice", uid=os.getuid(), gid=os.getgid(), display=1, cookie="c" * 32, name="s", server_name="h",
                               type="unix-console", state=State.RUNNING)
        self.sessions = {SID: self.session}
        self.listeners = ReverseListeners(reactor, self.directory, inline, self.sessions.get)
        self.addCleanup(self.listeners.close)
        self.caller = Caller(user="alice", uid=os.getuid(), gid=os.getgid())

    async def open_stream(self, caller, session_id, kind):
        service = reverse.service_of(kind)
        session = self.sessions[session_id]
        if kind.number is None:
            return self.listeners.open_route(caller, session, service)
        return self.listeners.take(caller, session, service, kind.number)

    def connect(self, path: str) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX)
        self.addCleanup(sock.close)
        sock.connect(path)
        return sock

    async def route(self, service: str = "sound") -> tuple[ReverseRoute, list]:
        delivered: list = []
        route = ReverseRoute(self.open_stream, self.caller, SID, service, delivered.append)
        self.addCleanup(route.close)
        await route.open()
        await until(lambda: route.transport is not None)
        return route, delivered

    @defer.inlineCallbacks
    def test_a_connection_of_the_session_travels_to_the_route_unread(self):
        route, delivered = yield defer.ensureDeferred(self.route())
        path = self.listeners.address(SID, "sound")
        self.assertEqual(path, os.path.join(self.directory, f"{SID}.sound"))
        self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o666)
        program = self.connect(path)
        program.sendall(b"hello from the session")
        yield defer.ensureDeferred(until(lambda: delivered))
        far = _Lines()
        delivered[0].attach(far)
        yield defer.ensureDeferred(until(lambda: far.data == b"hello from the session"))
        far.transport.write(b"and back")
        got = yield defer.ensureDeferred(receive(program))
        self.assertEqual(got, b"and back")
        self.assertEqual(self.listeners.waiting.count(SID), 0)

    @defer.inlineCallbacks
    def test_a_connection_is_handed_out_once_and_to_its_user_only(self):
        announced: list = []
        stream = self.listeners.open_route(self.caller, self.session, reverse.SOUND)
        lines = _Lines()
        stream.attach(lines)
        self.addCleanup(lines.transport.loseConnection)
        self.connect(self.listeners.address(SID, "sound"))
        yield defer.ensureDeferred(until(lambda: lines.data))
        announced.append(reverse.read_announcement(lines.data.rstrip(b"\n")))
        stranger = Caller(user="mallory", uid=4242, gid=4242)
        with self.assertRaises(SessionError) as refused:
            self.listeners.take(stranger, self.session, reverse.SOUND, announced[0])
        self.assertEqual(refused.exception.kind, Kind.NOT_YOURS)
        with self.assertRaises(SessionError):
            self.listeners.take(self.caller, self.session, reverse.PRINTING, announced[0])
        self.listeners.take(self.caller, self.session, reverse.SOUND, announced[0]).close()
        with self.assertRaises(SessionError) as again:
            self.listeners.take(self.caller, self.session, reverse.SOUND, announced[0])
        self.assertEqual(again.exception.kind, Kind.NOT_FOUND)

    @defer.inlineCallbacks
    def test_another_users_connection_is_refused_before_a_byte(self):
        self.sessions[SID] = self.session = self.session.evolve(uid=os.getuid() + 4242)
        route, delivered = yield defer.ensureDeferred(self.route())
        program = self.connect(self.listeners.address(SID, "sound"))
        got = yield defer.ensureDeferred(receive(program))
        self.assertEqual(got, b"")  # closed by the node
        yield sleep(0.2)
        self.assertEqual(delivered, [])
        self.assertIn("uid", " ".join(self.listeners.routes[(SID, "sound")].refused))

    @defer.inlineCallbacks
    def test_a_flood_is_capped_and_what_nobody_takes_expires(self):
        self.patch(node_reverse.reverse, "PATIENCE", 2.0)
        stream = self.listeners.open_route(self.caller, self.session, reverse.SOUND)
        lines = _Lines()
        stream.attach(lines)
        self.addCleanup(lines.transport.loseConnection)
        path = self.listeners.address(SID, "sound")
        for _ in range(reverse.MAX_WAITING + 10):
            self.connect(path)
            yield sleep(0.005)  # a Unix connect waits while the listener's backlog is full
        yield defer.ensureDeferred(until(lambda: lines.data.count(b"\n") >= reverse.MAX_WAITING))
        yield sleep(0.1)
        self.assertEqual(lines.data.count(b"\n"), reverse.MAX_WAITING)
        self.assertEqual(self.listeners.waiting.count(SID), reverse.MAX_WAITING)
        yield defer.ensureDeferred(until(lambda: self.listeners.waiting.count(SID) == 0, 6))

    @defer.inlineCallbacks
    def test_a_newer_route_replaces_an_older_one_and_the_end_of_a_route_ends_its_listener(self):
        old, _ = yield defer.ensureDeferred(self.route())
        ended: list = []
        old.ended = ended.append
        new, delivered = yield defer.ensureDeferred(self.route())
        yield defer.ensureDeferred(until(lambda: ended))
        self.connect(self.listeners.address(SID, "sound"))
        yield defer.ensureDeferred(until(lambda: delivered))
        delivered[0].close()
        new.close()
        yield defer.ensureDeferred(until(lambda: self.listeners.address(SID, "sound") is None))
        self.assertFalse(os.path.exists(os.path.join(self.directory, f"{SID}.sound")))

    @defer.inlineCallbacks
    def test_the_nodes_own_connection_goes_the_same_way(self):
        route, delivered = yield defer.ensureDeferred(self.route("printing"))
        own = self.listeners.connect_own(SID, "printing")
        self.addCleanup(own.close)
        own.sendall(b"IPP")
        yield defer.ensureDeferred(until(lambda: delivered))
        far = _Lines()
        delivered[0].attach(far)
        yield defer.ensureDeferred(until(lambda: far.data == b"IPP"))
        self.assertIsNone(self.listeners.connect_own(OTHER_SID, "printing"))

    @defer.inlineCallbacks
    def test_a_cookie_reaches_the_sound_setting(self):
        got: list = []

        async def setting(session, name, value):
            got.append((session.id, name, value))

        self.listeners.on_setting("sound", setting)
        route, _ = yield defer.ensureDeferred(self.route())
        cookie = os.urandom(256)
        route.send("cookie", cookie)
        yield defer.ensureDeferred(until(lambda: got))
        self.assertEqual(got, [(SID, "cookie", cookie)])

    @defer.inlineCallbacks
    def test_a_bad_setting_closes_the_route(self):
        route, _ = yield defer.ensureDeferred(self.route())
        ended: list = []
        route.ended = ended.append
        route.transport.write(b"cookie 00\n")  # one byte is no cookie
        yield defer.ensureDeferred(until(lambda: ended))
        self.assertIsNone(self.listeners.address(SID, "sound"))

    def test_a_switched_off_service_or_an_ending_session_gets_no_route(self):
        listeners = ReverseListeners(reactor, self.directory, inline, self.sessions.get, lambda word: False)
        with self.assertRaises(SessionError) as off:
            listeners.open_route(self.caller, self.session, reverse.SOUND)
        self.assertEqual(off.exception.kind, Kind.NOT_ALLOWED)
        with self.assertRaises(SessionError) as ending:
            self.listeners.open_route(self.caller, self.session.evolve(state=State.TERMINATING), reverse.SOUND)
        self.assertEqual(ending.exception.kind, Kind.WRONG_STATE)

    @defer.inlineCallbacks
    def test_short_of_files_connections_wait_in_the_backlog_and_routes_are_refused(self):
        room = [True]
        self.listeners.room = lambda count: room[0]
        route, delivered = yield defer.ensureDeferred(self.route())
        room[0] = False
        with self.assertRaises(SessionError) as refused:
            self.listeners.open_route(self.caller, self.session, reverse.PRINTING)
        self.assertEqual(refused.exception.kind, Kind.LIMIT_REACHED)
        self.connect(self.listeners.address(SID, "sound"))
        yield sleep(0.3)
        self.assertEqual(delivered, [])  # not accepted: the node holds no descriptor for it
        room[0] = True
        yield defer.ensureDeferred(until(lambda: delivered, 5))  # taken once there is room again
        delivered[0].close()


class SendBackTests(TestCase):
    """At most MAX_PER_CONNECTION reverse channels on one SSH connection."""

    def test_past_the_cap_the_stream_is_closed_not_sent(self):
        from nxgate.streams import reverse_channel

        class Connection:
            def __init__(self):
                self.opened = []

            def openChannel(self, channel, data):
                self.opened.append(channel)

        class Stream:
            closed = False

            def close(self):
                self.closed = True

        conn = Connection()
        streams = [Stream() for _ in range(reverse_channel.MAX_PER_CONNECTION + 5)]
        sent = [reverse_channel.send_back(conn, stream, b"forwarded-tcpip", "sound", b"") for stream in streams]
        self.assertEqual(sent.count(True), reverse_channel.MAX_PER_CONNECTION)
        self.assertEqual([stream.closed for stream in streams].count(True), 5)
        conn.opened[0].openFailed(Failure(Exception("refused by the client")))  # a refused one frees its place
        conn.opened[1].closed()  # so does one that ended
        self.assertTrue(reverse_channel.send_back(conn, Stream(), b"forwarded-tcpip", "sound", b""))
        self.assertTrue(reverse_channel.send_back(conn, Stream(), b"forwarded-tcpip", "sound", b""))
        self.assertFalse(reverse_channel.send_back(conn, Stream(), b"forwarded-tcpip", "sound", b""))
