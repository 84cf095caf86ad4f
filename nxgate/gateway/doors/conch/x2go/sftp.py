"""The SFTP subsystem for X2Go clients: write, stat and remove below ``~/.x2go`` only.

Conch's :class:`FileTransferServer` answers the requests; this module is
the file system it sees and the reader that feeds it:

* **Files.** Opening for writing (the pulse cookie, the sshfs key) gives a
  buffer in memory, at most 64 KiB, written when the client closes it, as
  the user (:mod:`~nxgate.gateway.doors.conch.x2go.pushes`): an open handle
  holds no descriptor of the gateway.  Handles are capped per channel and
  per user, pushes per channel and per user
  (:mod:`~nxgate.gateway.doors.conch.x2go.allowance`).  The attributes of
  those files (paramiko's ``put`` checks the size) and removing them are
  served; reading, listing, renaming and links are refused.
* **Packets.** A packet longer than :data:`MAX_PACKET` (OpenSSH's
  sftp-server takes 256 KiB; paramiko writes 32 KiB) closes the channel
  at once with one log line, and the buffer is consumed from the front of
  a ``bytearray``: Conch's own reader buffered whatever a length announced
  and copied its whole buffer for every chunk, so one header announcing
  2 GB cost the reactor time growing with the square of what followed.  A
  packet the server cannot read is answered ``SSH_FX_BAD_MESSAGE`` and
  logged in one line (Conch logged a critical traceback for each); after
  :data:`MAX_BAD_PACKETS` the channel is closed.
"""

from __future__ import annotations

import errno
import os
from typing import Any

from twisted.conch.interfaces import ISFTPFile, ISFTPServer
from twisted.conch.ssh import filetransfer
from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from nxgate.gateway.doors.conch.x2go import files
from nxgate.gateway.doors.conch.x2go.allowance import HANDLES_PER_CHANNEL, HANDLES_PER_USER, PushCount
from nxgate.gateway.doors.conch.x2go.pushes import FileDesk, Refused

log = Logger()

MAX_PACKET = 256 * 1024
MAX_BAD_PACKETS = 8
#: The reader holds at most one unfinished packet and the chunk that came
#: after it (an SSH channel's packets are at most 32 KiB here; 256 KiB is
#: what any SSH implementation sends).
MAX_BUFFER = 4 + MAX_PACKET + 256 * 1024


def _refused(what: str) -> filetransfer.SFTPError:
    return filetransfer.SFTPError(filetransfer.FX_PERMISSION_DENIED, what)


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


@implementer(ISFTPFile)
class _Upload:
    """One handle: the file's bytes until the client closes it."""

    def __init__(self, server: _X2GoFiles, path: str) -> None:
        self.server = server
        self.path = path
        self.data = bytearray()
        self.open = True

    def writeChunk(self, offset: int, data: bytes) -> defer.Deferred[None]:
        end = offset + len(data)
        if end > files.MAX_FILE_BYTES:
            return defer.fail(_refused("file too large"))
        if offset > len(self.data):
            self.data.extend(bytes(offset - len(self.data)))
        self.data[offset:end] = data
        return defer.succeed(None)

    def readChunk(self, offset: int, length: int) -> Any:
        raise _refused("reading is not offered")

    def getAttrs(self) -> dict[str, int]:
        return {"size": len(self.data), "permissions": 0o100600, "uid": self.server.owner.uid,
                "gid": self.server.owner.gid}

    def setAttrs(self, attrs: dict[str, Any]) -> None:
        pass  # modes and times the client sets are ours already (0600)

    def close(self) -> defer.Deferred[None]:
        if not self.open:
            return defer.succeed(None)
        self.open = False
        self.server.released()
        return self.server.store(self.path, bytes(self.data))

    def abandon(self) -> None:
        """The channel ended with the handle open: nothing is written."""
        if self.open:
            self.open = False
            self.server.released()


@implementer(ISFTPServer)
class _X2GoFiles:
    """The file system one SFTP channel sees."""

    def __init__(self, user: str, owner: files.Owner, desk: FileDesk) -> None:
        self.user = user
        self.owner = owner
        self.desk = desk
        self.handles = 0
        self.pushed = PushCount()
        self.logged = False
        self.unlogged = 0  # refusals past the first of the channel, counted in its last line

    def gotVersion(self, otherVersion: int, extData: dict[bytes, bytes]) -> dict[bytes, bytes]:
        return {}

    def note(self, text: str, **fields: Any) -> None:
        """A refusal: the channel's first is logged, the others counted (a
        client in a loop must not fill the log)."""
        if not self.logged:
            self.logged = True
            log.info(text + " (further refusals on this channel are counted, not logged)", user=self.user, **fields)
        else:
            self.unlogged += 1

    def ended(self) -> None:
        if self.unlogged:
            log.info("{count} more SFTP requests of {user} were refused on the channel that just closed",
                     count=self.unlogged, user=self.user)

    def _refuse(self, what: str, path: bytes = b"") -> Any:
        self.note("refused SFTP {what} {path!r} of {user}", what=what, path=_text(path)[:200])
        return defer.fail(_refused(f"{what} is not offered"))

    def openFile(self, filename: bytes, flags: int, attrs: dict[str, Any]) -> Any:
        path = _text(filename)
        if flags & filetransfer.FXF_READ or not flags & filetransfer.FXF_WRITE:
            return self._refuse("reading", filename)
        try:
            files.parts(path, self.owner.home)
        except files.PathRefused as error:
            self.note("refused an SFTP write of {user} to {path!r}: {why}", path=path[:200], why=str(error))
            return defer.fail(_refused(str(error)))
        if self.handles >= HANDLES_PER_CHANNEL:
            return self._too_many(f"at most {HANDLES_PER_CHANNEL} files open at once on one channel")
        if not self.desk.allowance.take_handle(self.user):
            return self._too_many(f"at most {HANDLES_PER_USER} files open at once per user")
        self.handles += 1
        return _Upload(self, path)

    def _too_many(self, limit: str) -> Any:
        self.note("refused an SFTP open of {user}: {limit}", limit=limit)
        return defer.fail(filetransfer.SFTPError(filetransfer.FX_FAILURE, f"too many open files ({limit})"))

    def released(self) -> None:
        self.handles -= 1
        self.desk.allowance.give_handle(self.user)

    def store(self, path: str, data: bytes) -> defer.Deferred[None]:
        refusal = self.pushed.refusal(len(data))
        if refusal is not None:
            self.note("refused an SFTP write of {user} to {path!r}: {why}", path=path[:200], why=refusal)
            return defer.fail(filetransfer.SFTPError(filetransfer.FX_FAILURE, refusal))

        def refused(failure: Failure) -> Any:
            failure.trap(Refused, files.PathRefused, OSError)
            self.note("refused an SFTP write of {user} to {path!r}: {why}", path=path[:200],
                      why=failure.getErrorMessage())
            code = filetransfer.FX_FAILURE if failure.check(Refused) else filetransfer.FX_PERMISSION_DENIED
            raise filetransfer.SFTPError(code, failure.getErrorMessage())

        d = self.desk.store(self.user, self.owner, path, data)
        d.addCallback(lambda _: log.info("X2Go client of {user} wrote {path} ({size} bytes)", user=self.user,
                                         path=path, size=len(data)))
        return d.addErrback(refused)

    def getAttrs(self, path: bytes, followLinks: bool) -> Any:
        def refused(failure: Failure) -> Any:
            failure.trap(Refused, files.PathRefused, OSError)
            raise filetransfer.SFTPError(filetransfer.FX_NO_SUCH_FILE, failure.getErrorMessage())

        d = self.desk.look(files.size_of, _text(path), self.owner)
        return d.addCallbacks(lambda size: {"size": size, "permissions": 0o100600, "uid": self.owner.uid,
                                            "gid": self.owner.gid}, refused)

    def removeFile(self, filename: bytes) -> Any:
        def refused(failure: Failure) -> Any:
            failure.trap(Refused, files.PathRefused, OSError)
            raise filetransfer.SFTPError(filetransfer.FX_NO_SUCH_FILE, failure.getErrorMessage())

        return self.desk.look(files.remove, _text(filename), self.owner).addErrback(refused)

    def realPath(self, path: bytes) -> bytes:
        text = _text(path)
        if text in ("", "."):
            return self.owner.home.encode()
        return (text if text.startswith("/") else os.path.join(self.owner.home, text)).encode()

    def setAttrs(self, path: bytes, attrs: dict[str, Any]) -> None:
        pass

    def renameFile(self, oldpath: bytes, newpath: bytes) -> Any:
        return self._refuse("renaming", oldpath)

    def makeDirectory(self, path: bytes, attrs: dict[str, Any]) -> Any:
        return self._refuse("making directories", path)  # the writer makes those under ~/.x2go

    def removeDirectory(self, path: bytes) -> Any:
        return self._refuse("removing directories", path)

    def openDirectory(self, path: bytes) -> Any:
        return self._refuse("listing", path)

    def readLink(self, path: bytes) -> Any:
        return self._refuse("reading links", path)

    def makeLink(self, linkPath: bytes, targetPath: bytes) -> Any:
        return self._refuse("making links", linkPath)

    def extendedRequest(self, extendedName: bytes, extendedData: bytes) -> Any:
        return self._refuse("extensions", extendedName)


class X2GoSFTPServer(filetransfer.FileTransferServer):
    """Conch's request handlers behind a bounded, linear reader (see the module)."""

    def __init__(self, avatar: _X2GoFiles) -> None:
        super().__init__(avatar=avatar)
        self.files = avatar
        self.buf = bytearray()  # type: ignore[assignment]  # Conch's is bytes
        self.bad = 0
        self.ended = False

    def dataReceived(self, data: bytes) -> None:
        if self.ended:
            return
        self.buf += data
        while not self.ended and len(self.buf) >= 4:
            length = int.from_bytes(self.buf[:4], "big")
            if length > MAX_PACKET:
                self._end(f"a packet of {length} bytes was announced (at most {MAX_PACKET})")
                return
            if length < 5:  # a type and a request id (or INIT's version), at least
                self._end(f"a packet of {length} bytes cannot be read")
                return
            if len(self.buf) < 4 + length:
                break
            packet = bytes(self.buf[4:4 + length])
            del self.buf[:4 + length]  # from the front of a bytearray: no copy of the rest
            self._dispatch(packet)
        if len(self.buf) > MAX_BUFFER:  # only a channel packet larger than any SSH implementation sends
            self._end(f"{len(self.buf)} bytes arrived without a whole packet")

    def _dispatch(self, packet: bytes) -> None:
        kind, body = packet[0], packet[1:]
        name = self.packetTypes.get(kind)
        handler = getattr(self, f"packet_{name}", None) if name else None
        if handler is None:
            self._bad(body[:4], f"type {kind}")
            return
        try:
            handler(body)
        except Exception as error:  # a packet its handler could not read (short, or with bytes to spare)
            self._bad(body[:4], f"{name}: {type(error).__name__}")

    def _bad(self, request_id: bytes, what: str) -> None:
        self.bad += 1
        if self.bad == 1:
            log.warn("malformed SFTP packet ({what}) from the X2Go client of {user}; answered as a bad message",
                     what=what, user=self.files.user)
        self._sendStatus(request_id, filetransfer.FX_BAD_MESSAGE, b"malformed packet")
        if self.bad >= MAX_BAD_PACKETS:
            self._end(f"{self.bad} malformed packets")

    def _ebStatus(self, reason: Failure, requestId: bytes, msg: bytes = b"request failed") -> None:
        """A failed request's status, without Conch's critical traceback for
        what is no fault of the server (a handle that is not open, say)."""
        value = reason.value
        if isinstance(value, filetransfer.SFTPError):
            code, message = value.code, value.message
        elif isinstance(value, KeyError):
            code, message = filetransfer.FX_FAILURE, "no such handle"
        elif isinstance(value, OSError) and value.errno == errno.ENOENT:
            code, message = filetransfer.FX_NO_SUCH_FILE, value.strerror or "no such file"
        elif isinstance(value, OSError) and value.errno == errno.EACCES:
            code, message = filetransfer.FX_PERMISSION_DENIED, value.strerror or "permission denied"
        else:
            log.warn("an SFTP request of the X2Go client of {user} failed: {error}", user=self.files.user,
                     error=f"{type(value).__name__}: {value}"[:300])
            code, message = filetransfer.FX_FAILURE, msg.decode("ascii", "replace")
        text = message if isinstance(message, str) else message.decode("utf-8", "replace")
        self._sendStatus(requestId, code, text.encode()[:200])

    def _end(self, why: str) -> None:
        self.ended = True
        self.buf = bytearray()
        log.warn("closed the SFTP channel of the X2Go client of {user}: {why}", user=self.files.user, why=why)
        self.transport.loseConnection()

    def connectionLost(self, reason: Any = None) -> None:
        """Handles still open are dropped, unwritten (Conch would close them: write them)."""
        self.ended = True
        self.buf = bytearray()
        for upload in list(self.openFiles.values()):
            upload.abandon()
        self.openFiles = {}
        self.files.ended()
        filetransfer.FileTransferBase.connectionLost(self, reason)


class _ChannelTransport:
    def __init__(self, channel: Any) -> None:
        self.channel = channel

    def write(self, data: bytes) -> None:
        self.channel.write(data)

    def loseConnection(self) -> None:
        self.channel.loseConnection()

    def getPeer(self) -> Any:
        return self.channel.conn.transport.transport.getPeer()

    def getHost(self) -> Any:
        return self.channel.conn.transport.transport.getHost()


class _Handler:
    """The channel's handler: feeds the SFTP protocol."""

    def __init__(self, protocol: filetransfer.FileTransferServer) -> None:
        self.protocol = protocol

    def data_received(self, data: bytes) -> None:
        self.protocol.dataReceived(data)

    def eof_received(self) -> None:
        self.protocol.transport.loseConnection()

    def connection_lost(self) -> None:
        self.protocol.connectionLost(None)

    def pause_output(self) -> None:
        pass

    def resume_output(self) -> None:
        pass


def start_sftp(desk: FileDesk, channel: Any) -> int:
    """Serve SFTP on ``channel`` for its user (1: the subsystem is granted)."""
    context = getattr(channel.avatar, "x2go_context", None)
    user = channel.avatar.principal.unix_user
    if context is None:
        # python-x2go asks for the home directory first (echo $HOME): no context yet is unusual.
        log.info("refused SFTP of {user}: no X2Go command came first", user=user)
        return 0
    owner = files.Owner(context.caller.uid, context.caller.gid, context.facts.home, user)
    protocol = X2GoSFTPServer(_X2GoFiles(user, owner, desk))
    protocol.makeConnection(_ChannelTransport(channel))
    channel.handler = _Handler(protocol)
    log.info("SFTP for {user}'s X2Go client (writes below ~/.x2go only)", user=user)
    return 1
