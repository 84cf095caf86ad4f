"""Every implementation of the session API has its methods with its
signatures (issue 23): the local service, the cluster's router and the
remote node a gateway talks to.  A method added to one and forgotten in
another, or an argument renamed, fails here instead of at a door."""

from __future__ import annotations

import inspect

from twisted.trial.unittest import SynchronousTestCase

from nxgate.cluster.remote import RemoteNode
from nxgate.cluster.sessions import ClusterSessions
from nxgate.sessions.api import SessionAPI
from nxgate.sessions.service import SessionService

IMPLEMENTATIONS = (SessionService, ClusterSessions, RemoteNode)


def api_methods() -> dict[str, inspect.Signature]:
    return {name: inspect.signature(value) for name, value in vars(SessionAPI).items()
            if inspect.iscoroutinefunction(value) and not name.startswith("_")}


def shape(parameter: inspect.Parameter) -> tuple[object, ...]:
    """A parameter as callers see it (a callable default is "a callable")."""
    default = "<callable>" if callable(parameter.default) else parameter.default
    return parameter.name, parameter.kind, default


class ConformanceTests(SynchronousTestCase):
    def test_the_api_is_not_empty(self):
        self.assertGreaterEqual(len(api_methods()), 13)

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
