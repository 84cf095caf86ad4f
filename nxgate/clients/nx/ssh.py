"""The SSH leg of the client: Twisted Conch, one session channel, one shell.

It logs in the way the other NX clients do (reference §1.1): as ``nx`` with
the NoMachine key, or, legacy-free, as the user himself with his key or
password.  Then it opens one session channel and requests a ``shell`` with
no pty and no command, exactly like Remmina's libssh code, so the channel
is binary-clean for the NX stream after ``bye``.

Everything that goes wrong before the shell is up — no TCP connection, a
host key that does not match, refused authentication, a refused channel —
becomes an :class:`SSHError` (exit code 3 at the command line).
"""

from __future__ import annotations

import getpass
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from twisted.conch.ssh import channel, connection, transport, userauth
from twisted.conch.error import ConchError
from twisted.conch.ssh.keys import Key
from twisted.internet import defer, protocol
from twisted.python.failure import Failure

from nxgate.protocols import service_tunnel as tunnels
from nxgate.clients.nx.knownhosts import KnownHosts, Verdict, fingerprint, preferred_algorithms
from nxgate.wire.ssh_etm import AEAD_CIPHERS, ETM_MACS, EtmTransport
from nxgate.wire.tcp import no_delay


class SSHError(Exception):
    """The SSH connection could not be set up; the message says why."""


class ShellHandler(Protocol):
    """Receives what happens on the shell channel."""

    def shell_opened(self, channel: ShellChannel) -> None: ...

    def shell_data(self, data: bytes) -> None: ...

    def shell_stderr(self, data: bytes) -> None: ...

    def shell_closed(self) -> None: ...

    def output_paused(self) -> None: ...

    def output_resumed(self) -> None: ...


@dataclass(frozen=True)
class Login:
    """How to authenticate: ``keys`` are private keys offered in order;
    ``password`` (asked lazily) enables the password and keyboard-interactive
    methods, and is tried once only."""

    user: str
    keys: Sequence[Key] = ()
    password: Callable[[], str] | None = field(default=None, repr=False)


@dataclass
class HostKeyPolicy:
    """``known_hosts`` None accepts any key (tests only)."""

    known_hosts: KnownHosts | None
    notify: Callable[[str], None] = lambda message: print(message, file=sys.stderr)


class ShellChannel(channel.SSHChannel):
    """The session channel carrying the NX shell, later the NX stream."""

    name = b"session"

    def __init__(self, handler: ShellHandler, ready: defer.Deferred[ShellChannel], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.handler = handler
        self.ready = ready
        self._closed = False

    def channelOpen(self, specificData: bytes) -> None:
        self.handler.shell_opened(self)
        d = self.conn.sendRequest(self, b"shell", b"", wantReply=True)
        d.addCallbacks(self._shell_started, self._shell_refused)

    def _shell_started(self, _: object) -> None:
        if not self.ready.called:
            self.ready.callback(self)

    def _shell_refused(self, reason: Failure) -> None:
        if not self.ready.called:
            self.ready.errback(SSHError("the server refused to start the NX shell on the SSH channel"))
        self.disconnect()

    def openFailed(self, reason: Failure) -> None:
        if not self.ready.called:
            self.ready.errback(SSHError(f"the server refused the SSH session channel: {reason.getErrorMessage()}"))
        self.disconnect()

    # Data may come before the reply to the shell request: the server starts
    # the conversation as it grants it.
    def dataReceived(self, data: bytes) -> None:
        self.handler.shell_data(data)

    def extReceived(self, dataType: int, data: bytes) -> None:
        self.handler.shell_stderr(data)

    def eofReceived(self) -> None:
        self.loseConnection()

    def closed(self) -> None:
        self._gone()

    def stopWriting(self) -> None:
        self.handler.output_paused()

    def startWriting(self) -> None:
        self.handler.output_resumed()

    def _gone(self) -> None:
        if not self._closed:
            self._closed = True
            self.handler.shell_closed()

    # ------------------------------------------------------------- for us
    def disconnect(self) -> None:
        """Close the whole SSH connection (the server then suspends an
        attached session, as when any client goes away)."""
        ssh_transport = self.conn.transport if self.conn is not None else None
        if ssh_transport is not None and ssh_transport.transport is not None:
            ssh_transport.loseConnection()

    def request_tunnel(self, service: str, session_id: str) -> defer.Deferred[Any]:
        """Ask the server to carry ``service`` of the session on SSH channels
        of its own (:mod:`nxgate.protocols.service_tunnel`); fails when it will not."""
        return self.conn.sendRequest(self, tunnels.REQUEST, tunnels.encode(service, session_id), wantReply=True)

    def pause_reading(self) -> None:
        """Stop reading from the server: the local side cannot keep up."""
        self.conn.transport.transport.pauseProducing()

    def resume_reading(self) -> None:
        self.conn.transport.transport.resumeProducing()


class _Connection(connection.SSHConnection):
    def __init__(self, handler: ShellHandler, ready: defer.Deferred[ShellChannel]) -> None:
        super().__init__()
        self.handler = handler
        self.ready = ready
        self.shell: ShellChannel | None = None

    def getChannel(self, channelType: bytes, windowSize: int, maxPacket: int, data: bytes) -> channel.SSHChannel:
        """Only the tunnels we asked for (:mod:`nxgate.protocols.service_tunnel`): the server's
        connections to our print gate or private Samba."""
        target = None
        if channelType == tunnels.CHANNEL:
            try:
                target = self.handler.tunnel_target(*tunnels.decode(data))  # type: ignore[attr-defined]
            except (tunnels.TunnelRequestError, AttributeError):
                target = None
        if target is None:
            raise ConchError(connection.OPEN_ADMINISTRATIVELY_PROHIBITED, "no such tunnel was asked for")
        # Imported here, for the first tunnel: it pulls in Twisted's endpoints
        # (TLS, HTTP), which a session without folders or printers never needs.
        from nxgate.streams.reverse_channel import TargetChannel

        reactor = self.handler.reactor  # type: ignore[attr-defined]
        return TargetChannel(reactor, target, tunnels.CHANNEL, remoteWindow=windowSize, remoteMaxPacket=maxPacket,
                             conn=self)

    def serviceStarted(self) -> None:
        super().serviceStarted()
        self.transport.factory.authenticated = True
        self.transport.factory.progress(f"SSH: logged in as {self.transport.factory.login.user}")
        self.shell = ShellChannel(self.handler, self.ready, conn=self)
        self.openChannel(self.shell)

    def serviceStopped(self) -> None:
        super().serviceStopped()
        if self.shell is not None:
            self.shell._gone()


class _UserAuth(userauth.SSHUserAuthClient):
    """Offers the keys, then one password attempt.

    Conch's client would retry a refused password for as long as the server
    lists the method again; a wrong password should be one failure, not a
    lock-out.  Keyboard-interactive comes before password, as in OpenSSH,
    so PAM conversations (2FA) work; the first hidden prompt gets the
    password, further ones are asked on the terminal.
    """

    preferredOrder = [b"publickey", b"keyboard-interactive", b"password"]

    def __init__(self, login: Login, instance: connection.SSHConnection) -> None:
        super().__init__(login.user.encode("utf-8", "surrogateescape"), instance)
        self.login = login
        self._keys = list(login.keys)
        self._current: Key | None = None
        self._password_used = False

    def getPublicKey(self) -> Key | None:
        if not self._keys:
            return None
        self._current = self._keys.pop(0)
        return self._current.public()

    def getPrivateKey(self) -> defer.Deferred[Key]:
        assert self._current is not None
        return defer.succeed(self._current)

    def _take_password(self) -> str | None:
        if self.login.password is None or self._password_used:
            return None
        self._password_used = True
        return self.login.password()

    def auth_password(self) -> bool:
        password = self._take_password()
        if password is None:
            return False
        self._cbPassword(password.encode("utf-8", "surrogateescape"))
        return True

    def auth_keyboard_interactive(self) -> bool:
        if self.login.password is None or self._password_used:
            return False
        return super().auth_keyboard_interactive()

    def getGenericAnswers(self, name: bytes, instruction: bytes, prompts: list[tuple[bytes, bool]]) -> defer.Deferred:
        answers = []
        for text, echo in prompts:
            prompt = text.decode("utf-8", "replace")
            if echo:
                answers.append(input(prompt))
            else:
                password = self._take_password()
                answers.append(password if password is not None else getpass.getpass(prompt))
        return defer.succeed(answers)


class _Transport(EtmTransport, transport.SSHClientTransport):
    factory: _Factory
    # AES-GCM first (EtmTransport's ciphers: the gateway and OpenSSH's sshd have it;
    # it needs no MAC).  With another cipher, encrypt-then-MAC first: the gateway
    # offers no other MAC by default.  SHA-256
    # before SHA-512: with the CPUs' SHA extensions (OpenSSL uses them) its HMAC
    # ran at 405 MB/s against 120 here, and every byte of a folder copy on its own
    # SSH channel is MACed by both ends (bench/sharing_copy.py).
    supportedMACs = [*sorted(ETM_MACS, key=lambda name: b"sha2-256" not in name),
                     *transport.SSHClientTransport.supportedMACs]

    def connectionMade(self) -> None:
        no_delay(self.transport)  # the NX stream's small messages must not wait (nxgate.wire.tcp)
        self.factory.progress(f"connected to {self.factory.address}")
        known = self.factory.policy.known_hosts
        if known is not None:
            self.supportedPublicKeys = preferred_algorithms(
                list(self.supportedPublicKeys), known.known_key_types()
            )
        super().connectionMade()

    def verifyHostKey(self, hostKey: bytes, fingerprint_: bytes) -> defer.Deferred[bool]:
        policy = self.factory.policy
        if policy.known_hosts is None:
            return defer.succeed(True)
        key = Key.fromString(hostKey)
        check = policy.known_hosts.check(key)
        if check.verdict is Verdict.CHANGED:
            self.factory.problem = check.message
            return defer.fail(SSHError(check.message))
        if check.verdict is Verdict.UNKNOWN:
            try:
                policy.known_hosts.add(key)
            except OSError as error:
                policy.notify(f"could not record the host key in {policy.known_hosts.path}: {error}")
            else:
                policy.notify(
                    f"added the host key of {policy.known_hosts.name} ({key.sshType().decode()} {fingerprint(key)})"
                    f" to {policy.known_hosts.path}"
                )
        return defer.succeed(True)

    def connectionSecure(self) -> None:
        ciphers = self.currentEncryptions
        mac = "" if ciphers.outCipType in AEAD_CIPHERS else f", {ciphers.outMACType.decode()}"  # GCM has its own
        self.factory.progress(f"SSH: keys exchanged ({self.kexAlg.decode()}, {ciphers.outCipType.decode()}{mac})")
        conn = _Connection(self.factory.handler, self.factory.ready)
        self.requestService(_UserAuth(self.factory.login, conn))

    def sendDisconnect(self, reason: int, desc: bytes) -> None:
        if reason == transport.DISCONNECT_NO_MORE_AUTH_METHODS_AVAILABLE:
            self.factory.problem = f"authentication as {self.factory.login.user!r} failed (permission denied)"
        super().sendDisconnect(reason, desc)

    def receiveError(self, reasonCode: int, description: bytes) -> None:
        if self.factory.problem is None:
            self.factory.problem = "the server closed the connection: " + description.decode("utf-8", "replace")

    def connectionLost(self, reason: Failure | None = None) -> None:
        super().connectionLost(reason)
        self.factory.lost(reason)


class _Factory(protocol.ClientFactory):
    def __init__(self, address: str, login: Login, policy: HostKeyPolicy, handler: ShellHandler,
                 progress: Callable[[str], None] | None = None) -> None:
        self.address = address
        self.progress = progress or (lambda message: None)
        self.login = login
        self.policy = policy
        self.handler = handler
        self.ready: defer.Deferred[ShellChannel] = defer.Deferred()
        self.problem: str | None = None
        self.authenticated = False

    def buildProtocol(self, addr: Any) -> _Transport:
        proto = _Transport()
        proto.factory = self
        return proto

    def clientConnectionFailed(self, connector: Any, reason: Failure) -> None:
        if not self.ready.called:
            self.ready.errback(SSHError(f"cannot connect to {self.address}: {reason.getErrorMessage()}"))

    def lost(self, reason: Failure | None) -> None:
        if self.ready.called:
            return
        if self.problem is not None:
            message = self.problem
        elif self.authenticated:
            message = "the server closed the connection before the NX shell started"
        else:
            detail = reason.getErrorMessage() if reason is not None else "connection lost"
            message = f"the SSH connection to {self.address} failed before login: {detail}"
        self.ready.errback(SSHError(message))


def open_shell(
    reactor: Any,
    host: str,
    port: int,
    login: Login,
    policy: HostKeyPolicy,
    handler: ShellHandler,
    timeout: float = 30.0,
    progress: Callable[[str], None] | None = None,
) -> defer.Deferred[ShellChannel]:
    """Connect, check the host key, log in and start the shell.

    The handler sees the shell's data from the first byte; the Deferred
    fires with the channel once the server granted the shell.  ``progress``
    hears each step (``--verbose`` shows them: where a slow start waits).
    """
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    factory = _Factory(address, login, policy, handler, progress)
    reactor.connectTCP(host, port, factory, timeout=timeout)
    return factory.ready

