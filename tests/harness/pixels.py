"""Pixel-level checks: what a session drew against what the client shows.

Two pictures meet here: nxagent's own framebuffer (``xwd -root`` against the
session's display with the session's X authority file: what the programs in
the session drew) and the client's screen (the Xvfb nxproxy draws into).
Over a lossless link the NX window on the client must hold exactly the
session's pixels; a shadow viewer's window must hold the watched screen,
whole, at 1:1 or uniformly scaled to fit.
"""

from __future__ import annotations

import os
import re
import struct
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

from tests.harness.process import stop, wait_for
from tests.harness.x11 import Screenshot

Colour = tuple[int, int, int]


# ------------------------------------------------------------------ grabbing
def parse_xwd(data: bytes) -> Screenshot:
    """An XWD dump (as ``xwd`` writes it: big-endian header, ZPixmap data)
    as an RGBA screenshot.  Handles the 24/32 bits-per-pixel TrueColor
    dumps of Xvfb and nxagent; anything else is refused."""
    if len(data) < 100:
        raise ValueError("not an XWD dump: too short")
    header = struct.unpack(">25I", data[:100])
    (header_size, version, pixmap_format, _depth, width, height, _xoffset, byte_order, _unit, _bit_order, _pad,
     bits_per_pixel, bytes_per_line, _visual_class, red_mask, green_mask, blue_mask, _bits_per_rgb,
     _entries, ncolors) = header[:20]
    if version != 7 or pixmap_format != 2 or bits_per_pixel not in (24, 32):
        raise ValueError(f"unsupported XWD dump: version {version} format {pixmap_format} bpp {bits_per_pixel}")
    offset = header_size + 12 * ncolors
    step = bits_per_pixel // 8
    order = "little" if byte_order == 0 else "big"
    shifts = [(mask, (mask & -mask).bit_length() - 1) for mask in (red_mask, green_mask, blue_mask)]
    out = bytearray(4 * width * height)
    index = 0
    for y in range(height):
        row = data[offset + y * bytes_per_line: offset + y * bytes_per_line + width * step]
        if len(row) < width * step:
            raise ValueError("truncated XWD dump")
        if step == 4 and order == "little" and shifts == [(0xFF0000, 16), (0xFF00, 8), (0xFF, 0)]:
            # The common case (BGRX in memory): reorder with slices, fast.
            out[index:index + 4 * width:4] = row[2::4]
            out[index + 1:index + 4 * width:4] = row[1::4]
            out[index + 2:index + 4 * width:4] = row[0::4]
            out[index + 3:index + 4 * width:4] = b"\xff" * width
            index += 4 * width
            continue
        for x in range(width):
            pixel = int.from_bytes(row[x * step:(x + 1) * step], order)
            out[index:index + 4] = bytes([*((pixel & m) >> s for m, s in shifts), 255])
            index += 4
    return Screenshot(width, height, bytes(out))


def grab(display: str, authority: str | None = None, window: str | None = None) -> Screenshot:
    """``xwd`` of a display's root window (or of one window by id), with
    ``authority`` as XAUTHORITY (a session's display needs its cookie)."""
    env = dict(os.environ, DISPLAY=display)
    if authority is not None:
        env["XAUTHORITY"] = authority
    target = ["-id", window] if window else ["-root"]
    result = subprocess.run(["xwd", "-silent", *target], env=env, capture_output=True, timeout=30)
    if result.returncode != 0:
        raise AssertionError(f"xwd on {display} failed: {result.stderr.decode(errors='replace')}")
    return parse_xwd(result.stdout)


# ------------------------------------------------------------------- windows
@dataclass(frozen=True)
class Rect:
    x: int
    y: int
    width: int
    height: int


_TREE_LINE = re.compile(r'^\s*(0x[0-9a-f]+) (?:"(.*)"|\(has no name\)):.*?\s(\d+)x(\d+)[+-]-?\d+[+-]-?\d+\s+([+-]-?\d+)([+-]-?\d+)\s*$')


def windows(display: str, authority: str | None = None) -> Iterator[tuple[str, str, Rect]]:
    """(id, name, absolute rectangle) of every window, from ``xwininfo -tree``."""
    env = dict(os.environ, DISPLAY=display)
    if authority is not None:
        env["XAUTHORITY"] = authority
    for _ in range(5):  # a window that goes while xwininfo walks the tree fails the walk
        result = subprocess.run(["xwininfo", "-root", "-tree"], env=env, capture_output=True)
        if result.returncode == 0:
            break
    else:
        raise AssertionError(f"xwininfo on {display} failed: {result.stderr.decode(errors='replace').strip()}")
    for raw in result.stdout.splitlines():
        # WM_NAME is a STRING (Latin-1) or a UTF8_STRING: xwininfo prints its bytes as they are.
        try:
            line = raw.decode()
        except UnicodeDecodeError:
            line = raw.decode("latin-1")
        match = _TREE_LINE.match(line)
        if match:
            wid, name, width, height, x, y = match.groups()
            yield wid, name or "", Rect(int(x.replace("+-", "-")), int(y.replace("+-", "-")), int(width), int(height))


def find_window(display: str, name_part: str, authority: str | None = None, min_size: int = 2) -> Rect | None:
    """The largest window whose name contains ``name_part`` (nxagent's top
    window on the client is ``NX - user@host:N - name``)."""
    found = [rect for _, name, rect in windows(display, authority)
             if name_part in name and rect.width >= min_size and rect.height >= min_size]
    return max(found, key=lambda r: r.width * r.height) if found else None


# ---------------------------------------------------------------- comparing
def crop(shot: Screenshot, rect: Rect) -> Screenshot:
    """The part of ``shot`` inside ``rect`` (clipped to the picture)."""
    x0, y0 = max(rect.x, 0), max(rect.y, 0)
    x1, y1 = min(rect.x + rect.width, shot.width), min(rect.y + rect.height, shot.height)
    if x1 <= x0 or y1 <= y0:
        return Screenshot(0, 0, b"")
    rows = [shot.rgba[4 * (y * shot.width + x0): 4 * (y * shot.width + x1)] for y in range(y0, y1)]
    return Screenshot(x1 - x0, y1 - y0, b"".join(rows))


def equal_share(a: Screenshot, b: Screenshot, tolerance: int = 0) -> float:
    """The share of pixels equal in both pictures, over the larger one's
    area (so a missing part counts as different); ``tolerance``: how far
    each of a pixel's colour channels may be off and still count as equal."""
    area = max(a.width * a.height, b.width * b.height)
    if area == 0:
        return 0.0
    width, height = min(a.width, b.width), min(a.height, b.height)
    equal = 0
    for y in range(height):
        row_a = a.rgba[4 * y * a.width: 4 * (y * a.width + width)]
        row_b = b.rgba[4 * y * b.width: 4 * (y * b.width + width)]
        if row_a == row_b:
            equal += width
        elif tolerance:
            equal += sum(1 for i in range(0, 4 * width, 4)
                         if all(abs(row_a[i + c] - row_b[i + c]) <= tolerance for c in range(3)))
        else:
            equal += sum(1 for i in range(0, 4 * width, 4) if row_a[i:i + 3] == row_b[i:i + 3])
    return equal / area


def save_png(shot: Screenshot, path: str) -> str:
    """Write ``shot`` as PNG (for a human to look at); returns the path."""
    ppm = path + ".ppm"
    shot.save(ppm)
    subprocess.run(["convert", ppm, path], check=True)
    os.unlink(ppm)
    return path


# ------------------------------------------------------------------ patterns
CORNERS: dict[str, Colour] = {"top-left": (255, 0, 0), "top-right": (0, 255, 0),
                              "bottom-left": (0, 0, 255), "bottom-right": (255, 255, 0)}
BORDER: Colour = (255, 0, 255)


@dataclass(frozen=True)
class Pattern:
    """A test card: a checkerboard of ``cell``-pixel squares, a one-pixel
    magenta border and a coloured square in each corner.  Cropping loses a
    corner; a wrong scale or aspect moves the cells off where
    :meth:`expected` says they are."""

    width: int
    height: int
    cell: int = 32
    corner: int = 48

    def colour(self, x: int, y: int) -> Colour:
        w, h, c = self.width, self.height, self.corner
        if y < c and x < c:
            return CORNERS["top-left"]
        if y < c and x >= w - c:
            return CORNERS["top-right"]
        if y >= h - c and x < c:
            return CORNERS["bottom-left"]
        if y >= h - c and x >= w - c:
            return CORNERS["bottom-right"]
        if x in (0, w - 1) or y in (0, h - 1):
            return BORDER
        return (255, 255, 255) if (x // self.cell + y // self.cell) % 2 else (0, 0, 0)

    def ppm(self) -> bytes:
        body = bytearray()
        for y in range(self.height):
            for x in range(self.width):
                body += bytes(self.colour(x, y))
        return f"P6 {self.width} {self.height} 255\n".encode() + bytes(body)

    def probes(self) -> Iterator[tuple[int, int, Colour]]:
        """Points well inside each cell and corner square, with their colour."""
        half = self.cell // 2
        for cy in range(0, self.height, self.cell):
            for cx in range(0, self.width, self.cell):
                x, y = cx + half, cy + half
                if x < self.width - 2 and y < self.height - 2 and self._solid(x, y):
                    yield x, y, self.colour(x, y)
        c = self.corner // 2
        for x, y in ((c, c), (self.width - c, c), (c, self.height - c), (self.width - c, self.height - c)):
            yield x, y, self.colour(x, y)

    def _solid(self, x: int, y: int) -> bool:
        """True if the pixels within a quarter cell around share its colour
        (a probe there survives rounding of any scale)."""
        q = max(self.cell // 4, 1)
        colour = self.colour(x, y)
        return all(self.colour(min(max(px, 0), self.width - 1), min(max(py, 0), self.height - 1)) == colour
                   for px in (x - q, x + q) for py in (y - q, y + q))

    def mismatches(self, shot: Screenshot, at: Rect) -> list[tuple[int, int, Colour, Colour]]:
        """Probes whose colour differs in ``shot``, where the card should
        fill ``at`` (scaled uniformly or not: the scale comes from ``at``)."""
        sx, sy = at.width / self.width, at.height / self.height
        wrong = []
        for x, y, colour in self.probes():
            px, py = at.x + int(x * sx), at.y + int(y * sy)
            seen = shot.pixel(px, py) if 0 <= px < shot.width and 0 <= py < shot.height else (-1, -1, -1)
            if seen != colour:
                wrong.append((x, y, colour, seen))  # type: ignore[arg-type]
        return wrong


def paint_root(display: str, authority: str | None, pattern: Pattern, workdir: str) -> None:
    """Make ``pattern`` the root window's background on ``display``
    (ImageMagick's ``display -window root``; it exits 1 even when it worked,
    so the caller checks the picture)."""
    path = os.path.join(workdir, f"pattern-{pattern.width}x{pattern.height}.ppm")
    with open(path, "wb") as handle:
        handle.write(pattern.ppm())
    env = dict(os.environ, DISPLAY=display)
    if authority is not None:
        env["XAUTHORITY"] = authority
    subprocess.run(["display", "-window", "root", path], env=env, capture_output=True, timeout=60)


def fit(width: int, height: int, area_width: int, area_height: int) -> tuple[int, int]:
    """The size a ``width`` x ``height`` picture has at 1:1 if it fits in
    the area, else scaled down uniformly to fit (the test's own reckoning,
    independent of the gateway's)."""
    if width <= area_width and height <= area_height:
        return width, height
    scale = min(area_width / width, area_height / height)
    return max(int(width * scale), 1), max(int(height * scale), 1)


def window_manager_running(display: str) -> bool:
    """True once a window manager announced itself on ``display`` (EWMH)."""
    out = subprocess.run(["xprop", "-root", "_NET_SUPPORTING_WM_CHECK"], env=dict(os.environ, DISPLAY=display),
                         capture_output=True, text=True).stdout
    return "window id" in out


def start_window_manager(display: str) -> subprocess.Popen:
    """xfwm4 (no compositing) on a client screen, as a user's desktop has:
    nxagent looks for a window manager on the client display and, finding
    none, ignores the size it was given and takes the whole screen."""
    process = subprocess.Popen(["xfwm4", "--compositor=off", "--sm-client-disable"],
                               env=dict(os.environ, DISPLAY=display), stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: window_manager_running(display), 20, f"a window manager on {display}")
    except BaseException:
        stop(process)
        raise
    return process
