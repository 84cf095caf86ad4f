"""A strict reader of the shell programs X2Go clients send (pure, no I/O).

X2Go's clients do not send argv lists: every ``exec`` is a little shell
program for the user's login shell (see the contract, 1.3), and the command
line a user typed into his profile is pasted into it as it is.  nxgate runs
no shell.  This module reads what a POSIX shell would make of the words --
``'…'``, ``"…"`` and ``\\`` quoting, ``$HOME``/``${HOME}``/``$USER``/
``$LOGNAME``/``$SHELL``/``$HOSTNAME`` of the caller's own account, a leading
``~`` or ``~user`` of the caller, any UTF-8 text -- and the glue the clients
use: ``VAR=value`` prefixes, ``;``, ``&&``, a final ``& exit``, ``{ …; }``
groups and ``>``/``>>``/``1>``/``2>`` redirections.  The result is a flat list
of simple commands (argv lists); everything a shell would do beyond words
(pipes, ``$(…)``, back-quotes, file-name patterns, other variables, input
redirection, sub-shells, comments) is refused with a reason for the log and
the client.

It also strips the two wrappers: python-x2go's
``echo X2GODATABEGIN:…; PATH=… sh -c "…"; echo X2GODATAEND:…`` and
x2goclient's ``bash -l -c '…'``.  python-x2go pastes the command between
double quotes without escaping it, so a profile command with its own double
quotes (``xterm -title "a b"``) breaks out of them: a login shell would run
``sh -c 'xterm -title a'`` with ``b`` as ``$0``.  The text between the
wrapper's quotes is what the client meant, and is read instead.  x2goclient
(4.1.2.2) does the same with its single quotes: a command with its own
(``xterm -xrm 'XTerm*allowTitleOps: false'``) is read between the wrapper's.
x2goclient sends its strings in Latin-1 (Qt's ``toLatin1``): a string that is not UTF-8
in x2goclient's wrapper is read as Latin-1.  Whether a command may run is
decided afterwards, by :mod:`nxgate.gateway.doors.conch.x2go.verbs`.
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
#: python-x2go's wrapper, exactly (backends/control/plain.py): the command between the quotes, unescaped.
_PYTHON_WRAPPER = re.compile(r'echo (X2GODATABEGIN:[0-9a-fA-F-]{8,64}); PATH=/usr/local/bin:/usr/bin:/bin sh -c "(.*)"; '
                             r"echo (X2GODATAEND:[0-9a-fA-F-]{8,64})", re.DOTALL)
#: x2goclient's wrapper (sshprocess.cpp): the program between the single quotes, which it does not escape.
_X2GOCLIENT_WRAPPER = re.compile(r"bash -l -c '(echo \"X2GODATABEGIN:[0-9a-fA-F-]{8,64}\"; .*)'", re.DOTALL)
#: Characters after ``$`` that leave it a plain dollar sign, as in a shell.
_PLAIN_DOLLAR = frozenset(" \t/:,.=+-%@]}")
#: Characters that end an unquoted word (braces do not: ``{`` and ``}`` are
#: words of their own, reserved only where a command starts).
_BREAKS = frozenset(" \t;&|<>()")
#: Unquoted characters that would mean more shell than we read.
_REFUSED_UNQUOTED = {
    "|": "a pipe ('|')", "<": "an input redirection ('<')", "(": "a sub-shell ('(')", ")": "a sub-shell (')')",
    "`": "command substitution ('`…`')", "\n": "a new line",
}
#: Unquoted file-name pattern characters: nxgate expands no patterns, so a
#: word with one is marked and refused where it would matter (see :class:`Simple`).
PATTERN = frozenset("*?[")
PATTERN_REFUSED = ("a file-name pattern (an unquoted '*', '?' or '['; quote it to pass it as it is; x2goclient"
                   " also sends '?' for a character outside Latin-1)")


class Refused(ValueError):
    """The program uses something outside the clients' contract."""


@dataclass(frozen=True)
class Facts:
    """What the words may expand to: the caller's own account."""

    user: str
    home: str
    hostname: str
    shell: str = "/bin/sh"


@dataclass(frozen=True)
class Redirect:
    fd: int  # 1 or 2
    append: bool
    path: str


@dataclass(frozen=True)
class Simple:
    """One simple command: ``VAR=value … word … > path``.  ``patterned``:
    the indices of the words of ``argv`` with an unquoted ``*``, ``?`` or
    ``[``, which a shell would try to expand (and leave as they are when no
    file matches): only where a word is not used to run anything may one
    pass (python-x2go's ``x2goruncommand`` argument, whose program nxgate
    takes from ``x2gostartagent`` instead)."""

    assignments: tuple[tuple[str, str], ...] = ()
    argv: tuple[str, ...] = ()
    redirects: tuple[Redirect, ...] = ()
    patterned: frozenset[int] = frozenset()


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
    pattern: bool = False  # an unquoted *, ? or [


def _variable(name: str, facts: Facts) -> str:
    values = {"HOME": facts.home, "HOSTNAME": facts.hostname, "USER": facts.user, "LOGNAME": facts.user,
              "SHELL": facts.shell}
    if name not in values:
        raise Refused(f"the variable ${name[:32]} (only $HOME, $USER, $LOGNAME, $SHELL and $HOSTNAME are known here)")
    return values[name]


def _dollar(text: str, at: int, facts: Facts) -> tuple[str, int]:
    """Expand ``$NAME`` or ``${NAME}`` at ``text[at] == '$'`` (a ``$`` that
    starts nothing is a plain dollar sign, as in a shell)."""
    rest = text[at + 1:at + 80]
    if rest.startswith("{"):
        close = rest.find("}")
        name = rest[1:close] if close > 0 else ""
        if not _NAME.fullmatch(name):
            raise Refused("a parameter expansion ('${…}' other than a plain name)")
        return _variable(name, facts), at + close + 2
    match = _NAME.match(rest)
    if match is None:
        if not rest or rest[0] in _PLAIN_DOLLAR or rest[0] == '"':
            return "$", at + 1
        if rest.startswith("(("):
            raise Refused("arithmetic expansion ('$((…))')")
        if rest.startswith("("):
            raise Refused("command substitution ('$(…)')")
        if rest[0] in "'":
            raise Refused("ANSI-C quoting ($'…')")
        raise Refused(f"a special parameter (${rest[0]})")
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
        if c == "#":
            raise Refused("a comment ('#' at the start of a word; quote it to pass it as it is)")
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
    pattern = False
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
            pattern = pattern or c in PATTERN
            if c == "=" and name_end < 0 and not quoted and _NAME.fullmatch(text[start:i]):
                name_end = i - start
            parts.append(c)
            i += 1
    return _Word("".join(parts), quoted, name_end, pattern), i


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
    patterned: set[int] = set()
    while i < len(items):
        item = items[i]
        if isinstance(item, _Op):
            if item.text in (";", "&&", "&"):
                break
            fd = 2 if item.text.startswith("2") else 1
            target = items[i + 1] if i + 1 < len(items) else None
            if not isinstance(target, _Word):
                raise Refused("a redirection without a file")
            if target.pattern:
                raise Refused(PATTERN_REFUSED)
            redirects.append(Redirect(fd, item.text.endswith(">>"), target.text))
            i += 2
            continue
        if not item.quoted and item.text in ("{", "}") and not argv:
            raise Refused(f"an unexpected '{item.text}'")
        if not argv and item.name_end > 0:
            assignments.append((item.text[:item.name_end], item.text[item.name_end + 1:]))
        else:
            if item.pattern:
                patterned.add(len(argv))
            argv.append(item.text)
        i += 1
    if not argv and not assignments:
        raise Refused("an empty command")
    return Simple(tuple(assignments), tuple(argv), tuple(redirects), frozenset(patterned)), i


def decode(raw: bytes) -> tuple[str, str]:
    """The text of an exec string and its encoding: UTF-8, or Latin-1 in
    x2goclient's wrapper (Qt's ``toLatin1``; a shell there would pass the
    bytes on, and a UTF-8 session would show them garbled)."""
    try:
        return raw.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        if raw.startswith(b"bash -l -c '"):
            return raw.decode("latin-1"), "latin-1"
        raise Refused("not UTF-8") from None


def read_exec(raw: bytes, facts: Facts) -> Program:
    """The program of one exec request, wrappers taken off.

    Raises :class:`Refused` with the reason for anything outside the
    contract; nothing is run before the whole program has been read."""
    if len(raw) > MAX_EXEC_BYTES:
        raise Refused(f"longer than {MAX_EXEC_BYTES} bytes")
    text, encoding = decode(raw)
    if any(ord(c) < 32 and c != "\t" or 0x7f <= ord(c) < 0xa0 for c in text):
        raise Refused("a control character")
    extra = {"encoding": encoding} if encoding != "utf-8" else {}
    python_literal = _PYTHON_WRAPPER.fullmatch(text)
    x2goclient_literal = _X2GOCLIENT_WRAPPER.fullmatch(text)
    try:
        outer = parse(text, facts)
    except Refused:
        if python_literal is None and x2goclient_literal is None:
            raise
        outer = ()
    python = _python_wrapper(outer) if outer else None
    if python is not None:
        begin, inner, end = python
        return Program(parse(inner, facts, 1), begin, end, "python-x2go", extra)
    if python_literal is not None:
        # The command's own double quotes broke python-x2go's: read what it meant.
        begin, inner, end = python_literal.groups()
        return Program(parse(inner, facts, 1), begin, end, "python-x2go", {**extra, "quotes": "literal"})
    if len(outer) == 1 and outer[0].command.argv[:3] == ("bash", "-l", "-c") and len(outer[0].command.argv) == 4 \
            and not outer[0].command.assignments and not outer[0].command.redirects:
        return _bash_program(parse(outer[0].command.argv[3], facts, 1), extra)
    if x2goclient_literal is not None:
        # The command's own single quotes broke x2goclient's: read what it meant.
        return _bash_program(parse(x2goclient_literal.group(1), facts, 1), {**extra, "quotes": "literal"})
    return Program(outer, extra=extra)


def _bash_program(inner: tuple[Step, ...], extra: dict[str, str]) -> Program:
    """x2goclient's ``bash -l -c`` program, its markers taken off."""
    first, last = inner[0].command, inner[-1].command
    if _is_marker_echo(first, "BEGIN") and len(inner) >= 2 and _is_marker_echo(last, "END"):
        return Program(inner[1:-1], first.argv[1], last.argv[1], "x2goclient", extra)
    if _is_marker_echo(first, "BEGIN") and inner[-1].joiner == "&":  # "... & exit": no END marker
        return Program(inner[1:], first.argv[1], None, "x2goclient", extra)
    return Program(inner, None, None, "bash -l -c", extra)


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
