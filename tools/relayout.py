#!/usr/bin/env python3
"""Issue 12, Phase 2: the mechanical move of nxgate into the layout that shows its architecture.

Run it once, from the top of a clean checkout::

    python3 tools/relayout.py --dry-run     # print what would move and which files would change
    python3 tools/relayout.py               # git mv, rewrite module paths, rename colliding names

What it does, and nothing else (no logic changes):

1. ``git mv`` every file in :data:`MOVES` (old path -> new path), ``git rm`` the emptied old packages'
   ``__init__.py`` (:data:`REMOVED`), and adds an empty ``__init__.py`` to every new package.
2. Rewrites module paths in ``nxgate tests bench tools setup.py debian README.md Makefile twisted``:
   import statements at any depth (parsed with ``ast``; a ``from`` import whose names now live in different
   modules is split into one import per module, and a module imported by its old short name keeps that name
   with ``as``), then every remaining dotted ``nxgate.old.module`` and slashed ``nxgate/old/module.py`` in
   strings, comments and other files (``-m nxgate.session.launcher``, ``patch("nxgate.x.y")``, setup.py's
   console scripts).  Log namespaces (``Logger(namespace="nxgate.ssh")`` and ``[nxgate.ssh#info]`` in log
   samples) are left alone: operators and tests match them, and they name a job, not a file.
3. Renames the colliding names (:data:`RENAMES`), each only where it means the thing defined in its module:
   in that module, and in files that import the name from it or use it as ``alias.Name``.

The symbols that a split moves (:data:`SYMBOL_MOVES`) are imported from their new module, but the script
does not cut the code itself: that is the hand work listed in :data:`HAND_WORK` and printed at the end.

4. Fixes the two paths computed from ``__file__`` that the move breaks (:data:`FIXUPS`).

It refuses to run when any new path already exists, or the tree has uncommitted changes, so a second run
does nothing.  ``--no-split-imports`` leaves split names importable from their file's new home, so the tree
works (and the tests pass) before the hand cuts; without it, imports already point where the cuts will put
the names.  Delete this script once the move has landed: the layering test then runs without it.  ``tests/test_layering.py`` reads :data:`MOVES` and :data:`SYMBOL_MOVES` to check the
import rules against the layout before the move lands.
"""

from __future__ import annotations

import argparse
import ast
import io
import os
import re
import subprocess
import sys
import tokenize
from dataclasses import dataclass

# --------------------------------------------------------------------------------------------------------------
# The mapping (old file -> new file).  Paths are relative to the top of the checkout.

MOVES: dict[str, str] = {
    # the pure NX 3 core
    "nxgate/nx/shell.py": "nxgate/nx/server_dialogue.py",
    "nxgate/client/dialogue.py": "nxgate/nx/client_dialogue.py",
    "nxgate/client/commands.py": "nxgate/nx/client_commands.py",
    "nxgate/commands.py": "nxgate/nx/dispatch.py",  # only if P1-A has not already replaced it
    "nxgate/session/request.py": "nxgate/nx/requests.py",  # split: StartRequest, DisplaySettings -> sessions
    # the front doors
    "nxgate/conversation.py": "nxgate/doors/conversation.py",
    "nxgate/ssh/__init__.py": "nxgate/doors/conch/__init__.py",
    "nxgate/ssh/server.py": "nxgate/doors/conch/server.py",
    "nxgate/ssh/checkers.py": "nxgate/doors/conch/checkers.py",
    "nxgate/ssh/authorized_keys.py": "nxgate/doors/conch/authorized_keys.py",
    "nxgate/ssh/hostkeys.py": "nxgate/doors/conch/hostkeys.py",
    "nxgate/shellsocket.py": "nxgate/doors/openssh/socket.py",
    "nxgate/shellproto.py": "nxgate/doors/openssh/framing.py",
    "nxgate/shell.py": "nxgate/doors/openssh/login_shell.py",
    "nxgate/admin/__init__.py": "nxgate/doors/admin/__init__.py",
    "nxgate/admin/server.py": "nxgate/doors/admin/server.py",
    "nxgate/admin/cli.py": "nxgate/doors/admin/cli.py",
    # the session service
    "nxgate/session/model.py": "nxgate/sessions/model.py",
    "nxgate/session/manager.py": "nxgate/sessions/manager.py",  # split by job in P3, then deleted
    "nxgate/session/programs.py": "nxgate/sessions/programs.py",  # split: login_environment -> node
    "nxgate/session/remote.py": "nxgate/sessions/remote_sessions.py",  # folded into sessions/service.py in P3
    "nxgate/shadow/service.py": "nxgate/sessions/shadow_sessions.py",  # split in P3: service.py + backends/shadow.py
    "nxgate/shadow/policy.py": "nxgate/sessions/shadow_policy.py",
    "nxgate/session/store.py": "nxgate/sessions/store/sqlite.py",  # split: the errors -> store/errors.py
    # the node: processes on this machine
    "nxgate/session/processes.py": "nxgate/node/processes.py",  # split: _Launch, Launcher -> node/launcher.py
    "nxgate/session/launcher.py": "nxgate/node/runas.py",
    "nxgate/session/files.py": "nxgate/node/files.py",  # split: displays -> node/displays.py, X11 -> backends/x11.py
    "nxgate/session/follow.py": "nxgate/node/follow.py",
    "nxgate/shadow/console.py": "nxgate/node/console.py",
    "nxgate/shadow/consent.py": "nxgate/node/consent.py",
    # backends
    "nxgate/shadow/screen.py": "nxgate/backends/shadow_screen.py",
    # the stream
    "nxgate/relay.py": "nxgate/stream/relay.py",
    "nxgate/agentsocket.py": "nxgate/stream/agentsocket.py",
    # authentication
    "nxgate/auth.py": "nxgate/auth/pam.py",
    "nxgate/pamlib.py": "nxgate/auth/pamlib.py",
    "nxgate/throttle.py": "nxgate/auth/throttle.py",
    "nxgate/users.py": "nxgate/auth/users.py",
    # tests named after what they test
    "tests/test_session_manager.py": "tests/test_sessions_manager.py",
    "tests/test_session_model.py": "tests/test_sessions_model.py",
    "tests/test_session_store.py": "tests/test_sessions_store.py",
    "tests/test_session_request.py": "tests/test_sessions_request.py",
    "tests/test_session_files.py": "tests/test_node_files.py",
    "tests/test_session_processes.py": "tests/test_node_processes.py",
    "tests/test_nx_shell.py": "tests/test_nx_server_dialogue.py",
    "tests/test_client_dialogue.py": "tests/test_nx_client_dialogue.py",
    "tests/test_shellproto.py": "tests/test_openssh_framing.py",
    "tests/test_relay.py": "tests/test_stream_relay.py",
    "tests/test_remote.py": "tests/test_backends_remote.py",
    "tests/test_shadow_screen.py": "tests/test_backends_shadow_screen.py",
}

# Old packages left empty by the moves: their __init__.py goes.
REMOVED = ["nxgate/session/__init__.py", "nxgate/shadow/__init__.py"]

# Names that a split sends somewhere other than the file's new home: old module -> {name: new module}, by
# the name after RENAMES.  The script rewrites imports of these names (unless --no-split-imports); the code
# itself is moved by hand (HAND_WORK).
SYMBOL_MOVES: dict[str, dict[str, str]] = {
    "nxgate.session.request": {"StartRequest": "nxgate.sessions.requests",
                               "DisplaySettings": "nxgate.sessions.requests"},
    "nxgate.session.processes": {"Launcher": "nxgate.node.launcher", "_Launch": "nxgate.node.launcher"},
    "nxgate.session.programs": {"login_environment": "nxgate.node.environment"},
    "nxgate.session.store": {name: "nxgate.sessions.store.errors" for name in
                             ("StoreError", "StoreUnavailable", "StoreCorrupt", "STORAGE_FULL", "storage_reason")},
    "nxgate.session.files": {name: "nxgate.backends.x11" for name in
                             ("X_LOCK", "X_SOCKET", "X_SOCKET_DIR", "xauthority", "cookie_in_xauthority")},
    "nxgate.shellsocket": {"peer_uid": "nxgate.auth.peercred"},
    "nxgate.client.commands": {"escape": "nxgate.nx.params", "format_params": "nxgate.nx.params"},
    "nxgate.client.dialogue": {"parse_row": "nxgate.nx.listing", "ParsedRow": "nxgate.nx.listing"},
    "nxgate.gateway": {"ChannelTransport": "nxgate.doors.conch.channel",
                       "ChannelHandler": "nxgate.doors.conch.channel"},
}


@dataclass(frozen=True)
class Rename:
    """``old`` becomes ``new`` wherever it means the name defined in ``module`` (an old module path)."""

    module: str
    old: str
    new: str
    prose: bool = True  # also in comments and docstrings; False for plain words such as "State"


RENAMES = [
    Rename("nxgate.nx.shell", "NXShell", "ServerDialogue"),
    Rename("nxgate.nx.shell", "ShellSettings", "DialogueSettings"),
    Rename("nxgate.nx.shell", "State", "DialogueState", prose=False),
    Rename("nxgate.nx.listing", "ListedSession", "ListingRow"),
    Rename("nxgate.client.dialogue", "ListedSession", "ParsedRow"),
    Rename("nxgate.shellsocket", "ShellProtocol", "OpenSSHDoorProtocol"),
    Rename("nxgate.shellsocket", "ShellFactory", "OpenSSHDoorFactory"),
    Rename("nxgate.ssh.server", "ShellFactory", "ChannelHandlerFactory"),
    Rename("nxgate.gateway", "ChannelShell", "ChannelHandler"),
    Rename("nxgate.gateway", "_open_shell", "_open_nx_channel"),
    Rename("nxgate.relay", "AgentRelay", "StreamRelay"),
    Rename("nxgate.commands", "SessionCommands", "NXDispatcher"),
]

# What a mechanical move cannot do safely; printed after a run, for the person doing Phase 2.
HAND_WORK = [
    "nx/requests.py: cut StartRequest and DisplaySettings into sessions/requests.py (replace its re-import)",
    "nx/requests.py: add remote_request, shadow_request, list_filter (P1 parsing, if not already there)",
    "node/processes.py: cut _Launch and Launcher into node/launcher.py",
    "node/files.py: cut the display part into node/displays.py, X_LOCK/X_SOCKET/X_SOCKET_DIR/xauthority/"
    "cookie_in_xauthority into backends/x11.py",
    "sessions/programs.py: cut login_environment into node/environment.py",
    "sessions/store/sqlite.py: cut StoreError, StoreUnavailable, StoreCorrupt, STORAGE_FULL, storage_reason "
    "into sessions/store/errors.py",
    "doors/openssh/socket.py: cut peer_uid into auth/peercred.py",
    "nx/client_commands.py: cut escape and format_params into nx/params.py (one codec: check nx/params has no twin)",
    "nx/client_dialogue.py: cut parse_row (and ParsedRow) into nx/listing.py",
    "gateway.py: cut ChannelTransport and ChannelHandler into doors/conch/channel.py",
    "any FIXUPS line the run reports as not found (CONSENT_PROGRAM, nxgate-shell's source-checkout nxcopy path)",
    "README.md: the architecture section describes the old files (P3-D rewrites it)",
]

# Paths computed from __file__ that a move breaks: (new file, exact old text, new text).  Applied only when
# the old text is found; otherwise the run says so and the item stays hand work.
FIXUPS = [
    ("nxgate/sessions/shadow_sessions.py",
     'CONSENT_PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "consent.py")',
     'CONSENT_PROGRAM = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "node", "consent.py")'),
    ("nxgate/doors/openssh/login_shell.py",
     'os.path.join(os.path.dirname(here), "helpers", "nxcopy"),  # a source checkout',
     'os.path.join(here, "..", "..", "..", "helpers", "nxcopy"),  # a source checkout'),
]

SPLIT_IMPORTS = True  # False (--no-split-imports): split symbols stay with their file, for a working tree now

REWRITE_ROOTS = ["nxgate", "tests", "bench", "tools", "setup.py", "debian", "README.md", "Makefile", "twisted"]


def module_of(path: str) -> str:
    """``nxgate/ssh/__init__.py`` -> ``nxgate.ssh``; ``nxgate/auth.py`` -> ``nxgate.auth``."""
    parts = path[:-3].split("/")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def module_moves(root: str | None = None) -> dict[str, str]:
    """Old module path -> new module path, for every file in :data:`MOVES` (under ``root``: only for the
    files still there, so that after the move ``nxgate.auth``, now a package, is not mapped again)."""
    return {module_of(old): module_of(new) for old, new in MOVES.items()
            if root is None or os.path.exists(os.path.join(root, old))}


def rename_module(name: str, moves: dict[str, str] | None = None) -> str:
    """The new dotted path of ``name`` (a module, or ``module.symbol``), by the longest moved prefix.

    Symbols that a split sends elsewhere (:data:`SYMBOL_MOVES`) follow their symbol.
    """
    moves = module_moves() if moves is None else moves
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        head = ".".join(parts[:cut])
        rest = parts[cut:]
        if rest and SPLIT_IMPORTS and head in SYMBOL_MOVES and rest[0] in SYMBOL_MOVES[head]:
            return ".".join([SYMBOL_MOVES[head][rest[0]], *rest])
        if head in moves:
            return ".".join([moves[head], *rest])
    return name


# --------------------------------------------------------------------------------------------------------------
# Import statements


def _from_import(module: str, names: list[tuple[str, str | None]], indent: str = "") -> str:
    parts = [name if alias is None or alias == name else f"{name} as {alias}" for name, alias in names]
    line = f"from {module} import {', '.join(parts)}"
    if len(indent) + len(line) <= 110:
        return line
    inner = "".join(f"{indent}    {part},\n" for part in parts)
    return f"from {module} import (\n{inner}{indent})"


def import_ranges(tree: ast.AST) -> list[tuple[int, int]]:
    """The line ranges (1-based, inclusive) of every import statement, at any depth."""
    return [(n.lineno, n.end_lineno) for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]


def _comment_start(code: str) -> int | None:
    try:
        for token in tokenize.generate_tokens(io.StringIO(code + "\n").readline):
            if token.type == tokenize.COMMENT:
                return token.start[1]
    except tokenize.TokenError:
        return None
    return None


def _from_groups(module: str, names: list[tuple[str, str | None]], known: set[str],
                 moves: dict[str, str]) -> tuple[dict[str, list[tuple[str, str | None]]], bool]:
    """``from module import names`` regrouped by the new module of each name, and whether anything moved."""
    groups: dict[str, list[tuple[str, str | None]]] = {}
    changed = False
    for name, asname in names:
        full = f"{module}.{name}"
        new = rename_module(full, moves)
        parent, _, last = new.rpartition(".")
        # A module imported by its old short name keeps that name: `from nxgate.auth import pam as auth`.
        local = asname or (name if full in known else None)
        groups.setdefault(parent, []).append((last, local))
        changed |= new != full
    return groups, changed


# `from nxgate.x import a, b as c` inside a string (code run with `python -c`): one line, no parentheses.
FROM_IN_TEXT = re.compile(r"^(?P<indent>\s*)from\s+(?P<module>nxgate(?:\.\w+)*)\s+import\s+"
                          r"(?P<names>\w+(?:\s+as\s+\w+)?(?:\s*,\s*\w+(?:\s+as\s+\w+)?)*)\s*$")


def rewrite_from_in_text(line: str, known: set[str], moves: dict[str, str]) -> str:
    match = FROM_IN_TEXT.match(line.rstrip("\n"))
    if not match:
        return line
    names = []
    for part in match.group("names").split(","):
        words = part.split()
        names.append((words[0], words[2] if len(words) == 3 else None))
    groups, changed = _from_groups(match.group("module"), names, known, moves)
    if not changed:
        return line
    indent = match.group("indent")
    return "".join(f"{indent}{_from_import(m, n)}\n" for m, n in groups.items())


def _only_statement(tree: ast.AST, node: ast.stmt) -> bool:
    """Whether ``node`` is the whole body of a block (removing it would leave the block empty)."""
    return any(isinstance(parent, ast.AST) and getattr(parent, "body", None) == [node] and parent is not tree
               for parent in ast.walk(tree))


def rewrite_imports(source: str, known: set[str], moves: dict[str, str],
                    own: str | None = None) -> tuple[list[str], set[int]]:
    """Rewrites every import statement whose module moved; returns the text and the lines it wrote.

    ``known`` holds the old module paths that exist, so ``from nxgate import auth`` is seen as a module.
    A statement is rewritten whole, onto one line per target module, keeping its indentation and a trailing
    comment; the lines of every import statement are reported so the dotted pass leaves them alone.
    """
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    edits: list[tuple[int, int, list[str]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            if all(rename_module(a.name, moves) == a.name for a in node.names):
                continue
            statements = []
            for a in node.names:
                new = rename_module(a.name, moves)
                statements.append(f"import {new} as {a.asname}" if a.asname else f"import {new}")
            edits.append((node.lineno, node.end_lineno, statements))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            groups, changed = _from_groups(node.module, [(a.name, a.asname) for a in node.names], known, moves)
            if own is not None and own in groups:
                # Names a split brings home (sessions/requests.py re-importing StartRequest): nothing to import.
                del groups[own]
                changed = True
            if not changed:
                continue
            if len(groups) == 1 and all(local is None or local == last
                                        for last, local in next(iter(groups.values()))) \
                    and [last for last, _ in next(iter(groups.values()))] == [a.name for a in node.names]:
                # Only the module moved: change it in place, keeping the statement's own layout.
                first = lines[node.lineno - 1]
                lines[node.lineno - 1] = re.sub(rf"\bfrom\s+{re.escape(node.module)}\s+import\b",
                                                f"from {next(iter(groups))} import", first, count=1)
                continue
            indent = re.match(r"\s*", lines[node.lineno - 1]).group(0)
            edits.append((node.lineno, node.end_lineno, [_from_import(m, n, indent) for m, n in groups.items()]
                          or ([f"pass  # {node.module}'s names now live here"] if _only_statement(tree, node) else [])))
    protected = {line for start, end in import_ranges(tree) for line in range(start, end + 1)}
    for start, end, statements in sorted(edits, reverse=True):
        first = lines[start - 1]
        indent = first[: len(first) - len(first.lstrip())]
        comment = ""
        if start == end:
            at = _comment_start(first.rstrip("\n"))
            if at is not None:
                comment = "  " + first[at:].strip()
        text = "".join(f"{indent}{s}{comment if i == len(statements) - 1 else ''}\n" for i, s in enumerate(statements))
        if not statements:
            comment = ""
        lines[start - 1:end] = [text] + [""] * (end - start)
    return lines, protected


def rewrite_python(source: str, known: set[str], moves: dict[str, str], own: str | None = None) -> str:
    """Import statements through :func:`rewrite_imports`, every other line through :func:`rewrite_paths`.

    ``own`` is the file's new module path: imports from itself (after a split) are dropped.
    """
    lines, protected = rewrite_imports(source, known, moves, own)
    return "".join(line if number in protected else rewrite_paths(rewrite_from_in_text(line, known, moves), moves)
                   for number, line in enumerate(lines, start=1))


# --------------------------------------------------------------------------------------------------------------
# Dotted and slashed paths in strings, comments and other files

DOTTED = re.compile(r"(?<![\w.])nxgate(?:\.\w+)+")
SLASHED = re.compile(r"(?<![\w/])nxgate(?:/\w+)+(?:\.py)?")
TESTS_DOTTED = re.compile(r"(?<![\w.])tests\.test_\w+")
# A log namespace: Logger(namespace="nxgate.ssh"), or "[nxgate.ssh#info]" in a log sample.
LOG_NAMESPACE = re.compile(r"""namespace\s*=\s*["']$|\[$""")


def rewrite_paths(text: str, moves: dict[str, str]) -> str:
    def dotted(match: re.Match[str]) -> str:
        before = text[max(0, match.start() - 20): match.start()]
        after = text[match.end(): match.end() + 1]
        if LOG_NAMESPACE.search(before) and (after in ("#", '"', "'")):
            return match.group(0)
        return rename_module(match.group(0), moves)

    def slashed(match: re.Match[str]) -> str:
        path = match.group(0)
        if path.endswith(".py"):
            return MOVES.get(path, path)
        as_module = path.replace("/", ".")
        new = rename_module(as_module, moves)
        if new == as_module:
            return path
        # A path names a module or a package only when it is one; leave prose such as "nxgate/ssh/" be if
        # the package as a whole did not move to one place.
        if as_module in moves.values() or as_module not in moves:
            return path
        return new.replace(".", "/")

    text = DOTTED.sub(dotted, text)
    text = TESTS_DOTTED.sub(lambda m: rename_module(m.group(0), moves), text)
    return SLASHED.sub(slashed, text)


# --------------------------------------------------------------------------------------------------------------
# Colliding names


def _aliases_and_names(tree: ast.AST, module: str, name: str, known: set[str]) -> tuple[set[str], bool]:
    """The local names bound to ``module``, and whether ``name`` is imported from it bare."""
    aliases: set[str] = set()
    bare = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == module and a.asname:
                    aliases.add(a.asname)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for a in node.names:
                if f"{node.module}.{a.name}" == module:
                    aliases.add(a.asname or a.name)
                elif node.module == module and a.name == name and a.asname is None:
                    bare = True
    return aliases, bare


def rename_names(source: str, own_module: str | None, known: set[str]) -> str:
    """Applies :data:`RENAMES` to one Python file (written in the old layout), on tokens."""
    tree = ast.parse(source)
    plans: list[tuple[Rename, set[str], bool]] = []
    for rename in RENAMES:
        aliases, bare = _aliases_and_names(tree, rename.module, rename.old, known)
        bare = bare or own_module == rename.module
        if aliases or bare:
            plans.append((rename, aliases, bare))
    if not plans:
        return source
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    lines = source.splitlines(keepends=True)
    # Edits per (row, col) of NAME tokens; prose edits per comment/string token.
    replacements: list[tuple[tuple[int, int], tuple[int, int], str]] = []
    for index, token in enumerate(tokens):
        if token.type == tokenize.NAME:
            previous = tokens[index - 1] if index else None
            before = tokens[index - 2] if index > 1 else None
            for rename, aliases, bare in plans:
                if token.string != rename.old:
                    continue
                attribute = previous is not None and previous.type == tokenize.OP and previous.string == "."
                if attribute and before is not None and before.type == tokenize.NAME and before.string in aliases:
                    replacements.append((token.start, token.end, rename.new))
                    break
                if (not attribute and bare) or (own_module == rename.module and rename.prose):
                    replacements.append((token.start, token.end, rename.new))
                    break
        elif token.type in (tokenize.COMMENT, tokenize.STRING):
            text = token.string
            for rename, aliases, bare in plans:
                if rename.prose and (bare or aliases) and re.search(rf"(?<![\w]){re.escape(rename.old)}\b", text):
                    text = re.sub(rf"(?<![\w]){re.escape(rename.old)}\b", rename.new, text)
            if text != token.string:
                replacements.append((token.start, token.end, text))
    for (row, col), (end_row, end_col), new in sorted(replacements, reverse=True):
        if row == end_row:
            line = lines[row - 1]
            lines[row - 1] = line[:col] + new + line[end_col:]
        else:
            head = lines[row - 1][:col]
            tail = lines[end_row - 1][end_col:]
            lines[row - 1:end_row] = [head + new + tail]
    return "".join(lines)


def split_attribute_uses(path: str, source: str, known: set[str]) -> list[str]:
    """``alias.name`` uses of a split symbol through its old module (``files.X_LOCK``): the import rewrite
    cannot follow these, so they are listed for the hand cut."""
    tree = ast.parse(source)
    found = []
    for module, names in SYMBOL_MOVES.items():
        aliases, _ = _aliases_and_names(tree, module, "", known)
        # The source is read before RENAMES, so look for a renamed symbol under its old name too.
        olds = {r.old: names[r.new] for r in RENAMES if r.module == module and r.new in names}
        for alias in aliases:
            for name, target in {**names, **olds}.items():
                for number, line in enumerate(source.splitlines(), start=1):
                    if re.search(rf"(?<![\w.]){re.escape(alias)}\.{re.escape(name)}\b", line):
                        found.append(f"{path}:{number}: {alias}.{name} -> {target}")
    return found


# --------------------------------------------------------------------------------------------------------------
# Driver


def git(*args: str, capture: bool = False) -> str:
    result = subprocess.run(["git", *args], check=True, text=True, capture_output=capture)
    return result.stdout if capture else ""


def files_to_rewrite(root: str) -> list[str]:
    tracked = git("ls-files", "--", *REWRITE_ROOTS, capture=True).splitlines()
    return [path for path in tracked if os.path.isfile(os.path.join(root, path))
            and not path.endswith((".png", ".key", ".pem", ".gz", ".c", ".o"))
            and path != "tools/relayout.py"]


#: Moves Phase 1 may have done already (P1 wrote nx/dispatch.py and split session/request.py).
DONE_IN_PHASE_1 = ("nxgate/commands.py", "nxgate/session/request.py")


def plan(root: str) -> tuple[dict[str, str], list[str]]:
    """The moves that apply to this tree, and the reasons to refuse (empty: go)."""
    problems: list[str] = []
    moves: dict[str, str] = {}
    for old, new in MOVES.items():
        if os.path.exists(os.path.join(root, new)):
            if os.path.exists(os.path.join(root, old)):
                problems.append(f"both {old} and {new} exist: merge them by hand first")
            elif old not in DONE_IN_PHASE_1:
                problems.append(f"{new} exists already: has the move been done?")
            continue
        if os.path.exists(os.path.join(root, old)):
            moves[old] = new
    if not moves:
        problems.append("nothing to move: has the move been done?")
    return moves, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="print the plan and the files it would change")
    parser.add_argument("--no-split-imports", action="store_true",
                        help="import split symbols from their file's new home (the tree works before the cuts)")
    options = parser.parse_args(argv)
    global SPLIT_IMPORTS
    SPLIT_IMPORTS = not options.no_split_imports
    root = git("rev-parse", "--show-toplevel", capture=True).strip()
    os.chdir(root)
    moves, problems = plan(root)
    if not options.dry_run and git("status", "--porcelain", "--untracked-files=no", capture=True).strip():
        problems.append("the tree has uncommitted changes: commit or stash them first")
    if problems:
        for problem in problems[:3]:
            print(f"refused: {problem}", file=sys.stderr)
        if len(problems) > 3:
            print(f"refused: ... and {len(problems) - 3} more", file=sys.stderr)
        return 1
    module_map = {module_of(old): module_of(new) for old, new in moves.items()}
    known = {module_of(path) for path in git("ls-files", "--", "nxgate", "tests", capture=True).splitlines()
             if path.endswith(".py")}
    sources = files_to_rewrite(root)
    new_contents: dict[str, str] = {}
    attribute_uses: list[str] = []
    for path in sources:
        with open(path, encoding="utf-8") as handle:
            try:
                text = handle.read()
            except UnicodeDecodeError:
                continue
        updated = text
        if path.endswith(".py") and SPLIT_IMPORTS:
            attribute_uses += split_attribute_uses(path, text, known)
        if path.endswith(".py"):
            own = module_of(path) if path.startswith(("nxgate/", "tests/")) else None
            updated = rename_names(updated, own, known)
            updated = rewrite_python(updated, known, module_map,
                                     rename_module(own, module_map) if own is not None else None)
        else:
            updated = rewrite_paths(updated, module_map)
        if updated != text:
            new_contents[path] = updated
    width = max(len(old) for old in moves)
    for old, new in moves.items():
        print(f"git mv {old:<{width}}  {new}")
    for path in REMOVED:
        if os.path.exists(path):
            print(f"git rm {path}")
    new_packages = sorted({os.path.dirname(new) for new in moves.values() if new.startswith("nxgate/")})
    inits = [os.path.join(d, "__init__.py") for d in new_packages]
    inits += [os.path.join(os.path.dirname(d), "__init__.py") for d in new_packages]
    inits = sorted({i for i in inits if i.startswith("nxgate/") and i != "nxgate/__init__.py"
                    and i not in moves.values() and not os.path.exists(i)})
    for init in inits:
        print(f"new    {init}")
    for path in sorted(new_contents):
        print(f"edit   {path}")
    if attribute_uses:
        print("\nUses of split names through their old module, for the hand cut (old path:line):")
        for use in attribute_uses:
            print(f"  {use}")
    if options.dry_run:
        return 0
    for old, new in moves.items():
        os.makedirs(os.path.dirname(new), exist_ok=True)
        git("mv", old, new)
    for path in REMOVED:
        if os.path.exists(path):
            git("rm", "-q", path)
    for init in inits:
        open(init, "w").close()
        git("add", init)
    for path, text in new_contents.items():
        target = moves.get(path, path)
        with open(target, "w", encoding="utf-8") as handle:
            handle.write(text)
        git("add", target)
    for path, before, after in FIXUPS:
        if not os.path.exists(path):
            print(f"fixup  {path}: not there, check by hand", file=sys.stderr)
            continue
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        if text.count(before) != 1:
            print(f"fixup  {path}: {before!r} not found once, fix by hand", file=sys.stderr)
            continue
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text.replace(before, after))
        git("add", path)
        print(f"fixup  {path}")
    print("\nLeft for hand work:")
    for item in HAND_WORK:
        print(f"  - {item}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
