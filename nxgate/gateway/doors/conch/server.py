"""The Conch SSH server: factory, user authentication, avatar and channel.

An authenticated connection can open *session* channels and request a
``shell`` on them (with or without a pty, as clients vary); that shell is
the NX conversation.  Everything else an SSH server usually offers is
refused: ``exec``, subsystems, port forwarding in both directions, agent
and X11 forwarding.  The nx account can do nothing but speak NX.
"""

from __future__ import annotations

import copy
import struct
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from twisted.conch.avatar import ConchUser
from twisted.conch.error import ConchError
from twisted.conch.interfaces import IConchUser
from twisted.conch.openssh_compat import primes
from twisted.conch.ssh import _kex, common, connection, factory, transport, userauth
from twisted.conch.ssh.channel import SSHChannel
from twisted.cred.error import UnauthorizedLogin
from twisted.cred.portal import IRealm, Portal
from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from nxgate.protocols import service_tunnel as tunnels
from nxgate.gateway.auth.pam import Prompt
from nxgate.gateway.doors.conch import algorithms, kexmath
from nxgate.gateway.doors.conch.checkers import (IKeyboardInteractive, KeyboardInteractive, LoginUnavailable, Principal,
                                                 RepeatedSecrets)
from nxgate.wire.ssh_compression import DELAYED_ZLIB, SERVER_COMPRESSIONS, BoundedInflater, CompressionError
from nxgate.wire.ssh_etm import INCOMING_STATE, MAX_PACKET, EtmTransport
from nxgate.gateway.doors.conch.kexlimit import KexAdmission, OncePer, Refusal
from nxgate.gateway.doors.conch.kexpool import InlineKexPool, KexJobError, KexPool
from nxgate.wire.guarded import authenticated, user_logged_in
from nxgate.wire.tcp import no_delay, quick_ack

log = Logger()

OPEN_ADMINISTRATIVELY_PROHIBITED = 1
MSG_USERAUTH_INFO_REQUEST = 60
MODULI_FILE = "/etc/ssh/moduli"
#: OpenSSH clients' ServerAliveInterval probe (global or on a channel).
KEEPALIVE = b"keepalive@openssh.com"
#: paramiko's (python-x2go's) probe, every 5 seconds with want_reply=0.
PARAMIKO_KEEPALIVE = b"keepalive@lag.net"
#: A client's goodbyes: Conch's and nxgate-client's "user closed connection", OpenSSH's "disconnected by user".
NORMAL_DISCONNECTS = frozenset((transport.DISCONNECT_CONNECTION_LOST, transport.DISCONNECT_BY_APPLICATION))

# Makes the NX conversation for a channel: (avatar, channel) -> handler
# with data_received(bytes), eof_received() and connection_lost().
ChannelHandlerFactory = Callable[["NXAvatar", "NXSessionChannel"], Any]


class TooManyConnections(UnauthorizedLogin):
    """A right login refused: its user holds as many connections as one may
    (``[server] max_connections_per_user``).  The client is told why in a
    banner and disconnected; it is no failed login."""


@dataclass(frozen=True)
class LoginMind:
    """What the realm learns of the connection a login comes on: the client's
    ``address`` (its text), and ``claim(user)``, which counts the connection
    for that user (:func:`nxgate.wire.guarded.user_logged_in`)."""

    address: str
    claim: Callable[[str], str | None] = lambda user: None

    def __str__(self) -> str:
        return self.address


class _AddressPortal:
    """Hands the client's address to the checkers along with the credentials."""

    def __init__(self, portal: Portal, address: str, claim: Callable[[str], str | None]) -> None:
        self._portal = portal
        self._address = address
        self._mind = LoginMind(address, claim)
        self._repeated = RepeatedSecrets()  # one per connection: one typo, one failure

    def listCredentialsInterfaces(self) -> list[Any]:
        return self._portal.listCredentialsInterfaces()

    def login(self, credentials: Any, mind: Any, *interfaces: Any) -> defer.Deferred[Any]:
        credentials.remote_address = self._address
        credentials.repeated_secrets = self._repeated
        return self._portal.login(credentials, self._mind, *interfaces)


class NXUserAuthServer(userauth.SSHUserAuthServer):
    """User authentication with a client address for every check and with
    keyboard-interactive (RFC 4256) conversations driven by PAM."""

    interfaceToMethod = {
        **userauth.SSHUserAuthServer.interfaceToMethod,
        IKeyboardInteractive: b"keyboard-interactive",
    }

    def serviceStarted(self) -> None:
        self.loginTimeout = self.transport.factory.login_grace_time
        self.attemptsBeforeDisconnect = self.transport.factory.max_auth_tries
        super().serviceStarted()
        peer = self.transport.transport.getPeer()
        guarded = self.transport.transport

        def claim(user: str) -> str | None:
            refusal = user_logged_in(guarded, user)
            if refusal is not None:
                authenticated(guarded)  # a right login refused for the cap: its end costs the address no penalty
            return refusal

        self.portal = _AddressPortal(self.portal, getattr(peer, "host", str(peer)), claim)
        self._info_answer: defer.Deferred[list[str]] | None = None

    def serviceStopped(self) -> None:
        super().serviceStopped()
        self._abandon_conversation()

    def timeoutAuthentication(self) -> None:
        log.info("SSH authentication timeout for {peer}", peer=self.transport.transport.getPeer())
        super().timeoutAuthentication()

    def ssh_USERAUTH_REQUEST(self, packet: bytes) -> Any:
        self._abandon_conversation()
        return super().ssh_USERAUTH_REQUEST(packet)

    def _ebBadAuth(self, reason: Any) -> None:
        """A login that could not be checked (the gateway is out of open
        files) is told so in a banner (OpenSSH prints it, paramiko keeps
        it) before the usual failure, which lets the client try again."""
        if reason.check(LoginUnavailable, TooManyConnections):
            message = f"nxgate: {reason.getErrorMessage()}\r\n".encode()
            self.transport.sendPacket(userauth.MSG_USERAUTH_BANNER, common.NS(message) + common.NS(b""))
        if reason.check(TooManyConnections):
            # Not a failure to try again with another method: the same right login would be refused again.
            self.transport.sendDisconnect(transport.DISCONNECT_TOO_MANY_CONNECTIONS,
                                          reason.getErrorMessage().encode()[:200])
            return
        super()._ebBadAuth(reason)

    def auth_keyboard_interactive(self, packet: bytes) -> defer.Deferred[Any]:
        credentials = KeyboardInteractive(self.user, self._ask)
        return self.portal.login(credentials, None, IConchUser)

    def _ask(self, prompts: Sequence[Prompt]) -> defer.Deferred[list[str]]:
        """Send PAM's messages and prompts as one INFO_REQUEST."""
        questions = [(text, style == 2) for style, text in prompts if style in (1, 2)]
        notes = "\n".join(text for style, text in prompts if style in (3, 4))
        packet = common.NS(b"") + common.NS(notes.encode()) + common.NS(b"")
        packet += struct.pack(">L", len(questions))
        for text, echo in questions:
            packet += common.NS(text.encode()) + (b"\x01" if echo else b"\x00")
        self.transport.sendPacket(MSG_USERAUTH_INFO_REQUEST, packet)
        self._info_answer = defer.Deferred()
        answer = self._info_answer
        # PAM expects an answer slot for every message, prompts or not.
        return answer.addCallback(_spread_answers, [style for style, _ in prompts])

    def ssh_USERAUTH_INFO_RESPONSE(self, packet: bytes) -> None:
        pending, self._info_answer = self._info_answer, None
        if pending is None:
            self.transport.sendDisconnect(2, b"unexpected keyboard-interactive response")
            return
        (count,) = struct.unpack(">L", packet[:4])
        rest = packet[4:]
        answers = []
        for _ in range(min(count, 64)):
            answer, rest = common.getNS(rest)
            answers.append(answer.decode("utf-8", "surrogateescape"))
        pending.callback(answers)

    def _abandon_conversation(self) -> None:
        pending, self._info_answer = getattr(self, "_info_answer", None), None
        if pending is not None:
            pending.errback(ConchError("keyboard-interactive conversation abandoned"))


def _spread_answers(answers: list[str], styles: list[int]) -> list[str | None]:
    given = iter(answers)
    return [next(given, "") if style in (1, 2) else None for style in styles]


class NXAvatar(ConchUser):
    """An authenticated SSH login; it may open only NX session channels."""

    def __init__(self, principal: Principal, shell_factory: ChannelHandlerFactory, max_channels: int,
                 x2go: Any = None) -> None:
        super().__init__()
        self.principal = principal
        self.shell_factory = shell_factory
        self.max_channels = max_channels
        self.open_channels = 0
        self.channelLookup[b"session"] = NXSessionChannel
        # The X2Go door (nxgate.gateway.doors.conch.x2go.door) for a user's own login with [x2go] enabled, else None:
        # then exec, the sftp subsystem and direct-tcpip to the user's session links are served.
        self.x2go = x2go if principal.unix_user and principal.ssh_user == principal.unix_user else None
        self.open_links = 0

    def refusal(self, channel_type: bytes, data: bytes, address: str) -> str | None:
        """Why a channel of ``channel_type`` is refused (after one INFO line
        in the log), or None.  Refused here, before Conch would log each
        refusal as a CRITICAL traceback: the nx key is public, so anyone
        could fill the log with ``ssh -W`` or ``-L`` attempts."""
        user = self.principal.ssh_user
        if channel_type == b"direct-tcpip" and self.x2go is not None:
            if self.open_links >= self.max_channels:
                log.info("refused an X2Go link for {user!r} from {address}: {limit} are open already",
                         user=user, address=address, limit=self.max_channels)
                return "too many channels"
            return None
        if channel_type != b"session":
            log.info("refused {kind!r} channel{target} for {user!r} from {address} (only the NX shell is offered)",
                     kind=channel_type[:64], target=_forward_target(channel_type, data), user=user, address=address)
            return "only NX sessions are offered here"
        if self.open_channels >= self.max_channels:
            log.info("refused a session channel for {user!r} from {address}: {limit} are open already",
                     user=user, address=address, limit=self.max_channels)
            return "too many channels"
        return None

    def lookupChannel(self, channelType: bytes, windowSize: int, maxPacket: int, data: bytes) -> SSHChannel:
        if channelType == b"direct-tcpip" and self.x2go is not None and self.open_links < self.max_channels:
            return self.x2go.link_channel(self, windowSize, maxPacket, data)  # counts itself in open_links
        if channelType != b"session" or self.open_channels >= self.max_channels:  # see NXConnection
            raise ConchError(OPEN_ADMINISTRATIVELY_PROHIBITED, "refused")
        return super().lookupChannel(channelType, windowSize, maxPacket, data)

    def gotGlobalRequest(self, requestType: bytes, data: bytes) -> int:
        if requestType in (KEEPALIVE, PARAMIKO_KEEPALIVE):
            return 0  # any answer tells the client we are alive; no log line every interval
        if self.x2go is not None and requestType in (b"tcpip-forward", b"cancel-tcpip-forward"):
            return self.x2go.forward_request(self, requestType, data)
        log.warn("refused global request {kind!r} for {user!r} from {address}", kind=requestType[:100],
                 user=self.principal.ssh_user, address=self.address)
        return 0

    @property
    def address(self) -> str:
        """The client's address (for the log: repeated lines are counted per address)."""
        conn = getattr(self, "conn", None)
        peer = conn.transport.transport.getPeer() if conn is not None else None
        return str(getattr(peer, "host", peer))

    def logout(self) -> None:
        log.debug("SSH logout of {user!r}", user=self.principal.ssh_user)
        if self.x2go is not None:
            self.x2go.connection_lost(self)  # its reverse routes go with it


def _forward_target(channel_type: bytes, data: bytes) -> str:
    """`` to b'host':port`` for a forwarding channel, for the log."""
    if channel_type not in (b"direct-tcpip", b"forwarded-tcpip"):
        return ""
    try:
        host, rest = common.getNS(data)
        (port,) = struct.unpack(">L", rest[:4])
    except (struct.error, ValueError, IndexError):
        return ""
    return f" to {host[:100]!r}:{port}"


class NXConnection(connection.SSHConnection):
    """The connection service; refuses unwanted channels quietly (see
    :meth:`NXAvatar.refusal`)."""

    def ssh_CHANNEL_OPEN(self, packet: bytes) -> None:
        channel_type, rest = common.getNS(packet)
        avatar = getattr(self.transport, "avatar", None)
        if avatar is not None and len(rest) >= 12:
            peer = self.transport.transport.getPeer()
            reason = avatar.refusal(channel_type, rest[12:], getattr(peer, "host", str(peer)))
            if reason is not None:
                (sender,) = struct.unpack(">L", rest[:4])
                self.transport.sendPacket(
                    connection.MSG_CHANNEL_OPEN_FAILURE,
                    struct.pack(">2L", sender, OPEN_ADMINISTRATIVELY_PROHIBITED)
                    + common.NS(reason.encode()) + common.NS(b""),
                )
                return
        super().ssh_CHANNEL_OPEN(packet)


class NXSessionChannel(SSHChannel):
    """A session channel whose only shell is the NX conversation."""

    name = b"session"

    #: What the client may send before we must grant more.  Conch's 128 KiB
    #: default holds a bulk upload to a window per round trip; with 2 MiB the
    #: relay carried 0.35 GB/s upstream instead of 0.105 (bench/relay.py).
    WINDOW = 2 * 1024 * 1024

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("localWindow", self.WINDOW)
        super().__init__(*args, **kwargs)
        self.handler: Any = None
        self.pty_requested = False

    @property
    def peer(self) -> str:
        address = self.conn.transport.transport.getPeer()
        return getattr(address, "host", str(address))

    @property
    def local_address(self) -> str:
        address = self.conn.transport.transport.getHost()
        return getattr(address, "host", str(address))

    def stopWriting(self) -> None:
        """Conch: the client's window is full; hold back what feeds us."""
        if self.handler is not None:
            self.handler.pause_output()

    def startWriting(self) -> None:
        if self.handler is not None:
            self.handler.resume_output()

    def channelOpen(self, specificData: bytes) -> None:
        self.avatar.open_channels += 1

    def request_pty_req(self, data: bytes) -> int:
        self.pty_requested = True  # accepted and ignored: the shell is no tty
        return 1

    def request_window_change(self, data: bytes) -> int:
        return 1

    def request_env(self, data: bytes) -> int:
        return 0

    def request_shell(self, data: bytes) -> int:
        if self.handler is not None:
            return 0
        self.handler = self.avatar.shell_factory(self.avatar, self)
        return 1

    def request_exec(self, data: bytes) -> int:
        if self.avatar.x2go is not None and self.handler is None:
            return self.avatar.x2go.exec(self, common.getNS(data)[0])
        command = common.getNS(data)[0][:200]
        log.warn(
            "refused exec {command!r} for {user!r} from {address}",
            command=command, user=self.avatar.principal.ssh_user, address=self.peer,
        )
        self.write_stderr(b"nxgate: this server offers only the NX shell; commands are refused.\r\n")
        return 0

    def request_subsystem(self, data: bytes) -> int:
        if self.avatar.x2go is not None and self.handler is None and common.getNS(data)[0] == b"sftp":
            return self.avatar.x2go.sftp(self)
        self._refuse(b"subsystem " + common.getNS(data)[0][:100])
        return 0

    def request_x11_req(self, data: bytes) -> int:
        self._refuse(b"X11 forwarding")
        return 0

    def requestReceived(self, requestType: bytes, data: bytes) -> int:
        # OpenSSH's name cannot be a method name (request_auth_agent_req@...).
        if requestType == b"auth-agent-req@openssh.com":
            self._refuse(b"agent forwarding")
            return 0
        if requestType == KEEPALIVE:
            return 0  # as for the global one
        if requestType == tunnels.REQUEST:  # nxgate-client's folders and printers beside the NX stream
            tunnel_request = getattr(self.handler, "tunnel_request", None)
            return tunnel_request(data) if tunnel_request is not None else 0
        return super().requestReceived(requestType, data)

    def _refuse(self, what: bytes) -> None:
        log.warn("refused {what!r} for {user!r} from {address}", what=what, user=self.avatar.principal.ssh_user,
                 address=self.peer)

    def write_stderr(self, data: bytes) -> None:
        self.writeExtended(connection.EXTENDED_DATA_STDERR, data)

    def dataReceived(self, data: bytes) -> None:
        if self.handler is not None:
            self.handler.data_received(data)

    def eofReceived(self) -> None:
        if self.handler is not None:
            self.handler.eof_received()
        else:
            self.loseConnection()

    def closed(self) -> None:
        self.avatar.open_channels -= 1
        if self.handler is not None:
            handler, self.handler = self.handler, None
            handler.connection_lost()

    def finish(self, status: int = 0) -> None:
        """Report an exit status (clients like a clean one) and close."""
        if not self.closing:
            self.conn.sendRequest(self, b"exit-status", struct.pack(">L", status))
            self.loseConnection()


@implementer(IRealm)
class NXRealm:
    def __init__(self, shell_factory: ChannelHandlerFactory, max_channels: int, x2go: Any = None) -> None:
        self.shell_factory = shell_factory
        self.max_channels = max_channels
        self.x2go = x2go

    def requestAvatar(self, avatarId: Principal, mind: Any, *interfaces: Any) -> tuple[Any, NXAvatar, Any]:
        """``mind``: the connection's :class:`LoginMind` (see :class:`_AddressPortal`).
        A user's own login counts for that user from now on, if it may; the
        nx account's counts at the NX login inside."""
        if IConchUser not in interfaces:
            raise NotImplementedError("only SSH logins are served")
        if avatarId.unix_user:
            refusal = mind.claim(avatarId.unix_user) if isinstance(mind, LoginMind) else None
            if refusal is not None:
                log.warn("SSH login of {user!r} from {address} ({method}) refused: {why}"
                         " ([server] max_connections_per_user)", user=avatarId.ssh_user, address=str(mind),
                         method=avatarId.method, why=refusal, audit="login_refused")
                raise TooManyConnections(refusal)
        avatar = NXAvatar(avatarId, self.shell_factory, self.max_channels, self.x2go)
        log.info(
            "SSH login of {user!r} from {address} ({method})",
            user=avatarId.ssh_user, address=str(mind), method=avatarId.method, audit="ssh_login",
        )
        return IConchUser, avatar, avatar.logout


# The signature algorithms our user authentication verifies (Conch's
# keys.Key), for ``server-sig-algs``: Conch would advertise its host key
# algorithms instead, leaving out ECDSA and the NoMachine DSA key.
USER_KEY_ALGORITHMS = (
    b"ssh-ed25519", b"ecdsa-sha2-nistp256", b"ecdsa-sha2-nistp384", b"ecdsa-sha2-nistp521",
    b"sk-ssh-ed25519@openssh.com", b"sk-ecdsa-sha2-nistp256@openssh.com",
    b"rsa-sha2-512", b"rsa-sha2-256", b"ssh-rsa", b"ssh-dss",
)


def _is_hybrid(kex: bytes) -> bool:
    """Conch before 25 (Debian 12 has 22.4) has no post-quantum hybrid."""
    check = getattr(_kex, "isPQHybrid", None)
    return bool(check and check(kex))


def _is_group_exchange(kex: bytes) -> bool:
    """``_kex.isDynamicPrimesGroup``, which Conch 22.4 lacks: what is neither
    a fixed group, nor ECDH, nor a hybrid."""
    return not (_kex.isFixedGroup(kex) or _kex.isEllipticCurve(kex) or _is_hybrid(kex))


#: What a client may send while its key-exchange computation is pending
#: (it has no reason to send anything until our reply).
HELD_INPUT_LIMIT = 256 * 1024


@dataclass
class KexService:
    """What all SSH connections share for their key exchanges: the algorithm
    set, the worker pool that computes, the admission limits and the
    rate-limited log of refusals."""

    policy: algorithms.AlgorithmPolicy = field(default_factory=lambda: algorithms.policy(False))
    pool: Any = field(default_factory=InlineKexPool)
    admission: KexAdmission = field(default_factory=lambda: KexAdmission(per_source=4, max_pending=32))
    refusals: OncePer = field(default_factory=lambda: OncePer(time.monotonic))


def kex_service(reactor: Any, ssh: Any) -> KexService:
    """The gateway's ``KexService`` from the ``[ssh]`` settings."""
    return KexService(algorithms.policy(ssh.legacy_algorithms), KexPool(reactor, ssh.kex_workers),
                      KexAdmission(ssh.kex_per_source, ssh.kex_max_pending), OncePer(reactor.seconds))


class NXServerTransport(EtmTransport, transport.SSHServerTransport):
    """The SSH transport, logging each connection with its peer.

    Key exchanges never compute on the reactor: the Diffie-Hellman and
    ML-KEM arithmetic goes to the factory's worker pool (``KexService``),
    admitted per client address and in total, and until the answer is back
    and our reply sent, the connection reads no further packets (they wait,
    undecrypted, in Conch's buffer: what follows the client's NEWKEYS needs
    the keys still being computed).  Conch's own handlers for these messages
    compute inline, and for group exchange take a group of any size the
    client names, 8192 bits included, proving its primes on each use (28 s
    of CPU): see ``tests.test_ssh_kex.ConchCanaryTests`` for what we replace.

    Our new keys take effect for what we send right after our NEWKEYS, not
    only once the client's NEWKEYS has arrived as in Conch, so that EXT_INFO
    (``server-sig-algs``) is the very next packet, as OpenSSH's sshd sends
    it (RFC 8308, section 2.4).  libssh 0.10 clients (Remmina) choose the
    signature algorithm for an RSA key as soon as they have our NEWKEYS;
    without ``rsa-sha2-*`` in ``server-sig-algs`` by then they fall back to
    SHA-1 ``ssh-rsa`` and refuse to use their key.

    Compression is OpenSSH's delayed ``zlib@openssh.com`` or none: it starts
    after user authentication, and every packet inflates to the packet limit
    at most (:mod:`nxgate.wire.ssh_compression`).
    """

    supportedCompressions = list(SERVER_COMPRESSIONS)
    _sending_new_keys = False
    #: User authentication succeeded: delayed compression may start.
    _user_authenticated = False
    _kex_job: defer.Deferred[Any] | None = None
    _gex_group: tuple[int, int] | None = None
    _receiving = False
    _lost = False
    #: Key-exchange messages the client may still send in this exchange.
    _kex_messages_left = 0

    def sendPacket(self, messageType: int, payload: bytes) -> None:
        sent_before = self.outgoingPacketSequence
        super().sendPacket(messageType, payload)
        if messageType == transport.MSG_NEWKEYS:
            self._start_sending_with_new_keys()
        elif messageType == userauth.MSG_USERAUTH_SUCCESS and self.outgoingPacketSequence != sent_before:
            self._start_delayed_compression()  # sent, not held back by a key exchange

    def _compresses(self, kind: bytes | None) -> bool:
        """Whether a direction negotiated as ``kind`` is compressed now."""
        return kind == DELAYED_ZLIB and self._user_authenticated

    def _start_delayed_compression(self) -> None:
        """OpenSSH's ``zlib@openssh.com``: both directions compress from the
        first packet after SSH_MSG_USERAUTH_SUCCESS (the client starts when
        it reads it and has nothing to send before)."""
        self._user_authenticated = True
        if self._compresses(self.outgoingCompressionType):
            self.outgoingCompression = zlib.compressobj(6)
        if self._compresses(self.incomingCompressionType):
            self.incomingCompression = BoundedInflater(MAX_PACKET)

    def _start_sending_with_new_keys(self) -> None:
        """RFC 4253, section 7.3: after our NEWKEYS we send with the new
        keys and compression; we still read with the old until the client's
        NEWKEYS.  Conch keeps both directions in one SSHCiphers, so ours is
        the new one with the old incoming half."""
        sending = copy.copy(self.nextEncryptions)
        for name in INCOMING_STATE:
            setattr(sending, name, getattr(self.currentEncryptions, name, None))
        self.currentEncryptions = sending
        self.outgoingCompression = zlib.compressobj(6) if self._compresses(self.outgoingCompressionType) else None
        self._sending_new_keys = True

    def sendExtInfo(self, extensions: list[tuple[bytes, bytes]]) -> None:
        super().sendExtInfo([
            (name, b",".join(USER_KEY_ALGORITHMS) if name == b"server-sig-algs" else value)
            for name, value in extensions
        ])

    def _allowedKeyExchangeMessageType(self, messageType: int) -> bool:
        # EXT_INFO may follow our NEWKEYS before the key exchange completes.
        if messageType == transport.MSG_EXT_INFO and self._sending_new_keys:
            return True
        return super()._allowedKeyExchangeMessageType(messageType)

    def _newKeys(self) -> None:
        """The client's NEWKEYS: now read with the new keys too (and a new
        zlib stream, bounded, if this exchange compresses after an earlier
        authentication).  Conch would also start a fresh outgoing compressor
        here, in the middle of the zlib stream we began at our NEWKEYS; it
        must go on."""
        if not self._sending_new_keys:  # a NEWKEYS before ours: Conch's way
            super()._newKeys()
            self.outgoingCompression = (zlib.compressobj(6) if self._compresses(self.outgoingCompressionType)
                                        else None)
        else:
            compressor, kind = self.outgoingCompression, self.outgoingCompressionType
            self.outgoingCompressionType = None  # Conch starts no compressor for this
            try:
                super()._newKeys()
            finally:
                self.outgoingCompressionType = kind
                self.outgoingCompression = compressor
                self._sending_new_keys = False
        self.incomingCompression = (BoundedInflater(MAX_PACKET) if self._compresses(self.incomingCompressionType)
                                    else None)

    # ---------------------------------------------- key exchange, off the reactor
    def dataReceived(self, data: bytes) -> None:
        quick_ack(self.transport, len(data))  # a client's next small message must not wait (nxgate.wire.tcp)
        if self._kex_job is not None:  # hold everything until our reply is out
            self.buf += data
            if len(self.buf) > HELD_INPUT_LIMIT:
                self.sendDisconnect(transport.DISCONNECT_PROTOCOL_ERROR, b"too much data during key exchange")
            return
        self._receiving = True
        try:
            super().dataReceived(data)
        finally:
            self._receiving = False

    def getPacket(self) -> bytes | None:
        """The next packet, inflated here rather than by Conch (or ETM) so
        that a packet inflating beyond the limit closes the connection with
        one clear line instead of a traceback."""
        if self._kex_job is not None:  # stops Conch's packet loop in dataReceived
            return None
        inflater, self.incomingCompression = self.incomingCompression, None
        try:
            payload = super().getPacket()
        finally:
            self.incomingCompression = inflater
        if payload is None or inflater is None:
            return payload
        try:
            return inflater.decompress(payload)
        except CompressionError as error:
            log.warn("SSH connection from {peer} closed: {why}", peer=getattr(self, "peer_text", "?"),
                     why=str(error), address=self.peer_host, event="ssh_compression_refused")
            self.sendDisconnect(transport.DISCONNECT_COMPRESSION_ERROR, str(error).encode())
            return None

    def ssh_KEXINIT(self, packet: bytes) -> None:
        super().ssh_KEXINIT(packet)
        # One message for a fixed group, ECDH or the hybrid; two for group exchange.
        try:
            self._kex_messages_left = 2 if _is_group_exchange(self.kexAlg) else 1
        except (AttributeError, ConchError):  # no algorithm agreed: Conch has disconnected
            self._kex_messages_left = 0

    def _take_kex_message(self) -> bool:
        """Conch would answer key-exchange messages at any time, each a
        computation and new keys; we take the ones this exchange has."""
        if self._kex_messages_left <= 0:
            log.info("SSH connection from {peer} closed: an unexpected key-exchange message",
                     peer=getattr(self, "peer_text", "?"))
            self.sendDisconnect(transport.DISCONNECT_PROTOCOL_ERROR, b"unexpected key-exchange message")
            return False
        self._kex_messages_left -= 1
        return True

    def ssh_KEX_DH_GEX_REQUEST_OLD(self, packet: bytes) -> None:
        """Message 30: KEXDH_INIT, KEX_ECDH_INIT, the hybrid INIT or the old
        group-exchange request, by the negotiated algorithm (as Conch)."""
        if self.ignoreNextPacket:  # the client's wrong guess (RFC 4253, 7)
            self.ignoreNextPacket = 0
            return
        if not self._take_kex_message():
            return
        if _kex.isFixedGroup(self.kexAlg):
            self._fixed_group_init(packet)
        elif _kex.isEllipticCurve(self.kexAlg):
            self._ssh_KEX_ECDH_INIT(packet)  # X25519 takes microseconds: Conch's, on the reactor
        elif _is_hybrid(self.kexAlg):
            self._hybrid_init(packet)
        elif len(packet) != 4:
            self.sendDisconnect(transport.DISCONNECT_PROTOCOL_ERROR, b"bad group-exchange request")
        else:
            (ideal,) = struct.unpack(">L", packet)
            self._send_group(packet, 0, ideal, 0xFFFFFFFF)

    def ssh_KEX_DH_GEX_REQUEST(self, packet: bytes) -> None:
        if self.ignoreNextPacket:
            self.ignoreNextPacket = 0
            return
        if not _is_group_exchange(self.kexAlg) or not self._take_kex_message():
            self.sendDisconnect(transport.DISCONNECT_PROTOCOL_ERROR, b"unexpected group-exchange request")
            return
        if len(packet) != 12:
            self.sendDisconnect(transport.DISCONNECT_PROTOCOL_ERROR, b"bad group-exchange request")
            return
        minimum, ideal, maximum = struct.unpack(">3L", packet)
        self._send_group(packet, minimum, ideal, maximum)

    def _send_group(self, request: bytes, minimum: int, ideal: int, maximum: int) -> None:
        """A group within our bounds (choosing costs nothing: our exponent is
        computed with the client's value, in ``ssh_KEX_DH_GEX_INIT``)."""
        policy = self.factory.kex.policy
        try:
            group = algorithms.choose_group(self.factory.primes or {}, minimum, ideal, maximum,
                                            policy.smallest_modulus, policy.largest_modulus,
                                            policy.preferred_modulus)
        except algorithms.NoGroup as refusal:
            log.info("SSH key exchange with {peer} refused: {why}", peer=self.peer_text, why=str(refusal))
            self.sendDisconnect(transport.DISCONNECT_KEY_EXCHANGE_FAILED, str(refusal).encode())
            return
        self.dhGexRequest = request
        self._gex_group = group
        generator, prime = group
        self.sendPacket(transport.MSG_KEX_DH_GEX_GROUP, common.MP(prime) + common.MP(generator))

    def ssh_KEX_DH_GEX_INIT(self, packet: bytes) -> None:
        group, self._gex_group = self._gex_group, None
        if group is None or not _is_group_exchange(self.kexAlg) or not self._take_kex_message():
            self.sendDisconnect(transport.DISCONNECT_PROTOCOL_ERROR, b"group-exchange init without a request")
            return
        generator, prime = group
        client_public = self._dh_public(packet, prime)
        if client_public is None:
            return
        request = self.dhGexRequest
        prefix = request + common.MP(prime) + common.MP(generator)
        self._compute({"op": "dh", "g": format(generator, "x"), "p": format(prime, "x"), "e": format(client_public, "x")},
                      lambda answer: self._dh_reply(transport.MSG_KEX_DH_GEX_REPLY, prefix, client_public, answer))

    def _fixed_group_init(self, packet: bytes) -> None:
        generator, prime = _kex.getDHGeneratorAndPrime(self.kexAlg)
        client_public = self._dh_public(packet, prime)
        if client_public is None:
            return
        self._compute({"op": "dh", "g": format(generator, "x"), "p": format(prime, "x"), "e": format(client_public, "x")},
                      lambda answer: self._dh_reply(transport.MSG_KEXDH_REPLY, b"", client_public, answer))

    def _dh_public(self, packet: bytes, prime: int) -> int | None:
        """The client's ``e``, checked here so that junk costs no worker."""
        try:
            value, _ = common.getMP(packet)
            kexmath.check_dh_public(value, prime)
        except (ValueError, struct.error, IndexError) as problem:
            why = str(problem) if isinstance(problem, kexmath.KexMathError) else "malformed Diffie-Hellman value"
            log.info("SSH key exchange with {peer} failed: {why}", peer=self.peer_text, why=why)
            self.sendDisconnect(transport.DISCONNECT_KEY_EXCHANGE_FAILED, why.encode())
            return None
        return value

    def _dh_reply(self, message: int, group_part: bytes, client_public: int, answer: dict[str, Any]) -> None:
        """RFC 4253, 8 and RFC 4419, 3: hash, sign and send; new keys."""
        ours, shared = int(answer["f"], 16), common.MP(int(answer["k"], 16))
        public_key, private_key = self._getHostKeys(self.keyAlg)
        exchange_hash = self._exchange_hash(public_key.blob(), group_part, common.MP(client_public),
                                            common.MP(ours), shared)
        self.sendPacket(message, common.NS(public_key.blob()) + common.MP(ours)
                        + common.NS(private_key.sign(exchange_hash, signatureType=self.keyAlg)))
        self._keySetup(shared, exchange_hash)

    def _hybrid_init(self, packet: bytes) -> None:
        try:
            client_init, _ = common.getNS(packet)
        except (ValueError, struct.error, IndexError):
            client_init = b""
        if len(client_init) != kexmath.MLKEM768_PUBLIC_KEY + kexmath.X25519_PUBLIC_KEY:
            self.sendDisconnect(transport.DISCONNECT_KEY_EXCHANGE_FAILED, b"Invalid C_INIT length")
            return
        self._compute({"op": "mlkem768x25519", "init": client_init.hex()},
                      lambda answer: self._hybrid_reply(client_init, answer))

    def _hybrid_reply(self, client_init: bytes, answer: dict[str, Any]) -> None:
        shared, reply = bytes.fromhex(answer["k"]), bytes.fromhex(answer["reply"])
        public_key, private_key = self._getHostKeys(self.keyAlg)
        exchange_hash = self._exchange_hash(public_key.blob(), b"", common.NS(client_init), common.NS(reply), shared)
        self.sendPacket(transport.OVERLAP_MSG_KEX_HYBRID_REPLY, common.NS(public_key.blob()) + common.NS(reply)
                        + common.NS(private_key.sign(exchange_hash, signatureType=self.keyAlg)))
        self._keySetup(shared, exchange_hash)

    def _exchange_hash(self, host_key: bytes, group_part: bytes, client_part: bytes, server_part: bytes,
                       shared: bytes) -> bytes:
        digest = _kex.getHashProcessor(self.kexAlg)()
        for part in (common.NS(self.otherVersionString), common.NS(self.ourVersionString),
                     common.NS(self.otherKexInitPayload), common.NS(self.ourKexInitPayload), common.NS(host_key),
                     group_part, client_part, server_part, shared):
            digest.update(part)
        return digest.digest()

    def _compute(self, job: dict[str, Any], finish: Callable[[dict[str, Any]], None]) -> None:
        """Admit ``job``, send it to the pool and hold the connection's input
        until ``finish`` has sent our reply."""
        kex: KexService = self.factory.kex
        source = self.peer_host
        refusal = kex.admission.admit(source)
        if refusal is not None:
            self._refused(kex, source, refusal)
            return
        # Admission ends when the pool is done with the job: a client that
        # hung up still holds it while a worker computes for it.
        pending = kex.pool.submit(job, lambda: kex.admission.release(source), source)
        self._kex_job = pending  # a synchronous answer clears it again in ended()

        def ended(result: Any) -> Any:
            self._kex_job = None
            return result

        pending.addBoth(ended)
        pending.addCallback(lambda answer: None if self._lost else finish(answer))
        pending.addErrback(self._kex_failed)
        pending.addCallback(lambda _: self._resume())

    def _refused(self, kex: KexService, source: str, refusal: Refusal) -> None:
        # Per address, once a minute; when all addresses together are too
        # many (a flood from many), once a minute in all.
        held = kex.refusals.allow(source if refusal.scope == "address" else "*")
        if held is not None:
            log.warn("SSH key exchange from {address} refused: {why}; the connection is closed{held}",
                     address=source, why=refusal.reason, scope=refusal.scope,
                     held=f" ({held} more refused since the last such line)" if held else "")
        # Not sendDisconnect: Conch logs a line for every one, the flood we log once a minute.
        self.sendPacket(transport.MSG_DISCONNECT, struct.pack(">L", transport.DISCONNECT_TOO_MANY_CONNECTIONS)
                        + common.NS(b"too many key exchanges, try again later") + common.NS(b""))
        self.transport.loseConnection()

    def _kex_failed(self, failure: Failure) -> None:
        if self._lost or failure.check(defer.CancelledError):
            return
        if failure.check(KexJobError):
            why = failure.getErrorMessage()
            log.info("SSH key exchange with {peer} failed: {why}", peer=self.peer_text, why=why)
        else:
            log.failure("SSH key exchange with {peer} failed", failure, peer=self.peer_text)
            why = "internal error"
        self.sendDisconnect(transport.DISCONNECT_KEY_EXCHANGE_FAILED, why.encode()[:200])

    def _resume(self) -> None:
        """Our reply is out: read what the client sent meanwhile."""
        if not self._lost and self._kex_job is None and not self._receiving and self.buf:
            self.dataReceived(b"")

    def sendDisconnect(self, reason: int, desc: bytes) -> None:
        if reason == transport.DISCONNECT_KEY_EXCHANGE_FAILED and desc == b"couldn't match all kex parts":
            self._log_no_common_algorithms()
        super().sendDisconnect(reason, desc)

    def _log_no_common_algorithms(self) -> None:
        """Conch refuses a client with no algorithm in common without a word
        in our log; say which kind, what the client offered, and the switch."""
        try:
            lists = common.getNS(self.otherKexInitPayload[17:], 8)[:8]
        except (AttributeError, ValueError, struct.error, IndexError):
            return
        ours = (self.supportedKeyExchanges, self.supportedPublicKeys, self.supportedCiphers, self.supportedCiphers,
                self.supportedMACs, self.supportedMACs, self.supportedCompressions, self.supportedCompressions)
        problems = algorithms.unmatched([names.split(b",") for names in lists], ours)
        legacy = self.factory.kex.policy.kex == algorithms.LEGACY_KEX
        if problems and all(problem.startswith("no compression") for problem in problems):
            hint = " (compression is zlib@openssh.com, after authentication, or none: never plain zlib)"
        else:
            hint = "" if legacy else " (NoMachine's nxssh and other old clients need [ssh] legacy_algorithms = yes)"
        log.info("SSH connection from {peer} refused: {problems}{hint}", peer=getattr(self, "peer_text", "?"),
                 problems="; ".join(problems) or "no algorithms in common", hint=hint)

    @property
    def peer_host(self) -> str:
        peer = self.transport.getPeer()
        return str(getattr(peer, "host", peer))

    def connectionMade(self) -> None:
        peer = self.transport.getPeer()
        self.peer_text = f"{getattr(peer, 'host', peer)}:{getattr(peer, 'port', '')}"
        log.info("SSH connection from {peer}", peer=self.peer_text)
        no_delay(self.transport)  # the NX stream's small messages must not wait (nxgate.wire.tcp)
        super().connectionMade()

    def setService(self, service: Any) -> None:
        super().setService(service)
        # ssh-connection comes only after user authentication (SSHFactory.getService); a user's own
        # login is theirs, the nx account's public key is not (the NX login inside counts, nxgate.gateway.root).
        if service.name == b"ssh-connection" and getattr(getattr(self.avatar, "principal", None), "unix_user", None):
            authenticated(self.transport)

    def receiveError(self, reasonCode: int, description: bytes) -> None:
        """The client's reason for disconnecting, told in the connection's
        closing line (Conch logs every one, a normal goodbye too, as an error)."""
        if reasonCode not in NORMAL_DISCONNECTS:
            self._client_reason = f" by the client: {description[:200].decode('utf-8', 'replace')} (code {reasonCode})"

    def connectionLost(self, reason: Any) -> None:
        log.info("SSH connection from {peer} closed{why}", peer=getattr(self, "peer_text", "?"),
                 why=getattr(self, "_client_reason", ""))
        self._lost = True
        if self._kex_job is not None:
            self._kex_job.cancel()  # a queued job is dropped (and its admission released)
        super().connectionLost(reason)


class NXSSHFactory(factory.SSHFactory):
    """The SSH server factory with our host keys and services."""

    protocol = NXServerTransport

    services = {
        b"ssh-userauth": NXUserAuthServer,
        b"ssh-connection": NXConnection,
    }

    def __init__(
        self, portal: Portal, host_keys: dict[bytes, Any], login_grace_time: int, max_auth_tries: int,
        kex: KexService | None = None,
    ) -> None:
        self.portal = portal
        self.privateKeys = host_keys
        self.publicKeys = {kind: key.public() for kind, key in host_keys.items()}
        self.login_grace_time = login_grace_time
        self.max_auth_tries = max_auth_tries
        self.kex = kex or KexService()

    def startFactory(self) -> None:
        super().startFactory()
        self.kex.pool.start()

    def stopFactory(self) -> None:
        self.kex.pool.stop()
        super().stopFactory()

    def buildProtocol(self, addr: Any) -> NXServerTransport:
        """A transport offering our algorithm set (``[ssh] legacy_algorithms``),
        not all that Conch implements."""
        built: NXServerTransport = super().buildProtocol(addr)
        policy = self.kex.policy
        built.supportedKeyExchanges = policy.offered_kex(built.supportedKeyExchanges, bool(self.primes))
        built.supportedPublicKeys = policy.offered_host_key_algorithms(built.supportedPublicKeys)
        built.supportedCiphers = [name for name in policy.ciphers if name in built.supportedCiphers]
        built.supportedMACs = list(policy.macs)
        return built

    def getPrimes(self) -> dict[int, list[tuple[int, int]]] | None:
        """Diffie-Hellman group-exchange primes from OpenSSH's moduli file.

        Old nxssh builds may know no better key exchange than
        diffie-hellman-group-exchange-sha1; without the file only the fixed
        groups and ECDH are offered.
        """
        try:
            return primes.parseModuliFile(MODULI_FILE)
        except OSError as error:
            # Conch asks once, when the factory starts: one line per start.
            log.info("no Diffie-Hellman group-exchange for old clients: cannot read {path} ({error})",
                     path=MODULI_FILE, error=error.strerror or str(error))
            return None
