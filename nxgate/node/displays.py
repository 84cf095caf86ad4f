"""Display numbers for new sessions: which are free on this node.

A number is free when no session or unknown agent of ours holds it, its
claim file could be taken (so a second gateway on the node never gets it
too), and nothing else holds the X display or its NX port.  The caller
says what it holds already (``in_use``), so the allocator keeps no copy of
the session table.  Running out is :class:`NoFreeDisplay`, which the life
cycle answers as a failed start.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from nxgate.node import files

#: An NX display's TCP port is 4000 + the display number.
NX_PORT_OFFSET = 4000


class NoFreeDisplay(Exception):
    """Every display number of the configured range is taken."""


class DisplayAllocator:
    """Hands out display numbers from ``first`` to ``first + count - 1``, where
    ``span()`` gives ``(first, count)`` (a callable: a reload may change it)."""

    def __init__(self, span: Callable[[], tuple[int, int]], in_use: Callable[[], Iterable[int]]) -> None:
        self.span = span
        self.in_use = in_use

    def allocate(self) -> int:
        """Reserve a free display number (its claim is held until :meth:`release`)."""
        taken = set(self.in_use())
        first, count = self.span()
        for display in range(first, first + count):
            if display in taken or display + NX_PORT_OFFSET >= 65536 or not files.claim_display(display):
                continue
            if files.display_available(display):
                return display
            files.release_display(display)
        raise NoFreeDisplay("no free display for a new session")

    @staticmethod
    def claim(display: int) -> bool:
        """Hold ``display`` for a session taken back after a restart."""
        return files.claim_display(display)

    @staticmethod
    def release(display: int) -> None:
        files.release_display(display)
