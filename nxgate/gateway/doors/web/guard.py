"""What every HTTP answer of the browser door has in common, whatever
resource (or none) makes it: the security headers, no ``Server`` banner,
a clean 400 for paths no resource could ever serve, a 413 for big bodies,
and a 500 whose traceback reaches the log at most once a minute.

Twisted's own pages (``NoResource``, ``UnsupportedMethod``, a failed
render) would otherwise go out bare, saying ``Server: TwistedWeb/26.x``;
and a ``%00`` in a path made :class:`twisted.web.static.File` raise, so
that any unauthenticated client could write a 30-line traceback per
request into the log.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import unquote_to_bytes

from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web import server

from nxgate.ratelimit import RateLimiter

log = Logger()

MAX_FORM_BYTES = 16 << 10
FAILURE_LOG_PERIOD = 60.0

Headers = Callable[[], Iterable[tuple[bytes, bytes]]]

ERROR_PAGE = (b'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>%s</title></head>'
              b"<body><p>%s</p></body></html>\n")


def clean_path(path: bytes) -> bool:
    """False for a request path that names no file and no page of the
    door: a NUL or bytes that are not UTF-8 once percent-decoded (the
    portal's names are ASCII; the OS refuses NUL in a file name)."""
    for segment in path.split(b"/"):
        raw = unquote_to_bytes(segment)
        if b"\x00" in raw:
            return False
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            return False
    return True


class Quota(RateLimiter):
    """At most one report per ``period`` seconds; the rest are counted, and
    the count is told with the next report (:class:`nxgate.ratelimit.RateLimiter`, one key)."""

    def __init__(self, clock: Callable[[], float], period: float = FAILURE_LOG_PERIOD) -> None:
        super().__init__(clock, allowance=1, window=period, capacity=1, reports=False)

    def take(self) -> int | None:
        """None: stay quiet; else how many were held back since the last one."""
        return self.tell()


class DoorSite(server.Site):
    """The door's Site: ``headers()`` are the security headers of the
    moment (HSTS only over TLS); ``failures`` rations tracebacks."""

    displayTracebacks = False

    def __init__(self, resource: Any, headers: Headers, clock: Callable[[], float]) -> None:
        super().__init__(resource, requestFactory=DoorRequest)
        self.headers = headers
        self.failures = Quota(clock)

    def log(self, request: server.Request) -> None:
        """Each request at debug, not Twisted's access line at info: a page
        is some twenty requests, a viewer more, and the logins, starts and
        refusals they make have lines of their own."""
        log.debug("web {method} {path} {code} for {address}", method=request.method.decode("ascii", "replace"),
                  path=request.path.decode("ascii", "replace")[:200], code=request.code,
                  address=getattr(request.getClientAddress(), "host", "?"))


def report_failure(request: server.Request, failure: Failure, what: str) -> None:
    """Log a failed request: its traceback at most once a minute (any
    client can make requests), else one line that counts them."""
    site = getattr(request, "site", None) or getattr(getattr(request, "channel", None), "site", None)
    quota = getattr(site, "failures", None)
    suppressed = 0 if quota is None else quota.take()
    path = request.path.decode("ascii", "replace")[:200]
    if suppressed is None:
        log.warn("web request {method} {path} failed: {error} (traceback logged at most once a minute)",
                 method=request.method.decode("ascii", "replace"), path=path,
                 error=failure.getErrorMessage()[:200], what=what)
        return
    log.failure("web request {method} {path} failed ({what}; {suppressed} more failures since the last "
                "traceback)", failure, method=request.method.decode("ascii", "replace"), path=path, what=what,
                suppressed=suppressed)


class DoorRequest(server.Request):
    """A request of the door (see the module's docstring).  Its body may
    not exceed :data:`MAX_FORM_BYTES` (the door's forms are a few hundred
    bytes): a larger one is answered 413 and the connection closed before
    the body is buffered."""

    received = 0
    refused = False

    # ------------------------------------------------------------ headers
    def setHeader(self, name: bytes | str, value: bytes | str) -> None:
        """No ``Server`` header: the version of Twisted is nobody's business."""
        if (name.encode() if isinstance(name, str) else name).lower() == b"server":
            return
        super().setHeader(name, value)

    def _security_headers(self) -> list[tuple[bytes, bytes]]:
        site = getattr(self.channel, "site", None)
        return list(site.headers()) if isinstance(site, DoorSite) else []

    def process(self) -> None:
        # Before any resource runs: Twisted's error pages keep what is set here,
        # and the door's own pages set the same (or a stricter) value again.
        for name, value in self._security_headers():
            self.setHeader(name, value)
        if not clean_path(self.path):
            self.site = self.channel.site
            self.prepath, self.postpath = [], []
            self.error_page(400, b"Bad Request", b"This address is not valid.")
            return
        super().process()

    def error_page(self, code: int, title: bytes, words: bytes) -> None:
        body = ERROR_PAGE % (title, words)
        self.setResponseCode(code)
        self.setHeader(b"Content-Type", b"text/html; charset=utf-8")
        self.setHeader(b"Content-Length", b"%d" % len(body))
        if self.method != b"HEAD":
            self.write(body)
        self.finish()

    def processingFailed(self, reason: Failure) -> Failure:
        report_failure(self, reason, "rendering")
        if self.finished or self._disconnected:
            return reason
        if self.startedWriting:  # half an answer went out: all the client can be told is the cut
            self.loseConnection()
            return reason
        self.error_page(500, b"Error", b"Internal error.")
        return reason

    # --------------------------------------------------------- body size
    def gotLength(self, length: int | None) -> None:
        super().gotLength(length)
        if length is not None and length > MAX_FORM_BYTES:
            self.too_large()

    def handleContentChunk(self, data: bytes) -> None:
        self.received += len(data)
        if self.received > MAX_FORM_BYTES:
            self.too_large()
        if not self.refused:
            super().handleContentChunk(data)

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
        if not self.refused:
            super().requestReceived(command, path, version)

    def too_large(self) -> None:
        if self.refused:
            return
        self.refused = True
        if self.channel is not None and self.channel.transport is not None:
            headers = b"".join(name + b": " + value + b"\r\n" for name, value in self._security_headers())
            self.channel.transport.write(b"HTTP/1.1 413 Request Entity Too Large\r\nConnection: close\r\n"
                                         + headers + b"Content-Length: 0\r\n\r\n")
            self.channel.transport.loseConnection()
