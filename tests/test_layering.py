"""The import rules (issues 12 and 23): which part of nxgate may import which.

The layout says who owns what: ``vocabulary`` (pure words every part speaks), ``gateway`` (the doors, the
router, logins, the composition root), ``node`` (the session service, kinds, agents, store, host work),
``wire`` (what crosses a socket), ``protocols`` (pure codecs) and ``clients`` (programs that use a
session).  These rules keep it that way; review misses a single stray ``from nxgate.protocols.nx import
...`` in a function body; this test does not.

Every import is collected with :mod:`ast` at any depth (function bodies and ``TYPE_CHECKING`` blocks too),
relative imports resolved, as the dotted name of what is imported; so are ``importlib.import_module(...)`` and
``__import__(...)`` calls (see :func:`imports_of`).  Each rule is a pure function of ``{module: imports}``;
:class:`TreeTests` also checks that the tree it reads has every package the rules name, no first-level
package they do not know, and more than a minimum of modules, so a rule can never pass on an empty or
misplaced tree; :class:`BrokenTreeTests` breaks each rule on a copy of the tree and sees the checker fail.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import shutil
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
            "nxgate.wire", "nxgate.protocols", "nxgate.protocols.nx", "nxgate.clients", "nxgate.clients.nx",
            "nxgate.streams")
#: The first-level packages of nxgate: one that is not here is one no rule was written for.
FIRST_LEVEL = frozenset({"nxgate.clients", "nxgate.gateway", "nxgate.node", "nxgate.protocols", "nxgate.store",
                         "nxgate.streams", "nxgate.vocabulary", "nxgate.wire"})
#: The composition root: the one module of the gateway that builds the node.
ROOT = "nxgate.gateway.root"
#: Host work the gateway's logins share with the node (PAM): it moves out of node/ with the layout's
#: next step; until then the one node module the gateway's other modules may reach.
HOST_WORK_IN_NODE = {"nxgate.gateway.auth.pam": "nxgate.node.pamlib"}
#: What an import the checker cannot read stands for (see :func:`imports_of`).
DYNAMIC = "<dynamic import>"
NOT_IN_NX_CORE = frozenset({"os", "socket", "subprocess", "threading", "signal", "select", "selectors", "asyncio",
                            "multiprocessing", "pwd", "grp", "sqlite3", "time", "twisted", "zope", "OpenSSL"})


def within(name: str, *packages: str) -> bool:
    """Whether the dotted ``name`` is one of ``packages`` or inside one of them."""
    return any(name == package or name.startswith(package + ".") for package in packages)


def in_vocab(name: str) -> bool:
    return within(name, VOCAB)


def module_name(path: str, root: str = REPO) -> tuple[str, bool]:
    """``nxgate/gateway/doors/conch/server.py`` -> (``nxgate.gateway.doors.conch.server``, False); an ``__init__.py`` is its package."""
    parts = os.path.relpath(path, root)[:-3].split(os.sep)
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


_MODULE_NAME = re.compile(r"nxgate(\.[A-Za-z_][A-Za-z0-9_]*)+")


def _is_dynamic_import(node: ast.Call) -> bool:
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return name in ("import_module", "__import__")


def imports_of(source: str, module: str, is_package: bool = False) -> frozenset[str]:
    """Every name ``module`` imports, at any depth, relative imports made absolute.

    ``importlib.import_module("x")`` and ``__import__("x")`` import ``x``.  One whose name is not written
    out is read as importing every ``nxgate...`` module name the module writes as a string (a table of
    plug-ins, say); a module that writes none imports :data:`DYNAMIC`, which a rule refuses."""
    found: set[str] = set()
    unread = False
    tree = ast.parse(source)
    for node in ast.walk(tree):
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
        elif isinstance(node, ast.Call) and _is_dynamic_import(node):
            first = node.args[0] if node.args else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                found.add(first.value)
            else:
                unread = True
    if unread:
        named = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
                 and isinstance(node.value, str) and _MODULE_NAME.fullmatch(node.value)}
        found.update(named or {DYNAMIC})
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


def receives_the_node(module: str) -> bool:
    """The modules that reach the node only through the node interface they are given: the whole
    gateway (doors, router, placement, membership, logins) but its composition root, and the wire."""
    return within(module, "nxgate.gateway", "nxgate.wire") and module != ROOT


def allowed_node_import(module: str, name: str) -> bool:
    return within(name, HOST_WORK_IN_NODE.get(module, "-"))


def l5_doors_and_the_wire_receive_the_node(graph: Graph) -> list[str]:
    """L5: only the composition root of the gateway imports the node; the doors, the router, placement,
    membership and the wire reach it only through the node interface they are given
    (nxgate.vocabulary.api), so one box and a cluster are one code path."""
    return [f"L5 {module} imports {name}" for module, imports in sorted(graph.items())
            if receives_the_node(module)
            for name in sorted(imports) if within(name, "nxgate.node") and not allowed_node_import(module, name)]


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
    """L10: the client programs (nxgate-client on the user's machine, the viewer engines inside a session)
    import no gateway and no node."""
    return [f"L10 {module} imports {name}" for module, imports in sorted(graph.items())
            if within(module, "nxgate.clients")
            for name in sorted(imports) if within(name, "nxgate.gateway", "nxgate.node")]


def resolve(graph: Graph, name: str) -> str | None:
    """The module of the tree an imported name is in (``nxgate.node.files.StateLayout`` -> ``nxgate.node.files``)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in graph:
            return candidate
        parts.pop()
    return None


def node_path(graph: Graph, start: str) -> list[str] | None:
    """The shortest chain of imports from ``start`` to a node module, through modules that are not the
    node's themselves, or None (the host work named in :data:`HOST_WORK_IN_NODE` is not followed)."""
    came_from: dict[str, str | None] = {start: None}
    todo = [start]
    while todo:
        following = []
        for module in todo:
            for name in sorted(graph.get(module, ())):
                target = resolve(graph, name)
                if target is None or target in came_from or allowed_node_import(module, target):
                    continue
                came_from[target] = module
                if within(target, "nxgate.node"):
                    path, at = [target], module
                    while at is not None:
                        path.append(at)
                        at = came_from[at]
                    return path[::-1]
                following.append(target)
        todo = following
    return None


def l11_no_way_round_to_the_node(graph: Graph) -> list[str]:
    """L11: what L5 and L10 keep from importing the node does not reach it through another module either
    (a door that imports a client module that imports the node)."""
    found = []
    for module in sorted(graph):
        if not (receives_the_node(module) or within(module, "nxgate.clients")):
            continue
        path = node_path(graph, module)
        if path is not None and len(path) > 2:  # a direct import is L5's or L10's to say
            found.append(f"L11 {module} reaches {path[-1]} through {' -> '.join(path)}")
    return found


def l12_every_import_can_be_read(graph: Graph) -> list[str]:
    """L12: an ``import_module(...)`` or ``__import__(...)`` says which modules it may load (as a literal, or
    a table of module names in its module): the rules cannot check an import they cannot read."""
    return [f"L12 {module} imports a module whose name the checker cannot read" for module, imports
            in sorted(graph.items()) if DYNAMIC in imports]


def l13_streams_serve_every_side(graph: Graph) -> list[str]:
    """L13: ``streams/`` (what travels back from a session to its client, used by the node, the doors and
    nxgate-client alike) imports no door, router, node, client program or store."""
    return [f"L13 {module} imports {name}" for module, imports in sorted(graph.items())
            if within(module, "nxgate.streams")
            for name in sorted(imports) if within(name, "nxgate.gateway", "nxgate.node", "nxgate.clients",
                                                   "nxgate.store")]


IMPORT_RULES: list[Rule] = [l1_the_node_ignores_the_front, l2_agents_stand_apart, l3_nx_core_is_pure,
                            l4_vocabulary_stands_alone, l5_doors_and_the_wire_receive_the_node,
                            l6_login_shell_starts_fast, l8_doors_and_the_wire_stay_apart, l9_no_package_cycles,
                            l10_the_nx_client_is_its_own_program, l11_no_way_round_to_the_node,
                            l12_every_import_can_be_read, l13_streams_serve_every_side]


def check(graph: Graph) -> list[str]:
    return [line for rule in IMPORT_RULES for line in rule(graph)]


# ----------------------------------------------------------------------------------------------------------
# The tree


def read_tree(sources: Mapping[str, str] | None = None,
              root: str = REPO) -> tuple[dict[str, frozenset[str]], dict[str, int]]:
    """``{module: imports}`` and ``{module: bare ensureDeferred count}`` for ``root``'s nxgate/

    ``sources`` maps extra or replacing paths (relative to ``root``) to their text, for the self-test.
    """
    texts: dict[str, str] = {}
    for directory, _, names in os.walk(os.path.join(root, "nxgate")):
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                with open(path, encoding="utf-8") as handle:
                    texts[os.path.relpath(path, root)] = handle.read()
    texts.update(sources or {})
    graph: dict[str, frozenset[str]] = {}
    bare: dict[str, int] = {}
    for relative, text in texts.items():
        module, is_package = module_name(os.path.join(root, relative), root)
        imports, count = _read_module(text, module, is_package)
        graph[module] = graph.get(module, frozenset()) | imports
        bare[module] = bare.get(module, 0) + count
    return graph, bare


@functools.lru_cache(maxsize=4096)
def _read_module(text: str, module: str, is_package: bool) -> tuple[frozenset[str], int]:
    """What the checker reads of one module's text (the same text is read once: the copies of the tree in
    BrokenTreeTests differ from it in a file or two)."""
    return imports_of(text, module, is_package), bare_ensure_deferred(text)


def first_level_packages(root: str = REPO) -> set[str]:
    """The packages directly below ``root``'s nxgate/ (directories with an ``__init__.py``)."""
    base = os.path.join(root, "nxgate")
    return {f"nxgate.{name}" for name in os.listdir(base)
            if os.path.isfile(os.path.join(base, name, "__init__.py"))}


def tree_problems(graph: Graph, bare: Mapping[str, int], root: str = REPO) -> list[str]:
    """Why the rules could pass on this tree without meaning it: too few modules, a package the rules name
    that is missing or empty, a first-level package no rule knows (or one that is gone)."""
    problems = []
    if len(graph) <= 140:
        problems.append(f"only {len(graph)} modules")
    if set(graph) != set(bare):
        problems.append("the imports and the ensureDeferred counts are of different modules")
    for package in PACKAGES:
        if sum(1 for module in graph if within(module, package)) <= 1:
            problems.append(f"no package {package} with modules")
    for module in SHARED_DOOR_MODULES + ("nxgate.gateway.doors.openssh.login_shell", ROOT):
        if module not in graph:
            problems.append(f"no module {module}")
    for package in sorted(first_level_packages(root) ^ FIRST_LEVEL):
        known = "unknown to" if package not in FIRST_LEVEL else "gone from the tree but named in"
        problems.append(f"first-level package {package} is {known} the rules")
    return problems


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

    def test_l11_no_way_round_to_the_node(self) -> None:
        self.assertRule(l11_no_way_round_to_the_node)

    def test_l12_every_import_can_be_read(self) -> None:
        self.assertRule(l12_every_import_can_be_read)

    def test_the_rules_read_the_whole_tree(self) -> None:
        """A rule on an empty or misplaced tree passes by itself: this one cannot."""
        graph, bare = read_tree()
        self.assertEqual(tree_problems(graph, bare), [])


class BrokenTreeTests(TestCase):
    """Each rule broken on a copy of the tree: the checker fails, with the line that says why."""

    def copy(self) -> str:
        """A copy of the checkout's nxgate/ (sources only)."""
        root = os.path.abspath(self.mktemp())
        shutil.copytree(os.path.join(REPO, "nxgate"), os.path.join(root, "nxgate"),
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "*.c"))
        return root

    def broken(self, *files: tuple[str, str], append: bool = False) -> tuple[dict[str, frozenset[str]], dict[str, int]]:
        """The copy with ``(path, text)`` written (or added at the end of the file), read as the checker reads."""
        root = self.copy()
        for path, text in files:
            full = os.path.join(root, *path.split("/"))
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "a" if append else "w", encoding="utf-8") as handle:
                handle.write(text)
        return read_tree(root=root)

    def assertBroken(self, line: str, *files: tuple[str, str], append: bool = False, which: int = 0) -> None:
        tree = self.broken(*files, append=append)
        found = l7_no_unwatched_deferreds(tree[1]) if which else check(tree[0])
        self.assertIn(line, found)

    def test_the_real_tree_passes(self) -> None:
        """What every test below breaks: the tree as it is has no violation."""
        graph, bare = read_tree()
        self.assertEqual(check(graph) + l7_no_unwatched_deferreds(bare), [])

    def test_l1(self) -> None:
        self.assertBroken("L1 nxgate.node.x imports nxgate.gateway.router.Router",
                          ("nxgate/node/x.py", "from nxgate.gateway.router import Router\n"))

    def test_l2(self) -> None:
        self.assertBroken("L2 nxgate.node.agents.x imports nxgate.node.files (agents do not use the node)",
                          ("nxgate/node/agents/x.py", "from nxgate.node import files\n"))

    def test_l3(self) -> None:
        self.assertBroken("L3 nxgate.protocols.nx.x imports time (the NX core does no I/O)",
                          ("nxgate/protocols/nx/x.py", "import time\n"))

    def test_l4(self) -> None:
        self.assertBroken("L4 nxgate.vocabulary.x imports twisted.internet.defer (the vocabulary is pure)",
                          ("nxgate/vocabulary/x.py", "from twisted.internet import defer\n"))

    def test_l5_membership_importing_the_node(self) -> None:
        self.assertBroken("L5 nxgate.gateway.membership imports nxgate.node.service.SessionService",
                          ("nxgate/gateway/membership.py", "\nfrom nxgate.node.service import SessionService\n"),
                          append=True)

    def test_l5_through_importlib(self) -> None:
        self.assertBroken("L5 nxgate.gateway.doors.web.site imports nxgate.node.service",
                          ("nxgate/gateway/doors/web/site.py",
                           "\nimport importlib\nservice = importlib.import_module('nxgate.node.service')\n"),
                          append=True)

    def test_l5_through_dunder_import(self) -> None:
        self.assertBroken("L5 nxgate.wire.relay imports nxgate.node.local",
                          ("nxgate/wire/relay.py", "\nlocal = __import__('nxgate.node.local', fromlist=['x'])\n"),
                          append=True)

    def test_l6(self) -> None:
        self.assertBroken("L6 nxgate.gateway.doors.openssh.login_shell imports twisted.python",
                          ("nxgate/gateway/doors/openssh/login_shell.py", "\nimport twisted.python\n"), append=True)

    def test_l7(self) -> None:
        self.assertBroken("L7 nxgate.node.x has 1 bare ensureDeferred(...)",
                          ("nxgate/node/x.py", "from twisted.internet import defer\n\n\n"
                                               "def f(c):\n    defer.ensureDeferred(c)\n"), which=1)

    def test_l8(self) -> None:
        self.assertBroken("L8 nxgate.gateway.doors.web.x imports nxgate.gateway.doors.dbus.wire (another door)",
                          ("nxgate/gateway/doors/web/x.py", "from nxgate.gateway.doors.dbus import wire\n"))

    def test_l9(self) -> None:
        self.assertBroken("L9 nxgate.store imports nxgate.node, which leads back to it",
                          ("nxgate/store/x.py", "from nxgate.node import files\n"))

    def test_l10(self) -> None:
        self.assertBroken("L10 nxgate.clients.engines.x imports nxgate.node.files",
                          ("nxgate/clients/engines/x.py", "from nxgate.node import files\n"))

    def test_l11_a_door_through_a_client_module(self) -> None:
        """The shape the browser viewer once had: a door uses a client module, which uses the node."""
        self.assertBroken("L11 nxgate.gateway.doors.web.x reaches nxgate.node.service through "
                          "nxgate.gateway.doors.web.x -> nxgate.clients.x -> nxgate.node.service",
                          ("nxgate/clients/x.py", "from nxgate.node.service import SessionService\n"),
                          ("nxgate/gateway/doors/web/x.py", "from nxgate.clients.x import SessionService\n"))

    def test_l11_through_a_shared_module(self) -> None:
        self.assertBroken("L11 nxgate.wire.x reaches nxgate.node.files through "
                          "nxgate.wire.x -> nxgate.x -> nxgate.node.files",
                          ("nxgate/x.py", "import nxgate.node.files\n"),
                          ("nxgate/wire/x.py", "from nxgate import x\n"))

    def test_l12(self) -> None:
        self.assertBroken("L12 nxgate.gateway.doors.web.x imports a module whose name the checker cannot read",
                          ("nxgate/gateway/doors/web/x.py",
                           "import importlib\n\n\ndef load(name):\n    return importlib.import_module(name)\n"))

    def test_l13(self) -> None:
        self.assertBroken("L13 nxgate.streams.x imports nxgate.node.reverse",
                          ("nxgate/streams/x.py", "from nxgate.node import reverse\n"))

    def test_a_tree_that_lost_a_package_or_grew_an_unknown_one(self) -> None:
        root = self.copy()
        shutil.rmtree(os.path.join(root, "nxgate", "node", "agents"))
        os.makedirs(os.path.join(root, "nxgate", "extra"))
        for name in ("__init__.py", "thing.py"):
            with open(os.path.join(root, "nxgate", "extra", name), "w", encoding="utf-8") as handle:
                handle.write("from nxgate.node import files\n")
        graph, bare = read_tree(root=root)
        self.assertEqual(tree_problems(graph, bare, root), [
            "no package nxgate.node.agents with modules",
            "first-level package nxgate.extra is unknown to the rules"])
        shutil.rmtree(os.path.join(root, "nxgate", "clients"))
        graph, bare = read_tree(root=root)
        self.assertIn("first-level package nxgate.clients is gone from the tree but named in the rules",
                      tree_problems(graph, bare, root))
