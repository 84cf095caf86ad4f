"""The SFTP subsystem for X2Go clients: write, stat and remove below ``~/.x2go`` only.

Conch speaks the protocol (:class:`FileTransferServer`); this module is the
file system it sees: opening for writing (the pulse cookie, the sshfs key),
the attributes of those files (paramiko's ``put`` checks the size) and
removing them.  Reading, listing, renaming and links are refused.  All file
work runs in a thread (:mod:`nxgate.gateway.doors.conch.x2go.files`).
"""

from __future__ import annotations

import os
from typing import Any

from twisted.conch.interfaces import ISFTPFile, ISFTPServer
from twisted.conch.ssh import filetransfer
from twisted.internet import defer
from twisted.logger import Logger
from zope.interface import implementer

from nxgate.gateway.doors.conch.x2go import files

log = Logger(namespace="nxgate.x2go")


def _refused(what: str) -> filetransfer.SFTPError:
    return filetransfer.SFTPError(filetransfer.FX_PERMISSION_DENIED, what)


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


@implementer(ISFTPFile)
class _Upload:
    def __init__(self, server: _X2GoFiles, fd: int, path: str) -> None:
        self.server = server
        self.fd = fd
        self.path = path
        self.written = 0

    def writeChunk(self, offset: int, data: bytes) -> defer.Deferred[None]:
        if offset + len(data) > files.MAX_FILE_BYTES:
            return defer.fail(_refused("file too large"))
        self.written = max(self.written, offset + len(data))
        return self.server.blocking(os.pwrite, self.fd, data, offset).addCallback(lambda _: None)

    def readChunk(self, offset: int, length: int) -> Any:
        raise _refused("reading is not offered")

    def getAttrs(self) -> dict[str, int]:
        return {"size": self.written, "permissions": 0o100600, "uid": self.server.owner.uid,
                "gid": self.server.owner.gid}

    def setAttrs(self, attrs: dict[str, Any]) -> None:
        pass  # modes and times the client sets are ours already (0600)

    def close(self) -> defer.Deferred[None]:
        log.info("X2Go client of {user} wrote {path} ({size} bytes)", user=self.server.user, path=self.path,
                 size=self.written)
        return self.server.blocking(os.close, self.fd)


@implementer(ISFTPServer)
class _X2GoFiles:
    def __init__(self, user: str, owner: files.Owner, blocking: Any) -> None:
        self.user = user
        self.owner = owner
        self.blocking = blocking

    def gotVersion(self, otherVersion: int, extData: dict[bytes, bytes]) -> dict[bytes, bytes]:
        return {}

    def _refuse(self, what: str, path: bytes = b"") -> Any:
        log.info("refused SFTP {what} {path!r} of {user}", what=what, path=_text(path)[:200], user=self.user)
        return defer.fail(_refused(f"{what} is not offered"))

    def openFile(self, filename: bytes, flags: int, attrs: dict[str, Any]) -> Any:
        path = _text(filename)
        if flags & filetransfer.FXF_READ or not flags & filetransfer.FXF_WRITE:
            return self._refuse("reading", filename)

        def refused(failure: Any) -> Any:
            failure.trap(files.PathRefused, OSError)
            log.info("refused an SFTP write of {user} to {path!r}: {why}", user=self.user, path=path[:200],
                     why=str(failure.value))
            raise _refused(str(failure.value))

        d = self.blocking(files.open_for_writing, path, self.owner)
        return d.addCallbacks(lambda fd: _Upload(self, fd, path), refused)

    def getAttrs(self, path: bytes, followLinks: bool) -> Any:
        def refused(failure: Any) -> Any:
            failure.trap(files.PathRefused, OSError)
            raise filetransfer.SFTPError(filetransfer.FX_NO_SUCH_FILE, str(failure.value))

        d = self.blocking(files.size_of, _text(path), self.owner)
        return d.addCallbacks(lambda size: {"size": size, "permissions": 0o100600, "uid": self.owner.uid,
                                            "gid": self.owner.gid}, refused)

    def removeFile(self, filename: bytes) -> Any:
        def refused(failure: Any) -> Any:
            failure.trap(files.PathRefused, OSError)
            raise filetransfer.SFTPError(filetransfer.FX_NO_SUCH_FILE, str(failure.value))

        return self.blocking(files.remove, _text(filename), self.owner).addErrback(refused)

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
        return self._refuse("making directories", path)  # open_for_writing makes those under ~/.x2go

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


def start_sftp(door: Any, channel: Any) -> int:
    """Serve SFTP on ``channel`` for its user (1: the subsystem is granted)."""
    context = getattr(channel.avatar, "x2go_context", None)
    user = channel.avatar.principal.unix_user
    if context is None:
        # python-x2go asks for the home directory first (echo $HOME): no context yet is unusual.
        log.info("refused SFTP of {user}: no X2Go command came first", user=user)
        return 0
    owner = files.Owner(context.caller.uid, context.caller.gid, context.facts.home)
    protocol = filetransfer.FileTransferServer(avatar=_X2GoFiles(user, owner, door.blocking))
    protocol.makeConnection(_ChannelTransport(channel))
    channel.handler = _Handler(protocol)
    log.info("SFTP for {user}'s X2Go client (writes below ~/.x2go only)", user=user)
    return 1
