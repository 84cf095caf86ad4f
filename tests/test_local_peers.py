"""Who may use a session user's back-channel (nxgate.local_peers): the pure
judgements, the kernel's tables read from a fake /proc, real sockets of this
machine, and the reverse listeners of a node (nxgate.node.reverse) on a real
reactor, where uid 0 is nobody's pass any more."""

from __future__ import annotations

import os
import socket
import tempfile

from twisted.internet import protocol, reactor, task
from twisted.trial.unittest import SynchronousTestCase, TestCase

from nxgate import local_peers
from nxgate.local_peers import TcpRow
from nxgate.node.reverse import ReverseListeners
from nxgate.streams import reverse
from nxgate.threads import in_thread
from nxgate.vocabulary.caller import Caller
from nxgate.vocabulary.model import Session, State

SID = "0123456789ABCDEF0123456789ABCDEF"
HEADER = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n")
TABLE = HEADER + (
    # our listener 127.0.0.1:8080
    "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 11 1 0 100 0 0 10 0\n"
    # 127.0.0.1:54321 of uid 1042, live, connected to it; and our accepted end
    "   1: 0100007F:D431 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1042        0 12 1 0 20 4 30 10 -1\n"
    "   2: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 13 1 0 20 4 30 10 -1\n"
    # 127.0.0.1:54322: connected, sent and closed at once (FIN_WAIT2, an orphan: uid 0, inode 0)
    "   3: 0100007F:D432 0100007F:1F90 05 00000000:00000000 00:00000000 00000000     0        0 0 1 0 20 4 30 10 -1\n")


class Judgements(SynchronousTestCase):
    def test_rows_are_found_by_both_ends(self) -> None:
        self.assertEqual(local_peers.tcp_row(TABLE, ("127.0.0.1", 54321), ("127.0.0.1", 8080)), TcpRow(1042, 12))
        self.assertEqual(local_peers.tcp_row(TABLE, ("127.0.0.1", 54322), ("127.0.0.1", 8080)), TcpRow(0, 0))
        self.assertIsNone(local_peers.tcp_row(TABLE, ("127.0.0.1", 54323), ("127.0.0.1", 8080)))
        self.assertIsNone(local_peers.tcp_row("garbage\nmore garbage", ("127.0.0.1", 1), ("127.0.0.1", 2)))

    def test_ipv6_addresses_are_written_as_the_kernel_does(self) -> None:
        self.assertEqual(local_peers.proc_address("::1", 80), "00000000000000000000000001000000:0050")

    def test_an_orphaned_socket_is_nobody_not_root(self) -> None:
        for uid in (0, 1042):
            verdict = local_peers.judge_tcp(TcpRow(0, 0), None, uid)
            self.assertFalse(verdict.admitted)
            self.assertIn("closed", verdict.reason)

    def test_a_live_socket_passes_only_with_the_users_uid_and_a_holder(self) -> None:
        self.assertTrue(local_peers.judge_tcp(TcpRow(1042, 12), 777, 1042).admitted)
        self.assertFalse(local_peers.judge_tcp(TcpRow(1042, 12), None, 1042).admitted)  # held by nobody of hers
        other = local_peers.judge_tcp(TcpRow(1043, 12), 778, 1042)
        self.assertEqual((other.admitted, other.who), (False, "uid 1043"))
        self.assertFalse(local_peers.judge_tcp(TcpRow(0, 12), 1, 1042).admitted)  # root's: not the user's
        self.assertFalse(local_peers.judge_tcp(None, None, 1042).admitted)

    def test_a_unix_peer_passes_with_the_users_uid_only(self) -> None:
        self.assertTrue(local_peers.judge_unix((777, 1042, 1042), 1042).admitted)
        refused = local_peers.judge_unix((1, 0, 0), 1042)
        self.assertEqual((refused.admitted, refused.who), (False, "uid 0"))
        self.assertFalse(local_peers.judge_unix(None, 1042).admitted)


class FakeProc(SynchronousTestCase):
    """holders() and check_tcp() on a /proc written by the test."""

    def setUp(self) -> None:
        self.proc = tempfile.mkdtemp()
        self.addCleanup(__import__("shutil").rmtree, self.proc)
        os.mkdir(os.path.join(self.proc, "net"))
        with open(os.path.join(self.proc, "net", "tcp"), "w") as handle:
            handle.write(TABLE)

    def process(self, pid: int, uid: int, links: dict[str, str]) -> None:
        directory = os.path.join(self.proc, str(pid))
        os.makedirs(os.path.join(directory, "fd"))
        for fd, target in links.items():
            os.symlink(target, os.path.join(directory, "fd", fd))
        os.chown(directory, uid, uid)

    def test_holders_are_found_among_the_users_processes(self) -> None:
        self.process(10, 1042, {"3": "socket:[12]", "4": "/dev/null"})
        self.process(11, 1043, {"3": "socket:[12]"})
        self.assertEqual(local_peers.holders([12], proc=self.proc), {12: {10, 11}})
        self.assertEqual(local_peers.holders([12], 1042, proc=self.proc), {12: {10}})
        self.assertEqual(local_peers.holders([0], proc=self.proc), {})

    def test_check_tcp_needs_the_live_socket_held_by_the_user(self) -> None:
        peer, local = ("127.0.0.1", 54321), ("127.0.0.1", 8080)
        self.assertFalse(local_peers.check_tcp(peer, local, 1042, self.proc).admitted)  # nobody holds inode 12
        self.process(10, 1042, {"5": "socket:[12]"})
        self.assertTrue(local_peers.check_tcp(peer, local, 1042, self.proc).admitted)
        self.assertFalse(local_peers.check_tcp(peer, local, 1043, self.proc).admitted)
        self.assertFalse(local_peers.check_tcp(("127.0.0.1", 54322), local, 0, self.proc).admitted)


class RealSockets(TestCase):
    """This machine's kernel: our own connections, live and closed."""

    def test_a_unix_peer_is_known_even_after_it_closed(self) -> None:
        server = socket.socket(socket.AF_UNIX)
        path = os.path.join(tempfile.mkdtemp(), "s")
        server.bind(path)
        server.listen(1)
        client = socket.socket(socket.AF_UNIX)
        client.connect(path)
        client.sendall(b"x")
        client.close()  # connect, send, close
        accepted, _ = server.accept()
        self.addCleanup(accepted.close)
        self.addCleanup(server.close)
        self.assertEqual(local_peers.peer_credentials(accepted)[1], os.getuid())
        self.assertTrue(local_peers.check_unix(accepted, os.getuid()).admitted)
        self.assertFalse(local_peers.check_unix(accepted, os.getuid() + 4242).admitted)

    async def test_a_tcp_peer_passes_while_we_hold_it_and_not_once_closed(self) -> None:
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        self.addCleanup(server.close)
        client = socket.create_connection(server.getsockname())
        accepted, peer = server.accept()
        self.addCleanup(accepted.close)
        local = accepted.getsockname()
        live = await in_thread(reactor)(local_peers.check_tcp, peer, local, os.getuid())
        self.assertTrue(live.admitted, live.reason)
        client.close()  # now an orphan in FIN_WAIT2: uid 0 and inode 0 in the table
        closed = local_peers.check_tcp(peer, local, os.getuid())
        self.assertFalse(closed.admitted, closed.reason)


class Listeners(TestCase):
    """The reverse listeners of a node (nxgate.node.reverse) on the real reactor, with our own connections:
    the tests run as root, so a connection of ours is uid 0's, which once counted as "the gateway itself"
    and must not any more."""

    def listeners(self, uid: int, service: str) -> tuple[ReverseListeners, list[bytes]]:
        directory = tempfile.mkdtemp()
        os.chmod(directory, 0o711)
        session = Session(id=SID, user="alice", uid=uid, gid=uid, display=1, cookie="c" * 32, name="s",
                          server_name="h", type="unix-console", state=State.RUNNING)
        listeners = ReverseListeners(reactor, directory, in_thread(reactor), {SID: session}.get)
        self.addCleanup(listeners.close)
        announced: list[bytes] = []

        class Lines(protocol.Protocol):
            def dataReceived(self, data: bytes) -> None:
                announced.extend(line for line in data.split(b"\n") if line)

        route = listeners.open_route(Caller(user="alice", uid=uid, gid=uid), session, reverse.SERVICES[service])
        route.attach(Lines())
        return listeners, announced

    async def settle(self) -> None:
        for _ in range(20):
            await task.deferLater(reactor, 0.02, lambda: None)

    async def test_printing_listens_on_a_unix_socket_that_lets_in_the_users_processes_only(self) -> None:
        mine = os.getuid()
        for uid, admitted in ((mine + 4242, False), (mine, True)):
            listeners, announced = self.listeners(uid, "printing")
            path = listeners.address(SID, "printing")
            self.assertIsInstance(path, str)
            self.assertEqual(os.stat(path).st_mode & 0o777, 0o666)  # reachable; the kernel's word decides
            client = socket.socket(socket.AF_UNIX)
            client.connect(path)
            client.sendall(b"POST / HTTP/1.1\r\n\r\n")
            client.close()  # connect, send, close
            await self.settle()
            self.assertEqual(len(announced), 1 if admitted else 0, f"uid {uid}")
            listeners.close()

    async def test_the_nodes_own_connection_goes_through_without_the_listener(self) -> None:
        listeners, announced = self.listeners(os.getuid() + 4242, "printing")  # not ours: only the own way in
        own = listeners.connect_own(SID, "printing")
        self.addCleanup(own.close)
        await self.settle()
        self.assertEqual(len(announced), 1)

    async def test_folders_listen_on_tcp_where_a_closed_socket_is_refused_and_a_held_one_passes(self) -> None:
        listeners, announced = self.listeners(os.getuid(), "sharing")
        port = listeners.address(SID, "sharing")
        self.assertIsInstance(port, int)
        closed = socket.create_connection(("127.0.0.1", port))
        closed.sendall(b"\x00\x00\xff\xff")
        closed.close()  # an orphan by the time it is looked at: uid 0 in the table, which is ours
        await self.settle()
        self.assertEqual(announced, [])
        held = socket.create_connection(("127.0.0.1", port))
        self.addCleanup(held.close)
        await self.settle()
        self.assertEqual(len(announced), 1)

    async def test_refusals_are_logged_once_a_minute_not_once_each(self) -> None:
        from twisted.logger import globalLogPublisher

        events: list[dict] = []
        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        listeners, announced = self.listeners(os.getuid() + 4242, "printing")
        path = listeners.address(SID, "printing")
        for _ in range(120):
            client = socket.socket(socket.AF_UNIX)
            client.connect(path)
            client.close()
            await task.deferLater(reactor, 0, lambda: None)
        await self.settle()
        refusals = [e for e in events if "refused a {what} connection" in e.get("log_format", "")]
        self.assertEqual(len(refusals), 1)  # the first; the rest in a minute's line, and the sum at the end
        listeners.close()
        summary = [e for e in events if "no longer takes its" in e.get("log_format", "")]
        self.assertIn("120 from uid", summary[0]["refused"])
        self.assertEqual(announced, [])
