"""Session thumbnails: a small PNG of an agent's framebuffer.

``xwd -root`` against the session's display, run as the session's user
with the session's X authority file (the gateway never opens the user's
authority file itself), then scaled down (nearest pixel) and written as a
PNG with :mod:`zlib`.  Blocking: run it in a thread.
"""

from __future__ import annotations

import os
import struct
import subprocess
import zlib

MAX_DUMP_BYTES = 64 << 20
XWD_TIMEOUT = 10.0


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


def grab(display: int, authority: str, uid: int, gid: int) -> bytes:
    """The raw ``xwd`` dump of ``:display``'s root window, taken as ``uid``:``gid``."""
    env = {"PATH": "/usr/bin:/bin", "DISPLAY": f":{display}", "XAUTHORITY": authority}
    try:
        result = subprocess.run(["xwd", "-silent", "-root"], env=env, capture_output=True, timeout=XWD_TIMEOUT,
                                user=uid if os.geteuid() == 0 else None, group=gid if os.geteuid() == 0 else None,
                                extra_groups=[] if os.geteuid() == 0 else None, cwd="/", check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ThumbnailError(f"xwd on :{display}: {error}") from error
    if result.returncode != 0:
        raise ThumbnailError(f"xwd on :{display} failed: {result.stderr.decode(errors='replace').strip()[:200]}")
    if len(result.stdout) > MAX_DUMP_BYTES:
        raise ThumbnailError(f"xwd on :{display}: dump too large")
    return result.stdout


def thumbnail(display: int, authority: str, uid: int, gid: int, max_width: int = 240, max_height: int = 180) -> bytes:
    """A PNG of at most ``max_width`` x ``max_height`` of the session's screen (blocking)."""
    width, height, rgb = parse_xwd(grab(display, authority, uid, gid))
    new_width, new_height = fit(width, height, max_width, max_height)
    return png(new_width, new_height, scale_nearest(width, height, rgb, new_width, new_height))
