"""Running a checked X2Go program against the session API (no Twisted here).

The calls of one exec (see :mod:`nxgate.gateway.doors.conch.x2go.verbs`) run in order,
with ``;``/``&&``/``exit`` as the shell would, and their output is gathered
between the client's markers.  The X2Go verbs map to
:class:`nxgate.vocabulary.api.SessionAPI`, the same calls every door makes
(the owner checks are the service's: a caller's listing holds only the
caller's sessions, so another user's session name is simply not found);
the rest is answered from what the door knows.  A start or resume leaves
a :class:`Link` behind: which agent a ``direct-tcpip`` to the session's
virtual graphics port reaches, and with which cookie.
"""

from __future__ import annotations

import dataclasses
import hmac
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from nxgate.gateway.doors.conch.x2go import files, folders, names
from nxgate.gateway.doors.conch.x2go.shell import Facts, Program
from nxgate.gateway.doors.conch.x2go.verbs import VERBS, Call, parse_start
from nxgate.vocabulary.caller import Caller
from nxgate.vocabulary.display_bounds import depth_problem, size_problem
from nxgate.vocabulary.errors import ErrorKind, SessionError
from nxgate.vocabulary.requests import (PUBLISHED_TYPE, DisplaySettings, FolderShares, RestoreRequest, ShadowRequest,
                                        StartRequest)
from nxgate.vocabulary.results import Ready, SessionView

#: x2gostartagent's exit status for a session limit (x2goclient then says "Sessions limit reached").
LIMIT_STATUS = 9
MAX_LINKS_PER_USER = 16


@dataclass(frozen=True)
class Link:
    """Where a ``direct-tcpip`` to a session's graphics port goes."""

    session_id: str
    target: Any  # nxgate.vocabulary.results.StreamTarget
    agent_cookie: str = field(repr=False)
    name: str = ""  # the session's X2Go name (its ~/.x2go/C-<name> holds what the client pushes)

    def cookie_matches(self, offered: str) -> bool:
        return hmac.compare_digest(offered.encode(), self.agent_cookie.encode())


class Links:
    """The door's links by (user, graphics port); one owner: the door."""

    def __init__(self) -> None:
        self._links: dict[tuple[str, int], Link] = {}

    def put(self, user: str, port: int, link: Link) -> None:
        mine = [key for key in self._links if key[0] == user]
        for key in mine:
            if self._links[key].session_id == link.session_id:
                del self._links[key]
        if len(mine) >= MAX_LINKS_PER_USER:
            self._links.pop(next(key for key in self._links if key[0] == user), None)
        self._links[(user, port)] = link

    def get(self, user: str, port: int) -> Link | None:
        return self._links.get((user, port))


@dataclass
class Outcome:
    stdout: str = ""
    stderr: str = ""
    status: int = 0
    exited: bool = False  # "& exit": the END marker is not echoed


@dataclass(frozen=True)
class Context:
    """What one connection's commands may use."""

    router: Any  # nxgate.vocabulary.api.SessionAPI: the router
    caller: Caller
    facts: Facts
    secret: bytes
    links: Links
    version: str
    now: Callable[[], float]
    locate: Callable[[str], Awaitable[str | None]]  # a program on the sessions' PATH, or None
    log: Any
    types: Callable[[], set[str]] = set  # the session types this server offers
    keys: Any = None  # folders.FolderKeys: the key bundles the caller's clients pushed
    sharing: Callable[[], bool] = lambda: False  # whether folders may be shared (``[services] sharing``)
    route_ready: Callable[[int], Awaitable[None]] | None = None  # the client's forward of a port is open
    remove: Callable[[str], Awaitable[None]] | None = None  # a file below ~/.x2go, removed (no link followed)


async def run(program: Program, calls: tuple[Call, ...], context: Context) -> Outcome:
    outcome = Outcome()
    if program.begin:
        outcome.stdout += program.begin + "\n"
    status = 0
    for call in calls:
        if call.joiner == "&&" and status != 0:
            continue
        if call.verb == "exit":
            outcome.exited = True
            break
        out, err, status = await _one(call, context)
        if call.output is None:
            outcome.stdout += out
        outcome.stderr += err
    outcome.status = status
    if program.end and not outcome.exited:
        outcome.stdout += program.end + "\n"
    return outcome


async def _one(call: Call, context: Context) -> tuple[str, str, int]:
    handler = _HANDLERS.get(call.verb)
    if handler is None:  # the checks and this table disagree: a bug, said plainly
        return "", f"nxgate: {call.verb} is not available\n", 127
    try:
        return await handler(call, context)
    except SessionError as error:
        context.log.info("X2Go {verb} of {user} from {address} refused: {message}", verb=call.verb,
                         user=context.caller.user, address=context.caller.address, message=error.message,
                         kind=error.kind.value)
        if error.kind in (ErrorKind.NOT_YOURS, ErrorKind.NOT_FOUND):
            return "", "nxgate: no such session\n", 1
        if error.kind is ErrorKind.LIMIT_REACHED:
            return "", f"LIMIT {error.message}\n", LIMIT_STATUS
        return "", f"nxgate: {error.message}\n", 1


async def _echo(call: Call, context: Context) -> tuple[str, str, int]:
    return " ".join(call.args) + "\n", "", 0


async def _quiet(call: Call, context: Context) -> tuple[str, str, int]:
    return "", "", 0


async def _which(call: Call, context: Context) -> tuple[str, str, int]:
    name = call.args[0]
    if name in VERBS:
        return f"/usr/bin/{name}\n", "", 0
    if name == "fusermount":  # where folders cannot be shared, nothing: python-x2go then switches them off cleanly
        found = await context.locate("fusermount3") if context.sharing() and await context.locate("sshfs") else None
        return (f"{found}\n", "", 0) if found else ("", "", 1)
    found = await context.locate(name)
    return (f"{found}\n", "", 0) if found else ("", "", 1)


async def _test(call: Call, context: Context) -> tuple[str, str, int]:
    path = call.args[1]
    if "/" not in path:
        return "", "", 1
    found = await context.locate(path)
    return "", "", 0 if found else 1


async def _stat(call: Call, context: Context) -> tuple[str, str, int]:
    caller = context.caller
    return f"{context.facts.home} 4096 8 41ed {caller.uid} {caller.gid} 0 0 1 0 0 0 0 0 0 4096\n", "", 0


async def _version(call: Call, context: Context) -> tuple[str, str, int]:
    return names.version_output(context.version), "", 0


async def _features(call: Call, context: Context) -> tuple[str, str, int]:
    return "".join(f"{name}\n" for name in names.FEATURES), "", 0


async def _basepath(call: Call, context: Context) -> tuple[str, str, int]:
    return "/usr", "", 0  # printf, no new line (x2goclient appends /bin/x2goruncommand)


async def _servers(call: Call, context: Context) -> tuple[str, str, int]:
    return context.facts.hostname + "\n", "", 0


async def _mine(context: Context) -> list[SessionView]:
    listing = await context.router.list(context.caller)
    return [view for view in listing.sessions if view.user == context.caller.user]


async def _list(call: Call, context: Context) -> tuple[str, str, int]:
    views = await _mine(context)
    return names.listing(views, context.secret, context.facts.hostname, context.now()), "", 0


async def _session(call: Call, context: Context) -> SessionView:
    view = names.find(await _mine(context), call.args[0])
    if view is None:
        context.log.info("X2Go {verb} of {user} from {address}: no session {name!r} of theirs",
                         verb=call.verb, user=context.caller.user, address=context.caller.address,
                         name=call.args[0][:160])
        raise SessionError(ErrorKind.NOT_FOUND, "no such session")
    return view


def _settings(geometry: str, depth: int, link: str, kbtype: str, clipboard: str) -> DisplaySettings:
    """The display an X2Go client asks for, within the bounds every door keeps."""
    fullscreen = geometry in ("fullscreen", "maximize")
    if not fullscreen:
        width, _, height = geometry.partition("x")
        problem = size_problem(int(width), int(height))
        if problem is not None:
            raise SessionError(ErrorKind.INVALID_REQUEST, f"the session size {geometry}: {problem}")
    problem = depth_problem(depth)
    if problem is not None:
        raise SessionError(ErrorKind.INVALID_REQUEST, f"a colour depth of {depth}: {problem}")
    return DisplaySettings(geometry="1024x768" if fullscreen else geometry, fullscreen=fullscreen, depth=depth,
                           keyboard=kbtype if re.fullmatch(r"[a-z0-9]+/[a-z0-9_-]+", kbtype) else "pc105/us",
                           link=link, clipboard=clipboard, client="x2go")


def _linked(ready: Ready, context: Context) -> names.X2GoNumbers:
    """The numbers to print for a session just started or resumed (with the
    agent's own cookie), remembered for the graphics link that follows."""
    numbers = dataclasses.replace(names.numbers(ready.view, context.secret), cookie=ready.cookie)
    if ready.stream is not None:
        context.links.put(context.caller.user, numbers.gr_port, Link(ready.view.id, ready.stream, ready.cookie,
                                                                     numbers.name))
    return numbers


def session_type_for(command: str, offered: set[str], more: tuple[str, ...] = ()) -> tuple[str, tuple[str, ...]]:
    """The nxgate type for an X2Go command word, and an application's argv."""
    desktop = names.DESKTOPS.get(command) or names.DESKTOPS.get(command.upper())
    if desktop is not None and not more:
        return desktop, ()
    argv = tuple(part for part in command.replace("X2GO_SPACE_CHAR", " ").split(" ") if part) + more
    return "unix-application", argv


async def _start(call: Call, context: Context) -> tuple[str, str, int]:
    start = parse_start(call.args)
    if start.kind == "S":
        return await _share(start, context)
    display = _settings(start.geometry, start.depth, start.link, start.kbtype, start.clipboard)
    if start.kind == "P":
        # Published applications: a rootless agent kept without a program; the client starts them one by one.
        session_type, application = PUBLISHED_TYPE, ()
        request = StartRequest(type=PUBLISHED_TYPE, name="PUBLISHED", encrypted=True, rootless=True, display=display)
    else:
        session_type, application = session_type_for(start.command, context.types(), start.command_args)
        request = StartRequest(type=session_type, name=start.command.rsplit("/", 1)[-1][:64], encrypted=True,
                               rootless=start.kind == "R", application=application, display=display)
    ready = await context.router.start(context.caller, request)
    numbers = _linked(ready, context)
    context.log.info("X2Go session {name} (session {id}, {type}) started for {user} from {address}",
                     name=numbers.name, id=ready.view.id, type=session_type, user=context.caller.user,
                     address=context.caller.address)
    return names.start_output(numbers), "", 0


_SHARED = re.compile(r"([01])XSHAD([A-Za-z0-9._@-]{1,64})XSHAD(?::|PP)?(\d{1,5})")


async def _share(start: Any, context: Context) -> tuple[str, str, int]:
    """X2Go's desktop sharing (``S``: ``<mode>XSHAD<user>XSHAD:<display>``) on
    nxgate's shadowing: the same policy and the owner's consent; mode 0 is
    view-only.  python-x2go reads a refusal from ``ACCESS DENIED`` and ``XSHAD``."""
    wanted = _SHARED.fullmatch(start.command)
    if wanted is None:
        return "", "ACCESS DENIED: no such desktop (XSHAD)\n", 8
    mode, owner, display = wanted.group(1), wanted.group(2), int(wanted.group(3))
    targets = await context.router.shadow_targets(context.caller)
    target = next((t for t in targets if t.owner == owner and t.display == display), None)
    if target is None:
        context.log.info("X2Go desktop sharing of {owner}@:{display} asked by {user}: not a desktop they may share",
                         owner=owner, display=display, user=context.caller.user)
        return "", "ACCESS DENIED: no such desktop to share (XSHAD)\n", 8
    settings = _settings(start.geometry, start.depth, start.link, start.kbtype, "both")
    try:
        ready = await context.router.attach_shadow(context.caller, ShadowRequest(target.id, settings, mode == "0"))
    except SessionError as error:
        if error.kind in (ErrorKind.REFUSED_BY_OWNER, ErrorKind.NOT_ALLOWED, ErrorKind.NOT_FOUND, ErrorKind.NOT_YOURS):
            context.log.info("X2Go desktop sharing of {owner}@:{display} by {user} refused: {why}", owner=owner,
                             display=display, user=context.caller.user, why=error.message)
            return "", f"ACCESS DENIED: {error.message} (XSHAD)\n", 8
        raise
    numbers = _linked(ready, context)
    context.log.info("X2Go desktop sharing of {owner}@:{display} for {user} as session {name}", owner=owner,
                     display=display, user=context.caller.user, name=numbers.name)
    return names.start_output(numbers), "", 0


async def _desktops(call: Call, context: Context) -> tuple[str, str, int]:
    targets = await context.router.shadow_targets(context.caller)
    return "".join(f"{t.owner}@:{t.display}\n" for t in targets), "", 0


async def _resume(call: Call, context: Context) -> tuple[str, str, int]:
    view = await _session(call, context)
    _, geometry, link, _pack, _layout, kbtype = call.args[:6]
    clipboard = call.args[7] if len(call.args) > 7 and call.args[7] in ("both", "server", "client", "none") else "both"
    settings = _settings(geometry, view.depth, link, kbtype, clipboard)
    # The client connects with the cookie of the listing it made before this resume.
    cookie = names.link_cookie(context.secret, view.id)
    ready = await context.router.restore(context.caller, RestoreRequest(view.id, settings, encrypted=True, cookie=cookie))
    if ready.cookie != cookie:
        context.log.warn("X2Go resume of session {id} by {user}: the agent kept its cookie (a session started for a"
                         " later client that never had one); the X2Go client cannot connect to it until an NX client"
                         " or the browser has attached once", id=view.id, user=context.caller.user)
    return names.resume_output(_linked(ready, context)), "", 0


async def _suspend(call: Call, context: Context) -> tuple[str, str, int]:
    view = await _session(call, context)
    await context.router.suspend(context.caller, view.id)
    return "", "", 0


async def _terminate(call: Call, context: Context) -> tuple[str, str, int]:
    view = await _session(call, context)
    await context.router.terminate(context.caller, view.id, "X2Go client request")
    return "", "", 0


async def _runcommand(call: Call, context: Context) -> tuple[str, str, int]:
    """The program starts when the graphics link is up (nxgate starts it at
    the first attach, as X2Go's clients expect of x2goruncommand): here only
    the session is checked to be the caller's."""
    view = await _session(call.__class__(call.verb, (call.args[2],)), context)
    context.log.info("X2Go runcommand {command!r} for session {id} of {user}: its program starts with the link",
                     command=call.args[4][:80], id=view.id, user=context.caller.user)
    return "", "", 0


async def _applications(call: Call, context: Context) -> tuple[str, str, int]:
    """``x2gogetapps``: the applications of the machine of the caller's
    published-applications session (else of his newest session; none: an
    empty menu), in x2goserver's format."""
    views = [view for view in await _mine(context) if not view.lost]
    published = [view for view in views if view.type == PUBLISHED_TYPE]
    chosen = (published or views)[-1:] if views else []
    if not chosen:
        context.log.info("X2Go x2gogetapps of {user}: no session of theirs to ask its machine; an empty menu",
                         user=context.caller.user)
        return "", "", 0
    entries = await context.router.applications(context.caller, chosen[0].id)
    context.log.info("X2Go x2gogetapps of {user}: {count} applications of the machine of session {id}",
                     user=context.caller.user, count=len(entries), id=chosen[0].id)
    return names.applications_output(entries), "", 0


async def _launch(call: Call, context: Context) -> tuple[str, str, int]:
    """A published application started by the client (``setsid <Exec> … & exit``)
    in its published-applications session, named by ``X2GO_SESSION`` or ``DISPLAY``."""
    views = await _mine(context)
    wanted = call.env.get("X2GO_SESSION", "")
    display = call.env.get("DISPLAY", "").lstrip(":").split(".")[0]
    view = names.find(views, wanted) if wanted else None
    if view is None and display.isdigit():
        view = next((v for v in views if v.display == int(display)), None)
    if view is None:
        published = [v for v in views if v.type == PUBLISHED_TYPE and v.status == "Running"]
        view = published[-1] if len(published) == 1 else None
    if view is None:
        context.log.info("X2Go client of {user} started {program!r} outside a session of theirs: refused",
                         user=context.caller.user, program=call.args[0][:64])
        raise SessionError(ErrorKind.NOT_FOUND, "no such session")
    await context.router.run_application(context.caller, view.id, call.args)
    return "", "", 0


async def _owned_quiet(call: Call, context: Context) -> tuple[str, str, int]:
    await _session(call, context)
    return "", "", 0




async def _mountdirs(call: Call, context: Context) -> tuple[str, str, int]:
    """``x2gomountdirs``: the caller's folders mounted in his session, by its
    node, with the key bundle his client pushed (:mod:`.folders`); x2goserver's
    lines for each, and a line on stderr for each refused."""
    caller = context.caller
    if not context.sharing():
        context.log.info("X2Go folder sharing asked by {user}: switched off ([services] sharing)", user=caller.user)
        return "the sshfs command is not installed on this X2Go Server, cannot share client-side folders\n", "", 0
    try:
        request = folders.parse_mountdirs(call.args)
    except folders.MountRefused as refusal:
        return _folders_refused(context, str(refusal))
    view = await _session(call.__class__(call.verb, (request.session,)), context)
    expected = names.numbers(view, context.secret).fs_port
    if request.port != expected:
        context.log.warn("X2Go client of {user} from {address} asked to mount folders of session {id} through port"
                         " {port}, which is not the session's folders port ({expected}); refused", user=caller.user,
                         address=caller.address, id=view.id, port=request.port, expected=expected,
                         audit="x2go_folder_refused")
        return "", (f"mounting of {request.listed[:200]} failed: port {request.port} is not the folders port of"
                    f" session {request.session}\n"), 1
    bundle = _key_bundle(request.key_path, context)
    if bundle is None:
        return _folders_refused(context, f"the key file {request.key_path[:120]!r} was not pushed (or is gone): a"
                                         " client pushes its key bundle below ~/.x2go/ssh first")
    if context.route_ready is not None:
        await context.route_ready(request.port)
    shares = FolderShares(request.folders, request.client_user, bundle.private, bundle.host_key)
    results = await context.router.mount_folders(caller, view.id, shares)
    out, err = folders.mountdirs_header(request, caller.user), ""
    for result in results:
        out += folders.mountdirs_folder(request, result.path, result.mount_point or "-", result.mounted)
        if not result.mounted:
            err += f"mounting of {result.path} failed: {result.problem}\n"
    return out, err, 0


def _key_bundle(path: str, context: Context) -> Any:
    """The bundle the caller's client pushed to ``path`` (``~``, ``$HOME`` and relative paths already read by the
    shell reader), or None."""
    try:
        name = folders.key_name(files.parts(path, context.facts.home))
    except files.PathRefused:
        return None
    return context.keys.get(context.caller.user, name) if name is not None and context.keys is not None else None


def _folders_refused(context: Context, why: str) -> tuple[str, str, int]:
    context.log.info("X2Go x2gomountdirs of {user} from {address} refused: {why}", user=context.caller.user,
                     address=context.caller.address, why=why)
    return "", f"mounting of the client's folders failed: {why}\n", 1


async def _umount(call: Call, context: Context) -> tuple[str, str, int]:
    """``x2goumount-session <session> [client path]``: the session's folders (or that one) unmounted; nothing
    on stderr when done (python-x2go reads success from an empty stderr)."""
    view = await _session(call, context)
    if not context.sharing():
        return "", "", 0
    path = call.args[1] if len(call.args) > 1 else ""
    await context.router.unmount_folders(context.caller, view.id, path)
    return "", "", 0


async def _listmounts(call: Call, context: Context) -> tuple[str, str, int]:
    view = await _session(call, context)
    if not context.sharing():
        return "\n", "", 0
    mounted = await context.router.folders(context.caller, view.id)
    return folders.listmounts_output([mount.mount_point for mount in mounted]) or "\n", "", 0


async def _remove(call: Call, context: Context) -> tuple[str, str, int]:
    """``rm -f`` of key files below ``~/.x2go/ssh`` (python-x2go's after x2gomountdirs): the bundles are forgotten;
    nothing of them is on disk here."""
    for path in call.args[1:]:
        try:
            name = folders.key_name(files.parts(path.removesuffix(".ident"), context.facts.home))
        except files.PathRefused:
            name = None
        if name is not None and context.keys is not None:
            context.keys.drop(context.caller.user, name)
        if context.remove is not None:  # a key file an earlier gateway wrote (this one keeps them in memory)
            try:
                await context.remove(path)
            except Exception as error:  # gone already, or not the user's: -f says nothing
                context.log.debug("rm -f {path!r} of {user}: {error}", path=path, user=context.caller.user,
                                  error=str(error))
    return "", "", 0


_HANDLERS: dict[str, Callable[[Call, Context], Awaitable[tuple[str, str, int]]]] = {
    "echo": _echo, "printf": _quiet, "export": _quiet, "assign": _quiet, "true": _quiet,
    "setxkbmap": _quiet, "xrandr": _quiet, "which": _which, "test": _test, "stat": _stat,
    "x2goversion": _version, "x2gofeaturelist": _features, "x2gobasepath": _basepath, "x2gogetservers": _servers,
    "x2golistsessions": _list, "x2golistshadowsessions": _quiet, "x2golistdesktops": _desktops,
    "x2gostartagent": _start, "x2goresume-session": _resume, "x2gosuspend-session": _suspend,
    "x2goterminate-session": _terminate, "x2goruncommand": _runcommand, "x2gocmdexitmessage": _owned_quiet,
    "x2goumount-session": _umount, "x2golistmounts": _listmounts, "x2gomountdirs": _mountdirs, "rm": _remove,
    "x2gogetapps": _applications, "launch": _launch,
}
