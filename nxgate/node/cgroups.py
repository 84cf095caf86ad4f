"""Resource limits of jailed sessions through cgroup v2.

Each limited session gets ``<root>/nxgate/<session id>`` with the
configured ``memory.max``, ``cpu.max`` and ``pids.max``; the launcher
(:mod:`nxgate.node.runas`) moves itself into it before it starts the agent
or the program, so everything they fork is in it from the start.  Where the
machine has no writable cgroup v2 hierarchy with those controllers (cgroup
v1, a hybrid layout, a container that does not delegate them), nothing is
limited and :meth:`SessionCgroups.unavailable` says why, for one log line.

Blocking file work: callers go through ``blocking``.
"""

from __future__ import annotations

import os

ROOT = "/sys/fs/cgroup"
#: The interface files a limit is written to, and the controller each needs.
CONTROLLERS = {"memory.max": "memory", "cpu.max": "cpu", "pids.max": "pids"}


def wanted(memory_max: str, cpu_max: str, pids_max: int) -> dict[str, str]:
    """The limits configured, as cgroup interface file -> value."""
    limits = {"memory.max": memory_max.strip(), "cpu.max": cpu_max.strip(),
              "pids.max": str(pids_max) if pids_max else ""}
    return {name: value for name, value in limits.items() if value}


class SessionCgroups:
    def __init__(self, root: str = ROOT) -> None:
        self.root = root
        self.parent = os.path.join(root, "nxgate")

    def unavailable(self, limits: dict[str, str]) -> str | None:
        """None if ``limits`` can be applied here, else why not."""
        try:
            with open(os.path.join(self.root, "cgroup.controllers")) as handle:
                present = set(handle.read().split())
        except OSError:
            return f"{self.root} is not a cgroup v2 hierarchy (cgroup v1 or hybrid)"
        missing = sorted({CONTROLLERS[name] for name in limits} - present)
        if missing:
            return f"the cgroup v2 controllers {', '.join(missing)} are not available in {self.root}"
        if not os.access(self.root, os.W_OK):
            return f"{self.root} is not writable"
        return None

    def create(self, session_id: str, limits: dict[str, str]) -> str:
        """Make the session's cgroup with ``limits``; the path of its
        ``cgroup.procs``, which the launcher joins (raises OSError)."""
        controllers = " ".join(sorted(f"+{CONTROLLERS[name]}" for name in limits))
        _write(os.path.join(self.root, "cgroup.subtree_control"), controllers)
        os.makedirs(self.parent, mode=0o755, exist_ok=True)
        _write(os.path.join(self.parent, "cgroup.subtree_control"), controllers)
        group = os.path.join(self.parent, session_id)
        os.makedirs(group, mode=0o755, exist_ok=True)
        for name, value in limits.items():
            _write(os.path.join(group, name), value)
        return os.path.join(group, "cgroup.procs")

    def remove(self, session_id: str) -> None:
        """Remove an ended session's cgroup (it is empty once its processes
        are gone); a missing one is fine."""
        try:
            os.rmdir(os.path.join(self.parent, session_id))
        except FileNotFoundError:
            pass


def _write(path: str, value: str) -> None:
    with open(path, "w") as handle:
        handle.write(value)
