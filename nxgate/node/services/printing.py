"""Printing (``--cups="1"``): the session prints on the client's printers
through the NX cups channel.

Each session with printing gets a cupsd of its own, run AS THE USER (no
root, no system cupsd involved), listening only on a Unix socket in the
session directory (0700, the user's; cupsd keeps its own ``cups/`` in it at
0755): ``CUPS_SERVER`` points the
session's programs (``lp``, ``lpstat``, print dialogs) at it, so another
user sees neither the queues nor the jobs, and a system cupsd, if any, is
never touched.  FreeNX ran a per-session cupsd too, but on TCP port
9000+display where every local user could reach it.

Its queues are raw IPP queues, one per printer of the client: the agent's
cups channel listens on 127.0.0.1:2000+display (:mod:`nxgate.protocols.service_channels`),
the client's nxproxy connects it to the client's print server (behind
``nxgate-client``'s gate, :mod:`nxgate.protocols.printgate`), so a queue's device URI
is ``ipp://nxgate:CREDENTIAL@127.0.0.1:2000+d/printers/NAME`` and CUPS's own
``ipp`` backend sends the job there; documents are not converted here, the
client's CUPS does that for its printer.  The credential (derived from the
session cookie) is only in printers.conf (0600, in the 0700 directory); cupsd
takes the password out of the backend's argv.

When ``nxgate-client`` takes the printing back over its own SSH connection
(its door opened a route: :mod:`nxgate.streams.reverse`), the queues send to
the session's reverse listener instead (a Unix socket only the user's
processes get through: ``ipp://nxgate:CREDENTIAL@%2F<path>/printers/NAME``),
and the node asks the client's printers through the same route
(:meth:`Printing.route`), on one box and for a client on another cluster
member alike.

The client's printers are known only once the client is attached, after
``start``: a background task asks the client's print server through the
channel (:mod:`nxgate.protocols.ipp`), retrying until the client answers, then writes
printers.conf and starts cupsd.

At suspend cupsd is stopped, not kept: the channel is gone with the client,
the next client may be another machine with other printers, and the
credential changes with the cookie at every resume.  The spool stays in the
session directory, so a job not yet delivered is sent after the resume if
the client then has a printer of the same name.  At the end the session
directory goes with everything in it; after a gateway SIGKILL, the gateway
that takes the session back stops a suspended session's cupsd, found by the
session's marker in its environment.
"""

from __future__ import annotations

import calendar
import contextlib
import os
import pwd
import re
import shutil
import signal
import socket
import stat
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from twisted.internet import defer, inotify, protocol, task
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.error import ConnectError, ConnectingCancelledError
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.logger import Logger
from twisted.python.filepath import FilePath
from twisted.web.client import Agent, HTTPConnectionPool, ResponseDone
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgentEndpointFactory, IBodyProducer
from zope.interface import implementer

from nxgate.protocols import service_channels
from nxgate.protocols import ipp
from nxgate.protocols import printgate
from nxgate.host import files, processes
from nxgate.node.services import Context
from nxgate.node.follow import LogFollower
from nxgate.safetext import printable

log = Logger()

DIRECTORY = "cups"
SOCKET = "socket"
SUBDIRECTORIES = ("spool", "cache", "state")
ASK_TIMEOUT = 10.0
FIRST_RETRY, LAST_RETRY = 0.5, 5.0
#: After this long without an answer (a client that asked for printing but
#: forwards nothing), the channel is asked only every SLOW_RETRY seconds.
PATIENCE, SLOW_RETRY = 120.0, 30.0
SOCKET_TIMEOUT = 20.0
STOP_GRACE = 5.0
#: Where the session's cupsd is looked for (it runs with this PATH).
CUPSD_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


class NotAnswering(Exception):
    """The channel has no print server behind it (yet)."""


class Refused(Exception):
    """The client's gate refused the session's credential."""


# ------------------------------------------------------------ configuration
def cupsd_conf(socket_path: str, extra: tuple[str, ...] = ()) -> str:
    """cupsd.conf of a session's cupsd: its Unix socket only, no browsing,
    no web interface; no authentication, as only the user reaches the socket."""
    return "\n".join([
        f"Listen {socket_path}",
        *extra,
        "LogLevel warn",
        "MaxLogSize 1m",
        "Browsing No",
        "BrowseLocalProtocols none",
        "WebInterface No",
        "DefaultAuthType None",
        "JobRetryInterval 5",
        "<Policy default>",
        "  JobPrivateAccess all",
        "  JobPrivateValues none",
        "  SubscriptionPrivateAccess all",
        "  SubscriptionPrivateValues none",
        "  <Limit All>",
        "    Order deny,allow",
        "  </Limit>",
        "</Policy>",
        "",
    ])


def cups_files_conf(directory: str, server_bin: str | None = None) -> str:
    """cups-files.conf: everything cupsd writes stays in ``directory``."""
    path = lambda name: os.path.join(directory, name)  # noqa: E731
    return "\n".join([
        f"ServerRoot {directory}",
        *([f"ServerBin {server_bin}"] if server_bin else []),
        f"RequestRoot {path('spool')}",
        f"TempDir {path('spool')}",
        f"CacheDir {path('cache')}",
        f"StateDir {path('state')}",
        f"ErrorLog {path('error_log')}",
        f"AccessLog {path(ACCESS_LOG)}",
        f"PageLog {path('page_log')}",
        f"Printcap {path('printcap')}",
        "ConfigFilePerm 0600",
        "LogFilePerm 0600",
        "FileDevice No",
        "",
    ])


def device_uri(address: int | str, resource: str, credential: str) -> str:
    """A queue's device URI: to 127.0.0.1:``address`` (the NX cups channel's
    port), or to the Unix socket at ``address`` (the client's own SSH
    connection, see :mod:`nxgate.streams.reverse`): CUPS's ipp backend takes
    a host that starts with ``/``, written ``%2F...``, for a socket path."""
    host = f"127.0.0.1:{address}" if isinstance(address, int) else urllib.parse.quote(address, safe="")
    return f"ipp://{printgate.USER}:{credential}@{host}{resource}"


def printers_conf(printers: Iterable[ipp.Printer], address: int | str, credential: str) -> str:
    """printers.conf: a raw queue per client printer (names and texts were
    cleaned by :mod:`nxgate.protocols.ipp`: nothing can end a line or a section)."""
    printers = list(printers)
    default = next((p.queue for p in printers if p.default), printers[0].queue if printers else None)
    lines = []
    for printer in printers:
        section = "DefaultPrinter" if printer.queue == default else "Printer"
        lines += [
            f"<{section} {printer.queue}>",
            f"Info {printer.info or printer.name} (NX client)",
            "Location the NX client's machine",
            f"DeviceURI {device_uri(address, printer.resource, credential)}",
            "State Idle",
            "Accepting Yes",
            "Shared No",
            "JobSheets none none",
            "QuotaPeriod 0",
            "PageLimit 0",
            "KLimit 0",
            "OpPolicy default",
            "ErrorPolicy retry-job",
            f"</{section}>",
        ]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------ asking the client
@implementer(IBodyProducer)
class _Body:
    """An IPP request's bytes, all known in advance (Agent wants a producer)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.length = len(data)

    def startProducing(self, consumer: Any) -> defer.Deferred[None]:
        consumer.write(self.data)
        return defer.succeed(None)

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass

    def stopProducing(self) -> None:
        pass


class _BoundedBody(protocol.Protocol):
    """An answer's body, at most ipp.MAX_RESPONSE bytes (a client's print
    server is not trusted to stop)."""

    def __init__(self, done: defer.Deferred[bytes]) -> None:
        self.done = done
        self.parts: list[bytes] = []
        self.size = 0

    def dataReceived(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > ipp.MAX_RESPONSE:
            self.transport.stopProducing()
            if not self.done.called:
                self.done.errback(NotAnswering(f"an answer longer than {ipp.MAX_RESPONSE} bytes"))
            return
        self.parts.append(data)

    def connectionLost(self, reason: Any = None) -> None:
        if self.done.called:
            return
        if reason is None or reason.check(ResponseDone, PotentialDataLoss):
            self.done.callback(b"".join(self.parts))
        else:
            self.done.errback(NotAnswering(f"the answer broke off: {reason.getErrorMessage()}"))


@dataclass(frozen=True)
class Answer:
    """An HTTP answer of the client's print server."""

    status: int
    body: bytes


@implementer(IAgentEndpointFactory)
class _Loopback:
    """Agent's connections go to 127.0.0.1:``port`` itself: no name to resolve."""

    def __init__(self, reactor: Any, port: int, timeout: float) -> None:
        self.reactor = reactor
        self.port = port
        self.timeout = timeout

    def endpointForURI(self, uri: Any) -> TCP4ClientEndpoint:
        return TCP4ClientEndpoint(self.reactor, "127.0.0.1", self.port, timeout=self.timeout)


@implementer(IStreamClientEndpoint)
class _Handed:
    """A connection to a socket someone hands us (the reverse listeners' :meth:`connect_own`)."""

    def __init__(self, reactor: Any, connect: Callable[[], socket.socket]) -> None:
        self.reactor = reactor
        self.connect_socket = connect

    def connect(self, factory: Any) -> defer.Deferred[Any]:
        try:
            sock = self.connect_socket()
        except OSError as error:
            return defer.fail(ConnectError(string=str(error)))
        built: list[Any] = []

        class Capture(protocol.Factory):
            def buildProtocol(self, addr: Any) -> Any:
                built.append(factory.buildProtocol(addr))
                return built[-1]

        try:
            self.reactor.adoptStreamConnection(sock.fileno(), socket.AF_UNIX, Capture())
        finally:
            sock.close()  # the reactor holds its own copy
        if not built or built[0] is None:
            return defer.fail(ConnectError(string="the connection was not taken"))
        return defer.succeed(built[0])


@implementer(IAgentEndpointFactory)
class _Reverse:
    def __init__(self, reactor: Any, connect: Callable[[], socket.socket]) -> None:
        self.endpoint = _Handed(reactor, connect)

    def endpointForURI(self, uri: Any) -> _Handed:
        return self.endpoint


@dataclass(frozen=True)
class Route:
    """Where a session's print requests reach the client's gate: the address
    its queues send to (:func:`device_uri`) and how the gateway itself asks
    there (an Agent's endpoints)."""

    address: int | str
    endpoints: Any

    @classmethod
    def channel(cls, reactor: Any, port: int, timeout: float = ASK_TIMEOUT) -> Route:
        """The NX cups channel's port on loopback."""
        return cls(port, _Loopback(reactor, port, timeout))

    @classmethod
    def reverse(cls, reactor: Any, address: int | str, connect: Callable[[], socket.socket]) -> Route:
        """Back over the client's own SSH connection: the session's cupsd
        connects to the reverse listener, the node itself through a socket
        pair its connections are handed with (the listener lets in the
        session user's processes only)."""
        return cls(address, _Reverse(reactor, connect))

    @property
    def host(self) -> str:
        """The ``host[:port]`` the requests name (the client's gate sets its own ``Host``)."""
        return f"127.0.0.1:{self.address}" if isinstance(self.address, int) else "localhost"


def _cancelled(error: BaseException) -> bool:
    """Whether ``error`` is (or wraps, as Agent's errors do) a cancellation."""
    if isinstance(error, (defer.CancelledError, ConnectingCancelledError)):
        return True
    reasons = getattr(error, "reasons", None) or []
    return any(reason.check(defer.CancelledError, ConnectingCancelledError) for reason in reasons)


async def post(reactor: Any, route: Route, path: str, body: bytes, authorization: str | None = None,
               timeout: float = ASK_TIMEOUT) -> Answer:
    """POST an IPP request along ``route`` (twisted.web's Agent, one
    connection per request); NotAnswering when nobody answers in time."""
    headers = Headers({b"Content-Type": [b"application/ipp"]})
    if authorization is not None:
        headers.addRawHeader(b"Authorization", authorization.encode())
    agent = Agent.usingEndpointFactory(reactor, route.endpoints, pool=HTTPConnectionPool(reactor, persistent=False))
    url = f"http://{route.host}{path}".encode()
    timed_out = []
    work: defer.Deferred[Any] = agent.request(b"POST", url, headers, _Body(body))
    timer = reactor.callLater(timeout, lambda: (timed_out.append(True), work.cancel()))
    try:
        response = await work
        work = defer.Deferred()
        response.deliverBody(_BoundedBody(work))
        return Answer(response.code, await work)
    except NotAnswering:
        raise
    except Exception as error:
        if timed_out:
            raise NotAnswering(f"no answer within {timeout:g} s") from None
        if _cancelled(error):
            raise defer.CancelledError() from None  # the session's printing is being stopped
        # Refused, reset, not HTTP: nobody (usable) there yet.
        raise NotAnswering(str(error) or type(error).__name__) from None
    finally:
        if timer.active():
            timer.cancel()


async def ask(reactor: Any, route: Route, cookie: str, operation: int, path: str, printer_uri: str | None = None,
              requested: tuple[str, ...] = ()) -> Answer:
    """One IPP request through the channel; the credential is sent only when
    asked for (a 401), as CUPS's ipp backend does, so that a client whose
    print server wants none (a plain CUPS behind the channel) works too."""
    body = ipp.request(operation, 1, printer_uri, requested)
    answer = await post(reactor, route, path, body)
    if answer.status == 401:
        answer = await post(reactor, route, path, body, printgate.authorization(cookie))
    if answer.status == 401:
        raise Refused("the client's print gate refused the session's credential")
    if answer.status >= 500:  # e.g. the client's gate cannot reach its CUPS (yet)
        raise NotAnswering(f"the client's print server answered HTTP {answer.status}")
    return answer


async def discover(reactor: Any, route: Route, cookie: str) -> list[ipp.Printer]:
    """The client's printers: a CUPS lists them; a bare IPP printer (no
    CUPS-Get-Printers) is one printer at /ipp/print."""
    answer = await ask(reactor, route, cookie, ipp.CUPS_GET_PRINTERS, "/", requested=ipp.PRINTER_ATTRIBUTES)
    if answer.status == 200:
        message = _decode(answer.body)
        if message.ok:
            default = None
            answer = await ask(reactor, route, cookie, ipp.CUPS_GET_DEFAULT, "/", requested=("printer-name",))
            if answer.status == 200:
                reply = _decode(answer.body)
                default = ipp.default_name(reply) if reply.ok else None
            return ipp.printers_of(message, default)
        if message.status == 0x0406:  # client-error-not-found: a CUPS without printers
            return []
    resource = "/ipp/print"
    answer = await ask(reactor, route, cookie, ipp.GET_PRINTER_ATTRIBUTES, resource,
                       printer_uri=f"ipp://{route.host}{resource}", requested=ipp.PRINTER_ATTRIBUTES)
    if answer.status != 200:
        return []
    message = _decode(answer.body)
    if not message.ok:
        return []
    found = ipp.printers_of(ipp.Message(message.status, message.request_id,
                                        [(ipp.PRINTER_GROUP, g) for g in message.group(ipp.PRINTER_GROUP)]))
    return [ipp.Printer(printer.name, resource, printer.info, default=True) for printer in found[:1]]


def _decode(body: bytes) -> ipp.Message:
    try:
        return ipp.decode(body)
    except ipp.IPPError as error:
        raise NotAnswering(f"not an IPP answer: {error}") from None


# -------------------------------------------------------------- the service
class Printing:
    name = "printing"

    def __init__(self, context: Context, cupsd: str | None = None) -> None:
        self.context = context
        self.cupsd = cupsd  # None: not installed, printing is left out (said at each start)
        self._tasks: dict[str, defer.Deferred[None]] = {}
        self._cupsd: dict[str, processes.ProcessId] = {}
        self._starts: dict[str, int] = {}  # per session: how many starts so far
        #: X2Go's printer: each session's job log and cupsd's access log, followed.
        self._job_logs: dict[str, list[LogFollower]] = {}
        self._notifier: Any = None

    def directory(self, session: Any) -> str:
        return os.path.join(self.context.session_dir(session), DIRECTORY)

    def socket_path(self, session: Any) -> str:
        return os.path.join(self.directory(session), SOCKET)

    def environment(self, session: Any) -> dict[str, str]:
        if service_channels.channel_port("printing", session.display) is None or self.cupsd is None:
            return {}
        return {"CUPS_SERVER": self.socket_path(session)}

    def reverse_environment(self, session: Any) -> dict[str, str]:
        """An X2Go client's session: its programs print on the session's cupsd, whose X2Go printer serves the
        client's print spool once the client shares it (:meth:`serve_x2go`)."""
        if self.cupsd is None or not self.context.config().services.printing \
                or session.options.get("display", {}).get("client") != "x2go":
            return {}
        return {"CUPS_SERVER": self.socket_path(session)}

    async def serve_x2go(self, session: Any, spool: str) -> None:
        """X2Go's printer: the session's cupsd with one queue, ``X2Go``, whose
        jobs become PDFs in the client's print spool, mounted at ``spool``
        (:mod:`nxgate.node.services.x2go_print`, the backend; x2goserver's
        cups-x2go does the same through root's CUPS).  Jobs are capped at
        :data:`X2GO_MAX_JOB` bytes, as sent (cupsd answers a larger request
        "Request Entity Too Large") and as PDF (the backend cancels it)."""
        if self.cupsd is None or not self.context.config().services.printing:
            log.info("session {id} of {user}: the X2Go client shares its print spool, but printing is {why}",
                     id=session.id, user=session.user, why="switched off ([services] printing)"
                     if self.cupsd is not None else "not installed (Debian: cups-daemon)")
            return
        self._starts[session.id] = self._starts.get(session.id, 0) + 1
        await self._end_cupsd(session, await self._blocking(_cupsd_of, session.id, session.uid))
        await self._blocking(self._prepare_x2go, session, spool)
        self._follow_jobs(session)  # its logs made before cupsd opens them (they are made anew: new files)
        cupsd = await self._launch(session)
        self._cupsd[session.id] = cupsd
        await self._socket_made(self.socket_path(session), cupsd)
        log.info("session {id} of {user}: printing to the X2Go client (queue {queue}, its spool at {spool})",
                 id=session.id, user=session.user, queue=X2GO_QUEUE, spool=spool)

    def _prepare_x2go(self, session: Any, spool: str) -> None:
        """cupsd's files for X2Go's printer, written by root into the user's directory without following links:
        its programs (the system's, and the backend of X2Go's printer), the queue and its PPD."""
        self._prepare(session)
        directory = self.directory(session)
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            _user_directories(fd, directory, ("bin", "ppd"), session.uid, session.gid)
        finally:
            os.close(fd)
        server_bin = os.path.join(directory, "bin")
        bin_fd = os.open(server_bin, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            if os.fstat(bin_fd).st_uid != session.uid:
                raise OSError(f"{server_bin} does not belong to the session's user")
            try:
                os.mkdir("backend", 0o700, dir_fd=bin_fd)
                os.chown("backend", session.uid, session.gid, dir_fd=bin_fd, follow_symlinks=False)
            except FileExistsError:
                pass
            backend_fd = os.open("backend", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=bin_fd)
            try:
                for name, target in x2go_server_bin(X2GO_BACKEND_PROGRAM).items():
                    where, _, base = name.rpartition("/")
                    at = backend_fd if where else bin_fd
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(base, dir_fd=at)
                    os.symlink(target, base, dir_fd=at)
                    os.chown(base, session.uid, session.gid, dir_fd=at, follow_symlinks=False)
            finally:
                os.close(backend_fd)
        finally:
            os.close(bin_fd)
        for name, text in (("cupsd.conf", cupsd_conf(self.socket_path(session), x2go_cupsd_lines())),
                           ("cups-files.conf", cups_files_conf(directory, server_bin)),
                           ("printers.conf", x2go_printers_conf(spool)),
                           (os.path.join("ppd", f"{X2GO_QUEUE}.ppd"), X2GO_PPD)):
            files.write_user_file(os.path.join(directory, name), text.encode(), session.uid, session.gid)

    def _follow_jobs(self, session: Any) -> None:
        """The backend's line for each job, and each request cupsd refused for its size (its access log: cupsd
        answers ``lp`` "Request Entity Too Large" and logs nothing else), repeated in the gateway's log."""
        self._stop_following(session)
        directory = self.directory(session)
        refused = RefusedRequests()

        def job_line(line: str) -> None:
            log.info("session {id} of {user}: X2Go print {what}", id=session.id, user=session.user,
                     what=printable(line)[:400])

        def access_line(line: str) -> None:
            why = refused.words(line)
            if why is not None:
                log.info("session {id} of {user}: X2Go print refused: {reason}; nothing reached the client",
                         id=session.id, user=session.user, reason=why, audit="x2go_print_refused")

        followers = []
        try:
            if self._notifier is None:
                self._notifier = inotify.INotify(self.context.reactor)
                self._notifier.startReading()
            for name, on_line in ((X2GO_JOB_LOG, job_line), (ACCESS_LOG, access_line)):
                path = os.path.join(directory, name)
                files.write_user_file(path, b"", session.uid, session.gid)
                followers.append(LogFollower(self._notifier, path, on_line))
        except OSError as error:
            log.warn("session {id}: the X2Go printer's logs cannot be followed: {error}", id=session.id,
                     error=str(error))
        self._job_logs[session.id] = followers

    def _stop_following(self, session: Any) -> None:
        for follower in self._job_logs.pop(session.id, []):
            follower.stop()

    async def start(self, session: Any) -> None:
        port = service_channels.channel_port("printing", session.display)
        if port is None:
            log.warn("session {id}: display :{display} is too high for a cups channel port", id=session.id,
                     display=session.display)
            return
        if self.cupsd is None:
            log.warn("session {id} of {user} asked for printing, but cupsd is not installed (Debian: cups-daemon); "
                     "the session has no printers", id=session.id, user=session.user)
            return
        await self._blocking(self._prepare, session)
        self._starts[session.id] = self._starts.get(session.id, 0) + 1
        old = self._tasks.pop(session.id, None)
        if old is not None:
            old.cancel()
        work = defer.ensureDeferred(self._bring_up(session))
        work.addErrback(lambda failure: None if failure.check(defer.CancelledError) else log.failure(
            "session {id}: printing could not be set up", failure, id=session.id))
        work.addBoth(lambda _: self._tasks.pop(session.id, None) if self._tasks.get(session.id) is work else None)
        if not work.called:
            self._tasks[session.id] = work

    def _prepare(self, session: Any) -> None:
        """The 0700 ``cups/`` directory and cupsd's configuration, written by
        root into the user's directory without following links (the user may
        have replaced anything there)."""
        directory = self.directory(session)
        try:
            files.make_session_dir(directory, session.uid, session.gid)
        except FileExistsError:
            pass
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            st = os.fstat(fd)
            if st.st_uid != session.uid:
                raise OSError(f"{directory} does not belong to the session's user")
            os.fchmod(fd, 0o700)
            _user_directories(fd, directory, SUBDIRECTORIES, session.uid, session.gid)
        finally:
            os.close(fd)
        for name, text in (("cupsd.conf", cupsd_conf(self.socket_path(session))),
                           ("cups-files.conf", cups_files_conf(directory))):
            files.write_user_file(os.path.join(directory, name), text.encode(), session.uid, session.gid)

    async def _bring_up(self, session: Any) -> None:
        reactor = self.context.reactor
        delay, said, since = FIRST_RETRY, "", reactor.seconds()
        while True:
            route = self.route(session)
            try:
                printers = await discover(reactor, route, session.cookie)
                break
            except NotAnswering as error:
                why = f"the client's print server does not answer through the cups channel yet ({error})"
            except Refused as error:
                why = str(error)
            if why != said:  # each new reason once, not every retry
                log.info("session {id} of {user}: {why}; retrying, every {every:g} s at most", id=session.id,
                         user=session.user, why=why, every=max(delay, LAST_RETRY))
                said = why
            await task.deferLater(reactor, delay, lambda: None)
            delay = min(delay * 1.5, LAST_RETRY) if reactor.seconds() - since < PATIENCE else SLOW_RETRY
        if said:
            log.info("session {id} of {user}: the client's print server answered after {seconds:.1f} s",
                     id=session.id, user=session.user, seconds=reactor.seconds() - since)
        # One cupsd per session: one left by an interrupted start would hold the socket.
        await self._end_cupsd(session, await self._blocking(_cupsd_of, session.id, session.uid))
        await self._blocking(files.write_user_file, os.path.join(self.directory(session), "printers.conf"),
                             printers_conf(printers, route.address, printgate.credential(session.cookie)).encode(),
                             session.uid, session.gid)
        cupsd = await self._launch(session)
        self._cupsd[session.id] = cupsd
        await self._socket_made(self.socket_path(session), cupsd)
        log.info("session {id} of {user}: printing on the client's printers: {queues}", id=session.id,
                 user=session.user, queues=", ".join(p.queue for p in printers) or "(the client has none)")

    def route(self, session: Any) -> Route:
        """Where the session's jobs reach the client's gate: the client's own
        SSH connection when its door opened a route for the session's printing
        (the session's reverse listener, :mod:`nxgate.node.reverse`: a Unix
        socket only the user's processes get through, on one box and for a
        client on another cluster member alike), else the NX cups channel
        (whose port :meth:`start` checked)."""
        reactor = self.context.reactor
        listeners = self.context.reverse
        address = listeners.address(session.id, self.name) if listeners is not None else None
        if isinstance(address, str):
            def connect() -> socket.socket:
                own = listeners.connect_own(session.id, self.name)
                if own is None:
                    raise OSError(f"the printing of session {session.id} no longer goes back to its client")
                return own
            return Route.reverse(reactor, address, connect)
        return Route.channel(reactor, service_channels.channel_port("printing", session.display) or 0)

    async def _socket_made(self, path: str, cupsd: processes.ProcessId) -> None:
        """Until cupsd has made its socket (told by inotify, no polling);
        OSError if cupsd ends first or takes longer than SOCKET_TIMEOUT."""
        reactor = self.context.reactor
        made: defer.Deferred[None] = defer.Deferred()
        notifier = inotify.INotify(reactor)
        notifier.startReading()

        def created(_watch: Any, filepath: FilePath, _mask: int) -> None:
            # INotify names what it saw in bytes, whatever the watched path was given as.
            if os.fsencode(filepath.path) == os.fsencode(path) and not made.called:
                made.callback(None)

        ended = None
        try:
            notifier.watch(FilePath(os.path.dirname(path)), mask=inotify.IN_CREATE | inotify.IN_MOVED_TO,
                           callbacks=[created])
            if os.path.exists(path):
                return
            ended = processes.exited(reactor, cupsd, SOCKET_TIMEOUT)
            first, which = await defer.DeferredList([made, ended], fireOnOneCallback=True, fireOnOneErrback=True)
            if which == 1:
                raise OSError("the session's cupsd ended at once (see the session's log)" if first
                              else "the session's cupsd did not open its socket")
        finally:
            notifier.loseConnection()
            if ended is not None and not ended.called:
                ended.cancel()
                ended.addErrback(lambda failure: failure.trap(defer.CancelledError))

    async def _launch(self, session: Any) -> processes.ProcessId:
        user = await self._blocking(pwd.getpwuid, session.uid)
        directory = self.directory(session)
        request = {
            "user": user.pw_name,
            "argv": [self.cupsd or "cupsd", "-f", "-c", os.path.join(directory, "cupsd.conf"),
                     "-s", os.path.join(directory, "cups-files.conf")],
            "env": {"PATH": CUPSD_PATH, "HOME": user.pw_dir, "LANG": "C.UTF-8"},
            "env_fixed": {processes.SESSION_MARKER: session.id, processes.SESSION_ID_VARIABLE: session.id},
            "cwd": directory,
            "log": self.context.layout.agent_files(session.id).app_log,
        }
        return await self.context.launcher.start(request)

    async def stop(self, session: Any) -> None:
        self._stop_following(session)
        starts = self._starts.get(session.id, 0)
        work = self._tasks.pop(session.id, None)
        if work is not None:
            work.cancel()
        known = self._cupsd.pop(session.id, None)
        if known is not None:
            running = [known]
        else:  # a gateway before this one started it
            running = await self._blocking(_cupsd_of, session.id, session.uid)
        await self._end_cupsd(session, running)
        if self._starts.get(session.id, 0) == starts:  # not when a resume started printing again meanwhile
            # The credential goes with the channel (cupsd keeps the previous file as .O).
            await self._blocking(files.remove_in_dir, self.directory(session), "printers.conf", "printers.conf.O")
            if not getattr(getattr(session, "state", None), "live", True):
                self._starts.pop(session.id, None)  # the session has ended

    async def _end_cupsd(self, session: Any, running: list[processes.ProcessId]) -> None:
        """SIGTERM (cupsd then stops its jobs' backends), SIGKILL after STOP_GRACE."""
        for process in running:
            processes.send_signal(process, signal.SIGTERM)
        await defer.gatherResults([processes.exited(self.context.reactor, process, STOP_GRACE) for process in running])
        for process in running:
            if process.alive():
                log.warn("session {id}: its cupsd ignored SIGTERM; killing it", id=session.id)
                processes.send_signal(process, signal.SIGKILL)

    async def _blocking(self, function: Any, *args: Any) -> Any:
        if self.context.blocking is None:
            return function(*args)
        return await self.context.blocking(function, *args)


def _user_directories(fd: int, directory: str, names: Iterable[str], uid: int, gid: int) -> None:
    """Directories ``names`` in ``directory`` (open as ``fd``), the user's, 0700; one already there must be a
    real directory (no link is followed)."""
    for name in names:
        try:
            os.mkdir(name, 0o700, dir_fd=fd)
            os.chown(name, uid, gid, dir_fd=fd, follow_symlinks=False)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(name, dir_fd=fd).st_mode):
                raise OSError(f"{directory}/{name} is not a directory") from None


def _cupsd_of(session_id: str, uid: int) -> list[processes.ProcessId]:
    """The session's cupsd processes, found by its marker (only ``uid``'s)."""
    found = []
    for process in processes.tagged_processes(session_id, uid):
        try:
            with open(f"/proc/{process.pid}/comm") as handle:
                if handle.read().strip() == "cupsd":
                    found.append(process)
        except OSError:
            continue
    return found


# ------------------------------------------------------------ X2Go's printer
X2GO_QUEUE = "X2Go"
#: cupsd's access log in its directory: one line per request, with its HTTP status.
ACCESS_LOG = "access_log"
_ACCESS_LINE = re.compile(r'\S+ \S+ \S+ \[(?P<time>[^\]]{1,64})\] "(?P<method>[A-Z]{1,16}) (?P<resource>[^ "]{1,256})'
                          r' HTTP/\d\.\d" (?P<status>\d{3}) (?P<bytes>\d{1,20}|-) (?P<operation>[A-Za-z-]{1,64})')
#: HTTP's "Request Entity Too Large": what cupsd answers past its MaxRequestSize.
TOO_LARGE = "413"
#: The backend's program (a console script beside the gateway's Python).
X2GO_BACKEND_PROGRAM = os.path.join(os.path.dirname(sys.executable), "nxgate-x2go-print")
X2GO_JOB_LOG = "x2go-jobs.log"
#: The most a job may send to the X2Go client, as printed and as PDF.
X2GO_MAX_JOB = 100 * 1024 * 1024
#: The system's CUPS programs, the session's cupsd runs them from its own ServerBin.
SYSTEM_SERVER_BIN = "/usr/lib/cups"


def x2go_server_bin(backend: str, system: str = SYSTEM_SERVER_BIN) -> dict[str, str]:
    """The session cupsd's ServerBin for X2Go's printer: names -> link targets
    (the system's programs, and in ``backend/`` the X2Go backend alone)."""
    links = {name: os.path.join(system, name) for name in ("cgi-bin", "daemon", "driver", "filter", "monitor",
                                                          "notifier")}
    links["backend/x2go"] = backend
    return links


class RefusedRequests:
    """The requests cupsd refused for their size, read from its access log
    (pure): cupsd writes one refused request's line twice, as it reads it and
    as it closes the connection, one right after the other; such a repeat is
    not a new refusal."""

    #: Seconds between a line and its repeat.
    REPEAT_WITHIN = 5

    def __init__(self) -> None:
        self.last: tuple[tuple[str, ...], float] | None = None

    def words(self, line: str) -> str | None:
        """What a refusal line says, in words for the log; None for any other line."""
        match = _ACCESS_LINE.match(line[:1024])
        if match is None or match["status"] != TOO_LARGE:
            self.last = None
            return None
        key = (match["resource"], match["operation"], match["bytes"])
        try:
            when = calendar.timegm(time.strptime(match["time"].split(" ")[0], "%d/%b/%Y:%H:%M:%S"))
        except ValueError:
            when = 0.0
        last, self.last = self.last, (key, when)
        if last is not None and last[0] == key and abs(when - last[1]) <= self.REPEAT_WITHIN:
            return None
        return (f"a {match['operation']} request to {match['resource']} larger than X2Go's printer takes"
                f" ({X2GO_MAX_JOB // 2**20} MiB; cupsd answered lp 'Request Entity Too Large')")


def x2go_cupsd_lines() -> tuple[str, ...]:
    return (f"MaxRequestSize {X2GO_MAX_JOB}", f"SetEnv NXGATE_X2GO_MAX_JOB {X2GO_MAX_JOB}")


def x2go_printers_conf(spool: str) -> str:
    """X2Go's printer, the session's default: the PDF goes into the client's spool (mounted at ``spool``)."""
    return "\n".join([
        f"<DefaultPrinter {X2GO_QUEUE}>",
        "Info X2Go client (PDF to the client's spool)",
        "Location the X2Go client's machine",
        f"DeviceURI x2go:{spool}",
        "State Idle",
        "Accepting Yes",
        "Shared No",
        "JobSheets none none",
        "OpPolicy default",
        "ErrorPolicy abort-job",
        "</DefaultPrinter>",
        ""])


#: The queue's PPD: CUPS converts every job to PDF for it (cups-filters), which the backend sends on as it is.
X2GO_PPD = "".join(f"{line}\n" for line in (
    '*PPD-Adobe: "4.3"', '*FormatVersion: "4.3"', '*FileVersion: "1.0"', '*LanguageVersion: English',
    '*LanguageEncoding: ISOLatin1', '*PCFileName: "NXGX2GO.PPD"', '*Manufacturer: "nxgate"',
    '*Product: "(X2Go client)"', '*ModelName: "X2Go client PDF"', '*ShortNickName: "X2Go client PDF"',
    '*NickName: "X2Go client PDF"', '*PSVersion: "(3010.000) 0"', '*LanguageLevel: "3"', '*ColorDevice: True',
    '*DefaultColorSpace: RGB', '*FileSystem: False', '*Throughput: "1"', '*LandscapeOrientation: Plus90',
    '*TTRasterizer: Type42', '*cupsFilter2: "application/pdf application/vnd.cups-pdf 0 -"',
    '*OpenUI *PageSize/Page Size: PickOne', '*OrderDependency: 10 AnySetup *PageSize', '*DefaultPageSize: A4',
    '*PageSize A4/A4: "<</PageSize[595 842]/ImagingBBox null>>setpagedevice"',
    '*PageSize Letter/US Letter: "<</PageSize[612 792]/ImagingBBox null>>setpagedevice"', '*CloseUI: *PageSize',
    '*OpenUI *PageRegion/Page Region: PickOne', '*OrderDependency: 10 AnySetup *PageRegion',
    '*DefaultPageRegion: A4', '*PageRegion A4/A4: "<</PageSize[595 842]/ImagingBBox null>>setpagedevice"',
    '*PageRegion Letter/US Letter: "<</PageSize[612 792]/ImagingBBox null>>setpagedevice"',
    '*CloseUI: *PageRegion', '*DefaultImageableArea: A4', '*ImageableArea A4/A4: "0 0 595 842"',
    '*ImageableArea Letter/US Letter: "0 0 612 792"', '*DefaultPaperDimension: A4',
    '*PaperDimension A4/A4: "595 842"', '*PaperDimension Letter/US Letter: "612 792"'))


def make(context: Context) -> Printing:
    return Printing(context, shutil.which("cupsd", path=CUPSD_PATH))
