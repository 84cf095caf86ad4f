"""The applications a node publishes: its .desktop files (X2Go's published-applications mode).

X2Go's clients show a menu of the server's applications and start them,
one by one, in a rootless session that runs no program of its own.  What
they list is x2goserver's ``x2gogetapps``: every .desktop file of the
published directories and of their subdirectories, its ``Name``,
``Comment``, ``Categories``, ``Terminal`` and ``Exec`` lines (translations
too) and its icon, unless it says ``NoDisplay=true`` or ``Hidden=true``.
The same is read here, as :class:`~nxgate.vocabulary.results.DesktopEntry`
values (the X2Go door writes them in x2goserver's format); and what may run
is decided here too: only the ``Exec`` line of a listed application, with
its field codes (``%f``, ``%U``, …) taken out, as the clients send it.

Reading is blocking (through the node's ``blocking``); the parsing is pure.
Everything is bounded: the number of files, a file's and an icon's size.
"""

from __future__ import annotations

import os
import re
import shlex
import stat
from collections.abc import Iterable

from nxgate.vocabulary.results import DesktopEntry

MAX_FILES = 2000
MAX_FILE_BYTES = 64 * 1024
MAX_ICON_BYTES = 512 * 1024
#: x2goserver's icon directories, in its order, and the extensions it tries (PNG first).
ICON_DIRECTORIES = tuple(
    [f"/usr/share/icons/hicolor/{size}/apps" for size in ("22x22", "24x24", "32x32", "36x36", "48x48", "64x64",
                                                           "72x72", "96x96", "128x128", "256x256", "scalable")]
    + ["/usr/share/pixmaps"])
ICON_EXTENSIONS = ("png", "svg", "jpeg", "jpg", "xpm", "bmp")
#: The lines x2gogetapps passes on (case-insensitive, at the start of a line).
_KEPT = re.compile(r"(?i)(Categories|Name|Terminal|Comment|Exec)")
_HIDDEN = re.compile(r"(NoDisplay|Hidden)[ \t]*=[ \t]*true")
#: Field codes of the Desktop Entry specification (the clients strip %f %F %u %U; a listed line has none left).
_FIELD_CODE = re.compile(r"%[fFuUdDnNickvm]")


def parse_entry(text: str) -> tuple[list[str], str | None] | None:
    """The kept lines of a .desktop file's ``[Desktop Entry]`` group, in
    order, with ``\\0ICON`` where its ``Icon`` line stood, and the icon's
    name; None for an entry not to be shown."""
    lines: list[str] = []
    icon: str | None = None
    inside = False
    for line in text.splitlines():
        line = line.rstrip("\r\n")
        if re.match(r"\[Desktop Entry\] *", line):
            inside = True
            continue
        if not inside:
            continue
        if re.match(r"\[.*\] *", line):
            break
        if _HIDDEN.match(line):
            return None
        if _KEPT.match(line):
            lines.append(line)
        if line.startswith("Icon") and icon is None:
            icon = re.sub(r"^Icon[ \t]*=", "", line)
            lines.append("\0ICON")
    return (lines, icon) if inside else None


def exec_argv(value: str) -> tuple[str, ...] | None:
    """The argv of an ``Exec`` value as the X2Go clients send it: its field
    codes removed, its words as a shell reads them (None: not readable)."""
    text = _FIELD_CODE.sub("", value).replace("%%", "%").strip()
    try:
        argv = tuple(shlex.split(text))
    except ValueError:
        return None
    return argv or None


def launchable(entries: Iterable[DesktopEntry]) -> set[tuple[str, ...]]:
    """The argvs a client may start in a published-applications session: each
    listed application's ``Exec`` (and, for ``Terminal=true``, python-x2go's
    ``x-terminal-emulator -e '…'`` around it)."""
    allowed: set[tuple[str, ...]] = set()
    for entry in entries:
        terminal = any(re.match(r"^Terminal=.*true", line, re.IGNORECASE) for line in entry.lines)
        for line in entry.lines:
            if not line.startswith("Exec="):
                continue
            value = line.split("=", 1)[1]
            argv = exec_argv(value)
            if argv:
                allowed.add(argv)
            # python-x2go takes the text up to a second '=' (line.split("=")[1]).
            cut = exec_argv(line.split("=")[1])
            if cut:
                allowed.add(cut)
            if terminal:
                allowed.add(("x-terminal-emulator", "-e", _FIELD_CODE.sub("", value).strip()))
    return allowed


def _read(path: str, limit: int) -> bytes | None:
    """A regular file's bytes (no link followed at the last step), None if unreadable or too large."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return None
        return os.read(fd, limit + 1)[:limit]
    finally:
        os.close(fd)


def find_icon(name: str, directories: tuple[str, ...] = ICON_DIRECTORIES) -> str | None:
    """x2gogetapps' icon search: an absolute path as it is; a name with a dot
    as it is in the icon directories; else each extension in turn."""
    if not name:
        return None
    if "/" in name:
        return name
    candidates = [name] if "." in name else [f"{name}.{ext}" for ext in ICON_EXTENSIONS]
    for candidate in candidates:
        for directory in directories:
            path = os.path.join(directory, candidate)
            if os.path.exists(path):
                return path
    return None


def desktop_files(directories: Iterable[str]) -> list[str]:
    """The .desktop files of ``directories`` and of their subdirectories (one
    level, as x2gogetapps reads them), each file once, in a stable order."""
    seen: set[str] = set()
    found: list[str] = []
    for base in directories:
        if not os.path.isdir(base):
            continue
        real = os.path.realpath(base)
        if real in seen:
            continue
        seen.add(real)
        try:
            subdirectories = sorted(name for name in os.listdir(base) if os.path.isdir(os.path.join(base, name)))
        except OSError:
            continue
        for directory in (base, *(os.path.join(base, name) for name in subdirectories)):
            try:
                names = sorted(name for name in os.listdir(directory) if name.endswith(".desktop"))
            except OSError:
                continue
            found.extend(os.path.join(directory, name) for name in names)
            if len(found) >= MAX_FILES:
                return found[:MAX_FILES]
    return found


def read_applications(directories: Iterable[str]) -> tuple[DesktopEntry, ...]:
    """The published applications (blocking: run it through ``blocking``)."""
    entries: list[DesktopEntry] = []
    for path in desktop_files(directories):
        data = _read(path, MAX_FILE_BYTES)
        if data is None:
            continue
        parsed = parse_entry(data.decode("utf-8", "replace"))
        if parsed is None:
            continue
        lines, icon_name = parsed
        icon = b""
        icon_path = find_icon(icon_name or "")
        if icon_path is not None:
            icon = _read(icon_path, MAX_ICON_BYTES) or b""
        at = lines.index("\0ICON") if "\0ICON" in lines else -1
        kept = tuple(line for line in lines if line != "\0ICON")
        entries.append(DesktopEntry(path=path, lines=kept, icon_at=at if icon else -1, icon=icon))
    return tuple(entries)
