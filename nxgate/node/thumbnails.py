"""Session thumbnails: a small PNG of an agent's framebuffer.

``xwd -root`` against the session's display, run as the session's user
with the session's X authority file (the gateway never opens the user's
authority file itself), then scaled down (nearest pixel) and written as a
PNG with :mod:`zlib`.  Blocking: run it in a thread.

The picture comes from the session's own agent only: xwd reaches the
display by its path socket alone, in the agent's namespaces (the jail of
a jailed session, see :func:`_runas_request`), so nobody who binds ``@/tmp/.X11-unix/XN`` or
TCP 6000+N on the host gets the session's cookie or can paint its
thumbnail.  The dump is read with a bound (:func:`read_limited`).
"""

from __future__ import annotations

import json
import os
import pwd
import select
import struct
import subprocess
import sys
import time
import zlib
from typing import Any

MAX_DUMP_BYTES = 64 << 20
MAX_STATUS_LINE = 4096  # the launcher's "ok PID" or error line before the dump
XWD_TIMEOUT = 10.0
CHUNK = 1 << 16
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


def read_limited(fd: int, limit: int, deadline: float) -> bytes:
    """All of a pipe up to its end, or :class:`DumpTooLarge` as soon as it
    holds more than ``limit`` bytes: never more than ``limit + 1`` bytes are
    read, whatever the writer sends (an X server controls the size of the
    dump: the user's own agent can claim a 4 GiB screen)."""
    data = bytearray()
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ThumbnailError(f"no complete dump within {XWD_TIMEOUT:g} seconds")
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            continue
        chunk = os.read(fd, min(CHUNK, limit + 1 - len(data)))
        if not chunk:
            return bytes(data)
        data += chunk
        if len(data) > limit:
            raise DumpTooLarge(len(data))


def _runas_request(display: int, authority: str, uid: int, agent: tuple[int, int] | None) -> dict[str, Any]:
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
        "user": pwd.getpwuid(uid).pw_name,
        "argv": ["timeout", "-s", "KILL", f"{XWD_TIMEOUT:g}", XWD, "-silent", "-root"],
        "env": {},
        "env_fixed": {"PATH": "/usr/bin:/bin", "DISPLAY": f":{display}", "XAUTHORITY": authority},
        "cwd": "/",
        "log": os.devnull,
        "pipe_stdout": True,
        "no_network": True,
        "join": list(agent) if agent else None,
    }


def grab(display: int, authority: str, uid: int, gid: int, agent: tuple[int, int] | None = None) -> bytes:
    """The raw ``xwd`` dump of ``:display``'s root window, taken as ``uid``
    (through the launcher, see :func:`_runas_request`), and read with a
    bound of :data:`MAX_DUMP_BYTES`.  Not as root (a developer's gateway):
    xwd as we are, on the display as it is."""
    deadline = time.monotonic() + XWD_TIMEOUT + 2
    env = {"PATH": "/usr/bin:/bin", "DISPLAY": f":{display}", "XAUTHORITY": authority}
    root = os.geteuid() == 0
    try:
        if root:
            process = subprocess.Popen([sys.executable, "-m", "nxgate.node.runas"], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd="/",
                                       env={"PATH": os.defpath, "LANG": "C.UTF-8",
                                            "PYTHONPATH": os.pathsep.join(sys.path)})
            assert process.stdin is not None
            process.stdin.write(json.dumps(_runas_request(display, authority, uid, agent)).encode())
            process.stdin.close()
        else:
            process = subprocess.Popen([XWD, "-silent", "-root"], env=env, stdin=subprocess.DEVNULL,
                                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd="/")
    except OSError as error:
        raise ThumbnailError(f"xwd on :{display}: {error}") from error
    assert process.stdout is not None
    try:
        data = read_limited(process.stdout.fileno(), MAX_DUMP_BYTES + (MAX_STATUS_LINE if root else 0), deadline)
    finally:
        process.stdout.close()  # a writer past the limit gets SIGPIPE
        try:
            process.wait(XWD_TIMEOUT + 2)
        except subprocess.TimeoutExpired:
            process.kill()  # our own child, not yet reaped: its pid cannot be anybody else's
            process.wait()
    if root:
        line, _, data = data.partition(b"\n")
        if not line.startswith(b"ok"):
            raise ThumbnailError(f"xwd on :{display}: {line.decode(errors='replace')[:200]}")
        if len(data) > MAX_DUMP_BYTES:
            raise DumpTooLarge(len(data))
    if not data:
        raise ThumbnailError(f"xwd on :{display} failed (no dump)")
    return data


def thumbnail(display: int, authority: str, uid: int, gid: int, max_width: int = 240, max_height: int = 180,
              agent: tuple[int, int] | None = None) -> bytes:
    """A PNG of at most ``max_width`` x ``max_height`` of the session's
    screen (blocking); ``agent``: a jailed session's agent (see :func:`grab`)."""
    width, height, rgb = parse_xwd(grab(display, authority, uid, gid, agent))
    new_width, new_height = fit(width, height, max_width, max_height)
    return png(new_width, new_height, scale_nearest(width, height, rgb, new_width, new_height))
