"""The ``listsession`` table, in the exact shape real clients parse, and its
rows read back by our client.

OpenNX is the strictest reader (reference §2.4); each row must match::

    ^(\\d+)\\s+([\\w-]+)\\s+([0-9A-F]{32})\\s+([A-Z-]{8})\\s+(\\d+)\\s+(\\d+x\\d+)\\s+(\\w+)\\s+(\\S.*)$

nxcl takes the lines after the dashes up to ``NX> 148``; Remmina takes every
non-``NX>`` line after a line starting with ``----``.  Column widths follow
Neatx and FreeNX: 7, 16, 32, 8, 5 (right-aligned), 14, 11, then the name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from nxgate.protocols.nx import errors

HEADER = (
    "Display Type             Session ID                       Options  Depth Screen"
    "         Status      Session Name"
)
DASHES = (
    "------- ---------------- -------------------------------- -------- ----- --------------"
    " ----------- ------------------------------"
)
_SESSION_ID = re.compile(r"[0-9A-F]{32}")
_OPTIONS = re.compile(r"[A-Z-]{8}")
_SCREEN = re.compile(r"\d+x\d+")


@dataclass(frozen=True)
class ListingRow:
    display: int
    session_type: str
    session_id: str
    options: str
    depth: int
    screen: str
    status: str
    name: str

    def row(self) -> str:
        if not _SESSION_ID.fullmatch(self.session_id):
            raise ValueError(f"session id must be 32 upper-case hex digits: {self.session_id!r}")
        if not _OPTIONS.fullmatch(self.options):
            raise ValueError(f"options must be 8 characters of A-Z or '-': {self.options!r}")
        if not _SCREEN.fullmatch(self.screen):
            raise ValueError(f"screen must be WxH: {self.screen!r}")
        status = self.status if self.status.isalnum() else "Unknown"
        # The name is the last column and may hold spaces, never line breaks.
        name = " ".join(self.name.split()) or "-"
        type_ = re.sub(r"[^\w-]", "-", self.session_type) or "-"
        return (
            f"{self.display:<7} {type_:<16} {self.session_id:<32} {self.options:<8} "
            f"{self.depth:>5} {self.screen:<14} {status:<11} {name}"
        )


def session_options(*, fullscreen: bool, render: bool, virtual_desktop: bool) -> str:
    """The 8-character options column (Neatx: ``F``, ``R``, ``D``, ``-``, ``-``, ``P``, ``S``, ``A``)."""
    return (
        ("F" if fullscreen else "-")
        + ("R" if render else "-")
        + ("D" if virtual_desktop else "-")
        + "--PSA"
    )


def format_session_list(user: str, sessions: Iterable[ListingRow], *, capacity_reached: bool) -> list[str]:
    """The lines of a ``listsession`` reply up to (not including) the prompt."""
    lines = [f"NX> {errors.SESSION_LIST} Session list of user '{user}':", HEADER, DASHES]
    lines.extend(session.row() for session in sessions)
    lines.append("")
    if capacity_reached:
        lines.append(f"NX> {errors.CAPACITY_REACHED} Server capacity: reached for user: {user}")
    else:
        lines.append(f"NX> {errors.CAPACITY_NOT_REACHED} Server capacity: not reached for user: {user}")
    return lines


# ------------------------------------------------ the client reading the table
@dataclass(frozen=True)
class ParsedRow:
    """One row of the ``listsession`` table (reference §2.4)."""

    display: str
    session_type: str
    session_id: str
    options: str
    depth: str
    screen: str
    status: str
    name: str


def parse_row(text: str) -> ParsedRow | None:
    """One table row: seven space-separated columns, then the name, which
    may contain spaces (Remmina's reading, reference §2.4)."""
    columns = text.split(None, 7)
    if len(columns) < 7:
        return None
    name = columns[7].strip() if len(columns) > 7 else ""
    return ParsedRow(*columns[:7], name=name)
