"""The X2Go door: the thin Twisted wiring of X2Go clients on the Conch SSH port.

A user who logged in to the SSH port as himself (password,
keyboard-interactive or key: :mod:`nxgate.gateway.doors.conch.checkers`) may, with
``[x2go] enabled``, send the ``exec`` requests of X2Go's clients
(read by :mod:`~nxgate.gateway.doors.conch.x2go.shell`, checked by
:mod:`~nxgate.gateway.doors.conch.x2go.verbs`, run by :mod:`~nxgate.gateway.doors.conch.x2go.commands`
against the session API), open ``direct-tcpip`` channels to his sessions'
virtual graphics ports (relayed to the agent's stream, which the session
API's ``open_stream`` opens on the session's node, through the same
:class:`~nxgate.streams.relay.StreamRelay` the NX door uses: one box and a
cluster are one path), write the files the
clients push over SFTP below his ``~/.x2go`` (:mod:`~nxgate.gateway.doors.conch.x2go.sftp`),
and carry his sessions' sound back to the client's reverse forward
(:meth:`X2GoDoor.forward_request`, on the node interface's reverse streams:
:mod:`nxgate.streams.reverse`).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import struct
from collections.abc import Callable
from typing import Any

from twisted.conch.error import ConchError
from twisted.conch.ssh import common
from twisted.conch.ssh.channel import SSHChannel
from twisted.internet import defer
from twisted.logger import Logger

from nxgate import __version__
from nxgate.host.users import resolve_caller
from nxgate.gateway.doors.conch.x2go import commands, files, pushes, scp, sftp, shell, verbs
from nxgate.gateway.doors.conch.x2go.commands import Context, Link, Links
from nxgate.streams.reverse_channel import MAX_PER_CONNECTION, send_back
from nxgate.streams.reverse_route import ReverseRoute
from nxgate.vocabulary.caller import Caller
from nxgate.vocabulary.errors import SessionError
from nxgate.streams.relay import StreamRelay

log = Logger()

OPEN_CONNECT_FAILED = 2
LOOPBACK = frozenset({b"localhost", b"127.0.0.1", b"::1", b"ip6-localhost"})
_COOKIE = re.compile(rb"cookie=([0-9A-Fa-f]{32})")
#: The nxproxy's first line (``NXPROXY-3.5.0-3.5.99 cookie=…,stream=…``) is short.
MAX_HANDSHAKE = 1024


class X2GoDoor:
    """One per gateway: the door's secret (for the cookies it shows), its
    links, and the per-connection callers."""

    def __init__(self, reactor: Any, router: Callable[[], Any], blocking: Any, users: Any,
                 config: Callable[[], Any], room: Callable[[int], bool] = lambda count: True) -> None:
        """``room(n)``: whether users' work may take ``n`` more of the
        gateway's descriptors (the guard's reserve)."""
        self.reactor = reactor
        self.room = room
        self.desk = pushes.FileDesk(blocking, reactor.seconds, room)
        self.router = router
        self.blocking = blocking
        self.users = users
        self.config = config
        self.secret = secrets.token_bytes(32)
        self.links = Links()
        #: The PulseAudio cookies X2Go clients pushed, by (user, X2Go session name): the last few per user.
        self.cookies: dict[tuple[str, str], bytes] = {}
        #: The open sound routes by (user, X2Go session name), for the cookies pushed after them.
        self.sound_routes: dict[tuple[str, str], set[ReverseRoute]] = {}
        self.desk.pushed = self.pushed

    # --------------------------------------------------------------- who
    async def context(self, avatar: Any, channel: Any) -> Context:
        cached = getattr(avatar, "x2go_context", None)
        if cached is not None:
            return cached
        user = avatar.principal.unix_user
        entry = await self.users.lookup(user)
        caller: Caller = await self.blocking(resolve_caller, user, channel.peer, channel.local_address, "x2go")
        config = self.config()
        hostname = config.server_name if config.server_name not in ("localhost", "(none)", "") else "nxgate"
        facts = shell.Facts(user=user, home=entry.pw_dir, hostname=hostname, shell=entry.pw_shell or "/bin/sh")
        path = config.sessions.path

        async def locate(name: str) -> str | None:
            if "/" in name:
                return name if await self.blocking(_executable, name) else None
            return await self.blocking(shutil.which, name, 1, path)

        owner = files.Owner(caller.uid, caller.gid, entry.pw_dir, caller.user)

        async def remove(path: str) -> None:
            await self.desk.look(files.remove, path, owner)

        context = Context(router=self.router(), caller=caller, facts=facts, secret=self.secret, links=self.links,
                          version=__version__, now=self.reactor.seconds, locate=locate, log=log,
                          types=lambda: set(self.config().types), keys=self.desk.keys,
                          route_ready=lambda port: self.route_ready(avatar, port),
                          sharing=lambda: bool(self.config().services.sharing), remove=remove)
        avatar.x2go_context = context
        return context

    # -------------------------------------------------------------- exec
    def exec(self, channel: Any, raw: bytes) -> int:
        """Accept the exec (the answer comes on the channel) and run it soon."""
        channel.handler = _Quiet()
        self.reactor.callLater(0, lambda: defer.ensureDeferred(self._exec(channel, raw)))
        return 1

    async def _exec(self, channel: Any, raw: bytes) -> None:
        try:
            context = await self.context(channel.avatar, channel)
        except Exception as error:  # an account gone since the login
            log.warn("X2Go command of {user!r} refused: the account cannot be looked up ({error})",
                     user=channel.avatar.principal.unix_user, error=str(error))
            channel.write_stderr(b"nxgate: your account cannot be looked up\n")
            channel.finish(1)
            return
        caller = context.caller
        try:
            program = shell.read_exec(raw, context.facts)
            calls = verbs.check_program(program, context.facts)
        except shell.Refused as refusal:
            log.warn("refused X2Go command {command!r} of {user} from {address}: {reason}; nothing was run",
                     command=raw[:600], user=caller.user, address=caller.address, reason=str(refusal),
                     audit="x2go_refused")
            channel.write_stderr(f"nxgate: command refused: {refusal}. Nothing was run: this server runs one program"
                                 f" with its arguments, without a shell.\n".encode())
            channel.finish(127)
            return
        log.debug("X2Go command of {user}: {verbs}", user=caller.user, verbs=[call.verb for call in calls])
        if [call.verb for call in calls] == ["scp"] and program.begin is None:
            self._scp_sink(channel, context, calls[0])
            return
        try:
            outcome = await commands.run(program, calls, context)
        except Exception:
            log.failure("X2Go command {command!r} of {user} failed", command=raw[:200], user=caller.user)
            outcome = commands.Outcome(stderr="nxgate: internal error (see the server log)\n", status=1)
        if channel.closing:
            return
        if outcome.stdout:
            channel.write(outcome.stdout.encode())
        if outcome.stderr:
            channel.write_stderr(outcome.stderr.encode())
        channel.finish(outcome.status)

    def _scp_sink(self, channel: Any, context: Context, call: Any) -> None:
        """x2goclient's ``scp -t``: files below ~/.x2go, written as the user, acknowledged in order."""
        target = [arg for arg in call.args if not arg.startswith("-")][0]
        owner = files.Owner(context.caller.uid, context.caller.gid, context.facts.home, context.caller.user)
        sink = scp.Sink(target)
        handler = pushes.ScpHandler(self.desk, channel, sink, owner, context.caller.user)
        channel.handler = handler
        channel.write(sink.start())

    def forward_request(self, avatar: Any, kind: bytes, data: bytes) -> Any:
        """X2Go's reverse forwards: the client asks for the sound port of a
        session of theirs that this door started or resumed, and the
        session's sound comes back on ``forwarded-tcpip`` channels to that
        port, as reverse streams from the session's node
        (:mod:`nxgate.streams.reverse`; :meth:`_route_sound`); the folders'
        port the same way for the session's sshfs (its shared folders and
        print spool, :meth:`_route_folders`).  Any other port is refused with
        one log line.  At most :data:`MAX_FORWARDS` requests are answered per
        connection (the clients ask for one per service and session), the
        rest refused with one log line."""
        try:
            host, rest = common.getNS(data)
            (port,) = struct.unpack(">L", rest[:4])
        except (ValueError, struct.error):
            return 0
        user = avatar.principal.unix_user
        routes: dict[int, ReverseRoute] = avatar.__dict__.setdefault("x2go_routes", {})
        if kind == b"cancel-tcpip-forward":
            route = routes.pop(port, None)
            if route is not None:
                route.close()
            return 1  # a cancel frees no slot: grants per connection stay bounded, and so do their log lines
        granted = getattr(avatar, "x2go_forwards", 0)
        if granted >= MAX_FORWARDS:
            if not getattr(avatar, "x2go_forwards_refused", False):
                avatar.x2go_forwards_refused = True
                log.info("refused reverse forwards of {user}'s X2Go client past {limit} on one connection (this"
                         " line once per connection)", user=user, limit=MAX_FORWARDS)
            return 0
        avatar.x2go_forwards = granted + 1
        sound, folders = self.links.get(user, port - 1), self.links.get(user, port - 2)
        if sound is not None and port not in routes:
            log.info("X2Go client of {user} asked for a reverse forward of port {port}: the sound of session {id}",
                     user=user, port=port, id=sound.session_id)
            routes[port] = self._route_sound(avatar, sound, host, port)
            return 1
        if sound is not None:
            return 1
        if folders is not None and port not in routes:
            log.info("X2Go client of {user} asked for a reverse forward of port {port}: the shared folders of session"
                     " {id}", user=user, port=port, id=folders.session_id)
            routes[port] = self._route_folders(avatar, folders, host, port)
            return 1
        if folders is not None:
            return 1
        log.info("refused a reverse forward of {user}'s X2Go client to {host!r}:{port}: not the sound or folders port"
                 " of a session of theirs started or resumed here", user=user, host=host[:100], port=port)
        return 0

    def _route_sound(self, avatar: Any, link: Link, host: bytes, port: int) -> ReverseRoute:
        """The session's sound, back to this connection: each connection a
        program of the session makes to its sound listener becomes a
        ``forwarded-tcpip`` channel to ``host:port`` as the client asked."""
        user = avatar.principal.unix_user
        what = f"the sound of session {link.session_id}"
        deliver = self._deliverer(avatar, link, host, port, what)

        def ended(why: str) -> None:
            log.info("X2Go client of {user}: {what} no longer comes back ({why})", user=user, what=what, why=why)
            self.sound_routes.get((user, link.name), set()).discard(route)

        route = ReverseRoute(self.router().open_stream, self.caller_of(avatar), link.session_id, "sound", deliver,
                             ended)
        self.sound_routes.setdefault((user, link.name), set()).add(route)
        cookie = self.cookies.get((user, link.name))
        if cookie is not None:
            route.send("cookie", cookie)

        def refused(failure: Any) -> None:
            self.sound_routes.get((user, link.name), set()).discard(route)
            why = failure.value.message if failure.check(SessionError) else failure.getErrorMessage()
            log.info("X2Go client of {user}: {what} cannot come back: {why}", user=user, what=what, why=why)

        defer.ensureDeferred(route.open()).addErrback(refused)
        return route

    def _deliverer(self, avatar: Any, link: Link, host: bytes, port: int, what: str) -> Callable[[Any], None]:
        """Each announced connection of a route: a ``forwarded-tcpip`` channel to ``host:port`` as the client asked."""
        user = avatar.principal.unix_user
        opened = struct.pack(">L", port)

        def deliver(stream: Any) -> None:
            if not self.room(LINK_FILES):
                log.warn("dropped a connection of {what} of {user}: the gateway is short of open files"
                         " ([server] fd_reserve)", what=what, user=user)
                stream.close()
                return
            data = common.NS(host) + opened + common.NS(b"127.0.0.1") + struct.pack(">L", 0)
            if not send_back(avatar.conn, stream, b"forwarded-tcpip", what, data):
                log.warn("dropped a connection of {what} of {user}: its client's connection carries {limit} such"
                         " connections already", what=what, user=user, limit=MAX_PER_CONNECTION)

        return deliver

    def _route_folders(self, avatar: Any, link: Link, host: bytes, port: int) -> ReverseRoute:
        """The session's sshfs connections (its shared folders), back to this
        connection's forward of the folders port; ``x2gomountdirs`` waits for
        the route to be open (:meth:`route_ready`)."""
        user = avatar.principal.unix_user
        what = f"the shared folders of session {link.session_id}"
        route = ReverseRoute(self.router().open_stream, self.caller_of(avatar), link.session_id, "sshfs",
                             self._deliverer(avatar, link, host, port, what),
                             lambda why: log.info("X2Go client of {user}: {what} no longer come back ({why})",
                                                  user=user, what=what, why=why))

        def refused(failure: Any) -> None:
            why = failure.value.message if failure.check(SessionError) else failure.getErrorMessage()
            log.info("X2Go client of {user}: {what} cannot come back: {why}", user=user, what=what, why=why)

        opening = defer.ensureDeferred(route.open())
        opening.addErrback(refused)
        avatar.__dict__.setdefault("x2go_route_opening", {})[port] = opening
        return route

    async def route_ready(self, avatar: Any, port: int) -> None:
        """Once the route this connection opened for ``port`` is open (or failed): nothing, when there is none."""
        opening = avatar.__dict__.get("x2go_route_opening", {}).get(port)
        if opening is not None and not opening.called:
            waiter: defer.Deferred[None] = defer.Deferred()
            opening.addBoth(lambda result: (waiter.callback(None), result)[1])
            await waiter

    def pushed(self, user: str, names: list[str], data: bytes) -> None:
        """A file the client pushed was written: a PulseAudio cookie
        (``~/.x2go/C-<session>/.pulse-cookie``) goes to the session's sound
        routes, now and when one opens."""
        if len(names) != 3 or names[2] != ".pulse-cookie" or not names[1].startswith("C-"):
            return
        session = names[1][2:]
        mine = [key for key in self.cookies if key[0] == user and key[1] != session]
        for key in mine[:max(0, len(mine) - MAX_COOKIES + 1)]:
            del self.cookies[key]
        self.cookies[(user, session)] = data
        for route in self.sound_routes.get((user, session), ()):
            route.send("cookie", data)

    def connection_lost(self, avatar: Any) -> None:
        """The client's SSH connection went: its sound goes back to nobody."""
        for route in avatar.__dict__.pop("x2go_routes", {}).values():
            route.close()

    # -------------------------------------------------------------- sftp
    def sftp(self, channel: Any) -> int:
        return sftp.start_sftp(self.desk, channel)

    # ------------------------------------------------------------- links
    def link_channel(self, avatar: Any, window: int, max_packet: int, data: bytes) -> SSHChannel:
        """A ``direct-tcpip`` channel to one of the user's graphics ports."""
        user = avatar.principal.unix_user
        try:
            host, rest = common.getNS(data)
            (port,) = struct.unpack(">L", rest[:4])
        except (ValueError, struct.error):
            raise ConchError(OPEN_CONNECT_FAILED, "bad forwarding request") from None
        link = self.links.get(user, port) if host.lower() in LOOPBACK else None
        if link is None:
            log.info("refused a forward of {user} to {host!r}:{port}: not a graphics port of a session of theirs"
                     " started or resumed here", user=user, host=host[:100], port=port)
            raise ConchError(OPEN_CONNECT_FAILED, "no such session port")
        if not self.room(LINK_FILES):
            log.warn("refused an X2Go graphics link of {user} to session {id}: the gateway is short of open files"
                     " ([server] fd_reserve)", user=user, id=link.session_id)
            raise ConchError(OPEN_CONNECT_FAILED, pushes.SHORT_OF_FILES)
        return X2GoLinkChannel(self, link, localWindow=LINK_WINDOW, remoteWindow=window, remoteMaxPacket=max_packet,
                               data=data, avatar=avatar)

    def caller_of(self, avatar: Any) -> Caller:
        context = getattr(avatar, "x2go_context", None)
        if context is not None:
            return context.caller
        return Caller(user=avatar.principal.unix_user, door="x2go")


LINK_WINDOW = 2 * 1024 * 1024
#: Descriptors one graphics link holds (its socket to the agent, or to the member that runs it).
LINK_FILES = 1
#: Reverse forwards granted per connection: python-x2go and x2goclient ask
#: for one each for sound, folders, printing and the MIME box per session.
MAX_FORWARDS = 16
#: PulseAudio cookies kept per user (one per session the client takes sound from).
MAX_COOKIES = 8


class _Quiet:
    """The handler of an exec channel: what the client sends is not read."""

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> None:
        pass

    def connection_lost(self) -> None:
        pass

    def pause_output(self) -> None:
        pass

    def resume_output(self) -> None:
        pass


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


class X2GoLinkChannel(SSHChannel):
    """The client's nxproxy <-> the session's agent.

    The proxy's first line carries the cookie; a wrong one is turned away
    here, before anything reaches the agent (which checks it again).  The
    cookie cannot be swapped in the stream: nxcomp uses it as the fake X
    authority cookie too."""

    name = b"direct-tcpip"

    def __init__(self, door: X2GoDoor, link: Link, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.door = door
        self.link = link
        self.head = b""
        self.relay: StreamRelay | None = None
        self.ended = False

    def channelOpen(self, specificData: bytes) -> None:
        self.avatar.open_links += 1
        self.counted = True
        log.info("X2Go graphics link of {user} to session {id} opened", user=self.avatar.principal.unix_user,
                 id=self.link.session_id)

    def dataReceived(self, data: bytes) -> None:
        if self.relay is not None:
            self.relay.write(data)
            return
        if self.ended:
            return
        self.head += data
        match = _COOKIE.search(self.head)
        if match is None:
            if len(self.head) > MAX_HANDSHAKE:
                self._refuse("no cookie in the proxy's first line")
            return
        if not self.link.cookie_matches(match.group(1).decode().lower()):
            self._refuse("a wrong cookie")
            return
        head, self.head = self.head, b""
        caller = self.door.caller_of(self.avatar)
        self.relay = StreamRelay(caller, self.link.session_id, _LinkStream(self), head, self.door.router().open_stream)

    def _refuse(self, why: str) -> None:
        log.warn("X2Go graphics link of {user} to session {id} closed: {why}", user=self.avatar.principal.unix_user,
                 id=self.link.session_id, why=why)
        self.ended = True
        self.loseConnection()

    def stopWriting(self) -> None:
        if self.relay is not None:
            self.relay.pause_agent()

    def startWriting(self) -> None:
        if self.relay is not None:
            self.relay.resume_agent()

    def eofReceived(self) -> None:
        self.loseConnection()

    def closed(self) -> None:
        if getattr(self, "counted", False):
            self.counted = False
            self.avatar.open_links -= 1
        if self.relay is not None:
            relay, self.relay = self.relay, None
            relay.close()


class _LinkStream:
    """The link channel as the relay's client stream."""

    def __init__(self, channel: X2GoLinkChannel) -> None:
        self.channel = channel

    def write(self, data: bytes) -> None:
        self.channel.write(data)

    def close(self) -> None:
        self.channel.loseConnection()

    def pause_input(self) -> None:
        self.channel.conn.transport.transport.pauseProducing()

    def resume_input(self) -> None:
        self.channel.conn.transport.transport.resumeProducing()
