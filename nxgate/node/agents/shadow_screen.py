"""How big the shadow's window is: the watched screen, 1:1 or scaled to fit.

nxagent in shadow mode (``-S``) draws the watched screen scaled by
``geometry / watched size`` into a window of ``geometry``
(nx-libs ``nxagentShadowInit``: the ratio is taken from the user geometry,
or from the client's whole screen in full-screen mode).  Handing it the
viewer's window size as it came made it stretch or enlarge the watched
screen and show a centred crop of it.  So the gateway asks the watched X
server for its size and gives the shadow agent the size the picture has at
1:1 if that fits in the viewer's area, else the largest size of the same
aspect that fits; it never asks for full screen (that scales to the whole
client screen, whatever its aspect).

The size comes from the X server's connection setup reply: the first
screen's width and height, nothing else is read.  The reply is bounded and
parsed with fixed offsets, so a hostile server can at worst report a wrong
size, which :func:`shadow_geometry` clamps.
"""

from __future__ import annotations

import struct
from typing import Any

from twisted.internet import defer, endpoints, protocol
from twisted.logger import Logger

from nxgate.node.agents.x11 import X_SOCKET

log = Logger()

MIN_SIDE = 64
MAX_SIDE = 16384
MAX_SETUP_REPLY = 1 << 20  # nxagent's is about 4 KiB; more than this is not an X server
AUTH_NAME = b"MIT-MAGIC-COOKIE-1"


class Incomplete(Exception):
    """More of the reply is needed."""


def _pad(length: int) -> int:
    return (4 - length % 4) % 4


def setup_request(cookie: str | None) -> bytes:
    """An X11 connection setup request (little-endian), with the
    MIT-MAGIC-COOKIE-1 ``cookie`` (hex) if the server needs one."""
    name, data = (AUTH_NAME, bytes.fromhex(cookie)) if cookie else (b"", b"")
    head = struct.pack("<BxHHHHxx", ord("l"), 11, 0, len(name), len(data))
    return head + name + b"\0" * _pad(len(name)) + data + b"\0" * _pad(len(data))


def screen_size(reply: bytes) -> tuple[int, int] | None:
    """The first screen's size from a setup reply; None if the server
    refused the connection or the reply makes no sense.  Raises
    :class:`Incomplete` while more bytes are needed."""
    if len(reply) < 8:
        raise Incomplete
    status, _, _, _, words = struct.unpack_from("<BBHHH", reply)
    total = 8 + 4 * words
    if len(reply) < total:
        raise Incomplete
    if status != 1:
        return None
    if total < 40:
        return None
    vendor_length, _, screens, formats = struct.unpack_from("<HHBB", reply, 24)
    offset = 40 + vendor_length + _pad(vendor_length) + 8 * formats
    if screens < 1 or offset + 24 > total:
        return None
    width, height = struct.unpack_from("<HH", reply, offset + 20)
    return width, height


def shadow_geometry(watched: tuple[int, int] | None, area: tuple[int, int]) -> tuple[int, int]:
    """The shadow window's size: ``watched`` at 1:1 if it fits in ``area``
    (the viewer's window, or his screen when he asked for full screen),
    else scaled down uniformly to fit.  With an unknown watched size, the
    area itself."""
    area_w = min(max(area[0], MIN_SIDE), MAX_SIDE)
    area_h = min(max(area[1], MIN_SIDE), MAX_SIDE)
    if watched is None:
        return area_w, area_h
    width, height = watched
    if not (MIN_SIDE <= width <= MAX_SIDE and MIN_SIDE <= height <= MAX_SIDE):
        return area_w, area_h
    if width <= area_w and height <= area_h:
        return width, height
    # The largest size of the watched aspect inside the area, by integers
    # so that the picture never spills over by a rounding pixel.
    if width * area_h <= height * area_w:  # height is the tighter side
        return max(width * area_h // height, MIN_SIDE), area_h
    return area_w, max(height * area_w // width, MIN_SIDE)


class _SetupReply(protocol.Protocol):
    def __init__(self, request: bytes) -> None:
        self.request = request
        self.buffer = b""
        self.result: defer.Deferred[tuple[int, int] | None] = defer.Deferred()

    def connectionMade(self) -> None:
        self.transport.write(self.request)

    def dataReceived(self, data: bytes) -> None:
        self.buffer += data
        try:
            size = screen_size(self.buffer)
        except Incomplete:
            if len(self.buffer) > MAX_SETUP_REPLY:
                self._finish(None)
            return
        self._finish(size)

    def connectionLost(self, reason: Any = None) -> None:
        self._finish(None)

    def _finish(self, size: tuple[int, int] | None) -> None:
        if not self.result.called:
            self.result.callback(size)
            self.transport.loseConnection()


async def watched_size(reactor: Any, display: int, cookie: str | None, timeout: float = 3.0) -> tuple[int, int] | None:
    """The size of X display ``:display``'s first screen, or None if it
    cannot be had within ``timeout`` seconds (the shadow then falls back
    to the viewer's size)."""
    endpoint = endpoints.UNIXClientEndpoint(reactor, X_SOCKET.format(n=display), timeout=timeout)
    reader = _SetupReply(setup_request(cookie))
    try:
        await endpoints.connectProtocol(endpoint, reader)
    except Exception as error:
        log.warn("cannot reach display :{display} to learn its size: {error}", display=display, error=error)
        return None
    result = reader.result
    result.addTimeout(timeout, reactor)
    try:
        size = await result
    except defer.TimeoutError:
        reader.transport.abortConnection()
        size = None
    if size is None:
        log.warn("display :{display} did not tell its size", display=display)
    return size
