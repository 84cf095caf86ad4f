"""The import rules (issues 12 and 23): which part of nxgate may import which.

The layout says who owns what: ``vocabulary`` (pure words every part speaks), ``gateway`` (the doors, the
router, logins, the composition root), ``node`` (the session service, kinds, agents, store, host work),
``wire`` (what crosses a socket), ``protocols`` (pure codecs) and ``clients`` (programs that use a
session).  These rules keep it that way; review misses a single stray ``from nxgate.protocols.nx import
...`` in a function body; this test does not.

Every import is collected with :mod:`ast` at any depth (function bodies and ``TYPE_CHECKING`` blocks too),
relative imports resolved, as the dotted name of what is imported.  Each rule is a pure function of
``{module: imports}``; :class:`TreeTests` also checks that the tree it reads has every package the rules
name and more than a minimum of modules, so a rule can never pass on an empty or misplaced tree.
"""

from __future__ import annotations

import ast
import os
import sys
from collections.abc import Callable, Iterable, Mapping

from twisted.trial.unittest import TestCase

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

Graph = Mapping[str, frozenset[str]]
Rule = Callable[[Graph], list[str]]

VOCAB = "nxgate.vocabulary"
#: What the node must never import: the gateway (doors, router, logins), the NX protocol, nxgate-client, twistd's tap.
FRONT = ("nxgate.gateway", "nxgate.protocols.nx", "nxgate.clients.nx", "nxgate.tap")
#: The packages the rules name: each must exist in the tree.
PACKAGES = ("nxgate.vocabulary", "nxgate.gateway", "nxgate.gateway.doors", "nxgate.node", "nxgate.node.agents",
            "nxgate.wire", "nxgate.protocols", "nxgate.protocols.nx", "nxgate.clients", "nxgate.clients.nx")
NOT_IN_NX_CORE = frozenset({"os", "socket", "subprocess", "threading", "signal", "select", "selectors", "asyncio",
                            "multiprocessing", "pwd", "grp", "sqlite3", "time", "twisted", "zope", "OpenSSL"})


def within(name: str, *packages: str) -> bool:
    """Whether the dotted ``name`` is one of ``packages`` or inside one of them."""
    return any(name == package or name.startswith(package + ".") for package in packages)


def in_vocab(name: str) -> bool:
    return within(name, VOCAB)


def module_name(path: str) -> tuple[str, bool]:
    """``nxgate/gateway/doors/conch/server.py`` -> (``nxgate.gateway.doors.conch.server``, False); an ``__init__.py`` is its package."""
    parts = os.path.relpath(path, REPO)[:-3].split(os.sep)
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def imports_of(source: str, module: str, is_package: bool = False) -> frozenset[str]:
    """Every name ``module`` imports, at any depth, relative imports made absolute."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            found.update(f"{origin}.{alias.name}" if alias.name != "*" else origin for alias in node.names)
    return frozenset(found)


def bare_ensure_deferred(source: str) -> int:
    """How many expression statements are a bare ``ensureDeferred(...)``: a Deferred nobody watches."""
    count = 0
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            func = node.value.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            count += name == "ensureDeferred"
    return count


def nxgate_imports(imports: Iterable[str]) -> list[str]:
    return sorted(name for name in imports if within(name, "nxgate"))


def top_level(name: str) -> str:
    return name.split(".")[0]


# ----------------------------------------------------------------------------------------------------------
# The rules: each takes {module: imports} and returns one line per violation.


def l1_the_node_ignores_the_front(graph: Graph) -> list[str]:
    """L1: the node imports no gateway (door, router, login), no NX protocol, no nxgate-client, no tap."""
    return [f"L1 {module} imports {name}" for module, imports in sorted(graph.items())
            if within(module, "nxgate.node")
            for name in sorted(imports) if within(name, *FRONT)]


def l2_agents_stand_apart(graph: Graph) -> list[str]:
    """L2: the agents (nxagent, jail, remote desktops, shadow screens) use the vocabulary, never the rest
    of the node: the node drives them, not the other way round."""
    return [f"L2 {module} imports {name} (agents do not use the node)" for module, imports in sorted(graph.items())
            if within(module, "nxgate.node.agents")
            for name in sorted(imports) if within(name, "nxgate.node") and not within(name, "nxgate.node.agents")]


def l3_nx_core_is_pure(graph: Graph) -> list[str]:
    """L3: nxgate.protocols.nx imports only itself, the vocabulary and safetext from nxgate, and no I/O,
    clock or Twisted."""
    found = []
    for module, imports in sorted(graph.items()):
        if not within(module, "nxgate.protocols.nx"):
            continue
        for name in sorted(imports):
            if within(name, "nxgate"):
                if not (within(name, "nxgate.protocols.nx", "nxgate.safetext") or in_vocab(name)):
                    found.append(f"L3 {module} imports {name}")
            elif top_level(name) in NOT_IN_NX_CORE:
                found.append(f"L3 {module} imports {name} (the NX core does no I/O)")
    return found


def l4_vocabulary_stands_alone(graph: Graph) -> list[str]:
    """L4: the vocabulary imports only itself and safetext from nxgate, and no Twisted."""
    found = []
    for module, imports in sorted(graph.items()):
        if not in_vocab(module):
            continue
        for name in sorted(imports):
            if within(name, "nxgate") and not (in_vocab(name) or within(name, "nxgate.safetext")):
                found.append(f"L4 {module} imports {name}")
            elif top_level(name) == "twisted":
                found.append(f"L4 {module} imports {name} (the vocabulary is pure)")
    return found


def l5_doors_and_the_wire_receive_the_node(graph: Graph) -> list[str]:
    """L5: the doors, the router and the wire never import the node: they reach it only through the node
    interface they are given (nxgate.vocabulary.api), so one box and a cluster are one code path."""
    return [f"L5 {module} imports {name}" for module, imports in sorted(graph.items())
            if within(module, "nxgate.gateway.doors", "nxgate.gateway.router", "nxgate.gateway.placement",
                      "nxgate.wire")
            for name in sorted(imports) if within(name, "nxgate.node")]


def l6_login_shell_starts_fast(graph: Graph) -> list[str]:
    """L6: nxgate-shell imports only the stdlib and its framing, so it starts in milliseconds."""
    module = "nxgate.gateway.doors.openssh.login_shell"
    allowed = set(sys.stdlib_module_names) | {"__future__"}
    return [f"L6 {module} imports {name}" for name in sorted(graph.get(module, ()))
            if not (within(name, "nxgate.gateway.doors.openssh.framing") or top_level(name) in allowed)]


def l7_no_unwatched_deferreds(bare: Mapping[str, int]) -> list[str]:
    """L7: no bare ``ensureDeferred(...)`` statement in the node or the router: its failure would vanish."""
    return [f"L7 {module} has {count} bare ensureDeferred(...)" for module, count in sorted(bare.items())
            if count and within(module, "nxgate.node", "nxgate.gateway.router")]


#: Modules of nxgate.gateway.doors shared by every door (the NX conversation, login events, the connection guard).
SHARED_DOOR_MODULES = ("nxgate.gateway.doors.conversation", "nxgate.gateway.doors.login_events", "nxgate.gateway.doors.preauth",
                       "nxgate.gateway.doors.guard", "nxgate.gateway.doors.keyfiles")


def door_of(module: str) -> str | None:
    """``nxgate.gateway.doors.web.site`` -> ``nxgate.gateway.doors.web``; None outside a door's own package."""
    parts = module.split(".")
    if len(parts) >= 4 and parts[:3] == ["nxgate", "gateway", "doors"] and not within(module, *SHARED_DOOR_MODULES):
        return ".".join(parts[:4])
    return None


def l8_doors_and_the_wire_stay_apart(graph: Graph) -> list[str]:
    """L8: a door never imports another door, and the wire never imports a door (the shared door
    modules excepted): each door turns its own wire into calls of the session API, nothing more."""
    found = []
    for module, imports in sorted(graph.items()):
        mine = door_of(module)
        for name in sorted(imports):
            theirs = door_of(name)
            if theirs is None:
                continue
            if mine is not None and theirs != mine:
                found.append(f"L8 {module} imports {name} (another door)")
            elif within(module, "nxgate.wire"):
                found.append(f"L8 {module} imports {name} (the wire never imports a door)")
    return found


def package_of(name: str) -> str:
    """The first-level package of an nxgate name (``nxgate.node.extras.sound`` -> ``nxgate.node``)."""
    return ".".join(name.split(".")[:2])


def l9_no_package_cycles(graph: Graph) -> list[str]:
    """L9: the first-level packages of nxgate import each other without a cycle."""
    edges: dict[str, set[str]] = {}
    for module, imports in graph.items():
        for name in nxgate_imports(imports):
            if package_of(name) != package_of(module):
                edges.setdefault(package_of(module), set()).add(package_of(name))

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            node = todo.pop()
            for nxt in edges.get(node, ()):
                if nxt == goal:
                    return True
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return False

    return [f"L9 {a} imports {b}, which leads back to it"
            for a in sorted(edges) for b in sorted(edges[a]) if reaches(b, a)]


def l10_the_nx_client_is_its_own_program(graph: Graph) -> list[str]:
    """L10: nxgate-client runs on the user's machine: it imports no gateway and no node."""
    return [f"L10 {module} imports {name}" for module, imports in sorted(graph.items())
            if within(module, "nxgate.clients.nx")
            for name in sorted(imports) if within(name, "nxgate.gateway", "nxgate.node")]


IMPORT_RULES: list[Rule] = [l1_the_node_ignores_the_front, l2_agents_stand_apart, l3_nx_core_is_pure,
                            l4_vocabulary_stands_alone, l5_doors_and_the_wire_receive_the_node,
                            l6_login_shell_starts_fast, l8_doors_and_the_wire_stay_apart, l9_no_package_cycles,
                            l10_the_nx_client_is_its_own_program]


def check(graph: Graph) -> list[str]:
    return [line for rule in IMPORT_RULES for line in rule(graph)]


# ----------------------------------------------------------------------------------------------------------
# The tree


def read_tree(sources: Mapping[str, str] | None = None) -> tuple[dict[str, frozenset[str]], dict[str, int]]:
    """``{module: imports}`` and ``{module: bare ensureDeferred count}`` for nxgate/

    ``sources`` maps extra or replacing paths (relative to the checkout) to their text, for the self-test.
    """
    texts: dict[str, str] = {}
    for directory, _, names in os.walk(os.path.join(REPO, "nxgate")):
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                with open(path, encoding="utf-8") as handle:
                    texts[os.path.relpath(path, REPO)] = handle.read()
    texts.update(sources or {})
    graph: dict[str, frozenset[str]] = {}
    bare: dict[str, int] = {}
    for relative, text in texts.items():
        module, is_package = module_name(os.path.join(REPO, relative))
        graph[module] = graph.get(module, frozenset()) | imports_of(text, module, is_package)
        bare[module] = bare.get(module, 0) + bare_ensure_deferred(text)
    return graph, bare


# ----------------------------------------------------------------------------------------------------------


class CheckerTests(TestCase):
    """The checker itself, on sources in memory."""

    def test_nx_import_in_the_node_is_reported(self) -> None:
        """``from nxgate.protocols.nx import errors`` in the node fails the test."""
        graph, _ = read_tree({os.path.join("nxgate", "node", "x.py"): "from nxgate.protocols.nx import errors\n"})
        self.assertIn("L1 nxgate.node.x imports nxgate.protocols.nx.errors", check(graph))

    def test_imports_at_any_depth_and_relative(self) -> None:
        source = (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from nxgate.gateway.doors import conversation\n"
            "def f():\n    import nxgate.wire.relay\n    from ..protocols.nx.errors import NXError\n"
            "    from . import kinds\n"
        )
        self.assertEqual(imports_of(source, "nxgate.node.x"), {
            "typing.TYPE_CHECKING", "nxgate.gateway.doors.conversation", "nxgate.wire.relay",
            "nxgate.protocols.nx.errors.NXError", "nxgate.node.kinds"})
        self.assertEqual(imports_of("from . import caller\n", "nxgate.vocabulary", is_package=True),
                         {"nxgate.vocabulary.caller"})

    def test_each_rule(self) -> None:
        graph = {
            "nxgate.node.files": frozenset({"nxgate.vocabulary.model.Session", "nxgate.gateway.router.Router"}),
            "nxgate.node.agents.nxagent": frozenset({"nxgate.node.files", "nxgate.node.agents.x11"}),
            "nxgate.protocols.nx.dispatch": frozenset({"time", "nxgate.vocabulary.errors.Kind", "nxgate.config"}),
            "nxgate.vocabulary.results": frozenset({"twisted.internet.defer", "nxgate.vocabulary.model.State"}),
            "nxgate.vocabulary.model": frozenset({"nxgate.node.processes", "nxgate.safetext"}),
            "nxgate.gateway.doors.admin.server": frozenset({"nxgate.node.service.SessionService",
                                                            "nxgate.vocabulary.api.SessionAPI"}),
            "nxgate.gateway.router": frozenset({"nxgate.node.local.LocalNode", "nxgate.store.errors.StoreError"}),
            "nxgate.gateway.doors.openssh.login_shell": frozenset({"os", "nxgate.gateway.doors.openssh.framing",
                                                                   "twisted.python"}),
            "nxgate.clients.nx.main": frozenset({"nxgate.protocols.nx.client_dialogue", "nxgate.node.files"}),
        }
        self.assertEqual(check(graph), [
            "L1 nxgate.node.files imports nxgate.gateway.router.Router",
            "L2 nxgate.node.agents.nxagent imports nxgate.node.files (agents do not use the node)",
            "L3 nxgate.protocols.nx.dispatch imports nxgate.config",
            "L3 nxgate.protocols.nx.dispatch imports time (the NX core does no I/O)",
            "L4 nxgate.vocabulary.model imports nxgate.node.processes",
            "L4 nxgate.vocabulary.results imports twisted.internet.defer (the vocabulary is pure)",
            "L5 nxgate.gateway.doors.admin.server imports nxgate.node.service.SessionService",
            "L5 nxgate.gateway.router imports nxgate.node.local.LocalNode",
            "L6 nxgate.gateway.doors.openssh.login_shell imports twisted.python",
            "L9 nxgate.gateway imports nxgate.node, which leads back to it",
            "L9 nxgate.gateway imports nxgate.vocabulary, which leads back to it",
            "L9 nxgate.node imports nxgate.gateway, which leads back to it",
            "L9 nxgate.node imports nxgate.vocabulary, which leads back to it",
            "L9 nxgate.vocabulary imports nxgate.node, which leads back to it",
            "L10 nxgate.clients.nx.main imports nxgate.node.files",
        ])

    def test_doors_apart_and_package_cycles(self) -> None:
        graph = {
            "nxgate.gateway.doors.web.site": frozenset({"nxgate.gateway.doors.dbus.wire",
                                                        "nxgate.gateway.doors.web.pages",
                                                        "nxgate.gateway.doors.conversation"}),
            "nxgate.wire.relay": frozenset({"nxgate.gateway.doors.conch.server"}),
            "nxgate.node.service": frozenset({"nxgate.wire.agentsocket"}),
            "nxgate.wire.agentsocket": frozenset({"nxgate.store.errors"}),
            "nxgate.store.errors": frozenset({"nxgate.node.files"}),
        }
        self.assertEqual(l8_doors_and_the_wire_stay_apart(graph), [
            "L8 nxgate.gateway.doors.web.site imports nxgate.gateway.doors.dbus.wire (another door)",
            "L8 nxgate.wire.relay imports nxgate.gateway.doors.conch.server (the wire never imports a door)",
        ])
        self.assertEqual(l9_no_package_cycles(graph), [
            "L9 nxgate.node imports nxgate.wire, which leads back to it",
            "L9 nxgate.store imports nxgate.node, which leads back to it",
            "L9 nxgate.wire imports nxgate.store, which leads back to it"])
        self.assertEqual(l9_no_package_cycles({"nxgate.a.x": frozenset({"nxgate.b.y"})}), [])

    def test_bare_ensure_deferred(self) -> None:
        source = ("from twisted.internet import defer\n"
                  "def f(c):\n    defer.ensureDeferred(c)\n    d = defer.ensureDeferred(c)\n"
                  "    ensureDeferred(c)\n    background(defer.ensureDeferred(c))\n")
        self.assertEqual(bare_ensure_deferred(source), 2)
        self.assertEqual(l7_no_unwatched_deferreds({"nxgate.node.lifecycle": 2, "nxgate.gateway.root": 1}),
                         ["L7 nxgate.node.lifecycle has 2 bare ensureDeferred(...)"])


class TreeTests(TestCase):
    """The rules on the real tree."""

    def assertRule(self, rule: Callable[..., list[str]], which: int = 0) -> None:
        found = rule(read_tree()[which])
        self.assertEqual(found, [], "\n" + "\n".join(found))

    def test_l1_the_node_ignores_the_front(self) -> None:
        self.assertRule(l1_the_node_ignores_the_front)

    def test_l2_agents_stand_apart(self) -> None:
        self.assertRule(l2_agents_stand_apart)

    def test_l3_nx_core_is_pure(self) -> None:
        self.assertRule(l3_nx_core_is_pure)

    def test_l4_vocabulary_stands_alone(self) -> None:
        self.assertRule(l4_vocabulary_stands_alone)

    def test_l5_doors_and_the_wire_receive_the_node(self) -> None:
        self.assertRule(l5_doors_and_the_wire_receive_the_node)

    def test_l6_login_shell_starts_fast(self) -> None:
        self.assertRule(l6_login_shell_starts_fast)

    def test_l7_no_unwatched_deferreds(self) -> None:
        self.assertRule(l7_no_unwatched_deferreds, which=1)

    def test_l8_doors_and_the_wire_stay_apart(self) -> None:
        self.assertRule(l8_doors_and_the_wire_stay_apart)

    def test_l9_no_package_cycles(self) -> None:
        self.assertRule(l9_no_package_cycles)

    def test_l10_the_nx_client_is_its_own_program(self) -> None:
        self.assertRule(l10_the_nx_client_is_its_own_program)

    def test_the_rules_read_the_whole_tree(self) -> None:
        """A rule on an empty or misplaced tree passes by itself: this one cannot."""
        graph, bare = read_tree()
        self.assertGreater(len(graph), 140)
        self.assertEqual(set(graph), set(bare))
        for package in PACKAGES:
            self.assertTrue(any(within(module, package) for module in graph), f"no package {package}")
            self.assertGreater(sum(1 for module in graph if within(module, package)), 1, package)
        for module in SHARED_DOOR_MODULES + ("nxgate.gateway.doors.openssh.login_shell",):
            self.assertIn(module, graph)
        # Every first-level package of the tree is one the rules know, or a shared module at the top.
        for first in {package_of(module) for module in graph}:
            self.assertTrue(first in PACKAGES or first == "nxgate" or first.count(".") == 1, first)
