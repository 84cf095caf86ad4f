"""``nxgate-client``: the command line, and the glue between its parts.

:class:`ClientRun` carries out what the pure dialogue asks for: it writes to
the SSH channel, prints results, starts nxproxy when the session is ready,
and relays the NX stream between nxproxy's local connection and the
channel after ``bye``.  It knows no protocol details itself.
"""

from __future__ import annotations

import dataclasses
import getpass
import io
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

from twisted.conch.ssh.keys import BadKeyError, EncryptedKeyError, Key
from twisted.internet import defer, task, threads
from twisted.internet.error import CannotListenError
from twisted.python.failure import Failure

from nxgate.clients.nx import cli
from nxgate.protocols.nx import client_commands as commands
from nxgate.protocols.nx import client_dialogue as dialogue
from nxgate.protocols.nx.listing import ParsedRow
from nxgate.clients.nx.knownhosts import KnownHosts
from nxgate.clients.nx.proxy import LocalConnection, NXProxy, last_lines
from nxgate.clients.nx.ssh import HostKeyPolicy, Login, ShellChannel, SSHError, open_shell

if TYPE_CHECKING:
    # The local services and the fate question are imported where they are
    # used: a run without sound, printing or folders never loads them.
    from nxgate.clients.nx.fate import FateQuestion
    from nxgate.clients.nx.printing import LocalPrinting
    from nxgate.clients.nx.sharing import LocalShares
    from nxgate.clients.nx.sound import LocalSound

OK, NX_ERROR, USAGE, SSH_FAILURE = 0, 1, 2, 3
PROG = "nxgate-client"
DIALOGUE_TIMEOUT = 180.0  # login plus the server starting an agent
ERROR_GRACE = 3.0  # for the rest of a multi-line error (599 + 500) to arrive
BYE_TIMEOUT = 30.0
PROXY_CONNECT_TIMEOUT = 60.0
QUIT_GRACE = 5.0  # for the server to close after our ``quit``
PROXY_EXIT_GRACE = 5.0


def nomachine_key() -> Key:
    """The well-known NoMachine client key that every NX 3 client ships.

    Read beside this module (setup.py installs it there as package data)
    rather than through importlib.resources, whose import alone costs
    every client run ~7 ms."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "nomachine-client.key"), "rb") as handle:
        data = handle.read()
    return Key.fromString(data)


def load_identity(path: str) -> Key:
    with open(path, "rb") as handle:
        data = handle.read()
    try:
        return Key.fromString(data)
    except EncryptedKeyError:
        passphrase = getpass.getpass(f"Passphrase for key {path}: ")
        return Key.fromString(data, passphrase=passphrase.encode())


class PasswordSource:
    """$NXGATE_PASSWORD, else asked once on the terminal; never in argv."""

    def __init__(self, user: str, host: str, environ: dict[str, str]) -> None:
        self.prompt = f"Password for {user}@{host}: "
        self._value = environ.get(cli.PASSWORD_VARIABLE)

    def __call__(self) -> str:
        if self._value is None:
            self._value = getpass.getpass(self.prompt)
        return self._value


class _Steady:
    """Our end of stdout or stderr.  A reader that went away (a closed pipe:
    ``| head``) must not stop the client halfway: the write that failed
    inside a protocol callback left the connection unhandled, and the client
    hung, even past SIGTERM.  What cannot be written is dropped."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except (OSError, ValueError):
            return 0

    def flush(self) -> None:
        try:
            self.stream.flush()
        except (OSError, ValueError):
            pass


class _ChannelReader:
    """Lets nxproxy's socket pause reading from the server when it is full."""

    def __init__(self, channel: ShellChannel) -> None:
        self.channel = channel

    def pauseProducing(self) -> None:
        self.channel.pause_reading()

    def resumeProducing(self) -> None:
        self.channel.resume_reading()

    def stopProducing(self) -> None:
        pass


class ClientRun:
    """One run of the client: a connection, a dialogue, maybe a session."""

    def __init__(self, reactor: Any, options: cli.Options, keys: list[Key], password: Callable[[], str],
                 nxproxy: str | None, environ: dict[str, str], out: TextIO = sys.stdout,
                 err: TextIO = sys.stderr, stdin: TextIO = sys.stdin) -> None:
        self.reactor = reactor
        self.options = options
        self.keys = keys
        self.password = password
        self.nxproxy_path = nxproxy
        self.environ = environ
        self.out = _Steady(out)
        self.err = _Steady(err)
        self.stdin = stdin
        self.dialogue = dialogue.ClientDialogue(options.user, password, options.request)
        self.done: defer.Deferred[int] = defer.Deferred()
        self.channel: ShellChannel | None = None
        self.proxy: NXProxy | None = None
        self.sound: LocalSound | None = None
        self.printing: LocalPrinting | None = None
        self.shares: LocalShares | None = None
        self.tunnels: set[str] = set()  # the services the server carries on channels of their own
        self.local: LocalConnection | None = None
        self.info: dialogue.SessionInfo | None = None
        self.switched = False
        self.result: int | None = None  # exit code once the outcome is known
        self._to_server: list[bytes] = []  # from nxproxy before the switch
        self._timers: dict[str, Any] = {}
        self._finishing = False
        self.listed: tuple[ParsedRow, ...] | None = None  # what a ListSessions request got
        self._ended_by: str | None = None  # who closed the session stream, when not we
        self._question: FateQuestion | None = None  # what became of the session, once its stream ended
        self._proxy_trouble = False  # nxproxy failed: its log is worth showing

    # ---------------------------------------------------------------- start
    def start(self) -> defer.Deferred[int]:
        options = self.options
        login = Login(options.ssh_user, self.keys, None if options.ssh_user == cli.NX_USER else self.password)
        known = KnownHosts(options.known_hosts, options.host, options.port) if options.known_hosts else None
        policy = HostKeyPolicy(known, notify=self.say)
        self._arm("dialogue", DIALOGUE_TIMEOUT, self._dialogue_timeout)
        d = open_shell(self.reactor, options.host, options.port, login, policy, self,
                       progress=self.say if options.verbose else None)
        d.addErrback(self._ssh_failed)
        return self.done

    def _ssh_failed(self, failure: Failure) -> None:
        if failure.check(SSHError):
            self.say(str(failure.value))
        else:
            self.say(f"SSH error: {failure.getErrorMessage()}")
        self.finish(SSH_FAILURE)

    # -------------------------------------------------------- shell handler
    def shell_opened(self, channel: ShellChannel) -> None:
        self.channel = channel

    def shell_data(self, data: bytes) -> None:
        if self.switched:
            if self.local is not None:
                self.local.transport.write(data)
            return
        if not self._finishing:
            self._run(self.dialogue.data_received, data)

    def shell_stderr(self, data: bytes) -> None:
        if not self.switched:
            self._run(self.dialogue.stderr_received, data)
        elif self.options.verbose:
            self.err.write(data.decode("utf-8", "replace"))

    def shell_closed(self) -> None:
        if self.switched:
            if not self._finishing:
                self._disconnected("the server")
            self.finish(OK)
        elif self.result is not None:
            self.finish(self.result)
        else:
            self._run(self.dialogue.connection_lost)
            self.finish(self.result if self.result is not None else NX_ERROR)

    def output_paused(self) -> None:
        if self.local is not None:
            self.local.transport.pauseProducing()

    def output_resumed(self) -> None:
        if self.local is not None:
            self.local.transport.resumeProducing()

    # -------------------------------------------------------------- dialogue
    def _run(self, step: Callable[..., list[dialogue.Event]], *args: Any) -> None:
        try:
            events = step(*args)
            for event in events:
                self._event(event)
        except Exception:  # a bug must end the run, not hang it
            self.say("internal error:\n" + Failure().getTraceback())
            self.finish(NX_ERROR)
            return
        if self.dialogue.error_pending and "error" not in self._timers:
            self._arm("error", ERROR_GRACE, self._dialogue_timeout)

    def _event(self, event: dialogue.Event) -> None:
        if isinstance(event, dialogue.Send):
            assert self.channel is not None
            self.channel.write(event.data)
        elif isinstance(event, dialogue.Trace):
            if self.options.verbose:
                prefix = {"server": "S", "client": "C", "stderr": "E"}[event.source]
                self.err.write(f"{prefix}: {event.text}\n")
        elif isinstance(event, dialogue.Listed):
            self.listed = event.sessions
            for row in event.sessions:
                self.out.write(f"{row.session_id} {row.display} {row.session_type} {row.status} {row.name}\n")
            self._quit_then(OK)
        elif isinstance(event, dialogue.Terminated):
            self.out.write(f"Session {event.session_id} terminated.\n")
            self._quit_then(OK)
        elif isinstance(event, dialogue.Suspended):
            self.out.write(f"Session {event.session_id} suspended.\n")
            self._quit_then(OK)
        elif isinstance(event, dialogue.Notice):
            self.say(event.text)
        elif isinstance(event, dialogue.ShadowChoices):
            self._choose(event.sessions)
        elif isinstance(event, dialogue.SessionReady):
            self._session_ready(event.info)
        elif isinstance(event, dialogue.Switched):
            self._switched(event.leftover)
        elif isinstance(event, dialogue.Failed):
            for line in event.lines:
                if line.startswith("NX>"):
                    self.err.write(line + "\n")
                else:
                    self.say(line)
            self.finish(NX_ERROR)

    def _choose(self, sessions: tuple[ParsedRow, ...]) -> None:
        """Several sessions may be shadowed: ask which on the terminal, or,
        without one, show them and stop (the user names one with --shadow ID)."""
        self._disarm("dialogue")
        interactive = self.stdin.isatty()
        table = self.err if interactive else self.out
        for number, row in enumerate(sessions, 1):
            prefix = f"{number:>3}  " if interactive else ""
            table.write(f"{prefix}{row.session_id} {row.display} {row.session_type} {row.status} {row.name}\n")
        table.flush()
        if not interactive:
            self.say("several sessions may be shadowed; name one with --shadow ID")
            self._run(self.dialogue.quit)
            self._quit_then(NX_ERROR)
            return
        # A daemon thread: a blocked read must not keep the process alive after Ctrl-C.
        threading.Thread(target=self._ask_choice, args=(sessions,), daemon=True).start()

    def _ask_choice(self, sessions: tuple[ParsedRow, ...]) -> None:
        """In a thread: read answers until one names a session (or none is given)."""
        while True:
            self.err.write(f"Which session to shadow (1-{len(sessions)}, or an id; nothing to cancel)? ")
            self.err.flush()
            answer = self.stdin.readline()
            if not answer.strip():
                self.reactor.callFromThread(self._chosen, None)
                return
            row = dialogue.pick(sessions, answer)
            if row is not None:
                self.reactor.callFromThread(self._chosen, row.session_id)
                return
            self.err.write(f"{answer.strip()!r} is not one of them\n")

    def _chosen(self, session_id: str | None) -> None:
        if self._finishing:
            return
        if session_id is None:
            self.say("no session chosen")
            self._run(self.dialogue.quit)
            self._quit_then(NX_ERROR)
            return
        self._arm("dialogue", DIALOGUE_TIMEOUT, self._dialogue_timeout)
        self._run(self.dialogue.choose, session_id)

    def _quit_then(self, code: int) -> None:
        """The dialogue sent ``quit``: wait a moment for the server to close."""
        self.result = code
        self._disarm("dialogue")
        self._arm("quit", QUIT_GRACE, lambda: self.finish(code))

    def _dialogue_timeout(self) -> None:
        self._timers.pop("error", None)
        self._timers.pop("dialogue", None)
        if self.channel is None:
            self.say(f"timed out setting up the SSH connection to {self.options.host}:{self.options.port}")
            self.finish(SSH_FAILURE)
            return
        self._run(self.dialogue.timed_out)

    # --------------------------------------------------------------- session
    def _session_ready(self, info: dialogue.SessionInfo) -> None:
        """The session waits for us: open the local services (sound, printing,
        folders: each may take a child process's while, none on the reactor's
        time), then start nxproxy with their ports."""
        self.info = info
        self._disarm("dialogue")
        assert self.nxproxy_path is not None
        self.say(f"session {info.session_id} on display {info.display} is ready; starting nxproxy")
        self.proxy = NXProxy(self.reactor, self.nxproxy_path, self, self.environ)
        opened = defer.ensureDeferred(self._open_channels(info, self.proxy.home))
        opened.addCallback(self._start_proxy, info)
        opened.addErrback(self._bug)

    def _bug(self, failure: Failure) -> None:
        """A bug must end the run, not hang it."""
        self.say("internal error:\n" + failure.getTraceback())
        self.finish(NX_ERROR)

    def _start_proxy(self, channels: dict[str, int], info: dialogue.SessionInfo) -> None:
        if self._finishing or self.proxy is None:
            return  # interrupted while the services opened; finish() closes them
        try:
            port = self.proxy.listen()
            argv = self.proxy.start(info, self.options.request.params.name, port,  # type: ignore[union-attr]
                                    channels)
        except (OSError, ValueError, CannotListenError) as problem:
            self.say(f"cannot start nxproxy: {problem}")
            self.finish(NX_ERROR)
            return
        if self.options.verbose:
            self.say("started " + " ".join(argv) + f" (log: {self.proxy.log_path})")
        self._arm("connect", PROXY_CONNECT_TIMEOUT, self._proxy_connect_timeout)
        self._request_tunnels(info)
        self._add_mounts(info)

    async def _open_channels(self, info: dialogue.SessionInfo, directory: str) -> dict[str, int]:
        """nxproxy's service channels: nxcomp channel name -> the local port
        it connects to (0: that service is off for this session), opened
        side by side."""
        media, cups, smb = await defer.gatherResults([
            defer.ensureDeferred(self._open_sound(info, directory)),
            defer.ensureDeferred(self._open_printing(info)),
            defer.ensureDeferred(self._open_shares(info, directory)),
        ])
        return {"media": media, "cups": cups, "smb": smb}

    async def _open_shares(self, info: dialogue.SessionInfo, directory: str) -> int:
        """The private SMB server's port for nxproxy's ``smb=`` (0: no folders).
        Only when the server offers folder sharing (``NX> 709``); without it,
        or when Samba fails here, the session runs without the folders."""
        if not self.options.shares:
            return 0
        if info.file_sharing_port is None:
            self.say("no shared folders: the server does not offer folder sharing for this session")
            return 0
        from nxgate.clients.nx.sharing import LocalShares, SharingError

        shares = self.shares = LocalShares(self.options.shares, directory)
        try:
            port = await shares.open(self.reactor)
        except (SharingError, OSError, subprocess.SubprocessError) as problem:
            self.say(f"no shared folders: {problem}")
            await defer.maybeDeferred(shares.close)
            if self.shares is shares:
                self.shares = None
            return 0
        if self.options.verbose:
            self.say(f"sharing {', '.join(sorted(self.options.shares))} from a private Samba on 127.0.0.1:{port}")
        return int(port)

    def _add_mounts(self, info: dialogue.SessionInfo) -> None:
        """Ask the server to mount each shared folder (``addmount``, before ``bye``)."""
        shares = self.shares
        if shares is None:
            return
        computer = socket.gethostname()
        lines = [commands.addmount_command(info.session_id, 3000 + info.display, name, shares.user, shares.password,
                                           computer) for name in sorted(shares.shares)]
        self._run(self.dialogue.add_mounts, lines, (shares.password,))

    async def _open_sound(self, info: dialogue.SessionInfo, directory: str) -> int:
        """The local sound server's port for nxproxy's ``media=`` (0: no sound).
        Without it the session still runs, silent: said, not fatal."""
        if self.options.sound_server is None:
            return 0
        from nxgate.clients.nx.sound import LocalSound, SoundError

        # pactl finds the user's sound server as his programs do; it never sees our passwords.
        environ = {name: value for name, value in self.environ.items() if name not in cli.PASSWORD_VARIABLES}
        sound = self.sound = LocalSound(self.reactor, self.options.sound_server, directory, environ)
        try:
            port = await sound.open(info.cookie)
        except (SoundError, OSError) as problem:
            self.say(f"no sound: {problem}")
            await sound.close()
            if self.sound is sound:
                self.sound = None
            return 0
        if self.options.verbose:
            self.say(f"sound: the session plays on the local sound server through 127.0.0.1:{port}")
        return port

    async def _open_printing(self, info: dialogue.SessionInfo) -> int:
        """The gate's port for nxproxy's ``cups=`` (0: no printing).  Without
        it the session runs without the client's printers: said, not fatal."""
        if self.options.print_server is None:
            return 0
        from nxgate.clients.nx.printing import LocalPrinting, PrintingError, default_server

        server = self.options.print_server or default_server(self.environ)
        try:
            printing = self.printing = LocalPrinting(self.reactor, server)
            port = await defer.maybeDeferred(printing.open, info.cookie)
        except (PrintingError, CannotListenError, OSError) as problem:
            self.say(f"no printing: {problem}")
            self.printing = None
            return 0
        if self.options.verbose:
            self.say(f"printing: the session prints on {server} through 127.0.0.1:{port}")
        return int(port)

    def _proxy_connect_timeout(self) -> None:
        self._timers.pop("connect", None)
        self._proxy_failed(f"nxproxy did not connect within {PROXY_CONNECT_TIMEOUT:g} seconds")

    def _proxy_failed(self, message: str) -> None:
        self.say(message)
        self._proxy_trouble = True  # the end of its log is shown once it is gone
        self.finish(NX_ERROR)

    def _request_tunnels(self, info: dialogue.SessionInfo) -> None:
        """Ask the server to carry the folders and printers on SSH channels of
        their own (:mod:`nxgate.protocols.service_tunnel`), beside the NX stream: nxagent's
        proxy throttles its smb and cups channels.  Sent before ``addmount``
        (the server reads them in order); a server that says no keeps using
        the NX channels, which nxproxy serves all the same."""
        assert self.channel is not None
        for service, wanted in (("sharing", self.shares is not None), ("printing", self.printing is not None)):
            if not wanted:
                continue
            d = self.channel.request_tunnel(service, info.session_id)
            d.addCallbacks(lambda _, s=service: self._tunnel_granted(s),
                           lambda failure, s=service: self._tunnel_refused(s))

    def _tunnel_granted(self, service: str) -> None:
        self.tunnels.add(service)
        if self.options.verbose:
            self.say(f"{service}: on an SSH channel of its own")

    def _tunnel_refused(self, service: str) -> None:
        if self.options.verbose:
            self.say(f"{service}: the server keeps it in the NX stream (no tunnel)")

    def tunnel_target(self, service: str, session_id: str) -> int | None:
        """Where a tunnel connection the server opens goes: our print gate or
        private Samba, for this session and a tunnel we asked for only."""
        if self.info is None or session_id != self.info.session_id.upper() or service not in self.tunnels:
            return None
        if service == "sharing" and self.shares is not None:
            return self.shares.port
        if service == "printing" and self.printing is not None:
            return self.printing.tunnel_port
        return None

    def proxy_connected(self, connection: LocalConnection) -> None:
        if self._finishing or self.channel is None:
            connection.transport.loseConnection()
            return
        self.local = connection
        self._disarm("connect")
        connection.transport.registerProducer(_ChannelReader(self.channel), True)
        self._arm("bye", BYE_TIMEOUT, self._dialogue_timeout)
        self._run(self.dialogue.proxy_connected)

    def _switched(self, leftover: bytes) -> None:
        self.switched = True
        self._disarm("bye")
        assert self.local is not None and self.channel is not None and self.info is not None
        if leftover:
            self.local.transport.write(leftover)
        for data in self._to_server:
            self.channel.write(data)
        self._to_server.clear()
        self.say(f"attached to session {self.info.session_id}")

    def proxy_data(self, data: bytes) -> None:
        if self.switched and self.channel is not None:
            self.channel.write(data)
        else:
            self._to_server.append(data)

    def proxy_disconnected(self) -> None:
        self.local = None
        if self.switched:
            if not self._finishing:
                self._disconnected("nxproxy")
            self.finish(OK)
        elif not self._finishing:
            self._proxy_failed("nxproxy closed its connection before the session was attached")

    def proxy_exited(self, status: str) -> None:
        if self._finishing:
            return
        if self.local is None:
            self._proxy_failed(f"nxproxy {status} before it connected")
        elif self.options.verbose:
            self.say(f"nxproxy {status}")

    # ----------------------------------------------------------------- end
    @property
    def _shadowing(self) -> bool:
        return isinstance(self.options.request, dialogue.ShadowSession)

    def _watched(self) -> str:
        """The session a shadow watches (the shadow's own id if unknown)."""
        assert self.info is not None
        return self.dialogue.shadowed or self.info.session_id

    def _disconnected(self, by: str) -> None:
        """The session stream ended, not by us.  A shadow simply ends; a
        session may have been suspended, terminated or taken over by another
        client, which the stream does not tell (nxproxy logs the same lines
        for all three): :meth:`finish` asks the server (:meth:`_fate`)."""
        assert self.info is not None
        self._ended_by = by
        if self._shadowing:
            self.say(f"the shadow of session {self._watched()} ended ({by} closed the connection): the watched "
                     "session ended, or the shadow was ended on the server")

    def interrupt(self, signum: int) -> None:
        """SIGINT/SIGTERM: drop the connection; the server suspends the
        session (a shadow ends).  While asking the server what became of a
        session, give up asking."""
        if self._question is not None and self._question.cancel():
            return
        if self._finishing:
            return
        name = signal.Signals(signum).name
        if self.info is not None and self._shadowing:
            self.say(f"{name}: disconnecting; the shadow of session {self._watched()} ends (that session goes on)")
            self.finish(OK, proxy_grace=0.5)
        elif self.info is not None:
            self.say(f"{name}: disconnecting; session {self.info.session_id} stays on the server")
            self.finish(OK, proxy_grace=0.5)
        else:
            self.say(f"{name}: interrupted")
            self.finish(self.result if self.result is not None else NX_ERROR)

    def finish(self, code: int, proxy_grace: float = PROXY_EXIT_GRACE) -> None:
        """Close everything, wait for nxproxy (and, when the server ended the
        session stream, for its word on the session), clean up, then report
        ``code``."""
        if self._finishing:
            return
        self._finishing = True
        self.result = code
        for name in list(self._timers):
            self._disarm(name)
        if self.local is not None:
            self.local.transport.loseConnection()
        if self.channel is not None:
            self.channel.disconnect()
        proxy = self.proxy
        closing: list[defer.Deferred[Any]] = []  # the services' children, waited for before we exit
        if self.sound is not None:
            closing.append(defer.ensureDeferred(self.sound.close()))
            self.sound = None
        if self.printing is not None:
            closing.append(defer.maybeDeferred(self.printing.close))
            self.printing = None
        if self.shares is not None:
            closing.append(defer.maybeDeferred(self.shares.close))
            self.shares = None
        waits = [proxy.stop(proxy_grace) if proxy is not None else defer.succeed(None),
                 self._fate() if self._ended_by is not None and not self._shadowing else defer.succeed(None),
                 *closing]

        def ended(results: list[Any]) -> defer.Deferred[None] | None:
            fate = results[1]
            if fate is not None:
                assert self.info is not None
                self.say(f"disconnected from session {self.info.session_id}: {fate}")
            if proxy is None:
                self.done.callback(code)
                return None
            proxy.stop_listening()
            logs = threads.deferToThreadPool(self.reactor, self.reactor.getThreadPool(), proxy.wrap_up)
            return logs.addCallback(self._report_logs, code)

        defer.gatherResults(waits, consumeErrors=True).addCallback(ended).addErrback(self._ending_failed, proxy, code)

    def _report_logs(self, logs: tuple[list[str], list[str]], code: int) -> None:
        """What nxproxy logged, now that it is gone; then the run's end."""
        errors, tail = logs
        if errors and self._ended_by is not None and not self.options.verbose:
            self.say("nxproxy reported:\n" + last_lines(errors[-5:]))  # it exits 0 whatever happened
        if tail and (self.options.verbose or self._proxy_trouble):
            self.say("the end of nxproxy's log:\n" + last_lines(tail))
        self.done.callback(code)

    def _ending_failed(self, failure: Failure, proxy: NXProxy | None, code: int) -> None:
        """A bug while ending: said, and the run still ends (and cleans up)."""
        self.say("internal error while ending:\n" + failure.getTraceback())
        if proxy is not None:
            proxy.cleanup()
        if not self.done.called:
            self.done.callback(code)

    def _fate(self) -> defer.Deferred[str]:
        """What became of our session, whose stream the server ended (see
        :mod:`nxgate.clients.nx.fate`): asked on a connection of its own."""
        from nxgate.clients.nx.fate import FateQuestion

        assert self.info is not None
        self._question = FateQuestion(self.reactor, self._listing, self.info.session_id,
                                      self._ended_by or "the server")
        return defer.ensureDeferred(self._question.ask())

    def _listing(self, errors: io.StringIO) -> ClientRun:
        """A ``--list`` run with our login, quietly (its complaints to ``errors``)."""
        options = dataclasses.replace(self.options, request=dialogue.ListSessions(), verbose=False,
                                      sound_server=None, print_server=None, shares={})
        return ClientRun(self.reactor, options, self.keys, self.password, None, self.environ, out=io.StringIO(),
                         err=errors, stdin=self.stdin)

    def say(self, message: str) -> None:
        self.err.write(f"{PROG}: {message}\n")
        self.err.flush()

    # ---------------------------------------------------------------- timers
    def _arm(self, name: str, seconds: float, function: Callable[[], None]) -> None:
        self._disarm(name)
        self._timers[name] = self.reactor.callLater(seconds, function)

    def _disarm(self, name: str) -> None:
        call = self._timers.pop(name, None)
        if call is not None and call.active():
            call.cancel()


# ---------------------------------------------------------------- command line
def _keys(options: cli.Options) -> list[Key]:
    if options.identity is not None:
        try:
            return [load_identity(options.identity)]
        except (OSError, BadKeyError, EncryptedKeyError, ValueError) as problem:
            raise cli.UsageError(f"--identity: cannot load {options.identity}: {problem}") from None
    return [nomachine_key()] if options.ssh_user == cli.NX_USER else []


def _nxproxy(options: cli.Options) -> str | None:
    if not options.attaches:
        return None
    path = shutil.which(options.nxproxy)
    if path is None:
        raise cli.UsageError(f"--nxproxy: {options.nxproxy!r} not found (install the nxproxy package)")
    return path


async def _run(reactor: Any, run: ClientRun) -> None:
    def on_signal(signum: int, frame: object) -> None:
        reactor.callFromThread(run.interrupt, signum)

    def install() -> None:
        # After the reactor's own handlers (which would just stop it,
        # leaving nxproxy and its files behind).
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, on_signal)

    reactor.callWhenRunning(install)
    code = await run.start()
    raise SystemExit(code)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    environ = dict(os.environ)
    try:
        options = cli.parse_options(argv, environ)
        keys = _keys(options)
        nxproxy = _nxproxy(options)
    except cli.UsageError as problem:
        print(f"{PROG}: {problem}", file=sys.stderr)
        return USAGE
    except SystemExit as exit_:  # argparse: --help (0) or a usage error (2)
        return int(exit_.code or 0)
    password = PasswordSource(options.user, options.host, environ)
    # Passwords needed for certain (NX login, SSH password, the remote desktop's)
    # are asked before connecting, so that the prompts do not race the server's timeouts.
    try:
        if options.ssh_user == cli.NX_USER or not keys:
            password()
        if options.remote_password_prompt is not None:
            options = options.with_remote_password(getpass.getpass(options.remote_password_prompt))
    except (EOFError, KeyboardInterrupt):
        print(f"\n{PROG}: no password given", file=sys.stderr)
        return USAGE
    from twisted.internet import reactor

    run = ClientRun(reactor, options, keys, password, nxproxy, environ)
    try:
        task.react(lambda r: _run(r, run))
    except SystemExit as exit_:
        _leave(int(exit_.code or 0))
    _leave(OK)
    return OK  # not reached


def _leave(code: int) -> None:
    """End the process now that the reactor has run and stopped (it cannot
    run again in this process; nxproxy, its files and the services were
    closed on it).  Without the interpreter's teardown: finalising the
    modules and objects of Twisted and cryptography took 80-180 ms after
    the work was done, which every ``--suspend``, ``--terminate`` and
    ``--list`` waited for."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # a closed or broken pipe: nothing more can be said there
    os._exit(code)
