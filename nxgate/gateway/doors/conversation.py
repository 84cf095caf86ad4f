"""The thin Twisted wrapper around the pure NX shell core.

A :class:`Conversation` owns one :class:`~nxgate.protocols.nx.server_dialogue.ServerDialogue` and
carries out its effects: it writes bytes, runs PAM, resolves the logged-in
user into a :class:`~nxgate.vocabulary.caller.Caller` (in a thread, once per
login), has the NX dispatcher carry out the session commands, arms the
login and idle timers, and hands the byte stream to a relay after ``bye``.  It knows nothing about SSH: anything with ``write``
and ``close`` can carry a conversation (the Conch channel, or the local
socket of the OpenSSH deployment mode).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from twisted.internet import defer
from twisted.logger import Logger, LogLevel
from twisted.python.failure import Failure

from nxgate.gateway.auth.pam import TEMPORARY_NOTE, AuthResult, Authenticator, Verdict
from nxgate.gateway.doors.login_events import log_granted, log_refused
from nxgate.protocols.nx import server_dialogue as nx
from nxgate.protocols.nx.errors import TEMPORARY_FAILURE, NXError
from nxgate.protocols.nx.params import Params
from nxgate.vocabulary.caller import Caller
from nxgate.threads import Blocking, inline
from nxgate.users import AccountsUnavailable, resolve_caller
from nxgate.wire.relay import ByteTransport  # where a conversation's bytes go: the wire's word

log = Logger()
#: How a conversation ends when the client says goodbye: not worth a line beside its connection's.
NORMAL_ENDS = frozenset(("quit", "bye"))



class Relay(Protocol):
    """The raw NX stream after ``bye``; created by the session layer."""

    def write(self, data: bytes) -> None: ...

    def end_of_input(self) -> None: ...  # the client's EOF (it sends no more)

    def close(self) -> None: ...


class Commands(Protocol):
    """The session commands (``listsession``, ``startsession``, ...):
    :class:`nxgate.protocols.nx.dispatch.NXDispatcher`.  ``progress`` sends a status
    line to the client while the command runs."""

    def execute(self, caller: Caller, command: str, params: Params,
                progress: Callable[[str], None]) -> Coroutine[Any, Any, nx.Reply]: ...


RelayFactory = Callable[[Caller, Any, ByteTransport, bytes], Relay]


class Conversation:
    def __init__(
        self,
        reactor: Any,
        settings: nx.DialogueSettings,
        transport: ByteTransport,
        address: str,
        authenticator: Authenticator,
        commands: Commands,
        relay_factory: RelayFactory | None = None,
        preauthenticated_user: str | None = None,
        local_address: str = "127.0.0.1",
        door: str = "nx",
        blocking: Blocking = inline,
        logged_in: Callable[[], None] | None = None,
        claim: Callable[[str], str | None] | None = None,
    ) -> None:
        """``logged_in``: called once the user is known (an NX login, or at
        once for a preauthenticated one): the door's guard stops counting
        the connection as unauthenticated (nxgate.gateway.doors.guard).
        ``claim(user)``: counts the connection for the user a right NX
        password logged in (:func:`nxgate.wire.guarded.user_logged_in`); the
        words it returns refuse that login (a preauthenticated user was
        counted by the door that authenticated it)."""
        self.logged_in = logged_in
        self.claim = claim
        self.reactor = reactor
        self.local_address = local_address
        self.door = door
        self.blocking = blocking
        self.settings = settings
        self.transport = transport
        self.address = address
        self.authenticator = authenticator
        self.commands = commands
        self.relay_factory = relay_factory
        self.shell = nx.ServerDialogue(settings, preauthenticated_user)
        self.relay: Relay | None = None
        self._timers: dict[str, Any] = {}
        self._closed = False
        self._eof = False
        # The logged-in caller, once resolved; commands that come before wait.
        self.caller: Caller | None = None
        self._caller_failure: Failure | None = None
        self._resolving = False
        self._waiting_for_caller: list[defer.Deferred[Caller]] = []

    def _resolve_caller(self, user: str) -> None:
        """Look the user up once, off the reactor thread (pwd, the group list)."""
        self._resolving = True
        d = self.blocking(resolve_caller, user, self.address, self.local_address, self.door)
        d.addCallbacks(self._caller_resolved, self._caller_unresolved)

    def _caller_resolved(self, caller: Caller) -> None:
        self.caller = caller
        waiting, self._waiting_for_caller = self._waiting_for_caller, []
        for d in waiting:
            d.callback(caller)

    def _caller_unresolved(self, failure: Failure) -> None:
        """The account could not be looked up: gone since the login (every
        command then fails), or the user database could not tell now (the
        gateway out of files: each command says so, and the next one looks
        again)."""
        if failure.check(AccountsUnavailable):
            self._resolving = False
        else:
            self._caller_failure = failure
        waiting, self._waiting_for_caller = self._waiting_for_caller, []
        for d in waiting:
            d.errback(failure)

    def _caller_ready(self) -> defer.Deferred[Caller]:
        """A Deferred of its own for each command: fired at once when the
        caller is known, else when it is (commands run one at a time, so
        typed-ahead commands keep their order)."""
        if self.caller is not None:
            return defer.succeed(self.caller)
        if self._caller_failure is not None:
            return defer.fail(self._caller_failure)
        d: defer.Deferred[Caller] = defer.Deferred()
        self._waiting_for_caller.append(d)
        if not self._resolving and self.shell.user:
            self._resolve_caller(self.shell.user)  # the last look-up could not tell: once more
        return d

    def _progress(self, line: str) -> None:
        if not self._closed:
            self._run(self.shell.progress(line))

    # ------------------------------------------------------------- events
    def start(self) -> None:
        self._arm("login", self.settings.login_timeout)
        self._touch()
        self._run(self.shell.connection_made())

    def data_received(self, data: bytes) -> None:
        if self.relay is not None:
            self.relay.write(data)
            return
        if self._closed:
            return
        self._touch()
        self._run(self.shell.data_received(data))

    def eof_received(self) -> None:
        """The client will send no more; finish what it asked for, then close
        (a relayed stream passes the EOF on to the agent, which then closes)."""
        self._eof = True
        if self.relay is None:
            self._run([])
        else:
            self.relay.end_of_input()

    def connection_lost(self) -> None:
        self._closed = True
        self.shell.connection_lost()
        self._cancel_timers()
        if self.relay is not None:
            relay, self.relay = self.relay, None
            relay.close()

    # ------------------------------------------------------------ effects
    def _run(self, effects: list[nx.Effect]) -> None:
        self._apply(effects)
        if self._eof and not self._closed and self.relay is None and self.shell.state is not nx.DialogueState.BUSY:
            self._apply(self.shell.end_of_input())

    def _apply(self, effects: list[nx.Effect]) -> None:
        for effect in effects:
            if self._closed:
                return
            if isinstance(effect, nx.Send):
                self.transport.write(effect.data)
            elif isinstance(effect, nx.Authenticate):
                self._authenticate(effect)
            elif isinstance(effect, nx.LoggedIn):
                self._logged_in(effect)
            elif isinstance(effect, nx.Execute):
                self._execute(effect)
            elif isinstance(effect, nx.SwitchToRelay):
                self._switch(effect)
            elif isinstance(effect, nx.Close):
                log.emit(LogLevel.debug if effect.reason in NORMAL_ENDS else LogLevel.info,
                         "NX conversation with {address} closed ({reason})", address=self.address, reason=effect.reason)
                self._cancel_timers()
                self._closed = True
                self.transport.close()

    def _authenticate(self, effect: nx.Authenticate) -> None:
        d = self.authenticator.password(effect.username, effect.password, self.address)
        d.addCallback(self._authenticated)
        d.addErrback(self._unexpected, "authentication")

    def _authenticated(self, result: AuthResult) -> None:
        if self._closed:
            return
        if result.granted:
            refusal = self.claim(result.username) if self.claim is not None else None
            if refusal is not None:
                log.warn("NX login of {user} from {address} refused: {why} ([server] max_connections_per_user)",
                         user=result.username, address=self.address, why=refusal, audit="login_refused")
                self._run(self.shell.authentication_finished(None, error=True, note=refusal))
                return
            self._run(self.shell.authentication_finished(result.username))
            return
        log_refused(log, "NX", result, self.address, self.shell.failed_logins + 1)
        self._run(self.shell.authentication_finished(None, error=result.verdict is Verdict.ERROR,
                                                     note=result.client_note))

    def _logged_in(self, effect: nx.LoggedIn) -> None:
        self._disarm("login")
        if self.logged_in is not None:
            self.logged_in()
        self._resolve_caller(effect.username)
        log_granted(log, "NX", effect.username, self.address, effect.method)

    def _execute(self, effect: nx.Execute) -> None:
        log.debug("{user} runs {command} {params!r}", user=self.shell.user, command=effect.command, params=effect.params)
        d = self._caller_ready()
        d.addCallback(lambda caller: defer.ensureDeferred(
            self.commands.execute(caller, effect.command, effect.params, self._progress)))
        d.addErrback(self._command_error, effect.command)
        d.addCallback(lambda result: None if self._closed else self._run(self.shell.command_finished(result)))
        d.addErrback(self._unexpected, effect.command)

    def _command_error(self, failure: Failure, command: str) -> NXError:
        if failure.check(AccountsUnavailable):
            log.warn("{command} for {user} from {address} refused: {error}", command=command, user=self.shell.user,
                     address=self.address, error=failure.value.strerror or str(failure.value))
            return NXError(TEMPORARY_FAILURE, f"ERROR: {TEMPORARY_NOTE[:1].upper()}{TEMPORARY_NOTE[1:]}.")
        if failure.check(NXError):
            error: NXError = failure.value  # type: ignore[assignment]
            log.info(
                "{command} for {user} from {address} refused: {error}",
                command=command, user=self.shell.user, address=self.address, error=str(error),
            )
            return error
        log.failure("{command} failed for {user}", failure, command=command, user=self.shell.user)
        return NXError(500, "ERROR: Internal error.")

    def _switch(self, effect: nx.SwitchToRelay) -> None:
        self._cancel_timers()
        if self.relay_factory is None:
            self.transport.close()
            return
        assert self.caller is not None  # a command prepared the relay
        self.relay = self.relay_factory(self.caller, effect.target, self.transport, effect.leftover)

    # ------------------------------------------------------------- timers
    def _touch(self) -> None:
        self._arm("idle", self.settings.idle_timeout)

    def _arm(self, which: str, seconds: float) -> None:
        self._disarm(which)
        self._timers[which] = self.reactor.callLater(seconds, self._timeout, which)

    def _disarm(self, which: str) -> None:
        timer = self._timers.pop(which, None)
        if timer is not None and timer.active():
            timer.cancel()

    def _timeout(self, which: str) -> None:
        self._timers.pop(which, None)
        if self.shell.state is nx.DialogueState.BUSY:
            # Slow work is under way and has limits of its own; look again soon.
            self._arm(which, 1.0)
            return
        log.info("NX {which} timeout for {address}", which=which, address=self.address)
        self._run(self.shell.timed_out(which))

    def _cancel_timers(self) -> None:
        for which in list(self._timers):
            self._disarm(which)

    def _unexpected(self, failure: Failure, what: str) -> None:
        log.failure("unexpected error during {what} for {address}", failure, what=what, address=self.address)
        if not self._closed:
            self._closed = True
            self.transport.write(b"\nNX> 500 ERROR: Internal error.\nNX> 999 Bye.\n")
            self.transport.close()
