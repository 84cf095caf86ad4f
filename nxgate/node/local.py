"""This machine's node, in process: the node interface over its session manager.

The router (:class:`nxgate.gateway.router.Router`) reaches the sessions of
this machine through a :class:`LocalNode`, and so does every other gateway
of a cluster, through :class:`nxgate.wire.node_listener.NodeAMP`, which
answers with the same object.  So the node's own rules hold whichever way
a call arrives, on one box and on many:

* **The node owns the user.**  Every call's caller is looked up again here
  by name (:meth:`nxgate.host.users.UserDirectory.here`): the uid, gid and
  groups a gateway resolved are never trusted, and an account this machine
  does not have is refused with words for the user.
* **Thumbnails** are drawn here, as the session's user, from its own agent
  (:mod:`nxgate.node.thumbnails`), after the owner check of ``show``.
* **Streams** (:meth:`LocalNode.open_stream`) are opened here, after the
  same owner check: the end is picked from the node's own record of the
  session, never from what a gateway says.  One opener per kind: ``agent``
  (the agent's socket, :mod:`nxgate.streams.agentsocket`) and ``view`` (a
  live browser viewer's x11vnc, :mod:`nxgate.node.browser_viewer`, which
  ends with its stream), and the reverse services' (``sound``,
  ``printing``, ``sharing``: without a number, a route that keeps the
  service's listener open; with one, a connection that waits there for its
  client, :mod:`nxgate.node.reverse` and :mod:`nxgate.streams.reverse`).
* **Events**: whoever subscribes hears every state change of this node's
  sessions (the D-Bus door of any member, through the router).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from twisted.internet import defer
from twisted.logger import Logger

from nxgate.node import thumbnails
from nxgate.node.browser_viewer import BrowserViewer
from nxgate.node.thumbnails import ThumbnailError
from nxgate.streams import reverse
from nxgate.vocabulary.caller import Caller
from nxgate.vocabulary.errors import ErrorKind, SessionError
from nxgate.vocabulary.model import Session, State
from nxgate.vocabulary.requests import FolderShares, RestoreRequest, ShadowRequest, ShareMount, StartRequest
from nxgate.vocabulary.results import (DesktopEntry, FolderMount, Listing, ProgressCallback, Ready, ServiceStatus, SessionEvent, SessionView,
                                     ShadowTarget)
from nxgate.vocabulary.streams import Stream, StreamKind
from nxgate.streams import agentsocket
from nxgate.streams.agentsocket import SocketStream, StreamWatch

log = Logger()

Blocking = Callable[..., Awaitable[Any]]

#: How long a live viewer's x11vnc may take to listen (it takes a tenth of a second or two), and how often
#: its socket is tried meanwhile.
VIEW_WAIT, VIEW_EVERY = 10.0, 0.02
#: After the viewer's client first spoke (its RFB version: the handshake is done well within this),
#: x11vnc is told to stop holding the clipboard back (nxgate.node.browser_viewer.selection_nudge_argv).
NUDGE_AFTER = 1.0


def short_of_files(machine: str, session_id: str) -> SessionError:
    """The refusal of a stream for want of descriptors (the users' reserve is spent): try again later."""
    return SessionError(ErrorKind.LIMIT_REACHED, f"Machine {machine} is short of open files; please try again in a"
                        " minute.", session_id=session_id)


class LocalNode:
    """:class:`nxgate.vocabulary.api.NodeAPI` of this machine.

    ``manager``: its :class:`nxgate.node.manager.SessionManager`;
    ``users``: its :class:`nxgate.host.users.UserDirectory`; ``machine``:
    its name for refusals; ``blocking``: runs a blocking call off the
    reactor; ``viewers``: this machine's
    :class:`nxgate.node.browser_viewer.BrowserViewers` (None: no ``view``
    streams here), which hear this node's sessions from now on."""

    def __init__(self, manager: Any, users: Any, machine: Callable[[], str], blocking: Blocking,
                 viewers: Any = None, room: Callable[[int], bool] = lambda count: True) -> None:
        """``room(n)``: whether users' work may take ``n`` more of this
        process's descriptors (the doors' guard's reserve): every stream
        opened here takes one (a reverse route's listener is its node's)."""
        self.manager = manager
        self.room = room
        self.users = users
        self.machine = machine
        self.blocking = blocking
        self.viewers = viewers
        if viewers is not None:
            self.subscribe(viewers.session_changed)  # a resume elsewhere, or the end, ends live viewers
        #: One opener per stream kind: (caller resolved here, the caller's live session) -> the stream.
        self.openers: dict[str, Callable[[Caller, Session, StreamKind], Awaitable[Stream]]] = {
            "agent": self._agent_stream, "view": self._view_stream,
            **{word: self._reverse_stream for word in reverse.SERVICES}}

    def __repr__(self) -> str:
        return f"LocalNode({self.machine()!r})"

    @property
    def name(self) -> str:
        """Its sessions' ``node`` in the store ("" on a single box)."""
        return str(self.manager.node_name)

    def session(self, session_id: str) -> Session | None:
        """This node's own record of a session it runs (its memory is
        authoritative: the store may lag by a write), or None."""
        return self.manager.sessions.get(session_id)

    async def _here(self, caller: Caller) -> Caller:
        return await self.users.here(caller, self.machine())

    # ----------------------------------------------------- SessionAPI
    async def start(self, caller: Caller, request: StartRequest) -> Ready:
        return await self.manager.start(await self._here(caller), request)

    async def start_for_later(self, caller: Caller, session_type: str, name: str) -> SessionView:
        return await self.manager.start_for_later(await self._here(caller), session_type, name)

    async def restore(self, caller: Caller, request: RestoreRequest) -> Ready:
        return await self.manager.restore(await self._here(caller), request)

    async def attach_shadow(self, caller: Caller, request: ShadowRequest,
                            progress: ProgressCallback = lambda progress: None) -> Ready:
        return await self.manager.attach_shadow(await self._here(caller), request, progress)

    async def suspend(self, caller: Caller, session_id: str) -> SessionView:
        return await self.manager.suspend(await self._here(caller), session_id)

    async def terminate(self, caller: Caller, session_id: str, reason: str = "user request") -> SessionView:
        return await self.manager.terminate(await self._here(caller), session_id, reason)

    async def rename(self, caller: Caller, session_id: str, name: str) -> SessionView:
        return await self.manager.rename(await self._here(caller), session_id, name)

    async def add_mount(self, caller: Caller, session_id: str, mount: ShareMount) -> bool:
        return await self.manager.add_mount(await self._here(caller), session_id, mount)

    async def mount_folders(self, caller: Caller, session_id: str, shares: FolderShares) -> tuple[FolderMount, ...]:
        return await self.manager.mount_folders(await self._here(caller), session_id, shares)

    async def unmount_folders(self, caller: Caller, session_id: str, path: str = "") -> tuple[FolderMount, ...]:
        return await self.manager.unmount_folders(await self._here(caller), session_id, path)

    async def folders(self, caller: Caller, session_id: str) -> tuple[FolderMount, ...]:
        return await self.manager.folders(await self._here(caller), session_id)

    async def applications(self, caller: Caller, session_id: str) -> tuple[DesktopEntry, ...]:
        return await self.manager.applications(await self._here(caller), session_id)

    async def run_application(self, caller: Caller, session_id: str, argv: tuple[str, ...]) -> bool:
        return await self.manager.run_application(await self._here(caller), session_id, argv)

    async def list(self, caller: Caller) -> Listing:
        return await self.manager.list(await self._here(caller))

    async def show(self, caller: Caller, session_id: str) -> SessionView:
        return await self.manager.show(await self._here(caller), session_id)

    async def shadow_targets(self, caller: Caller) -> tuple[ShadowTarget, ...]:
        return await self.manager.shadow_targets(await self._here(caller))

    async def status(self, caller: Caller) -> ServiceStatus:
        return await self.manager.status(await self._here(caller))

    async def set_draining(self, caller: Caller, on: bool) -> bool:
        return await self.manager.set_draining(await self._here(caller), on)

    # ------------------------------------------------ beyond the API
    async def thumbnail(self, caller: Caller, session_id: str) -> bytes:
        """A PNG of the session's screen, taken here as its user from its own
        agent (the only X server the picture may come from)."""
        view = await self.show(caller, session_id)  # the owner check
        session = self.manager.sessions.get(view.id)
        if session is None or not session.agent_pid:
            raise SessionError(ErrorKind.NOT_FOUND, f"Session {session_id} has no screen now.", session_id=session_id)
        authority = self.manager.layout.agent_files(view.id).authority
        try:
            return await thumbnails.thumbnail(self.manager.launcher, self.blocking, session.display, authority,
                                              session.user, agent=(session.agent_pid, session.agent_started))
        except (ThumbnailError, OSError) as error:
            raise SessionError(ErrorKind.NOT_FOUND, f"No picture of session {session_id}: {error}",
                               session_id=session_id) from None

    async def open_stream(self, caller: Caller, session_id: str, kind: StreamKind) -> Stream:
        """One end of the caller's session on this machine (see the module's docstring)."""
        opener = self.openers.get(kind.word)
        if opener is None or (kind.number is not None and reverse.service_of(kind) is None):
            raise SessionError(ErrorKind.INVALID_REQUEST, f"Machine {self.machine()} opens no stream of kind {kind}.",
                               session_id=session_id)
        here = await self._here(caller)
        view = await self.manager.show(here, session_id)  # the owner check, as for every call
        session = self.session(view.id)
        if session is None or not session.state.live:
            raise SessionError(ErrorKind.NOT_FOUND, f"Could not find session {session_id}.", session_id=session_id)
        if kind.word in ("agent", "view") and not self.room(1):
            log.warn("{user} from {address}: no {kind} stream of session {id}: this machine is short of open files"
                     " ([server] fd_reserve)", user=caller.user, address=caller.address, kind=kind.word,
                     id=session_id)
            raise short_of_files(self.machine(), session_id)
        return await opener(here, session, kind)

    async def _agent_stream(self, caller: Caller, session: Session, kind: StreamKind) -> Stream:
        """The agent's socket, once it listens (a resumed agent is made to listen again: a moment)."""
        if session.state is State.TERMINATING:
            raise SessionError(ErrorKind.WRONG_STATE, f"Session {session.id} is ending.", session_id=session.id)
        target = self.manager.stream_target(session)
        if target is None:
            raise SessionError(ErrorKind.INVALID_REQUEST, f"Session {session.id} is not encrypted: its client connects"
                               " to its agent itself.", session_id=session.id)
        try:
            sock = await agentsocket.reach(self.manager.reactor, target.path, target.uid)
        except OSError as error:
            raise SessionError(ErrorKind.UNAVAILABLE, f"The agent of session {session.id} cannot be reached: {error}",
                               session_id=session.id) from None
        return SocketStream(self.manager.reactor, sock, session.id, kind)

    async def _view_stream(self, caller: Caller, session: Session, kind: StreamKind) -> Stream:
        """RFB of the session's own screen: a live viewer's x11vnc, started for
        this stream, stopped when it ends (the session's own user only, as a
        browser shows only one's own sessions live; the admin shadows)."""
        if session.user != caller.user:
            log.warn("{user} from {address} asked to view session {id} of another user", user=caller.user,
                     address=caller.address, id=session.id, audit="session_denied")
            raise SessionError(ErrorKind.NOT_YOURS, f"Could not find session {session.id}.", session_id=session.id)
        if self.viewers is None:
            raise SessionError(ErrorKind.UNAVAILABLE, f"Machine {self.machine()} shows no sessions in a browser.",
                               session_id=session.id)
        files = self.manager.layout.agent_files(session.id)
        viewer: BrowserViewer = await self.viewers.open_live(session, files.directory, files.authority)
        reactor = self.manager.reactor
        try:
            sock = await agentsocket.reach(reactor, viewer.vnc_socket, viewer.uid, VIEW_WAIT, VIEW_EVERY,
                                           alive=lambda: not viewer.closed and all(viewer.alive().values()))
        except OSError as error:
            viewer.close()
            raise SessionError(ErrorKind.UNAVAILABLE, f"The browser viewer of session {session.id} did not start: "
                               f"{error}", session_id=session.id) from None
        except BaseException:
            viewer.close()
            raise
        if viewer.closed:  # the session was resumed elsewhere, or ended, while x11vnc started
            sock.close()
            raise SessionError(ErrorKind.WRONG_STATE, viewer.ended or f"Session {session.id} cannot be shown now.",
                               session_id=session.id)

        def nudge() -> None:
            if not viewer.closed:
                defer.ensureDeferred(viewer.nudge_selection()).addErrback(
                    lambda failure: log.failure("cannot nudge the clipboard of browser viewer {id}", failure,
                                                id=viewer.id))

        watch = StreamWatch(first_write=lambda: reactor.callLater(NUDGE_AFTER, nudge), ended=viewer.close)
        stream = SocketStream(reactor, sock, session.id, kind, watch)
        viewer.on_close = stream.end  # the node ends the viewer: the stream ends, with its words
        return stream

    async def _reverse_stream(self, caller: Caller, session: Session, kind: StreamKind) -> Stream:
        """A reverse service's route (no number) or one of its waiting connections (a number)."""
        service = reverse.service_of(kind)
        assert service is not None  # the openers table holds only its words
        listeners = self.manager.reverse
        if kind.number is None:
            return listeners.open_route(caller, session, service)
        return listeners.take(caller, session, service, kind.number)

    def subscribe(self, observer: Callable[[SessionEvent], None]) -> Callable[[], None]:
        """``observer`` hears this node's session changes until the result is called."""
        self.manager.observers.append(observer)

        def stop() -> None:
            if observer in self.manager.observers:
                self.manager.observers.remove(observer)
        return stop
