"""Where a new session runs: the least-loaded node, by a documented score
(issue 13, "Placement").  Pure: members in, a name (or a refusal) out.

A member may take a new session when it is

* a node (role ``node``), up by its last heartbeat and by this gateway's
  link to it (:func:`nxgate.gateway.membership.state`: a node whose
  certificate the link refused, or that it cannot reach, is never chosen;
  one whose first attempt is under way may be),
* not drained by the admin, with a weight above 0,
* and reports at least :data:`MIN_FREE_MEMORY` of available memory.

Among those, the lowest score wins::

    score = (sessions + 1 + load1) / (cpus × weight)

``sessions`` is the member's live sessions at its last heartbeat, ``+ 1``
the session being placed (so an idle 8-CPU node beats an idle 1-CPU one
by the new session's share, not only by load), ``load1`` its 1-minute
load average, ``cpus`` its CPU count and ``weight`` the admin's
``[cluster] weight`` (2 takes twice the share of 1).  Sessions are counted
beside the load because a suspended session has no load but still holds
memory and a display, and a session just started has no load yet.  Equal
scores go to the name that sorts first, so the choice is reproducible.

``pending`` counts sessions placed since the last heartbeat (the store
row's ``sessions`` lags by up to one heartbeat): without it, a burst of
starts would all go to the node that was idlest a heartbeat ago.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from nxgate.gateway.membership import DEFAULT_HEARTBEAT, Links, no_links, reachable, state
from nxgate.vocabulary.errors import Kind, SessionError
from nxgate.vocabulary.model import Member

#: A node with less available memory takes no new session (an nxagent and a
#: desktop need about this much to start).
MIN_FREE_MEMORY = 128 * 1024 * 1024

NO_NODE = "No machine of this cluster can take a new session now; try again later."


def score(member: Member, pending: int = 0) -> float:
    """``(sessions + pending + 1 + load1) / (cpus × weight)``; lower is better."""
    return (member.sessions + pending + 1 + max(member.load, 0.0)) / (max(member.cpus, 1) * member.weight)


def eligible(member: Member, now: float, heartbeat: float = DEFAULT_HEARTBEAT, link: str | None = None) -> bool:
    """May ``member`` take a new session (role node, reachable, not drained, weighted, memory)?"""
    return ("node" in member.roles and reachable(state(member, now, heartbeat, link)) and not member.drained
            and member.weight > 0 and member.free_memory >= MIN_FREE_MEMORY)


def ranked(members: Iterable[Member], now: float, heartbeat: float = DEFAULT_HEARTBEAT,
           pending: Mapping[str, int] | None = None, links: Links = no_links) -> list[Member]:
    """The eligible members, best first (score, then name)."""
    pending = pending or {}
    return sorted((m for m in members if eligible(m, now, heartbeat, links(m.name))),
                  key=lambda m: (score(m, pending.get(m.name, 0)), m.name))


def place(members: Iterable[Member], now: float, heartbeat: float = DEFAULT_HEARTBEAT,
          pending: Mapping[str, int] | None = None, links: Links = no_links) -> Member:
    """The member a new session goes to; LIMIT_REACHED (``NX> 599``) when none may take one."""
    best = ranked(members, now, heartbeat, pending, links)
    if not best:
        raise SessionError(Kind.LIMIT_REACHED, NO_NODE)
    return best[0]
