"""The wire between cluster members (issue 13): the serialiser, AMP over
mutually authenticated TLS with real certificates (made by nxgate-admin
cluster and by openssl), refusals, and the session stream."""

from __future__ import annotations

import dataclasses
import datetime
import inspect
import json
import os
import pwd
import shutil
import stat
import subprocess
import tempfile

from twisted.internet import defer, endpoints, protocol, reactor
from twisted.internet.task import deferLater
from twisted.logger import globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase, TestCase

from nxgate.users import UserDirectory
from nxgate.wire import protocol as wire
from nxgate.wire import tls
from nxgate.wire.node_listener import choose
from nxgate.wire.connection import GateFactory
from nxgate.node.local import LocalNode
from nxgate.wire.remote_node import RemoteNode, RemoteNodes, link_problem
from nxgate.gateway.doors.admin.cli import main as admin_main
from nxgate.threads import inline
from nxgate.vocabulary.api import NodeAPI, SessionAPI
from nxgate.vocabulary.caller import Caller
from nxgate.vocabulary.errors import Kind, SessionError
from nxgate.vocabulary.model import State
from nxgate.vocabulary.requests import (DisplaySettings, RemoteRequest, RestoreRequest, ShadowRequest, ShareMount,
                                      StartRequest)
from nxgate.vocabulary.results import (Listing, Progress, Ready, ServiceStatus, SessionView, ShadowTarget,
                                     StreamTarget, UnknownSession, HeldDisplay)
from nxgate.vocabulary.streams import AGENT, StreamKind
from nxgate.vocabulary.streams import VIEW as VIEW_STREAM
from nxgate.wire.relay import StreamRelay
from tests.harness.clock import FakeReactor
from tests.harness.fakes import FakeSessionAPI

CALLER = Caller("alice", 1001, 1001, frozenset({"staff", "nxadmin"}), "10.0.0.9:4711 (claimed by uid 5)",
                "10.0.0.1", "nx-conch", False)
DISPLAY = DisplaySettings("1024x768", True, 16, False, "pc105/de", "adsl", "32M", "128M", "none", "linux", False)
VIEW = SessionView(
    id="A" * 32, full_id="node-b-1001-" + "A" * 32, user="alice", type="unix-console", name="work", display=1001,
    state=State.RUNNING, geometry="1024x768", depth=24, render=True, fullscreen=False, rootless=True,
    encrypted=True, client_address="10.0.0.9", created=1764790000.25, changed=1764790001.5, attached_before=True,
    agent_pid=4242, failure="", node="node-b", program_pid=4343,
    options={"for_later": True, "shadow": {"target": "B" * 32, "mode": "view"}})
STREAM = StreamTarget("A" * 32, "/var/lib/nxgate/sessions/A/agent.sock", 1001)

EXAMPLES = [
    CALLER, DISPLAY, VIEW, STREAM,
    Caller("bob"),
    StartRequest("unix-application", "term", DISPLAY, True, False, ("xterm", "-e", "top"),
                 (("session", "x"), ("cache", "8M")), None),
    StartRequest("windows", "pc", DisplaySettings(), False, False,
                 remote=RemoteRequest("pc.example", "bob", "DOM", "s3cret")),
    RestoreRequest("A" * 32, DISPLAY, False),
    ShadowRequest("B" * 32, DISPLAY, True),
    Ready(VIEW, "c00k1e", True, STREAM),
    Ready(VIEW, "c00k1e", False, None),
    Ready(VIEW, "c", False, StreamTarget("A" * 32, "/p", 7, "node-b", "127.0.0.22:7022")),
    Listing((VIEW, dataclasses.replace(VIEW, id="C" * 32, state=State.SUSPENDED)), True),
    Listing((), False),
    ShadowTarget("A" * 32, "alice", 1001, "work", "unix-console"),
    ServiceStatus(True, 3, 1, (UnknownSession("D" * 32, "carol", 1003, 99),)),
    ServiceStatus(False, 0, 0, (), (HeldDisplay(650, ("bob",), ("X lock /tmp/.X650-lock of pid 77",)),)),
]


def roundtrip(value):
    return wire.decode(type(value), json.loads(json.dumps(wire.encode(value))))


class LinkProblemTests(SynchronousTestCase):
    """A failed link attempt in the words of the member's state (``nxgate-admin nodes``)."""

    def test_words(self):
        self.assertEqual(link_problem("TLS with member node-x failed: [('SSL routines', '', "
                                      "'certificate verify failed')]"),
                         "refused: certificate not from the cluster's CA")
        self.assertEqual(link_problem("[('SSL routines', '', 'tlsv1 alert unknown ca')]"),
                         "refused: it does not trust this gateway's certificate")
        self.assertEqual(link_problem("member node-b: its certificate names node-c, not node-b"),
                         "refused: its certificate names node-c, not node-b")
        self.assertEqual(link_problem("Connection was refused by other side: 111: Connection refused."),
                         "unreachable: Connection was refused by other side: 111: Connection refused.")


class SerialiserTests(SynchronousTestCase):
    def test_every_vocabulary_type_comes_back_equal(self):
        for value in EXAMPLES:
            back = roundtrip(value)
            self.assertEqual(back, value)
            self.assertEqual(type(back), type(value))
        self.assertEqual(roundtrip(VIEW).options, VIEW.options)  # compare=False: checked on its own
        self.assertIs(roundtrip(VIEW).state, State.RUNNING)
        self.assertIsInstance(roundtrip(CALLER).groups, frozenset)
        self.assertIsInstance(roundtrip(EXAMPLES[5]).ignored[0], tuple)
        self.assertEqual(roundtrip(EXAMPLES[6]).remote.password, "s3cret")

    def test_method_signatures_come_from_the_session_api(self):
        # Every coroutine of the node interface travels as a call, but open_stream (a connection of its own).
        coroutines = {name for name, member in vars(NodeAPI).items() if inspect.iscoroutinefunction(member)}
        coroutines |= {name for name, member in vars(SessionAPI).items() if inspect.iscoroutinefunction(member)}
        self.assertEqual(wire.METHODS, coroutines - {"open_stream"})
        self.assertLessEqual({"start", "restore", "terminate", "list", "show", "thumbnail"}, wire.METHODS)
        self.assertEqual(wire.decode_outcome("thumbnail", {"ok": wire.encode(b"\x89PNG\x00")}), b"\x89PNG\x00")
        args = wire.encode_arguments("terminate", (CALLER, "A" * 32, "admin"))
        self.assertEqual(wire.decode_arguments("terminate", json.loads(json.dumps(args))), [CALLER, "A" * 32, "admin"])
        targets = (ShadowTarget("A" * 32, "alice", 1001, "w", "unix-console"),)
        self.assertEqual(wire.decode_outcome("shadow_targets", {"ok": wire.encode(targets)}), targets)
        self.assertIs(wire.decode_outcome("set_draining", {"ok": True}), True)

    def test_a_shared_folder_travels_with_its_password_and_comes_back_equal(self):
        mount = ShareMount(share="docs", name="My Docs", username="alice", password="p4ss", computer="box")
        self.assertEqual(roundtrip(mount), mount)
        self.assertEqual(roundtrip(mount).password, "p4ss")  # compare=True, repr=False: checked on its own
        self.assertNotIn("p4ss", repr(mount))
        args = wire.encode_arguments("add_mount", (CALLER, "A" * 32, mount))
        self.assertEqual(wire.decode_arguments("add_mount", json.loads(json.dumps(args))), [CALLER, "A" * 32, mount])
        self.assertIs(wire.decode_outcome("add_mount", {"ok": False}), False)

    def test_errors_keep_kind_words_and_session(self):
        error = SessionError(Kind.NOT_YOURS, "Could not find session X.", session_id="X")
        with self.assertRaises(SessionError) as caught:
            wire.decode_outcome("show", json.loads(json.dumps(wire.encode_error(error))))
        self.assertEqual((caught.exception.kind, caught.exception.message, caught.exception.session_id),
                         (Kind.NOT_YOURS, "Could not find session X.", "X"))
        with self.assertRaises(SessionError) as caught:
            wire.decode_outcome("show", {"error": {"kind": "from_the_future", "message": "m"}})
        self.assertIs(caught.exception.kind, Kind.INTERNAL)

    def test_bad_shapes_and_methods_are_refused(self):
        for hint, data in ((Caller, ["alice"]), (int, "1"), (int, True), (State, "dancing"),
                           (tuple[str, str], ["a"]), (StreamTarget, {"session_id": "x"})):
            self.assertRaises((ValueError, TypeError, KeyError), wire.decode, hint, data)
        self.assertRaises(ValueError, wire.decode_arguments, "stream_target", [])
        self.assertRaises(ValueError, wire.decode_arguments, "show", [wire.encode(CALLER), "x", "y"])


# --------------------------------------------------------------- TLS pairs
class PKI:
    """A cluster CA and member certificates, made as an admin would."""

    def __init__(self, base):
        self.base = base
        self.ca = os.path.join(base, "ca")
        self.assert_ok(admin_main(["cluster", "ca", self.ca]))

    @staticmethod
    def assert_ok(code):
        assert code == 0, code

    def member(self, name, **options):
        out = os.path.join(self.base, "special" if options else "members")
        if options:
            tls.make_cert(name, self.ca, out, **options)
        else:
            self.assert_ok(admin_main(["cluster", "cert", name, "--ca", self.ca, "--out", out]))
        return self.load(name, os.path.join(out, f"{name}.pem"), os.path.join(out, f"{name}.key"))

    def load(self, name, cert, key):
        return tls.ClusterTLS.load(name, os.path.join(self.ca, "ca.pem"), cert, key)


def openssl_member(base, ca_dir, name, dns):
    """A member certificate made with the openssl command line."""
    key, csr, cert, ext = (os.path.join(base, f"{name}.{suffix}") for suffix in ("key", "csr", "pem", "ext"))
    with open(ext, "w") as handle:
        handle.write(f"subjectAltName=DNS:{dns}\nextendedKeyUsage=serverAuth,clientAuth\n")
    run = lambda *argv: subprocess.run(argv, check=True, capture_output=True)  # noqa: E731
    run("openssl", "req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", f"/CN={name}")
    run("openssl", "x509", "-req", "-in", csr, "-CA", os.path.join(ca_dir, "ca.pem"), "-CAkey",
        os.path.join(ca_dir, "ca.key"), "-CAcreateserial", "-out", cert, "-days", "30", "-extfile", ext)
    return cert, key


class FakeSessions(FakeSessionAPI):
    """Stands in for SessionService: answers from canned values, records calls."""

    def __init__(self):
        self.calls = []
        self.sessions = {}
        self.targets = {}
        self.reactor = reactor
        super().__init__()

    async def on_start(self, caller, request):
        self.calls.append(("start", caller, request))
        return Ready(VIEW, "cookie", False, STREAM)

    async def on_start_for_later(self, caller, session_type, name):
        self.calls.append(("start_for_later", caller, session_type, name))
        return VIEW

    async def on_restore(self, caller, request):
        self.calls.append(("restore", caller, request))
        if request.session_id == "Z" * 32:
            raise SessionError(Kind.NOT_YOURS, f"Could not find session {request.session_id}.",
                               session_id=request.session_id)
        return Ready(VIEW, "cookie", True, STREAM)

    async def on_attach_shadow(self, caller, request, progress=lambda p: None):
        progress(Progress.ASKING_OWNER)
        await deferLater(reactor, 0.05, lambda: None)
        return Ready(VIEW, "cookie", False, None)

    async def on_suspend(self, caller, session_id):
        return VIEW

    async def on_terminate(self, caller, session_id, reason="user request"):
        self.calls.append(("terminate", caller, session_id, reason))
        return VIEW

    async def on_rename(self, caller, session_id, name):
        if not name:
            raise SessionError(Kind.INVALID_REQUEST, "A session name must not be empty.")
        return dataclasses.replace(VIEW, name=name)

    async def on_list(self, caller):
        return Listing(tuple(dataclasses.replace(VIEW, id=f"{n:032X}") for n in range(600)), False)

    async def on_show(self, caller, session_id):
        session = self.sessions.get(session_id)
        if session is None:
            raise RuntimeError("a bug on the node")
        if not caller.owns(session.user):
            raise SessionError(Kind.NOT_YOURS, f"Could not find session {session_id}.", session_id=session_id)
        return dataclasses.replace(VIEW, id=session_id, user=session.user)

    async def on_shadow_targets(self, caller):
        return (ShadowTarget("A" * 32, "alice", 1001, "work", "unix-console"),)

    async def on_status(self, caller):
        return ServiceStatus(False, 1, 0, ())

    async def on_set_draining(self, caller, on):
        return on

    def stream_target(self, session):
        return self.targets.get(session.id)


class SameNumbers:
    """A node whose accounts have the numbers the gateway resolved."""

    async def here(self, caller, machine):
        return caller


class LogCatcher:
    def __init__(self, case):
        self.events = []
        globalLogPublisher.addObserver(self.events.append)
        case.addCleanup(globalLogPublisher.removeObserver, self.events.append)

    def refusals(self):
        return [e for e in self.events if e.get("event") == "cluster_peer_refused"]


class WireTests(TestCase):
    """AMP and streams over real TLS on the loopback interface."""

    def setUp(self):
        self.addCleanup(deferLater, reactor, 0.2, lambda: None)  # last: closing connections finish
        self.base = os.path.abspath(self.mktemp())
        os.makedirs(self.base)
        self.pki = PKI(self.base)
        self.node_tls = self.pki.member("node-b")
        self.gateway_tls = self.pki.member("gw-a")
        self.sessions = FakeSessions()
        self.users = SameNumbers()
        self.authorized = {"gw-a"}
        self.clock = FakeReactor()  # the node's, for re-checks of a member (GateFactory clock)
        self.authorizations = 0
        self.log = LogCatcher(self)

    def node(self):
        """This machine's node as the listener serves it (the caller resolved again by ``self.users``)."""
        return LocalNode(self.sessions, self.users, lambda: "node-1", blocking=None)

    def authorize(self, names):
        self.authorizations += 1
        known = names & self.authorized
        return next(iter(known)) if len(known) == 1 else None

    @defer.inlineCallbacks
    def listen(self, node_tls=None):
        factory = GateFactory(self.authorize, choose(self.node()),
                              clock=self.clock).tls_factory(node_tls or self.node_tls)
        port = yield endpoints.serverFromString(reactor, "tcp:0:interface=127.0.0.1").listen(factory)
        self.addCleanup(port.stopListening)
        return port

    def remote(self, port, gateway_tls=None, name="node-b"):
        node = RemoteNode(reactor, gateway_tls or self.gateway_tls, name, f"127.0.0.1:{port.getHost().port}")
        self.addCleanup(node.close)
        return node

    @defer.inlineCallbacks
    def test_every_call_goes_to_the_node_and_back(self):
        node = self.remote((yield self.listen()))
        request = EXAMPLES[6]
        ready = yield defer.ensureDeferred(node.start(CALLER, request))
        self.assertEqual(self.sessions.calls[0], ("start", CALLER, request))  # the password too, over TLS
        self.assertEqual(ready.view, VIEW)
        self.assertEqual(ready.cookie, "cookie")
        self.assertEqual(ready.stream, dataclasses.replace(STREAM, node="node-b", address=node.address))
        restored = yield defer.ensureDeferred(node.restore(CALLER, EXAMPLES[7]))
        self.assertTrue(restored.resumed)
        seen = []
        shadow = yield defer.ensureDeferred(node.attach_shadow(CALLER, EXAMPLES[8], seen.append))
        self.assertEqual(seen, [Progress.ASKING_OWNER])
        self.assertIsNone(shadow.stream)
        self.assertEqual((yield defer.ensureDeferred(node.start_for_later(CALLER, "unix-console", "n"))), VIEW)
        self.assertEqual((yield defer.ensureDeferred(node.suspend(CALLER, "A" * 32))), VIEW)
        yield defer.ensureDeferred(node.terminate(CALLER, "A" * 32))
        self.assertEqual(self.sessions.calls[-1], ("terminate", CALLER, "A" * 32, "user request"))
        self.assertEqual((yield defer.ensureDeferred(node.rename(CALLER, "A" * 32, "new"))).name, "new")
        listing = yield defer.ensureDeferred(node.list(CALLER))  # ~600 KB of JSON: more than one AMP value
        self.assertEqual(len(listing.sessions), 600)
        self.assertEqual(listing.sessions[599].id, f"{599:032X}")
        self.assertEqual((yield defer.ensureDeferred(node.shadow_targets(CALLER)))[0].owner, "alice")
        self.assertEqual((yield defer.ensureDeferred(node.status(CALLER))), ServiceStatus(False, 1, 0, ()))
        self.assertIs((yield defer.ensureDeferred(node.set_draining(CALLER, True))), True)

    @defer.inlineCallbacks
    def test_a_bug_of_the_gateway_is_internal_not_an_unreachable_node(self):
        """Issue 23: an argument this gateway cannot encode used to be reported
        as "the session node cannot be reached"."""
        node = self.remote((yield self.listen()))
        error = yield self.assertFailure(defer.ensureDeferred(node.rename(CALLER, "A" * 32, object())), SessionError)
        self.assertEqual((error.kind, error.message), (Kind.INTERNAL, "Internal error on this gateway."))
        self.assertEqual(len(self.flushLoggedErrors(TypeError)), 1)
        self.assertFalse([e for e in self.log.events if e.get("event") == "cluster_member_unreachable"])

    @defer.inlineCallbacks
    def test_the_node_resolves_the_account_itself(self):
        """Issue 23: a node trusts no uid or gid from the gateway; an account it
        does not have is refused, and the session service is not asked."""
        self.users = UserDirectory(inline)
        node = self.remote((yield self.listen()))
        nobody = pwd.getpwnam("nobody")
        numbered_elsewhere = dataclasses.replace(CALLER, user="nobody", uid=1001, gid=1001, groups=frozenset({"x"}))
        yield defer.ensureDeferred(node.start_for_later(numbered_elsewhere, "unix-console", "n"))
        caller = self.sessions.calls[-1][1]
        self.assertEqual((caller.uid, caller.gid), (nobody.pw_uid, nobody.pw_gid))
        self.assertNotIn("x", caller.groups)
        self.assertEqual(caller.address, CALLER.address)
        unknown = dataclasses.replace(CALLER, user="nxgate-no-such-user")
        error = yield self.assertFailure(defer.ensureDeferred(node.start_for_later(unknown, "unix-console", "n")),
                                         SessionError)
        self.assertEqual(error.kind, Kind.NOT_ALLOWED)
        self.assertIn("does not exist on the machine node-1", error.message)
        self.assertEqual(len(self.sessions.calls), 1)

    @defer.inlineCallbacks
    def test_refusals_keep_their_kind_and_a_node_bug_is_internal(self):
        node = self.remote((yield self.listen()))
        error = yield self.assertFailure(defer.ensureDeferred(node.restore(CALLER, RestoreRequest("Z" * 32, DISPLAY, True))),
                                         SessionError)
        self.assertEqual((error.kind, error.message, error.session_id),
                         (Kind.NOT_YOURS, f"Could not find session {'Z' * 32}.", "Z" * 32))
        error = yield self.assertFailure(defer.ensureDeferred(node.rename(CALLER, "A" * 32, "")), SessionError)
        self.assertEqual(error.kind, Kind.INVALID_REQUEST)
        error = yield self.assertFailure(defer.ensureDeferred(node.show(CALLER, "A" * 32)), SessionError)
        self.assertEqual(error.kind, Kind.INTERNAL)
        self.flushLoggedErrors(RuntimeError)

    @defer.inlineCallbacks
    def test_an_unreachable_member_is_unavailable_and_the_next_call_reconnects(self):
        port = yield self.listen()
        number = port.getHost().port
        yield port.stopListening()
        node = RemoteNode(reactor, self.gateway_tls, "node-b", f"127.0.0.1:{number}")
        self.addCleanup(node.close)
        error = yield self.assertFailure(defer.ensureDeferred(node.status(CALLER)), SessionError)
        self.assertEqual(error.kind, Kind.UNAVAILABLE)
        self.assertIn("node-b", error.message)
        self.assertTrue([e for e in self.log.events if e.get("event") == "cluster_member_unreachable"])
        self.assertTrue(error.unreachable)  # nothing was asked: a start may be placed elsewhere
        self.assertIsNotNone(node.broken_at)  # the gateway sees it down before its heartbeats go stale
        self.assertRegex(node.link_state, r"^unreachable: .*refused")
        factory = GateFactory(self.authorize, choose(self.node())).tls_factory(self.node_tls)
        again = yield endpoints.serverFromString(reactor, f"tcp:{number}:interface=127.0.0.1").listen(factory)
        self.addCleanup(again.stopListening)
        self.assertEqual((yield defer.ensureDeferred(node.status(CALLER))), ServiceStatus(False, 1, 0, ()))
        self.assertIsNone(node.broken_at)
        self.assertEqual(node.link_state, "up")
        # The node goes away during the connection's life: the next call dials again.
        node.connection.transport.abortConnection()
        yield deferLater(reactor, 0.05, lambda: None)
        self.assertIsNotNone(node.broken_at)  # seen at once, not three heartbeats later
        self.assertEqual(node.link_state, "unreachable: its connection closed")
        self.assertIs((yield defer.ensureDeferred(node.set_draining(CALLER, False))), False)
        self.assertIsNone(node.broken_at)

    @defer.inlineCallbacks
    def test_a_broken_member_link_is_dialled_again_in_the_background(self):
        """Issue 23: the link is Twisted's ClientService: after a break it
        reconnects by itself (backing off), not only at the next call."""
        node = self.remote((yield self.listen()))
        yield defer.ensureDeferred(node.status(CALLER))
        first = node.connection
        first.transport.abortConnection()
        yield deferLater(reactor, 0.05, lambda: None)
        self.assertIsNotNone(node.broken_at)
        for _ in range(100):  # the first retry comes after about a second
            if node.connection is not None:
                break
            yield deferLater(reactor, 0.05, lambda: None)
        self.assertIsNotNone(node.connection)
        self.assertIsNot(node.connection, first)
        self.assertIsNone(node.broken_at)

    @defer.inlineCallbacks
    def test_remote_nodes_keeps_one_per_member(self):
        nodes = RemoteNodes(None, reactor, self.gateway_tls)
        self.assertEqual(nodes.link_state("node-b"), "connecting")  # not dialled yet: not up either
        self.assertIs(nodes.get("node-b", "127.0.0.1:1"), nodes.get("node-b", "127.0.0.1:1"))
        self.assertIsNot(nodes.get("node-b", "127.0.0.1:1"), nodes.get("node-b", "127.0.0.1:2"))
        yield None

    @defer.inlineCallbacks
    def assert_refused(self, node, reason_words, link_state=None):
        """``link_state``: the member's state for this gateway (``nxgate-admin nodes``) after the refusal."""
        error = yield self.assertFailure(defer.ensureDeferred(node.status(CALLER)), SessionError)
        self.assertEqual(error.kind, Kind.UNAVAILABLE)
        yield deferLater(reactor, 0.1, lambda: None)
        self.assertEqual(self.sessions.calls, [])
        reasons = " | ".join(e.get("reason", "") for e in self.log.refusals())
        self.assertIn(reason_words, reasons)
        if link_state is not None:
            self.assertEqual(node.link_state, link_state)

    @defer.inlineCallbacks
    def test_a_gateway_with_a_certificate_of_another_ca_is_refused(self):
        port = yield self.listen()
        other = PKI(os.path.join(self.base, "other"))
        # Its CA is another too: it trusts no certificate of the cluster, the node's included.
        yield self.assert_refused(self.remote(port, other.member("gw-a")), "not the cluster CA",
                                  "refused: certificate not from the cluster's CA")

    @defer.inlineCallbacks
    def test_a_node_with_a_certificate_of_another_ca_is_refused_by_the_gateway(self):
        other = PKI(os.path.join(self.base, "other"))
        port = yield self.listen(other.member("node-b"))
        yield self.assert_refused(self.remote(port), "not the cluster CA",
                                  "refused: certificate not from the cluster's CA")

    @defer.inlineCallbacks
    def test_an_expired_certificate_is_refused(self):
        port = yield self.listen()
        old = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=10)
        expired = self.pki.member("gw-a", valid_from=old, days=1)
        yield self.assert_refused(self.remote(port, expired), "it has expired")

    @defer.inlineCallbacks
    def test_a_node_naming_another_member_is_refused(self):
        port = yield self.listen(self.pki.member("node-c"))
        yield self.assert_refused(self.remote(port, name="node-b"), "names node-c, not node-b",
                                  "refused: its certificate names node-c, not node-b")

    @defer.inlineCallbacks
    def test_a_peer_that_is_no_gateway_is_refused(self):
        port = yield self.listen()
        yield self.assert_refused(self.remote(port, self.pki.member("node-c")),
                                  "names node-c, not a member with role gateway")

    @defer.inlineCallbacks
    def test_a_peer_without_a_certificate_is_refused(self):
        from OpenSSL import SSL
        from twisted.internet import ssl
        from twisted.protocols.tls import TLSMemoryBIOFactory

        port = yield self.listen()
        context = SSL.Context(SSL.TLS_METHOD)
        context.load_verify_locations(os.path.join(self.pki.ca, "ca.pem").encode())
        closed = defer.Deferred()

        class Probe(protocol.Protocol):
            def connectionMade(self):
                self.transport.write(b"\x00\x04xxxx")

            def connectionLost(self, reason):
                closed.callback(reason.getErrorMessage())

        creator = ssl.optionsForClientTLS("node-b", trustRoot=ssl.Certificate.loadPEM(
            open(os.path.join(self.pki.ca, "ca.pem"), "rb").read()))
        factory = TLSMemoryBIOFactory(creator, True, protocol.Factory.forProtocol(Probe))
        yield endpoints.TCP4ClientEndpoint(reactor, "127.0.0.1", port.getHost().port).connect(factory)
        why = yield closed
        self.assertIn("certificate required", why)
        yield deferLater(reactor, 0.05, lambda: None)
        self.assertEqual(self.sessions.calls, [])
        self.assertTrue(self.log.refusals(), "the refusal is logged")

    @defer.inlineCallbacks
    def test_openssl_made_certificates_work(self):
        cert, key = openssl_member(self.base, self.pki.ca, "gw-openssl", "gw-a")
        port = yield self.listen()
        node = self.remote(port, self.pki.load("gw-a", cert, key))
        self.assertEqual((yield defer.ensureDeferred(node.status(CALLER))), ServiceStatus(False, 1, 0, ()))

    def test_keys_are_private(self):
        out = os.path.join(self.base, "members")
        for name in ("node-b.key", "gw-a.key"):
            self.assertEqual(stat.S_IMODE(os.stat(os.path.join(out, name)).st_mode), 0o600)
        self.assertEqual(stat.S_IMODE(os.stat(os.path.join(self.pki.ca, "ca.key")).st_mode), 0o600)
        self.assertEqual(admin_main(["cluster", "cert", "node-b", "--ca", self.pki.ca, "--out", out]), 1)

    # --------------------------------------------------------- streams
    def agent(self, session_id="A" * 32, user="alice"):
        """An echoing 'agent' on a Unix socket, and the session (of ``user``) that owns it."""
        short = tempfile.mkdtemp(prefix="nxcw")  # Unix socket paths are short
        self.addCleanup(shutil.rmtree, short, True)
        path = os.path.join(short, "agent.sock")

        class Echo(protocol.Protocol):
            def dataReceived(self, data):
                self.transport.write(data.upper())

        port = reactor.listenUNIX(path, protocol.Factory.forProtocol(Echo))
        self.addCleanup(port.stopListening)
        session = dataclasses.make_dataclass("S", [("id", str), ("state", State), ("user", str)])(
            session_id, State.RUNNING, user)
        self.sessions.sessions[session_id] = session
        self.sessions.targets[session_id] = StreamTarget(session_id, path, os.getuid())
        return session_id

    @defer.inlineCallbacks
    def test_the_relay_reaches_an_agent_on_another_member(self):
        node = self.remote((yield self.listen()))
        channel = FakeChannel()
        relay = StreamRelay(CALLER, self.agent(), channel, b"hello ", node.open_stream)
        relay.write(b"world")
        yield channel.wait_for(b"HELLO WORLD")
        relay.close()
        yield deferLater(reactor, 0.05, lambda: None)

    @defer.inlineCallbacks
    def open_stream(self, node, session_id, data=b"ping"):
        channel = FakeChannel()
        relay = StreamRelay(CALLER, session_id, channel, data, node.open_stream)
        yield channel.wait_for(data.upper())
        relay.close()
        yield deferLater(reactor, 0.05, lambda: None)  # the spare is dialled once the node answered

    @defer.inlineCallbacks
    def test_the_next_stream_to_a_member_takes_a_spare_connection(self):
        """Issue 25: after a stream opened, one connection to that member is
        kept ready, and the next stream uses it (no TCP connect or handshake)."""
        node = self.remote((yield self.listen()))
        session_id = self.agent()
        yield self.open_stream(node, session_id)
        self.assertEqual(self.authorizations, 2)  # the stream's connection and the spare
        spare = node.streams.spares[("node-b", node.address)][0]
        yield self.open_stream(node, session_id, b"again")
        self.assertTrue(spare.open)  # it carried the second stream
        self.assertEqual(self.authorizations, 3)  # and a new spare was dialled
        node.streams.close()
        self.assertEqual(node.streams.spares, {})

    @defer.inlineCallbacks
    def test_a_spare_used_later_has_its_member_checked_again(self):
        node = self.remote((yield self.listen()))
        session_id = self.agent()
        yield self.open_stream(node, session_id)
        self.clock.advance(60)  # the spare waited a minute; meanwhile gw-a left the cluster
        self.authorized = set()
        channel = FakeChannel()
        StreamRelay(CALLER, session_id, channel, b"ping", node.open_stream)
        yield channel.closed
        self.assertEqual(channel.data, b"")
        self.assertIn("names gw-a, not a member with role gateway",
                      " | ".join(e.get("reason", "") for e in self.log.refusals()))

    @defer.inlineCallbacks
    def test_control_and_stream_connections_send_small_writes_at_once(self):
        """TCP_NODELAY on both ends of AMP and of a stream: a request written
        right after the TLS handshake must not wait for a delayed ACK."""
        gates = []
        factory = GateFactory(self.authorize, choose(self.node()))
        build = factory.buildProtocol
        factory.buildProtocol = lambda addr: gates.append(build(addr)) or gates[-1]
        port = yield endpoints.serverFromString(reactor, "tcp:0:interface=127.0.0.1").listen(
            factory.tls_factory(self.node_tls))
        self.addCleanup(port.stopListening)
        node = self.remote(port)
        yield defer.ensureDeferred(node.status(CALLER))
        self.assertTrue(node.connection.transport.getTcpNoDelay(), "the gateway's AMP connection")
        self.assertTrue(gates[0].transport.getTcpNoDelay(), "the node's AMP connection")
        channel = FakeChannel()
        relay = StreamRelay(CALLER, self.agent(), channel, b"ping", node.open_stream)
        yield channel.wait_for(b"PING")
        self.assertTrue(relay.agent.getTcpNoDelay(), "the gateway's end of the stream")
        self.assertTrue(gates[1].transport.getTcpNoDelay(), "the node's end of the stream")
        relay.close()
        yield deferLater(reactor, 0.05, lambda: None)

    @defer.inlineCallbacks
    def test_a_big_write_goes_to_tcp_as_one_write_and_arrives_whole(self):
        """One application write -> one TCP write of all its TLS records (not
        one per 16 KiB record), byte for byte, both ways."""
        node = self.remote((yield self.listen()))
        channel = FakeChannel()
        relay = StreamRelay(CALLER, self.agent(), channel, b"x", node.open_stream)
        yield channel.wait_for(b"X")
        tcp = relay.agent.transport  # under the TLS protocol
        writes = []
        write = tcp.write
        tcp.write = lambda data: (writes.append(len(data)), write(data))
        block = bytes(range(97, 123)) * 10000  # 260,000 bytes of a-z
        relay.write(block)
        self.assertEqual(len(writes), 1, writes)
        self.assertGreater(writes[0], len(block))  # the records' headers and tags
        yield channel.wait_for(b"X" + block.upper())
        self.assertEqual(channel.data, b"X" + block.upper())
        relay.close()
        yield deferLater(reactor, 0.05, lambda: None)

    def test_a_process_that_makes_member_connections_keeps_freed_buffers(self):
        """glibc's malloc is told once to keep freed stream buffers (a relaying
        process otherwise faulted fresh pages in for most reads and records)."""
        from nxgate.wire import heap

        GateFactory(lambda names: None, lambda head, member: None).tls_factory(self.node_tls)
        self.assertEqual(heap._applied, [True])  # Debian's libc is glibc: applied, once
        self.assertTrue(heap.keep_freed_memory())
        self.assertEqual(heap._applied, [True])

    def test_the_records_of_one_tcp_read_reach_the_stream_as_one_piece(self):
        """Twisted's TLS hands over 16 KiB records one by one; the gate passes
        what one read decrypted to as one piece (fewer, fuller SSH packets and
        agent writes downstream), in order, and before the end."""
        from twisted.internet.address import IPv4Address
        from twisted.test import iosim

        from nxgate.wire.connection import _ClientGate, _TLSFactory

        got, ends = [], []

        class Collect(protocol.Protocol):
            def dataReceived(self, data):
                got.append(data)

            def connectionLost(self, reason):
                ends.append(len(b"".join(got)))

        server_factory = GateFactory(lambda names: "gw-a", lambda head, member: Collect()).tls_factory(self.node_tls)
        ready = defer.Deferred()
        sender = protocol.Protocol()
        client_factory = _TLSFactory(self.gateway_tls.client("node-b"), True, protocol.Factory.forProtocol(
            lambda: _ClientGate(sender, "node-b", ready, self.gateway_tls)))
        address = IPv4Address("TCP", "127.0.0.1", 7022)
        server, client = server_factory.buildProtocol(address), client_factory.buildProtocol(address)
        pump = iosim.connect(server, iosim.makeFakeServer(server), client, iosim.makeFakeClient(client))
        self.assertTrue(ready.called)
        block = bytes(range(256)) * 1024  # 256 KiB: 16 records
        for offset in range(0, len(block), 16384):
            sender.transport.write(block[offset:offset + 16384])
        pump.flush()  # the 16 writes' records arrive in one read
        self.assertEqual(b"".join(got), block)
        self.assertEqual(len(got), 1, [len(piece) for piece in got])
        sender.transport.write(b"last")
        sender.transport.loseConnection()
        pump.flush()
        self.assertEqual(b"".join(got), block + b"last")
        self.assertEqual(ends, [len(block) + 4])

    @defer.inlineCallbacks
    def test_a_stream_for_an_unknown_session_is_refused(self):
        node = self.remote((yield self.listen()))
        self.agent()
        channel = FakeChannel()
        StreamRelay(CALLER, "F" * 32, channel, b"", node.open_stream)
        yield channel.closed
        self.flushLoggedErrors(RuntimeError)  # the fake node's show knows no such session
        self.assertTrue([e for e in self.log.events if "cannot reach the agent of session" in e.get("log_format", "")])

    @defer.inlineCallbacks
    def test_a_stream_of_another_users_session_is_refused_with_the_nodes_words(self):
        """The node checks the owner of a stream as of any call: another
        user's session is NOT_YOURS, with NOT_FOUND's words, and nothing of
        the agent is reached."""
        node = self.remote((yield self.listen()))
        session_id = self.agent(user="bob")
        error = yield self.assertFailure(defer.ensureDeferred(node.open_stream(CALLER, session_id, AGENT)),
                                         SessionError)
        self.assertEqual((error.kind, error.message), (Kind.NOT_YOURS, f"Could not find session {session_id}."))

    @defer.inlineCallbacks
    def test_a_stream_of_an_unknown_kind_is_refused_with_words(self):
        node = self.remote((yield self.listen()))
        session_id = self.agent()
        error = yield self.assertFailure(
            defer.ensureDeferred(node.open_stream(CALLER, session_id, StreamKind("accept", 3))), SessionError)
        self.assertEqual(error.kind, Kind.INVALID_REQUEST)
        self.assertEqual(error.message, "Machine node-1 opens no stream of kind accept 3.")

    @defer.inlineCallbacks
    def test_a_view_stream_of_a_session_the_node_cannot_show_is_refused_with_words(self):
        """Issue 25: the ``view`` kind of stream (a browser viewer on the node); a node without
        viewers answers with its words, which the gateway hands on, and starts nothing."""
        node = self.remote((yield self.listen()))
        session_id = self.agent()
        error = yield self.assertFailure(defer.ensureDeferred(node.open_stream(CALLER, session_id, VIEW_STREAM)),
                                         SessionError)
        self.assertEqual((error.kind, error.message), (Kind.UNAVAILABLE, "Machine node-1 shows no sessions in a browser."))

    def test_the_stream_request_carries_the_call_and_refusals_their_kind(self):
        line = wire.stream_request(CALLER, "A" * 32, VIEW_STREAM)
        self.assertTrue(line.startswith(b"NXSTREAM ") and line.endswith(b"\n"))
        self.assertEqual(wire.read_stream_request(line[:-1]), [CALLER, "A" * 32, VIEW_STREAM])
        for bad in (b"NXSTREAM [1]", b"NXSTREAM {", b"GET / HTTP/1.1",
                    wire.stream_request(CALLER, "A" * 32, AGENT)[:-1].replace(b'"agent"', b'"Agent!"')):
            self.assertRaises(ValueError, wire.read_stream_request, bad)
        self.assertIsNone(wire.read_stream_answer(b"OK"))
        refusal = wire.stream_refusal(SessionError(Kind.NOT_YOURS, "Could not find session X.", session_id="X"))
        error = self.assertRaises(SessionError, wire.read_stream_answer, refusal[:-1])
        self.assertEqual((error.kind, error.message, error.session_id), (Kind.NOT_YOURS, "Could not find session X.", "X"))
        for bad in (b"ERR", b"ERR {}", b"ERR []", b"ERR {\"error\": {}}", b"HELLO"):
            self.assertRaises(ValueError, wire.read_stream_answer, bad)
        self.assertNotIn("open_stream", wire.METHODS)  # not an AMP call: its result is a connection
        self.assertRaises(ValueError, wire.decode_arguments, "open_stream", [wire.encode(CALLER), "A", {"word": "agent"}])

    @defer.inlineCallbacks
    def test_an_unreachable_member_is_unavailable(self):
        node = RemoteNode(reactor, self.gateway_tls, "node-b", "127.0.0.1:1")
        self.addCleanup(node.close)
        error = yield self.assertFailure(defer.ensureDeferred(node.open_stream(CALLER, "A" * 32, AGENT)),
                                         SessionError)
        self.assertEqual(error.kind, Kind.UNAVAILABLE)

    @defer.inlineCallbacks
    def test_the_openssh_door_gets_a_socket_to_the_remote_agent(self):
        node = self.remote((yield self.listen()))
        stream = yield defer.ensureDeferred(node.open_stream(CALLER, self.agent(), AGENT))
        sock = stream.take_socket()
        sock.sendall(b"abc")
        data = yield defer.ensureDeferred(read_some(sock))
        self.assertEqual(data, b"ABC")
        sock.close()


async def read_some(sock):
    sock.setblocking(False)
    for _ in range(100):
        try:
            data = sock.recv(100)
            if data:
                return data
        except BlockingIOError:
            pass
        await deferLater(reactor, 0.02, lambda: None)
    raise AssertionError("nothing came back")


class FakeChannel:
    """The client's SSH channel as the relay sees it."""

    def __init__(self):
        self.data = b""
        self.closed = defer.Deferred()
        self.paused = False
        self.waiting = None

    def write(self, data):
        self.data += data
        if self.waiting and self.waiting[0] in self.data:
            waiting, self.waiting = self.waiting, None  # the callback may wait for more at once
            waiting[1].callback(None)

    def wait_for(self, expected):
        d = defer.Deferred()
        if expected in self.data:
            d.callback(None)
        else:
            self.waiting = (expected, d)
        return d

    def close(self):
        if not self.closed.called:
            self.closed.callback(None)

    def pause_input(self):
        self.paused = True

    def resume_input(self):
        self.paused = False


