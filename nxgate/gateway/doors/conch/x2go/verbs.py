"""Which commands of an X2Go client's program may run, with what (pure).

Every simple command of a program read by :mod:`nxgate.gateway.doors.conch.x2go.shell`
becomes one typed :class:`Call` here, or the whole program is refused
(:class:`~nxgate.gateway.doors.conch.x2go.shell.Refused`): the X2Go verbs with their
arguments checked, and the few shell utilities the clients use as glue
(``echo``, ``export``, ``which``, ``stat -tL <home>``, ``test``, ``setsid``,
``setxkbmap``/``xrandr`` as no-ops, ``rm -f`` of the sshfs key a client pushed).  Output may go to ``/dev/null`` or to a
file under the caller's ``~/.x2go/``; nothing else.  The user's own session
command (the words of ``x2gostartagent`` after the session type) may be any
text: it becomes one argv, started without a shell.  A program of its own
under ``setsid`` is a ``launch`` (a published application), which the
session's node allows only for the ``Exec`` line of a listed application.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field

from nxgate.gateway.doors.conch.x2go import files
from nxgate.gateway.doors.conch.x2go.shell import MAX_EXEC_BYTES, PATTERN_REFUSED, Facts, Program, Refused, Simple

#: Variables a client may set before a command or export.
ASSIGNABLE = frozenset({"PATH", "TERM", "HOSTNAME", "DISPLAY", "X2GO_XINERAMA", "X2GODPI", "X2GOXDMCP",
                        "PULSE_CLIENTCONFIG", "X2GO_SPOOLDIR", "X2GO_MIMEBOX", "X2GO_SESSION", "X2GO_ICONV"})
#: The verbs this door answers (``which`` finds them in /usr/bin).
VERBS = frozenset({"x2golistsessions", "x2golistshadowsessions", "x2golistdesktops", "x2gostartagent",
                   "x2goruncommand", "x2goresume-session", "x2gosuspend-session", "x2goterminate-session",
                   "x2goversion", "x2gofeaturelist", "x2gobasepath", "x2gocmdexitmessage", "x2gogetservers",
                   "x2goumount-session", "x2gomountdirs", "x2golistmounts", "x2gogetapps"})
_GEOMETRY = re.compile(r"(\d{2,5}x\d{2,5}|fullscreen|maximize)")
_LINK = frozenset({"modem", "isdn", "adsl", "wan", "lan"})
_WORD = re.compile(r"[A-Za-z0-9._@:/+,()-]{0,64}")
_INT = re.compile(r"-?\d{1,10}")
_CLIPBOARD = frozenset({"both", "server", "client", "none"})
_DEPTH = re.compile(r"[A-Za-z0-9-]{0,32}-depth_(\d{1,2})")
_NAME = re.compile(r"[A-Za-z0-9._@-]{1,160}")
#: A session command (any text a user types in his profile): its words, and one word's characters.
MAX_COMMAND_WORDS = 64
MAX_COMMAND_WORD = 1024


@dataclass(frozen=True)
class Call:
    """One command to run: its verb and checked arguments."""

    verb: str
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    output: str | None = None  # a file under ~/.x2go/ for stdout (``>``/``>>``), None: to the client
    append: bool = False
    joiner: str = ";"


@dataclass(frozen=True)
class StartAgent:
    geometry: str
    link: str
    pack: str
    depth: int
    kblayout: str
    kbtype: str
    kind: str  # D, R, S or P
    command: str
    clipboard: str
    command_args: tuple[str, ...] = ()  # a command with blanks arrives as more words (a client bug)


def check_program(program: Program, facts: Facts) -> tuple[Call, ...]:
    """The calls of ``program``, or Refused naming the first problem.  A
    ``launch`` (a published application) carries what the program exported
    before it (python-x2go names the session in ``X2GO_SESSION``)."""
    calls: list[Call] = []
    exported: dict[str, str] = {}
    steps = program.steps
    for index, step in enumerate(steps):
        command = step.command
        if step.joiner == "&":
            # Only "X & exit" at the very end: run X, then stop.
            if command.argv != ("exit",) or index != len(steps) - 1 and not _only_end_echo(steps[index + 1:]):
                raise Refused("a background command other than '… & exit'")
        call = _call(command, facts, step.joiner)
        if call.verb == "export":
            exported.update(arg.split("=", 1) for arg in call.args if "=" in arg)
        if call.verb == "launch":
            call = dataclasses.replace(call, env={**exported, **call.env})
        calls.append(call)
    return tuple(calls)


def _only_end_echo(rest: tuple) -> bool:
    return all(s.command.argv[:1] == ("echo",) and s.command.argv[1:2] and
               s.command.argv[1].startswith("X2GODATAEND:") for s in rest)


def _call(command: Simple, facts: Facts, joiner: str) -> Call:
    env: dict[str, str] = {}
    for name, value in command.assignments:
        if name not in ASSIGNABLE:
            raise Refused(f"setting {name}")
        env[name] = value
    argv = command.argv
    patterned = command.patterned
    if argv[:1] == ("setsid",):
        argv = argv[1:]
        patterned = frozenset(index - 1 for index in patterned)
    # A pattern passes only in x2goruncommand's program word, which nothing runs (see Simple).
    if patterned and not (argv[:1] and argv[0].rpartition("/")[2] == "x2goruncommand" and patterned == {5}):
        raise Refused(PATTERN_REFUSED)
    verb = argv[0] if argv else "assign"
    if command.argv[:1] == ("setsid",) and argv and argv[0].rpartition("/")[2] not in VERBS:
        # A program of its own in a session (a published application): the node decides whether it may run.
        if any(r.path != "/dev/null" for r in command.redirects) or len(argv) > MAX_COMMAND_WORDS \
                or any(len(word) > MAX_COMMAND_WORD for word in argv):
            raise Refused(f"starting {argv[0][:64]!r} other than as a published application")
        return Call("launch", tuple(argv), env, "/dev/null", False, joiner)
    if "/" in verb:  # x2goclient runs "<x2gobasepath>/bin/x2goruncommand"
        directory, _, base = verb.rpartition("/")
        if directory not in ("/usr/bin", "/usr/local/bin", "/bin") or base not in VERBS:
            raise Refused(f"the program {verb[:64]!r}")
        verb = base
    output, append = None, False
    for redirect in command.redirects:
        if redirect.path == "/dev/null":
            if redirect.fd == 1:
                output = "/dev/null"
            continue
        if redirect.fd != 1:
            raise Refused("standard error to a file")
        if verb not in ("echo", "printf", "assign"):
            raise Refused(f"{verb[:32]}'s output to a file (a redirection)")
        output, append = x2go_path(redirect.path, facts), redirect.append
    if not argv:
        return Call("assign", (), env, output, append, joiner)
    args = argv[1:]
    checker = _CHECKS.get(verb)
    if checker is None:
        raise Refused(f"the command {verb[:64]!r}")
    checker(args, facts)
    return Call(verb, tuple(args), env, output, append, joiner)


def x2go_path(path: str, facts: Facts) -> str:
    """``path`` if it is a file below the caller's ``~/.x2go/`` (no ``..``)."""
    base = facts.home.rstrip("/") + "/.x2go/"
    normal = os.path.normpath(path)
    if not path.startswith(base) or normal != path.rstrip("/") or ".." in path.split("/") or len(path) > 512:
        raise Refused(f"writing outside ~/.x2go ({path[:80]!r})")
    return normal


def _none(args: tuple[str, ...], facts: Facts) -> None:
    if args:
        raise Refused("unexpected arguments")


def _any_words(limit: int):
    def check(args: tuple[str, ...], facts: Facts) -> None:
        if len(args) > limit or any(len(a) > 512 for a in args):
            raise Refused("too many or too long arguments")
    return check


def _export(args: tuple[str, ...], facts: Facts) -> None:
    for arg in args:
        name = arg.split("=", 1)[0]
        if name not in ASSIGNABLE:
            raise Refused(f"exporting {name[:32]}")


def _which(args: tuple[str, ...], facts: Facts) -> None:
    if len(args) != 1 or not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", args[0]):
        raise Refused("which with other than one program name")


def _stat(args: tuple[str, ...], facts: Facts) -> None:
    if len(args) != 2 or args[0] != "-tL" or args[1].rstrip("/") != facts.home.rstrip("/"):
        raise Refused("stat of other than the home directory")


def _test(args: tuple[str, ...], facts: Facts) -> None:
    if len(args) != 2 or args[0] != "-x" or len(args[1]) > 256:
        raise Refused("test other than -x PATH")


def _session_name(args: tuple[str, ...], facts: Facts, low: int = 1, high: int = 1) -> None:
    if not low <= len(args) <= high or not _NAME.fullmatch(args[0]):
        raise Refused("a session name expected")


def _name_then_words(low: int, high: int):
    def check(args: tuple[str, ...], facts: Facts) -> None:
        _session_name(args, facts, low, high)
        if any(not _WORD.fullmatch(a) for a in args[1:]):
            raise Refused("an unexpected argument")
    return check


def parse_start(args: tuple[str, ...]) -> StartAgent:
    """x2gostartagent's positional arguments (both clients' forms).  A
    command with blanks shifts the clipboard mode to the end (X2Go's script
    would take its second word as the mode): the words between are the
    command's arguments."""
    if not 9 <= len(args) <= 10 + MAX_COMMAND_WORDS:
        raise Refused("x2gostartagent needs 9 or 10 arguments and the words of the session command")
    geometry, link, pack, cache_depth, kblayout, kbtype, _setkbd, kind, command = args[:9]
    rest = args[9:]
    clipboard = rest[-1] if rest and rest[-1] in _CLIPBOARD else "both"
    command_args = tuple(rest[:-1] if rest and rest[-1] in _CLIPBOARD else rest)
    if len(command_args) > MAX_COMMAND_WORDS or any(len(word) > MAX_COMMAND_WORD for word in command_args):
        raise Refused(f"a session command of more than {MAX_COMMAND_WORDS} words or a word longer than"
                      f" {MAX_COMMAND_WORD} characters")
    depth = _DEPTH.fullmatch(cache_depth)
    if not _GEOMETRY.fullmatch(geometry) or link not in _LINK or depth is None or kind not in ("D", "R", "S", "P") \
            or clipboard not in _CLIPBOARD or not all(_WORD.fullmatch(a) for a in (pack, kblayout, kbtype)):
        raise Refused("x2gostartagent with an argument out of range")
    if not 0 < len(command) <= MAX_COMMAND_WORD or command.startswith("-") or any(c.isspace() for c in command):
        raise Refused(f"the session command {command[:64]!r}")
    return StartAgent(geometry, link, pack, int(depth.group(1)), kblayout, kbtype, kind, command, clipboard,
                      command_args)


def _start(args: tuple[str, ...], facts: Facts) -> None:
    parse_start(args)


def _resume(args: tuple[str, ...], facts: Facts) -> None:
    _session_name(args, facts, 7, 9)
    if not _GEOMETRY.fullmatch(args[1]) or args[2] not in _LINK or any(not _WORD.fullmatch(a) for a in args[3:]):
        raise Refused("x2goresume-session with an argument out of range")


def _runcommand(args: tuple[str, ...], facts: Facts) -> None:
    if len(args) != 7 or not all(_INT.fullmatch(a) for a in (args[0], args[1], args[3])) \
            or not _NAME.fullmatch(args[2]) or len(args[4]) > MAX_EXEC_BYTES or not _WORD.fullmatch(args[5]) \
            or args[6] not in ("D", "R", "S", "P"):
        raise Refused("x2goruncommand with an argument out of range")


def _echo(args: tuple[str, ...], facts: Facts) -> None:
    if len(args) > 8 or sum(len(a) for a in args) > 1024:
        raise Refused("a long echo")


def _scp(args: tuple[str, ...], facts: Facts) -> None:
    """x2goclient's ``scp -t [-r] DIR`` (a sink below ~/.x2go only)."""
    flags, targets = [a for a in args if a.startswith("-")], [a for a in args if not a.startswith("-")]
    if "-t" not in flags or not set(flags) <= {"-t", "-r", "-p", "-d"} or len(targets) != 1:
        raise Refused("scp other than a sink (-t) into one directory")
    try:
        files.parts(targets[0].rstrip("/") + "/x", facts.home)
    except files.PathRefused as error:
        raise Refused(f"scp into {targets[0][:80]!r}: {error}") from None


def _umount(args: tuple[str, ...], facts: Facts) -> None:
    """``x2goumount-session <session> [<client path>]`` (python-x2go quotes a path, which may hold blanks)."""
    _session_name(args[:1], facts)
    if len(args) > 2 or (len(args) == 2 and (len(args[1]) > 512 or any(ord(c) < 32 for c in args[1]))):
        raise Refused("x2goumount-session with other than a session and a folder")


def _rm(args: tuple[str, ...], facts: Facts) -> None:
    """python-x2go's ``rm -f KEY KEY.ident`` after x2gomountdirs: the key bundle it pushed, below ~/.x2go/ssh/
    (the door forgets the bundle it kept; nothing else may be removed)."""
    if len(args) < 2 or len(args) > 3 or args[0] != "-f":
        raise Refused("the command 'rm' (only 'rm -f' of the sshfs key the client pushed)")
    for path in args[1:]:
        try:
            names = files.parts(path, facts.home)
        except files.PathRefused as error:
            raise Refused(f"the command 'rm' of {path[:80]!r}: {error}") from None
        if len(names) != 3 or names[1] != "ssh" or not names[2].startswith("key."):
            raise Refused(f"the command 'rm' of {path[:80]!r}: not an sshfs key below ~/.x2go/ssh")


def _printf(args: tuple[str, ...], facts: Facts) -> None:
    if len(args) != 2 or args[0] != "%b" or len(args[1]) > 1024:
        raise Refused("printf other than %b 'TEXT'")


_CHECKS = {
    "echo": _echo, "printf": _printf, "scp": _scp, "export": _export, "which": _which, "stat": _stat, "test": _test,
    "exit": _none, "true": _none, "rm": _rm,
    "setxkbmap": _any_words(8), "xrandr": _any_words(8),
    "x2golistsessions": _none, "x2golistshadowsessions": _none, "x2golistdesktops": _none,
    "x2goversion": _none, "x2gofeaturelist": _none, "x2gobasepath": _none, "x2gogetservers": _none,
    "x2gostartagent": _start, "x2goruncommand": _runcommand, "x2goresume-session": _resume,
    "x2gosuspend-session": _name_then_words(1, 1), "x2goterminate-session": _name_then_words(1, 1),
    "x2gocmdexitmessage": _name_then_words(1, 1), "x2goumount-session": _umount,
    "x2golistmounts": _name_then_words(1, 1), "x2gomountdirs": _any_words(40), "x2gogetapps": _any_words(4),
}
