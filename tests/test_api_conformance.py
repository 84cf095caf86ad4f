"""Every implementation of the session API has its methods with its
signatures (issue 23): the node's session service, the router every door
uses, and the two nodes the router talks to (this machine's in process,
another member's over the wire), which also implement the node interface, and
the tests' one fake of each interface (tests/harness/fakes.py).  A method
added to one and forgotten in another, or an argument renamed, fails here
instead of at a door or in a test that still passes against an old fake.
The router has the node interface's calls about one session too
(``thumbnail``, ``open_stream``: a door reaches a session's bytes only
through it)."""

from __future__ import annotations

import inspect

from twisted.internet import defer
from twisted.trial.unittest import SynchronousTestCase

from nxgate.wire.remote_node import RemoteNode
from nxgate.gateway.router import Router
from nxgate.node.local import LocalNode
from nxgate.vocabulary.api import NodeAPI, SessionAPI
from nxgate.node.service import SessionService
from nxgate.vocabulary.errors import Kind, SessionError
from tests.harness.fakes import FakeNodeAPI, FakeSessionAPI, UnexpectedCall

IMPLEMENTATIONS = (SessionService, Router, RemoteNode, LocalNode, FakeSessionAPI, FakeNodeAPI)
NODES = (RemoteNode, LocalNode, FakeNodeAPI)
#: What the router routes of the node interface beyond the session API (``subscribe`` is its ``observers``).
ROUTED = ("thumbnail", "open_stream")


def api_methods(api: type = SessionAPI) -> dict[str, inspect.Signature]:
    """The public methods ``api`` declares (its own and its bases')."""
    return {name: inspect.signature(value) for owner in reversed(api.__mro__) for name, value in vars(owner).items()
            if callable(value) and not name.startswith("_") and owner not in (object,)
            and getattr(owner, "_is_protocol", False)}


def shape(parameter: inspect.Parameter) -> tuple[object, ...]:
    """A parameter as callers see it (a callable default is "a callable")."""
    default = "<callable>" if callable(parameter.default) else parameter.default
    return parameter.name, parameter.kind, default


class ConformanceTests(SynchronousTestCase):
    def test_the_api_is_not_empty(self):
        self.assertGreaterEqual(len(api_methods()), 13)
        self.assertEqual(set(api_methods(NodeAPI)) - set(api_methods()), {"thumbnail", "subscribe", "open_stream"})

    def test_every_node_has_the_node_interface(self):
        for node in NODES:
            for name, expected in api_methods(NodeAPI).items():
                with self.subTest(node=node.__name__, method=name):
                    method = getattr(node, name, None)
                    self.assertIsNotNone(method, f"{node.__name__} has no {name}")
                    self.assertEqual(inspect.iscoroutinefunction(method),
                                     inspect.iscoroutinefunction(getattr(NodeAPI, name)))
                    self.assertEqual([shape(p) for p in inspect.signature(method).parameters.values()],
                                     [shape(p) for p in expected.parameters.values()])

    def test_the_router_draws_thumbnails_and_opens_streams_through_the_nodes(self):
        node_api = api_methods(NodeAPI)
        for name in ROUTED:
            with self.subTest(method=name):
                method = getattr(Router, name, None)
                self.assertIsNotNone(method, f"Router has no {name}")
                self.assertTrue(inspect.iscoroutinefunction(method))
                self.assertEqual([shape(p) for p in inspect.signature(method).parameters.values()],
                                 [shape(p) for p in node_api[name].parameters.values()])

    def test_open_stream_is_on_every_node_and_the_router(self):
        """The one way to a session's bytes, with one signature everywhere (the checks above, named)."""
        expected = inspect.signature(NodeAPI.open_stream)
        for implementation in NODES + (Router,):
            with self.subTest(implementation=implementation.__name__):
                self.assertEqual(inspect.signature(implementation.open_stream), expected)

    def test_every_implementation_has_every_method_with_its_signature(self):
        for implementation in IMPLEMENTATIONS:
            for name, expected in api_methods().items():
                with self.subTest(implementation=implementation.__name__, method=name):
                    method = getattr(implementation, name, None)
                    self.assertIsNotNone(method, f"{implementation.__name__} has no {name}")
                    self.assertTrue(inspect.iscoroutinefunction(method), f"{implementation.__name__}.{name}")
                    got = inspect.signature(method)
                    self.assertEqual([shape(p) for p in got.parameters.values()],
                                     [shape(p) for p in expected.parameters.values()],
                                     f"{implementation.__name__}.{name}{got} is not SessionAPI.{name}{expected}")


class FakeTests(SynchronousTestCase):
    """The shared fakes answer what a test says, and refuse what it did not."""

    def call(self, coroutine):
        return defer.ensureDeferred(coroutine)

    def test_values_errors_and_functions_answer(self):
        refused = SessionError(Kind.NOT_FOUND, "No such session.")
        fake = FakeNodeAPI(status="status", show=refused, thumbnail=lambda caller, session_id: session_id.encode())
        self.assertEqual(self.successResultOf(self.call(fake.status(None))), "status")
        self.assertIs(self.failureResultOf(self.call(fake.show(None, "S")), SessionError).value, refused)
        self.assertEqual(self.successResultOf(self.call(fake.thumbnail(None, "S"))), b"S")
        self.assertEqual(fake.received, [("status", None), ("show", None, "S"), ("thumbnail", None, "S")])
        self.assertEqual(fake.called("show"), [(None, "S")])

    def test_a_call_the_test_did_not_answer_fails_it(self):
        self.failureResultOf(self.call(FakeSessionAPI(list=None).suspend(None, "S")), UnexpectedCall)
        self.assertIsNone(self.successResultOf(self.call(FakeSessionAPI(default=None).suspend(None, "S"))))

    def test_an_answer_for_no_method_and_a_redefined_method_are_refused(self):
        self.assertRaises(TypeError, FakeSessionAPI, lsit=None)
        self.assertRaises(TypeError, FakeSessionAPI, thumbnail=b"")  # the node interface's, not the session API's
        with self.assertRaises(TypeError):
            type("Drifting", (FakeSessionAPI,), {"start": lambda self, caller: None})

    def test_events_reach_the_subscribers_until_they_stop(self):
        fake, heard = FakeNodeAPI(), []
        stop = fake.subscribe(heard.append)
        fake.publish("event")
        stop()
        fake.publish("another")
        self.assertEqual(heard, ["event"])
