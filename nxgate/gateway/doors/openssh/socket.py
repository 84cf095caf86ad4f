"""The gateway's local socket for ``nxgate-shell`` (the OpenSSH deployment mode).

Sites that keep their system sshd give the nx account ``nxgate-shell`` as
its command; it brings the NX conversation here, where authentication and
session management happen exactly as for the built-in SSH server.  The
kernel tells us who connected (SO_PEERCRED): the nx account gets the usual
NX login; any other user (sshd's ForceCommand for users who log in as
themselves) is already authenticated as that user, as with legacy-free
logins; root and unknown users are refused.  After ``bye`` the gateway
asks the router for the session's agent stream (``open_stream``: the
session's node checks the owner and connects to the agent's socket, which
only root and the session's user can reach) and passes it to the shell as
a socket (SCM_RIGHTS), which relays the stream itself (with nxcopy).  A
session on this machine: the agent's own socket, nothing in between; on
another member: one end of a socket pair the gateway splices to that
member's stream.
"""

from __future__ import annotations

import base64
import json
import socket
from typing import Any

from twisted.internet import protocol
from twisted.logger import Logger

from twisted.internet import defer
from twisted.python.failure import Failure

from nxgate.gateway.auth.pam import AuthResult
from nxgate.gateway.auth.peercred import peer_uid
from nxgate.gateway.doors.openssh import framing
from nxgate.gateway.doors.conversation import Conversation
from nxgate.wire.guarded import authenticated, user_logged_in
from nxgate.vocabulary.caller import Caller
from nxgate.vocabulary.errors import SessionError
from nxgate.vocabulary.streams import AGENT, Stream

log = Logger()


class _Frames:
    """The conversation's transport: DATA frames out, EXIT on close."""

    def __init__(self, transport: Any) -> None:
        self.transport = transport

    def write(self, data: bytes) -> None:
        self.transport.write(framing.frame(framing.DATA, data))

    def close(self) -> None:
        self.transport.write(framing.frame(framing.EXIT, b"0"))
        self.transport.loseConnection()


class _HandedOver:
    """Stands in for a relay: the shell carries the stream itself."""

    def write(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        pass

    def pause_agent(self) -> None:
        pass

    def resume_agent(self) -> None:
        pass


class OpenSSHDoorProtocol(protocol.Protocol):
    """One nxgate-shell connection.

    Who connected comes from the kernel (SO_PEERCRED) only.  The client
    address in the hello is the shell's claim: for the nx account it is
    sshd's word (sshd runs nxgate-shell as that account's only command), so
    it serves for PAM, throttling and fail2ban like the built-in server's
    peer address; from any other local user it is shown marked as a claim.
    """

    def __init__(self, gateway: Any) -> None:
        self.gateway = gateway
        self.deframer = framing.Deframer()
        self.conversation: Conversation | None = None
        self.preauthenticated: str | None = None
        self.agent: socket.socket | None = None  # handed to the shell; ours to close once sent
        self.lost = False
        self.uid: int | None = None
        self.done = False
        # Frames that came before the peer's account was known, in order.
        self.early: list[tuple[bytes, bytes]] | None = []
        self.early_bytes = 0

    def connectionMade(self) -> None:
        """Who connected: the uid from the kernel, its name from NSS (in a
        thread, through the gateway's user directory: NSS may be LDAP).
        Frames that arrive meanwhile wait, in order, until the name is known."""
        self.uid = uid = peer_uid(self.transport)
        if uid is None or uid == 0:
            self._refuse()
            return
        d = self.gateway.users.by_uid(uid)
        d.addCallbacks(self._known, lambda failure: self._refuse())  # the directory logged why
        d.addErrback(lambda failure: (log.failure("shell socket connection from uid {uid}", failure, uid=uid),
                                      self._drop()))

    def _refuse(self) -> None:
        log.warn("refused a shell socket connection from uid {uid}", uid=self.uid)
        self._drop()

    def _known(self, entry: Any) -> None:
        if self.lost or self.done:
            return
        name = entry.pw_name
        if name != self.gateway.config.ssh.nx_user:
            if not self.gateway.config.ssh.user_logins:
                log.warn("refused {user} on the shell socket: user logins are disabled", user=name)
                self._drop()
                return
            # The kernel proved who this is, but not that the account may
            # log in: the same account check as every door (deny_users,
            # shell, lock, pam_acct_mgmt) before any session operation.
            d = self.gateway.authenticator.account(name, None)
            d.addCallback(self._account_checked, name)
            d.addErrback(lambda failure: (log.failure("account check of {user} on the shell socket", failure,
                                                      user=name), self._drop()))
            return
        self._serve_early()

    def _account_checked(self, result: AuthResult, name: str) -> None:
        if self.lost or self.done:
            return
        if not result.granted:
            log.warn("refused {user} (uid {uid}) on the shell socket: {reason}", user=name, uid=self.uid,
                     reason=result.reason, audit="login_failed", address=f"local uid {self.uid}")
            note = result.client_note or "this account may not log in to NX on this server"
            self.transport.write(framing.frame(framing.DATA, f"NX> 500 ERROR: {note}.\nNX> 999 Bye.\n".encode()))
            self.transport.write(framing.frame(framing.EXIT, b"1"))
            self._drop()
            return
        refusal = user_logged_in(self.transport, name)
        if refusal is not None:
            log.warn("refused {user} (uid {uid}) on the shell socket: {why} ([server] max_connections_per_user)",
                     user=name, uid=self.uid, why=refusal, audit="login_refused", address=f"local uid {self.uid}")
            self.transport.write(framing.frame(framing.DATA, f"NX> 503 ERROR: {refusal[:1].upper()}{refusal[1:]}.\n"
                                                             "NX> 999 Bye.\n".encode()))
            self.transport.write(framing.frame(framing.EXIT, b"1"))
            self._drop()
            return
        self.preauthenticated = name
        self._serve_early()

    def _serve_early(self) -> None:
        early, self.early = self.early or [], None
        self._frames(early)

    def dataReceived(self, data: bytes) -> None:
        try:
            frames = list(self.deframer.feed(data))
        except framing.FramingError as error:
            log.warn("bad data from nxgate-shell (uid {uid}): {error}", uid=self.uid, error=str(error))
            self._drop()
            return
        if self.early is None:
            self._frames(frames)
            return
        self.early.extend(frames)
        self.early_bytes += sum(len(payload) for _, payload in frames)
        if self.early_bytes > framing.MAX_FRAME:
            log.warn("nxgate-shell (uid {uid}) sent {size} bytes before its account was known", uid=self.uid,
                     size=self.early_bytes)
            self._drop()

    def _frames(self, frames: list[tuple[bytes, bytes]]) -> None:
        try:
            for kind, payload in frames:
                if self.done:
                    return
                self._frame(kind, payload)
        except framing.FramingError as error:
            log.warn("bad data from nxgate-shell (uid {uid}): {error}", uid=self.uid, error=str(error))
            self._drop()

    def _frame(self, kind: bytes, payload: bytes) -> None:
        if self.conversation is None:
            if kind != framing.HELLO:
                raise framing.FramingError("no hello first")
            self._hello(payload)
        elif kind == framing.DATA:
            self.conversation.data_received(payload)
        elif kind == framing.EOF:
            self.conversation.eof_received()
        else:
            raise framing.FramingError(f"unexpected frame {kind!r}")

    def _hello(self, payload: bytes) -> None:
        who = self.preauthenticated or "nx account"
        try:
            hello = framing.parse_hello(payload)
        except framing.HelloError as error:
            log.warn("refused a malformed hello on the shell socket from uid {uid} ({who}): {error}",
                     uid=self.uid, who=who, error=str(error))
            self.transport.write(framing.frame(
                framing.DATA, b"NX> 500 ERROR: Malformed greeting from nxgate-shell.\nNX> 999 Bye.\n"))
            self.transport.write(framing.frame(framing.EXIT, b"1"))
            self._drop()
            return
        claimed = hello.claimed_address
        if self.preauthenticated is None:
            address = claimed or "unknown"
        else:
            address = f"{claimed} (claimed by uid {self.uid})" if claimed else f"local uid {self.uid}"
        log.info("NX conversation through sshd for uid {uid} ({who}), client address {claimed_address} "
                 "as nxgate-shell reports it", uid=self.uid, who=who, claimed_address=claimed or "not given")
        # The deadline ([server] login_grace_time) runs until the user is known: the NX login, or
        # at once for a user that sshd logged in as themselves.
        self.conversation = self.gateway.conversation(_Frames(self.transport), address, self.preauthenticated,
                                                      self._hand_over, door="nx-openssh",
                                                      logged_in=lambda: authenticated(self.transport),
                                                      claim=lambda user: user_logged_in(self.transport, user))
        self.conversation.start()

    def _drop(self) -> None:
        self.done = True
        self.transport.loseConnection()

    def _hand_over(self, client: Caller, target: Any, _transport: Any, leftover: bytes) -> _HandedOver:
        def opened(stream: Stream) -> None:
            if self.lost:  # nxgate-shell is gone already
                stream.close()
                return
            try:
                sock = stream.take_socket()
            except (OSError, ValueError) as error:
                failed(str(error))
                return
            self.agent = sock
            self.transport.sendFileDescriptor(sock.fileno())
            message = {"leftover": base64.b64encode(leftover).decode()}
            self.transport.write(framing.frame(framing.SWITCH, json.dumps(message).encode()))
            self._drop()
            log.info("handed {user}'s stream for session {id} to nxgate-shell", user=client.user,
                     id=target.session_id)

        def failed(why: str) -> None:
            log.warn("cannot reach the agent of session {id}: {error}", id=target.session_id, error=why)
            if not self.lost:
                self.transport.write(framing.frame(framing.EXIT, b"1"))
                self._drop()

        def not_opened(failure: Failure) -> None:
            if failure.check(SessionError):
                failed(failure.value.message)
            else:
                log.failure("opening the stream of session {id} failed", failure, id=target.session_id)
                failed("internal error")

        opening = defer.ensureDeferred(self.gateway.api.open_stream(client, target.session_id, AGENT))
        opening.addCallbacks(opened, not_opened)
        return _HandedOver()

    def connectionLost(self, reason: Any) -> None:
        self.lost = True
        if self.agent is not None:
            self.agent.close()
            self.agent = None
        if self.conversation is not None:
            self.conversation.connection_lost()


class OpenSSHDoorFactory(protocol.Factory):
    def __init__(self, gateway: Any) -> None:
        self.gateway = gateway

    def buildProtocol(self, addr: Any) -> OpenSSHDoorProtocol:
        return OpenSSHDoorProtocol(self.gateway)
