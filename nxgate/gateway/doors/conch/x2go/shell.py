"""A strict reader of the shell programs X2Go clients send (pure, no I/O).

X2Go's clients do not send argv lists: every ``exec`` is a little shell
program for the user's login shell (see the contract, 1.3).  nxgate runs no
shell.  This module reads exactly the constructs the two clients produce --
words with ``'…'``, ``"…"`` and ``\\`` quoting, ``$HOME``/``${HOME}``/
``$HOSTNAME``/``$USER``, a leading ``~`` or ``~user`` of the caller,
``VAR=value`` prefixes, ``;``, ``&&``, a final ``& exit``, ``{ …; }`` groups and
``>``/``>>``/``1>``/``2>`` redirections -- into a flat list of simple
commands, and refuses everything else (pipes, ``$(…)``, back-quotes, globs,
other variables, input redirection, sub-shells) with a reason for the log.
It also strips the two wrappers: python-x2go's
``echo X2GODATABEGIN:…; PATH=… sh -c "…"; echo X2GODATAEND:…`` and
x2goclient's ``bash -l -c '…'``.  Whether a command may run is decided
afterwards, by :mod:`nxgate.gateway.doors.conch.x2go.verbs`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

#: Longest exec string read at all (before any per-character work): the
#: clients' longest (x2goclient's runcommand with a Kerberos prefix) is < 1 KiB.
MAX_EXEC_BYTES = 4096
#: Deepest ``{ … }`` nesting and most simple commands in one program.
MAX_DEPTH = 3
MAX_COMMANDS = 16

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MARKER = re.compile(r"X2GODATA(BEGIN|END):[0-9a-fA-F-]{8,64}")
#: Characters that end an unquoted word (braces do not: ``{`` and ``}`` are
#: words of their own, reserved only where a command starts).
_BREAKS = frozenset(" \t;&|<>()")
#: Unquoted characters that would mean more shell than we read.
_REFUSED_UNQUOTED = {"|": "a pipe", "<": "an input redirection", "(": "a sub-shell", ")": "a sub-shell",
                     "`": "command substitution", "*": "a glob", "?": "a glob", "[": "a glob", "\n": "a new line",
                     "!": "history expansion", "#": "a comment"}


class Refused(ValueError):
    """The program uses something outside the clients' contract."""


@dataclass(frozen=True)
class Facts:
    """What the words may expand to: the caller's own account."""

    user: str
    home: str
    hostname: str


@dataclass(frozen=True)
class Redirect:
    fd: int  # 1 or 2
    append: bool
    path: str


@dataclass(frozen=True)
class Simple:
    """One simple command: ``VAR=value … word … > path``."""

    assignments: tuple[tuple[str, str], ...] = ()
    argv: tuple[str, ...] = ()
    redirects: tuple[Redirect, ...] = ()


@dataclass(frozen=True)
class Step:
    """A command and how it joins the one before (";", "&&" or "&")."""

    joiner: str
    command: Simple


@dataclass(frozen=True)
class Program:
    """What an exec asked for: the markers to echo around the output (None
    for a bare command) and the commands in order."""

    steps: tuple[Step, ...]
    begin: str | None = None
    end: str | None = None
    wrapper: str = "bare"  # "python-x2go", "x2goclient" or "bare"
    extra: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class _Op:
    text: str


@dataclass
class _Word:
    text: str
    quoted: bool  # any part was quoted (then it is never an operator or assignment)
    name_end: int = -1  # for NAME=value: where the unquoted name ended


def _variable(name: str, facts: Facts) -> str:
    values = {"HOME": facts.home, "HOSTNAME": facts.hostname, "USER": facts.user, "LOGNAME": facts.user}
    if name not in values:
        raise Refused(f"variable ${name}")
    return values[name]


def _dollar(text: str, at: int, facts: Facts) -> tuple[str, int]:
    """Expand ``$NAME`` or ``${NAME}`` at ``text[at] == '$'``."""
    rest = text[at + 1:]
    if rest.startswith("{"):
        close = rest.find("}")
        name = rest[1:close] if close > 0 else ""
        if not _NAME.fullmatch(name):
            raise Refused("a parameter expansion")
        return _variable(name, facts), at + close + 2
    match = _NAME.match(rest)
    if match is None:
        raise Refused("command substitution" if rest.startswith("(") else "a special parameter")
    return _variable(match.group(), facts), at + 1 + match.end()


def tokens(text: str, facts: Facts) -> list[_Word | _Op]:
    """The words (expanded) and operators of ``text``."""
    out: list[_Word | _Op] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in " \t":
            i += 1
            continue
        if c == ";":
            out.append(_Op(";"))
            i += 1
            continue
        if c == "&":
            if text.startswith("&&", i):
                out.append(_Op("&&"))
                i += 2
            else:
                out.append(_Op("&"))
                i += 1
            continue
        if c == ">":
            if text.startswith(">&", i) or text.startswith(">>&", i):
                raise Refused("a descriptor duplication")
            append = text.startswith(">>", i)
            out.append(_Op(">>" if append else ">"))
            i += 2 if append else 1
            continue
        if c in _REFUSED_UNQUOTED:
            raise Refused(_REFUSED_UNQUOTED[c])
        word, after = _read_word(text, i, facts)
        if after <= i:  # cannot happen with the breaks above; never loop on it
            raise Refused(f"an unexpected {c!r}")
        i = after
        # "1>" / "2>": a digit word glued to a redirection.
        if not word.quoted and word.text in ("1", "2") and i < n and text[i] == ">":
            append = text.startswith(">>", i)
            if text.startswith(">&", i) or text.startswith(">>&", i):
                raise Refused("a descriptor duplication")
            out.append(_Op(word.text + (">>" if append else ">")))
            i += 2 if append else 1
            continue
        out.append(word)
    return out


def _read_word(text: str, i: int, facts: Facts) -> tuple[_Word, int]:
    parts: list[str] = []
    quoted = False
    name_end = -1
    start = i
    n = len(text)
    if text[i] == "~":
        j = i + 1
        while j < n and text[j] not in _BREAKS and text[j] not in "/'\"\\$":
            j += 1
        named = text[i + 1:j]
        if named not in ("", facts.user):
            raise Refused(f"another user's home (~{named[:32]})")
        parts.append(facts.home)
        i = j
    while i < n:
        c = text[i]
        if c in _BREAKS:
            break
        if c == "'":
            close = text.find("'", i + 1)
            if close < 0:
                raise Refused("an unterminated quote")
            parts.append(text[i + 1:close])
            quoted = True
            i = close + 1
        elif c == '"':
            value, i = _double_quoted(text, i + 1, facts)
            parts.append(value)
            quoted = True
        elif c == "\\":
            if i + 1 >= n:
                raise Refused("a trailing backslash")
            parts.append(text[i + 1])
            quoted = True
            i += 2
        elif c == "$":
            value, i = _dollar(text, i, facts)
            parts.append(value)
        elif c in _REFUSED_UNQUOTED:
            raise Refused(_REFUSED_UNQUOTED[c])
        else:
            if c == "=" and name_end < 0 and not quoted and _NAME.fullmatch(text[start:i]):
                name_end = i - start
            parts.append(c)
            i += 1
    return _Word("".join(parts), quoted, name_end), i


def _double_quoted(text: str, i: int, facts: Facts) -> tuple[str, int]:
    parts: list[str] = []
    n = len(text)
    while i < n:
        c = text[i]
        if c == '"':
            return "".join(parts), i + 1
        if c == "\\" and i + 1 < n and text[i + 1] in '"\\$`':
            parts.append(text[i + 1])
            i += 2
        elif c == "$":
            value, i = _dollar(text, i, facts)
            parts.append(value)
        elif c == "`":
            raise Refused("command substitution")
        elif c == "\n":
            raise Refused("a new line")
        else:
            parts.append(c)
            i += 1
    raise Refused("an unterminated quote")


def parse(text: str, facts: Facts, depth: int = 0) -> tuple[Step, ...]:
    """The steps of a program (groups flattened: a group's first command
    takes the group's joiner, which is what ``;``/``&&`` mean for it here)."""
    if depth > MAX_DEPTH:
        raise Refused("too deeply nested")
    items = tokens(text, facts)
    steps: list[Step] = []
    joiner = ";"
    i = 0
    expect_command = True
    while i < len(items):
        item = items[i]
        if isinstance(item, _Op) and item.text in (";", "&&", "&"):
            if expect_command:
                if item.text == ";" and not steps:
                    raise Refused("an empty command")
                raise Refused(f"'{item.text}' without a command before it")
            joiner = item.text
            expect_command = True
            i += 1
            continue
        if not expect_command:
            raise Refused("a command where a separator was expected")
        if isinstance(item, _Word) and not item.quoted and item.text == "{":
            close = _group_end(items, i)
            inner = _group_steps(items[i + 1:close], facts, depth)
            steps.append(Step(joiner, inner[0].command))
            steps.extend(inner[1:])
            i = close + 1
        else:
            command, i = _simple(items, i)
            steps.append(Step(joiner, command))
        expect_command = False
        if len(steps) > MAX_COMMANDS:
            raise Refused("too many commands")
    if expect_command and joiner in ("&&",):
        raise Refused("'&&' at the end")
    if not steps:
        raise Refused("no command")
    return tuple(steps)


def _group_end(items: list[_Word | _Op], start: int) -> int:
    level = 0
    for j in range(start, len(items)):
        item = items[j]
        if isinstance(item, _Word) and not item.quoted and item.text in ("{", "}"):
            # Only as a command word (after a separator or the opening brace).
            previous = items[j - 1] if j > start else None
            if j != start and not (isinstance(previous, _Op) and previous.text in (";", "&&")) \
                    and not (isinstance(previous, _Word) and previous.text == "{" and not previous.quoted):
                continue
            level += 1 if item.text == "{" else -1
            if level == 0:
                return j
    raise Refused("an unclosed '{'")


def _group_steps(items: list[_Word | _Op], facts: Facts, depth: int) -> list[Step]:
    if not items or not (isinstance(items[-1], _Op) and items[-1].text == ";"):
        raise Refused("a group without its final ';'")
    if depth + 1 > MAX_DEPTH:
        raise Refused("too deeply nested")
    steps: list[Step] = []
    joiner = ";"
    i = 0
    expect = True
    while i < len(items):
        item = items[i]
        if isinstance(item, _Op) and item.text in (";", "&&"):
            if expect:
                raise Refused("an empty command in a group")
            joiner, expect = item.text, True
            i += 1
            continue
        if isinstance(item, _Op) and item.text == "&":
            raise Refused("a background command in a group")
        if isinstance(item, _Word) and not item.quoted and item.text == "{":
            raise Refused("nested groups")
        if not expect:
            raise Refused("a command where a separator was expected")
        command, i = _simple(items, i)
        steps.append(Step(joiner, command))
        expect = False
    if not steps:
        raise Refused("an empty group")
    return steps


def _simple(items: list[_Word | _Op], i: int) -> tuple[Simple, int]:
    assignments: list[tuple[str, str]] = []
    argv: list[str] = []
    redirects: list[Redirect] = []
    while i < len(items):
        item = items[i]
        if isinstance(item, _Op):
            if item.text in (";", "&&", "&"):
                break
            fd = 2 if item.text.startswith("2") else 1
            target = items[i + 1] if i + 1 < len(items) else None
            if not isinstance(target, _Word):
                raise Refused("a redirection without a file")
            redirects.append(Redirect(fd, item.text.endswith(">>"), target.text))
            i += 2
            continue
        if not item.quoted and item.text in ("{", "}") and not argv:
            raise Refused(f"an unexpected '{item.text}'")
        if not argv and item.name_end > 0:
            assignments.append((item.text[:item.name_end], item.text[item.name_end + 1:]))
        else:
            argv.append(item.text)
        i += 1
    if not argv and not assignments:
        raise Refused("an empty command")
    return Simple(tuple(assignments), tuple(argv), tuple(redirects)), i


def read_exec(raw: bytes, facts: Facts) -> Program:
    """The program of one exec request, wrappers taken off.

    Raises :class:`Refused` with the reason for anything outside the
    contract; nothing is run before the whole program has been read."""
    if len(raw) > MAX_EXEC_BYTES:
        raise Refused(f"longer than {MAX_EXEC_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise Refused("not UTF-8") from None
    if any(ord(c) < 32 and c not in "\t" for c in text) or "\x7f" in text:
        raise Refused("a control character")
    outer = parse(text, facts)
    python = _python_wrapper(outer)
    if python is not None:
        begin, inner, end = python
        return Program(parse(inner, facts, 1), begin, end, "python-x2go")
    if len(outer) == 1 and outer[0].command.argv[:3] == ("bash", "-l", "-c") and len(outer[0].command.argv) == 4 \
            and not outer[0].command.assignments and not outer[0].command.redirects:
        inner = parse(outer[0].command.argv[3], facts, 1)
        first, last = inner[0].command, inner[-1].command
        if _is_marker_echo(first, "BEGIN") and len(inner) >= 2 and _is_marker_echo(last, "END"):
            return Program(inner[1:-1], first.argv[1], last.argv[1], "x2goclient")
        if _is_marker_echo(first, "BEGIN") and inner[-1].joiner == "&":  # "... & exit": no END marker
            return Program(inner[1:], first.argv[1], None, "x2goclient")
        return Program(inner, None, None, "bash -l -c")
    return Program(outer)


def _is_marker_echo(command: Simple, which: str) -> bool:
    return (command.argv[:1] == ("echo",) and len(command.argv) == 2 and not command.assignments
            and not command.redirects and bool(_MARKER.fullmatch(command.argv[1]))
            and command.argv[1].startswith(f"X2GODATA{which}:"))


def _python_wrapper(steps: tuple[Step, ...]) -> tuple[str, str, str | None] | None:
    """``echo BEGIN; PATH=… sh -c "CMD"; echo END`` -> (begin, CMD, end);
    a CMD ending in ``& exit`` leaves the END echo in place too (the shell
    would never run it: the caller drops it)."""
    if len(steps) != 3 or any(step.joiner != ";" for step in steps):
        return None
    first, middle, last = (step.command for step in steps)
    if not (_is_marker_echo(first, "BEGIN") and _is_marker_echo(last, "END")):
        return None
    if middle.argv[:2] != ("sh", "-c") or len(middle.argv) != 3 or middle.redirects:
        return None
    if any(name != "PATH" for name, _ in middle.assignments):
        return None
    return first.argv[1], middle.argv[2], last.argv[1]
