"""Where X2Go clients' pushes (SFTP and scp) are admitted and written.

One :class:`FileDesk` per door: the per-user :class:`~.allowance.Allowance`,
the gateway's file reserve (what logged-in users hold stops short of the
limit, :meth:`nxgate.gateway.doors.guard.DoorGuard.users_may_open`), and
the writes themselves, as the user in a thread
(:func:`~.files.write_as_user`).  :class:`ScpHandler` feeds x2goclient's
``scp -t`` to the pure :class:`~.scp.Sink` and writes what it hands out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.logger import Logger

from nxgate.gateway.doors.conch.x2go import files, folders, scp
from nxgate.gateway.doors.conch.x2go.allowance import Allowance
from nxgate.streams.reverse import PULSE_COOKIE_BYTES

log = Logger()

#: What a refusal for want of descriptors says to the client.
SHORT_OF_FILES = "the server is short of open files; try again later"
#: Descriptors a stat or an unlink holds for a moment (the walk from home).
WALK_FILES = files.MAX_DEPTH + 2


class Refused(Exception):
    """A push the desk does not take now (the reason is for the client and the log)."""


class FileDesk:
    """The SFTP and scp pushes of every user of one X2Go door."""

    def __init__(self, blocking: Any, now: Callable[[], float],
                 room: Callable[[int], bool] = lambda count: True) -> None:
        """``room(n)``: whether users' work may take ``n`` more descriptors."""
        self.blocking = blocking
        self.room = room
        self.allowance = Allowance(now)
        #: The key bundles for shared folders, kept in memory until x2gomountdirs names them.
        self.keys = folders.FolderKeys(now)
        #: Told ``(user, names below home, data)`` of each file written (the door's sound cookies).
        self.pushed: Callable[[str, list[str], bytes], None] = lambda user, names, data: None

    def store(self, user: str, owner: files.Owner, path: str, data: bytes) -> defer.Deferred[None]:
        """Write a pushed file as the user; fails with :class:`Refused` or
        :class:`files.PathRefused`.  A PulseAudio cookie that is not one (a
        cookie has :data:`PULSE_COOKIE_BYTES` bytes) is refused: it would go
        to the session's machine and the client's sound server.  A key bundle
        for shared folders (``~/.x2go/ssh/key.*``) is checked and kept, not
        written: the session's node gets it with the mount (:mod:`.folders`)."""
        try:
            names = files.parts(path, owner.home)
        except files.PathRefused as refusal:
            return defer.fail(refusal)
        key = folders.key_name(names)
        if key is not None:
            return self._keep_key(user, key, data)
        if names[-1] == ".pulse-cookie" and len(data) != PULSE_COOKIE_BYTES:
            return defer.fail(Refused(f"not a PulseAudio cookie ({len(data)} bytes; a cookie has "
                                      f"{PULSE_COOKIE_BYTES})"))
        refusal = self.allowance.take_push(user, len(data))
        if refusal is None and not self.room(files.WRITER_FILES):
            refusal = SHORT_OF_FILES
        if refusal is not None:
            return defer.fail(Refused(refusal))
        written = self.blocking(files.write_as_user, path, data, owner)
        written.addCallback(lambda result: (self.pushed(user, names, data), result)[1])
        return written

    def _keep_key(self, user: str, name: str, data: bytes) -> defer.Deferred[None]:
        refusal = self.allowance.take_push(user, len(data))
        if refusal is not None:
            return defer.fail(Refused(refusal))
        try:
            bundle = folders.parse_bundle(data)
        except folders.NotABundle as error:
            return defer.fail(Refused(f"not an X2Go key bundle for shared folders: {error}"))
        self.keys.put(user, name, bundle)
        log.info("X2Go client of {user} pushed the key bundle {name} for its shared folders (kept in memory for"
                 " x2gomountdirs)", user=user, name=name)
        return defer.succeed(None)

    def look(self, function: Callable[..., Any], *args: Any) -> defer.Deferred[Any]:
        """A stat or an unlink (root's, read-only walk) in a thread, when
        the reserve allows."""
        if not self.room(WALK_FILES):
            return defer.fail(Refused(SHORT_OF_FILES))
        return self.blocking(function, *args)


class ScpHandler:
    """Feeds an SCP sink; writes its files one after the other, then acknowledges."""

    def __init__(self, desk: FileDesk, channel: Any, sink: scp.Sink, owner: files.Owner, user: str) -> None:
        self.desk = desk
        self.channel = channel
        self.sink = sink
        self.owner = owner
        self.user = user
        self.chain: defer.Deferred[Any] = defer.succeed(None)
        self.failed = False

    def data_received(self, data: bytes) -> None:
        if self.failed:
            return
        try:
            answer, received = self.sink.feed(data)
        except scp.Failed as error:
            self._fail(str(error))
            return
        for item in received:
            self.chain.addCallback(lambda _, item=item: self._store(item))
        self.chain.addCallback(lambda _: self.channel.write(answer) if answer and not self.channel.closing else None)
        self.chain.addErrback(lambda failure: self._fail(failure.getErrorMessage()))
        if self.sink.done:
            self.chain.addCallback(lambda _: self.channel.finish(0) if not self.failed else None)

    def _store(self, item: scp.File) -> defer.Deferred[None] | None:
        """One file the sink handed out (a key bundle is kept by the desk, not written)."""
        if self.failed:
            return None
        d = self.desk.store(self.user, self.owner, item.path, item.data)
        d.addCallback(lambda _: log.info("X2Go client of {user} copied {path} ({size} bytes)", user=self.user,
                                         path=item.path, size=len(item.data)))
        return d

    def _fail(self, why: str) -> None:
        if self.failed:
            return
        self.failed = True
        log.info("refused an SCP copy of {user}: {why}", user=self.user, why=why)
        if not self.channel.closing:
            self.channel.write(scp.failure(why))
            self.channel.finish(1)

    def eof_received(self) -> None:
        self.chain.addCallback(lambda _: self.channel.finish(0) if not self.failed and not self.channel.closing
                               else None)

    def connection_lost(self) -> None:
        self.failed = True

    def pause_output(self) -> None:
        pass

    def resume_output(self) -> None:
        pass
