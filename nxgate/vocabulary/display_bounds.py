"""What a client may ask of a session's screen, the same at every door (pure).

The NX door (:mod:`nxgate.protocols.nx.requests`, ``NX> 597``) and the X2Go
door (:mod:`nxgate.gateway.doors.conch.x2go.commands`, x2gostartagent's and
x2goresume-session's error) ask these questions, each answering in its own
client's words; nxagent would otherwise clamp what it cannot show, and a
session would run at a size nobody asked for.
"""

from __future__ import annotations

MIN_SIDE = 64
MAX_SIDE = 16384
DEPTHS = (8, 15, 16, 24, 32)


def size_problem(width: int, height: int) -> str | None:
    """Why a ``width`` x ``height`` screen cannot be had, or None."""
    if MIN_SIDE <= width <= MAX_SIDE and MIN_SIDE <= height <= MAX_SIDE:
        return None
    return f"size out of range ({MIN_SIDE}x{MIN_SIDE} to {MAX_SIDE}x{MAX_SIDE})"


def depth_problem(depth: int) -> str | None:
    """Why a colour depth cannot be had, or None."""
    if depth in DEPTHS:
        return None
    return "depth must be " + ", ".join(str(d) for d in DEPTHS[:-1]) + f" or {DEPTHS[-1]}"
