"""Session thumbnails: a small PNG of an agent's framebuffer.

``xwd -root`` against the session's display, run as the session's user
with the session's X authority file (the gateway never opens the user's
authority file itself, and starts xwd with the node's one launcher,
:meth:`nxgate.node.launcher.Launcher.output`), then scaled down (nearest
pixel) and written as a PNG with :mod:`zlib` (in a thread: ``blocking``).

The picture comes from the session's own agent only: xwd reaches the
display by its path socket alone, in the agent's namespaces (the jail of
a jailed session, see :func:`_runas_request`), so nobody who binds ``@/tmp/.X11-unix/XN`` or
TCP 6000+N on the host gets the session's cookie or can paint its
thumbnail.  The dump is read with a bound (:data:`MAX_DUMP_BYTES`).
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

from nxgate.node.processes import LaunchError
from nxgate.node.launcher import OutputTooLarge

MAX_DUMP_BYTES = 64 << 20
XWD_TIMEOUT = 10.0
XWD = "xwd"


class ThumbnailError(Exception):
    """The framebuffer could not be read (the agent is gone, xwd failed)."""


def parse_xwd(data: bytes) -> tuple[int, int, bytes]:
    """``(width, height, rgb)`` of an ``xwd`` ZPixmap dump of 24/32 bits per pixel TrueColor."""
    if len(data) < 100:
        raise ThumbnailError("not an XWD dump: too short")
    header = struct.unpack(">25I", data[:100])
    (header_size, version, pixmap_format, _depth, width, height, _xoffset, byte_order, _unit, _bit_order, _pad,
     bits_per_pixel, bytes_per_line, _visual, red_mask, green_mask, blue_mask, _bits_per_rgb, _entries,
     ncolors) = header[:20]
    if version != 7 or pixmap_format != 2 or bits_per_pixel not in (24, 32) or not width or not height:
        raise ThumbnailError(f"unsupported XWD dump: version {version} format {pixmap_format} bpp {bits_per_pixel}")
    offset = header_size + 12 * ncolors
    if len(data) < offset + bytes_per_line * height:
        raise ThumbnailError("truncated XWD dump")
    step = bits_per_pixel // 8
    order = "little" if byte_order == 0 else "big"
    shifts = [(mask, (mask & -mask).bit_length() - 1) for mask in (red_mask, green_mask, blue_mask)]
    out = bytearray(3 * width * height)
    for y in range(height):
        row = data[offset + y * bytes_per_line: offset + y * bytes_per_line + width * step]
        at = 3 * width * y
        if step == 4 and order == "little" and shifts == [(0xFF0000, 16), (0xFF00, 8), (0xFF, 0)]:
            out[at:at + 3 * width:3] = row[2::4]
            out[at + 1:at + 3 * width:3] = row[1::4]
            out[at + 2:at + 3 * width:3] = row[0::4]
            continue
        for x in range(width):
            pixel = int.from_bytes(row[x * step:(x + 1) * step], order)
            out[at + 3 * x:at + 3 * x + 3] = bytes((pixel & mask) >> shift for mask, shift in shifts)
    return width, height, bytes(out)


def fit(width: int, height: int, max_width: int, max_height: int) -> tuple[int, int]:
    """The largest size within the box that keeps the aspect ratio (never larger than the source)."""
    scale = min(max_width / width, max_height / height, 1.0)
    return max(1, round(width * scale)), max(1, round(height * scale))


def scale_nearest(width: int, height: int, rgb: bytes, new_width: int, new_height: int) -> bytes:
    """Nearest-pixel scaling: output pixel (x, y) is source pixel (x*W//w, y*H//h)."""
    columns = [3 * (x * width // new_width) + c for x in range(new_width) for c in range(3)]
    out = bytearray()
    for y in range(new_height):
        start = 3 * width * (y * height // new_height)
        row = rgb[start:start + 3 * width]
        out += bytes([row[i] for i in columns])
    return bytes(out)


def png(width: int, height: int, rgb: bytes) -> bytes:
    """An 8-bit RGB PNG (filter 0 on every row)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    stride = 3 * width
    raw = b"".join(b"\0" + rgb[y * stride:(y + 1) * stride] for y in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


class DumpTooLarge(ThumbnailError):
    """The dump grew past the limit; reading stopped there (``read`` bytes)."""

    def __init__(self, read: int) -> None:
        super().__init__(f"dump too large: more than {read - 1} bytes")
        self.read = read


def _runas_request(display: int, authority: str, user: str, agent: tuple[int, int] | None) -> dict[str, Any]:
    """What :mod:`nxgate.node.runas` needs to run xwd for a session.

    ``xwd`` runs as the session's user, with ``no_network`` (a new, empty
    network namespace), so libxcb can reach the display only by its path
    socket ``/tmp/.X11-unix/XN``: not by the abstract socket or TCP port
    6000+N that it tries first and that any local user may bind.  It also
    joins the mount, PID and IPC namespaces of the agent (``agent``: its
    ``(pid, start time)``).  For a jailed agent the path is then its own
    socket in the jail's private ``/tmp`` (the host's ``/tmp/.X11-unix/XN``
    is anybody's to create); for an agent on the host the namespaces are
    the host's, and the join proves that the agent still runs: the launcher
    checks through a pidfd that the pid is still that agent.  The program
    runs with ``no_new_privs``.  ``timeout`` (as the
    user, in the jail) ends an xwd that a stalled server keeps waiting, so
    the gateway never has to signal a pid it did not start."""
    return {
        "user": user,
        "argv": ["timeout", "-s", "KILL", f"{XWD_TIMEOUT:g}", XWD, "-silent", "-root"],
        "env": {},
        "env_fixed": {"PATH": "/usr/bin:/bin", "DISPLAY": f":{display}", "XAUTHORITY": authority},
        "cwd": "/",
        "log": os.devnull,
        "pipe_stdout": True,
        "no_network": True,
        "join": list(agent) if agent else None,
    }


async def grab(launcher: Any, display: int, authority: str, user: str,
               agent: tuple[int, int] | None = None) -> bytes:
    """The raw ``xwd`` dump of ``:display``'s root window, taken as ``user``
    (see :func:`_runas_request`), and read with a bound of
    :data:`MAX_DUMP_BYTES` (the X server decides how big the dump is)."""
    try:
        data = await launcher.output(_runas_request(display, authority, user, agent), MAX_DUMP_BYTES,
                                     XWD_TIMEOUT + 2)
    except OutputTooLarge as error:
        raise DumpTooLarge(error.read) from None
    except LaunchError as error:
        raise ThumbnailError(f"xwd on :{display}: {str(error)[:200]}") from None
    if not data:
        raise ThumbnailError(f"xwd on :{display} failed (no dump)")
    return data


def picture(dump: bytes, max_width: int = 240, max_height: int = 180) -> bytes:
    """A PNG of at most ``max_width`` x ``max_height`` of an xwd dump (CPU work: in a thread)."""
    width, height, rgb = parse_xwd(dump)
    new_width, new_height = fit(width, height, max_width, max_height)
    return png(new_width, new_height, scale_nearest(width, height, rgb, new_width, new_height))


async def thumbnail(launcher: Any, blocking: Callable[..., Awaitable[Any]], display: int, authority: str,
                    user: str, agent: tuple[int, int] | None = None) -> bytes:
    """A small PNG of the session's screen: its dump taken as ``user``
    (``agent``: a jailed session's agent, see :func:`grab`), drawn off the reactor."""
    return bytes(await blocking(picture, await grab(launcher, display, authority, user, agent)))
