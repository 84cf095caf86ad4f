"""Printing through NX (issue 14), the pure parts and the client's gate on
loopback: IPP encoding and decoding, the gate's checks and framing, the
session cupsd's configuration, the client's options.  The real thing (a
session's cupsd, nxproxy, a client CUPS and ippeveprinter) is in
tests/test_e2e_printing.py."""

from __future__ import annotations

import os
import struct
import tempfile
from types import SimpleNamespace

from twisted.internet import defer, protocol, reactor
from twisted.trial.unittest import TestCase

from nxgate.protocols import ipp
from nxgate.protocols import printgate
from nxgate.node.extras import printing

COOKIE = "0123456789abcdef0123456789abcdef"


def attribute(tag: int, name: str, value: bytes) -> bytes:
    return struct.pack(">BH", tag, len(name)) + name.encode() + struct.pack(">H", len(value)) + value


def response(status: int, printers: list[dict[str, str]]) -> bytes:
    body = struct.pack(">BBHI", 2, 0, status, 1) + bytes([ipp.OPERATION_GROUP])
    body += attribute(ipp.CHARSET, "attributes-charset", b"utf-8")
    for printer in printers:
        body += bytes([ipp.PRINTER_GROUP])
        for name, value in printer.items():
            tag = ipp.URI if name.endswith("uri-supported") else ipp.NAME
            body += attribute(tag, name, value.encode())
    return body + bytes([ipp.END])


class IPPCoding(TestCase):
    def test_request_has_the_required_operation_attributes_in_order(self) -> None:
        data = ipp.request(ipp.GET_PRINTER_ATTRIBUTES, 7, "ipp://h/ipp/print", ("printer-name", "printer-info"))
        self.assertEqual(data[:8], struct.pack(">BBHI", 2, 0, ipp.GET_PRINTER_ATTRIBUTES, 7))
        decoded = ipp.decode(data)  # the same layout as an answer
        attributes = decoded.group(ipp.OPERATION_GROUP)[0]
        self.assertEqual(list(attributes)[:2], ["attributes-charset", "attributes-natural-language"])
        self.assertEqual(attributes["printer-uri"], ["ipp://h/ipp/print"])
        self.assertEqual(attributes["requested-attributes"], ["printer-name", "printer-info"])

    def test_printers_of_a_cups_get_printers_answer(self) -> None:
        message = ipp.decode(response(0, [
            {"printer-name": "office", "printer-uri-supported": "ipp://localhost:631/printers/office",
             "printer-info": "Office laser"},
            {"printer-name": "My Printer/2", "printer-uri-supported": "ipp://localhost/printers/My%20Printer"},
        ]))
        self.assertTrue(message.ok)
        found = ipp.printers_of(message, default_name="My Printer/2")
        self.assertEqual([(p.queue, p.resource, p.default) for p in found],
                         [("office", "/printers/office", False), ("My_Printer_2", "/printers/My%20Printer", True)])
        self.assertEqual(found[0].info, "Office laser")

    def test_names_that_could_break_cupsd_conf_are_cleaned(self) -> None:
        message = ipp.decode(response(0, [{"printer-name": "a>\n<Printer evil", "printer-info": "x\n</Printer>"}]))
        (printer,) = ipp.printers_of(message)
        self.assertNotIn("\n", printer.info + printer.queue)
        self.assertNotIn(">", printer.info + printer.queue)
        self.assertEqual(printer.queue, "aPrinter_evil")

    def test_malformed_answers_are_ipp_errors(self) -> None:
        good = response(0, [{"printer-name": "p"}])
        for bad in (b"", good[:12], good[:-1], good[:9] + b"\x42\xff\xff", b"\x02\x00\x00\x00\x00\x00\x00\x01\x42"):
            self.assertRaises(ipp.IPPError, ipp.decode, bad)


def post(body: bytes = b"12345", auth: str | None = None, extra: str = "") -> bytes:
    head = f"POST /printers/p HTTP/1.1\r\nHost: 127.0.0.1:2001\r\nContent-Length: {len(body)}\r\n{extra}"
    if auth is not None:
        head += f"Authorization: {auth}\r\n"
    return (head + "\r\n").encode() + body


class Gate(TestCase):
    def test_without_the_credential_a_401_and_nothing_passes(self) -> None:
        for auth in (None, "Basic " + "x" * 20, printgate.authorization("f" * 32)):
            gate = printgate.Gate(COOKIE)
            out = gate.feed(post(auth=auth))
            self.assertEqual(out.to_server, b"")
            self.assertTrue(out.to_client.startswith(b"HTTP/1.1 401 "))
            self.assertIn(b'WWW-Authenticate: Basic realm="nxgate printing"', out.to_client)
            self.assertTrue(out.close)
            self.assertEqual(gate.feed(post(auth=printgate.authorization(COOKIE))).to_server, b"")

    def test_with_it_the_request_passes_without_authorization_and_with_host_localhost(self) -> None:
        gate = printgate.Gate(COOKIE)
        out = gate.feed(post(b"hello", auth=printgate.authorization(COOKIE), extra="Expect: 100-continue\r\n"))
        self.assertFalse(out.close)
        self.assertEqual(out.to_client, b"")
        self.assertNotIn(b"Authorization", out.to_server)
        self.assertNotIn(b"127.0.0.1:2001", out.to_server)
        self.assertIn(b"\r\nHost: localhost\r\n", out.to_server)
        self.assertIn(b"Expect: 100-continue", out.to_server)
        self.assertTrue(out.to_server.endswith(b"\r\n\r\nhello"))

    def test_every_request_is_checked_even_on_an_authorized_connection(self) -> None:
        """Bodies are framed, so a second request hidden after the first
        body is seen as a request, and refused without the credential."""
        gate = printgate.Gate(COOKIE)
        good = post(b"a" * 10, auth=printgate.authorization(COOKIE))
        out = gate.feed(good + post(b"HIDDEN"))
        self.assertTrue(out.to_server.endswith(b"a" * 10))
        self.assertNotIn(b"HIDDEN", out.to_server)
        self.assertTrue(out.close)

    def test_chunked_bodies_byte_by_byte_then_the_next_request(self) -> None:
        gate = printgate.Gate(COOKIE)
        auth = printgate.authorization(COOKIE)
        head = f"POST /p HTTP/1.1\r\nTransfer-Encoding: chunked\r\nAuthorization: {auth}\r\n\r\n".encode()
        data = head + b"4\r\nabcd\r\n3;ext=1\r\nefg\r\n0\r\nTrailer: x\r\n\r\n" + post(b"next", auth=auth)
        passed = b""
        for index in range(len(data)):
            out = gate.feed(data[index:index + 1])
            self.assertFalse(out.close, data[:index + 1])
            passed += out.to_server
        self.assertIn(b"4\r\nabcd\r\n3;ext=1\r\nefg\r\n0\r\nTrailer: x\r\n\r\nPOST /printers/p", passed)
        self.assertTrue(passed.endswith(b"next"))
        self.assertNotIn(b"Authorization", passed)

    def test_garbage_gets_a_400(self) -> None:
        for data in (b"x" * (printgate.MAX_HEAD + 10), b"NONSENSE\r\n\r\n", b"POST / HTTP/1.1\r\nno colon\r\n\r\n",
                     b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n"):
            out = printgate.Gate(COOKIE).feed(data)
            self.assertTrue(out.to_client.startswith(b"HTTP/1.1 400"), data[:40])
            self.assertTrue(out.close)

    def test_the_credential_follows_the_cookie(self) -> None:
        self.assertEqual(len(printgate.credential(COOKIE)), 64)
        self.assertNotEqual(printgate.credential(COOKIE), printgate.credential("f" * 32))
        self.assertNotIn(COOKIE, printgate.credential(COOKIE))


class CupsdConfiguration(TestCase):
    def test_the_socket_only_and_everything_in_the_directory(self) -> None:
        conf = printing.cupsd_conf("/s/cups/socket")
        self.assertIn("Listen /s/cups/socket\n", conf)
        self.assertNotIn("Port", conf)
        self.assertIn("Browsing No", conf)
        files_conf = printing.cups_files_conf("/s/cups")
        for line in ("ServerRoot /s/cups", "RequestRoot /s/cups/spool", "ConfigFilePerm 0600", "FileDevice No"):
            self.assertIn(line + "\n", files_conf)
        for line in files_conf.splitlines():
            if line.split()[0] in ("RequestRoot", "TempDir", "CacheDir", "StateDir", "ErrorLog", "Printcap"):
                self.assertTrue(line.split()[1].startswith("/s/cups/"), line)

    def test_one_raw_queue_per_client_printer_through_the_channel(self) -> None:
        printers = [ipp.Printer("office", "/printers/office"), ipp.Printer("home", "/printers/home", default=True)]
        conf = printing.printers_conf(printers, 2001, "c" * 64)
        self.assertIn("<Printer office>", conf)
        self.assertIn("<DefaultPrinter home>", conf)
        self.assertIn(f"DeviceURI ipp://nxgate:{'c' * 64}@127.0.0.1:2001/printers/home\n", conf)
        self.assertNotIn("PPD", conf)
        self.assertEqual(conf.count("Shared No"), 2)
        self.assertEqual(printing.printers_conf([], 2001, "c"), "\n")

    def test_a_reverse_listeners_unix_socket_is_the_uris_host_written_with_percent_slashes(self) -> None:
        """CUPS's ipp backend connects to a host that starts with "/" as a
        Unix socket; in a URI it is written %2F...."""
        uri = printing.device_uri("/var/lib/nxgate/tunnels/printing-0a1b", "/printers/home", "c" * 8)
        self.assertEqual(uri, "ipp://nxgate:cccccccc@%2Fvar%2Flib%2Fnxgate%2Ftunnels%2Fprinting-0a1b/printers/home")

    def test_prepare_makes_a_private_directory(self) -> None:
        base = tempfile.mkdtemp()
        self.addCleanup(lambda: __import__("shutil").rmtree(base))
        os.chmod(base, 0o700)
        context = SimpleNamespace(session_dir=lambda session: base)
        extra = printing.Printing(context, "cupsd")  # type: ignore[arg-type]
        session = SimpleNamespace(id="A" * 32, uid=os.getuid(), gid=os.getgid(), display=5)
        extra._prepare(session)
        directory = os.path.join(base, "cups")
        self.assertEqual(os.stat(directory).st_mode & 0o777, 0o700)
        for name in ("cupsd.conf", "cups-files.conf"):
            self.assertEqual(os.stat(os.path.join(directory, name)).st_mode & 0o777, 0o600)
        self.assertEqual(extra.environment(session), {"CUPS_SERVER": os.path.join(directory, "socket")})
        extra._prepare(session)  # again at a resume: no error
        self.assertTrue(os.path.isdir(os.path.join(directory, "spool")))

    def test_a_planted_link_instead_of_the_directory_is_refused(self) -> None:
        base = tempfile.mkdtemp()
        self.addCleanup(lambda: __import__("shutil").rmtree(base))
        elsewhere = tempfile.mkdtemp()
        self.addCleanup(lambda: __import__("shutil").rmtree(elsewhere))
        os.symlink(elsewhere, os.path.join(base, "cups"))
        extra = printing.Printing(SimpleNamespace(session_dir=lambda session: base))  # type: ignore[arg-type]
        session = SimpleNamespace(id="A" * 32, uid=os.getuid(), gid=os.getgid(), display=5)
        self.assertRaises(OSError, extra._prepare, session)
        self.assertEqual(os.listdir(elsewhere), [])


class FakeCups(protocol.Protocol):
    """A print server answering CUPS-Get-Printers / CUPS-Get-Default (or,
    as a bare IPP printer, only Get-Printer-Attributes); it records what came."""

    def connectionMade(self) -> None:
        self.data = b""
        self.factory.open += 1

    def connectionLost(self, reason=None) -> None:
        self.factory.open -= 1
        if not self.factory.open:
            waiting, self.factory.closed = self.factory.closed, []
            for d in waiting:
                d.callback(None)

    def dataReceived(self, data: bytes) -> None:
        self.data += data
        end = self.data.find(b"\r\n\r\n")
        if end < 0:
            return
        length = int([line.split(b":")[1] for line in self.data[:end].split(b"\r\n")
                      if line.lower().startswith(b"content-length")][0])
        if len(self.data) < end + 4 + length:
            return
        self.factory.seen.append(self.data[:end])
        operation = struct.unpack(">H", self.data[end + 6:end + 8])[0]
        if self.factory.bare and operation != ipp.GET_PRINTER_ATTRIBUTES:
            body = response(ipp.OPERATION_NOT_SUPPORTED, [])
        elif operation == ipp.CUPS_GET_DEFAULT:
            body = response(0, [{"printer-name": "home"}])
        else:
            body = response(0, self.factory.printers)
        self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/ipp\r\nContent-Length: %d\r\n\r\n"
                             % len(body) + body)
        self.data = b""


class ThroughTheGate(TestCase):
    """The session side's discovery through the client's gate, on loopback."""

    def serve(self, printers, bare=False) -> int:
        from nxgate.clients.nx.printing import LocalPrinting

        factory = protocol.Factory.forProtocol(FakeCups)
        factory.seen, factory.printers, factory.bare, factory.open, factory.closed = [], printers, bare, 0, []
        self.factory = factory
        port = reactor.listenTCP(0, factory, interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        self.addCleanup(self.all_closed)  # the gate closes its side after the session side's close
        gate = LocalPrinting(reactor, f"127.0.0.1:{port.getHost().port}")
        gate_port = gate.open(COOKIE)
        self.addCleanup(gate.close)
        return gate_port

    def all_closed(self) -> defer.Deferred:
        if not self.factory.open:
            return defer.succeed(None)
        d = defer.Deferred()
        self.factory.closed.append(d)
        return d

    async def test_discovery_passes_the_gate_and_the_server_never_sees_the_credential(self) -> None:
        port = self.serve([{"printer-name": "office", "printer-uri-supported": "ipp://x/printers/office"},
                           {"printer-name": "home", "printer-uri-supported": "ipp://x/printers/home"}])
        found = await printing.discover(reactor, printing.Route.channel(reactor, port), COOKIE)
        self.assertEqual([(p.queue, p.default) for p in found], [("office", False), ("home", True)])
        self.assertTrue(self.factory.seen)
        for head in self.factory.seen:
            self.assertNotIn(b"Authorization", head)

    async def test_a_bare_ipp_printer_is_one_queue(self) -> None:
        port = self.serve([{"printer-name": "Tiny", "printer-uri-supported": "ipp://x/ipp/print"}], bare=True)
        found = await printing.discover(reactor, printing.Route.channel(reactor, port), COOKIE)
        self.assertEqual([(p.queue, p.resource, p.default) for p in found], [("Tiny", "/ipp/print", True)])

    async def test_a_wrong_cookie_is_refused(self) -> None:
        port = self.serve([{"printer-name": "office"}])
        with self.assertRaises(printing.Refused):
            await printing.discover(reactor, printing.Route.channel(reactor, port), "f" * 32)
        self.assertEqual(self.factory.seen, [])

    async def test_nobody_listening_is_not_yet(self) -> None:
        from tests.harness.net import free_port

        with self.assertRaises(printing.NotAnswering):
            await printing.discover(reactor, printing.Route.channel(reactor, free_port()), COOKIE)


class ClientOptions(TestCase):
    def options(self, *argv: str):
        from nxgate.clients.nx.cli import parse_options

        return parse_options([*argv, "u@h"], {"DISPLAY": ":9"} if "--list" not in argv else {})

    def test_print_asks_for_cups(self) -> None:
        options = self.options("--geometry", "800x600", "--print")
        self.assertIn(("cups", "1"), options.request.params.pairs())
        self.assertEqual(options.print_server, "")
        plain = self.options("--geometry", "800x600")
        self.assertNotIn("cups", dict(plain.request.params.pairs()))
        self.assertIsNone(plain.print_server)

    def test_print_server_needs_print_and_a_session(self) -> None:
        from nxgate.clients.nx.cli import UsageError

        self.assertRaises(UsageError, self.options, "--geometry", "800x600", "--print-server", "localhost:631")
        self.assertRaises(UsageError, self.options, "--list", "--print")
        self.assertRaises(UsageError, self.options, "--geometry", "800x600", "--print", "--print-server", "host:x")
        self.assertEqual(self.options("--geometry", "800x600", "--print", "--print-server", "/run/c.sock").print_server,
                         "/run/c.sock")

    def test_print_servers(self) -> None:
        from nxgate.clients.nx.printing import PrintingError, default_server, parse_server

        self.assertEqual(parse_server("/run/cups/cups.sock"), "/run/cups/cups.sock")
        self.assertEqual(parse_server("printhost"), ("printhost", 631))
        self.assertEqual(parse_server("localhost:8631"), ("localhost", 8631))
        self.assertEqual(parse_server("[::1]:631"), ("::1", 631))
        for bad in ("host:port", "host:0", ":631"):
            self.assertRaises(PrintingError, parse_server, bad)
        self.assertEqual(default_server({"CUPS_SERVER": "cups.example:631"}), "cups.example:631")

    def test_nxproxy_gets_the_cups_port(self) -> None:
        from nxgate.clients.nx.proxy import proxy_options
        from nxgate.protocols.nx.client_dialogue import SessionInfo

        info = SessionInfo(full_id="h-1001-" + "A" * 32, session_id="A" * 32, display=1001, cookie=COOKIE)
        self.assertIn(",cups=6310,", proxy_options(info, "s", 1234, {"cups": 6310, "media": 0}))


class FakeLauncher:
    """Stands in for the launcher: records the request, "starts" cupsd as a
    sleeping process and makes its socket appear."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.children: list = []

    async def start(self, request: dict):
        import subprocess
        import threading

        from nxgate.node.processes import ProcessId

        self.requests.append(request)
        conf = request["argv"][request["argv"].index("-c") + 1]
        socket_path = [line.split()[1] for line in open(conf) if line.startswith("Listen ")][0]
        open(socket_path, "w").close()
        child = subprocess.Popen(["sleep", "60"])
        threading.Thread(target=child.wait, daemon=True).start()  # reaped, so it ends for real
        self.children.append(child)
        return ProcessId.of(child.pid)


class Lifecycle(TestCase):
    """The extra from start (discovery through the gate, printers.conf,
    cupsd launched as the user) to stop, with a stand-in launcher."""

    async def test_start_discovers_writes_the_queues_launches_cupsd_and_stop_ends_it(self) -> None:
        factory = protocol.Factory.forProtocol(FakeCups)
        factory.seen, factory.bare, factory.open, factory.closed = [], False, 0, []
        factory.printers = [{"printer-name": "home", "printer-uri-supported": "ipp://x/printers/home"}]
        server = reactor.listenTCP(0, factory, interface="127.0.0.1")
        self.addCleanup(server.stopListening)
        from nxgate.clients.nx.printing import LocalPrinting

        gate = LocalPrinting(reactor, f"127.0.0.1:{server.getHost().port}")
        gate_port = gate.open(COOKIE)
        self.addCleanup(gate.close)
        base = tempfile.mkdtemp()
        self.addCleanup(lambda: __import__("shutil").rmtree(base))
        launcher = FakeLauncher()
        context = SimpleNamespace(reactor=reactor, session_dir=lambda session: base, launcher=launcher, blocking=None,
                                  reverse=None,
                                  layout=SimpleNamespace(agent_files=lambda sid: SimpleNamespace(
                                      app_log=os.path.join(base, "session.log"))))
        extra = printing.Printing(context, "cupsd")  # type: ignore[arg-type]
        session = SimpleNamespace(id="B" * 32, uid=os.getuid(), gid=os.getgid(), display=gate_port - 2000,
                                  cookie=COOKIE, user="someone")
        await extra.start(session)
        await defer.ensureDeferred(_until(lambda: launcher.requests and extra._cupsd.get(session.id)))
        (request,) = launcher.requests
        self.assertEqual(request["argv"][0], "cupsd")
        self.assertEqual(request["env_fixed"]["NXGATE_SESSION"], session.id)
        self.assertNotIn(printgate.credential(COOKIE), repr(request))  # never in argv or the environment
        with open(os.path.join(base, "cups", "printers.conf")) as handle:
            conf = handle.read()
        self.assertIn(f"DeviceURI ipp://nxgate:{printgate.credential(COOKIE)}@127.0.0.1:{gate_port}/printers/home",
                      conf)
        self.assertIn("<DefaultPrinter home>", conf)
        await extra.stop(session)
        self.assertFalse(os.path.exists(os.path.join(base, "cups", "printers.conf")))
        await defer.ensureDeferred(_until(lambda: launcher.children[0].poll() is not None))

    async def test_with_a_route_the_node_asks_through_it_and_the_queues_send_to_its_socket(self) -> None:
        """The client takes its printing back over its own SSH connection (a
        route to the session's reverse listener): discovery goes through the
        listeners' own way in (a socket pair, not the listening socket), and the
        queues' device URIs name the listener's Unix socket."""
        import socket

        factory = protocol.Factory.forProtocol(FakeCups)
        factory.seen, factory.bare, factory.open, factory.closed = [], False, 0, []
        factory.printers = [{"printer-name": "home", "printer-uri-supported": "ipp://x/printers/home"}]

        class Listeners:
            calls = 0

            def address(self, session_id, service):
                return f"/run/nxgate/reverse/{session_id}.{service}"

            def connect_own(self, session_id, service):
                Listeners.calls += 1
                ours, theirs = socket.socketpair()
                theirs.setblocking(False)
                reactor.adoptStreamConnection(theirs.fileno(), socket.AF_UNIX, factory)
                theirs.close()
                ours.setblocking(False)
                return ours

        base = tempfile.mkdtemp()
        self.addCleanup(lambda: __import__("shutil").rmtree(base))
        session = SimpleNamespace(id="D" * 32, uid=os.getuid(), gid=os.getgid(), display=7, cookie=COOKIE,
                                  user="someone")
        launcher = FakeLauncher()
        context = SimpleNamespace(reactor=reactor, session_dir=lambda session: base, launcher=launcher, blocking=None,
                                  reverse=Listeners(),
                                  layout=SimpleNamespace(agent_files=lambda sid: SimpleNamespace(
                                      app_log=os.path.join(base, "session.log"))))
        extra = printing.Printing(context, "cupsd")  # type: ignore[arg-type]
        await extra.start(session)
        await defer.ensureDeferred(_until(lambda: launcher.requests and extra._cupsd.get(session.id)))
        self.assertEqual(Listeners.calls, 2)  # CUPS-Get-Printers and CUPS-Get-Default
        with open(os.path.join(base, "cups", "printers.conf")) as handle:
            self.assertIn(f"@%2Frun%2Fnxgate%2Freverse%2F{session.id}.printing/printers/home\n", handle.read())
        await extra.stop(session)
        await defer.ensureDeferred(_until(lambda: launcher.children[0].poll() is not None))

    async def test_stop_before_the_client_answers_cancels_the_discovery(self) -> None:
        from tests.harness.net import free_port

        base = tempfile.mkdtemp()
        self.addCleanup(lambda: __import__("shutil").rmtree(base))
        launcher = FakeLauncher()
        context = SimpleNamespace(reactor=reactor, session_dir=lambda session: base, launcher=launcher, blocking=None,
                                  reverse=None,
                                  layout=None)
        extra = printing.Printing(context, "cupsd")  # type: ignore[arg-type]
        session = SimpleNamespace(id="C" * 32, uid=os.getuid(), gid=os.getgid(), display=free_port() - 2000,
                                  cookie=COOKIE, user="someone")
        await extra.start(session)
        self.assertIn(session.id, extra._tasks)
        await extra.stop(session)
        self.assertEqual(extra._tasks, {})
        self.assertEqual(launcher.requests, [])


class SocketMade(TestCase):
    async def test_a_socket_cupsd_makes_after_the_watch_began_is_seen(self) -> None:
        """inotify names what it saw in bytes: the socket must still be
        recognised (else every start waited SOCKET_TIMEOUT and logged a failure)."""
        import socket
        import subprocess
        import threading

        from nxgate.node.processes import ProcessId

        base = tempfile.mkdtemp()
        self.addCleanup(lambda: __import__("shutil").rmtree(base))
        child = subprocess.Popen(["sleep", "60"])
        threading.Thread(target=child.wait, daemon=True).start()
        self.addCleanup(child.kill)
        extra = printing.Printing(SimpleNamespace(reactor=reactor))  # type: ignore[arg-type]
        path = os.path.join(base, "socket")
        made = socket.socket(socket.AF_UNIX)
        self.addCleanup(made.close)
        reactor.callLater(0.1, made.bind, path)
        self.patch(printing, "SOCKET_TIMEOUT", 30.0)
        await extra._socket_made(path, ProcessId.of(child.pid))
        self.assertIsNone(child.poll())  # seen while cupsd (here: sleep) still runs


async def _until(predicate, timeout: float = 10.0) -> None:
    from twisted.internet import task

    deadline = reactor.seconds() + timeout
    while not predicate():
        if reactor.seconds() > deadline:
            raise AssertionError("timed out")
        await task.deferLater(reactor, 0.02, lambda: None)


class WithoutCupsd(TestCase):
    async def test_no_cupsd_installed_means_no_printing_and_no_cups_server(self) -> None:
        base = tempfile.mkdtemp()
        self.addCleanup(lambda: __import__("shutil").rmtree(base))
        extra = printing.Printing(SimpleNamespace(session_dir=lambda session: base), None)  # type: ignore[arg-type]
        session = SimpleNamespace(id="D" * 32, uid=os.getuid(), gid=os.getgid(), display=5, cookie=COOKIE, user="u")
        self.assertEqual(extra.environment(session), {})
        await extra.start(session)
        self.assertEqual((extra._tasks, os.listdir(base)), ({}, []))


class HostHeader(TestCase):
    def test_the_print_servers_own_name(self) -> None:
        from nxgate.clients.nx.printing import GateFactory

        self.assertEqual(GateFactory(reactor, COOKIE, "/run/cups/cups.sock").host_header, "localhost")
        self.assertEqual(GateFactory(reactor, COOKIE, ("printhost", 631)).host_header, "printhost:631")
        self.assertEqual(GateFactory(reactor, COOKIE, ("::1", 631)).host_header, "[::1]:631")
