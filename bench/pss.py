"""Memory of processes as PSS, read from /proc/PID/smaps_rollup.

A sum of RSS counts every shared library once per process, so it favours
the side with fewer processes (X2Go's session has a wrapper script and an
sshd, nxgate's none); PSS divides each shared page among the processes
that map it, so the PSS of a set of processes adds up to what they cost
together.  Both sides of a comparison are measured at the same moment:
the nxagent binary and its libraries are shared by every agent on the
machine, so the file part of an agent's PSS depends on how many agents
run, and the anonymous and shared-memory parts (private to it) do not.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from relay import comm, descendants

#: smaps_rollup fields kept, and the names they get in the JSON.
FIELDS = {"Pss": "pss", "Pss_Anon": "anon", "Pss_File": "file", "Pss_Shmem": "shmem", "Rss": "rss"}


def rollup(pid: int) -> dict[str, int]:
    """kB of ``pid``'s memory by kind (all 0 once it is gone)."""
    out = dict.fromkeys(FIELDS.values(), 0)
    try:
        with open(f"/proc/{pid}/smaps_rollup") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key in FIELDS:
                    out[FIELDS[key]] = int(value.split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return out


def owner(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def tree(root: int) -> list[int]:
    """``root`` and all its descendants."""
    return [root, *descendants(root)]


def user_pids(uid: int) -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit() and owner(int(entry)) == uid]


def by_name(pids: Iterable[int]) -> dict[str, dict[str, int]]:
    """Summed kB per process name, with the count of processes (``n``)."""
    out: dict[str, dict[str, int]] = {}
    for pid in pids:
        figures = rollup(pid)
        if not figures["rss"]:
            continue  # gone, or a kernel thread
        entry = out.setdefault(comm(pid), {"n": 0, **dict.fromkeys(FIELDS.values(), 0)})
        entry["n"] += 1
        for key, value in figures.items():
            entry[key] += value
    return out


def total(groups: dict[str, dict[str, int]], names: Iterable[str] | None = None, key: str = "pss") -> int:
    """kB of ``key`` summed over ``names`` (all when None)."""
    wanted = set(groups) if names is None else set(names)
    return sum(entry[key] for name, entry in groups.items() if name in wanted)
