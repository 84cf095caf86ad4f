"""Resource limits of jailed sessions through cgroup v2, in the subtree
that systemd delegates to the gateway.

The shipped unit says ``Delegate=yes``: the service's own cgroup (read from
``/proc/self/cgroup``) is ours to divide, and nothing above it is ever
written.  cgroup v2 lets only leaves hold processes once controllers are
switched on for the children, so the first limited session moves every
process of the service's cgroup (twistd, and the agents and desktops that
``KillMode=process`` left there across restarts) into ``<own>/gateway``,
switches the controllers on for ``<own>`` and ``<own>/sessions``, and
makes ``<own>/sessions/<session id>`` with the configured ``memory.max``,
``cpu.max`` and ``pids.max``; the launcher (:mod:`nxgate.host.runas`)
moves itself into that group before it starts the agent or the program,
so everything they fork is in it from the start.

Where that cannot work -- cgroup v1 or a hybrid layout, controllers that
are not delegated, a read-only tree (``ProtectControlGroups=yes``), or a
gateway in the root cgroup (not run as a service: its "own" cgroup would be
the whole machine's) -- nothing is limited and :meth:`SessionCgroups.unavailable`
says why, for one log line.

Blocking file work: callers go through ``blocking``.
"""

from __future__ import annotations

import os

ROOT = "/sys/fs/cgroup"
#: The interface files a limit is written to, and the controller each needs.
CONTROLLERS = {"memory.max": "memory", "cpu.max": "cpu", "pids.max": "pids"}
#: Where the service's own processes go, and where the sessions' groups go, under its cgroup.
GATEWAY_GROUP, SESSIONS_GROUP = "gateway", "sessions"


def wanted(memory_max: str, cpu_max: str, pids_max: int) -> dict[str, str]:
    """The limits configured, as cgroup interface file -> value."""
    limits = {"memory.max": memory_max.strip(), "cpu.max": cpu_max.strip(),
              "pids.max": str(pids_max) if pids_max else ""}
    return {name: value for name, value in limits.items() if value}


def own_cgroup(text: str) -> str | None:
    """This process's cgroup v2 path from ``/proc/self/cgroup`` (the ``0::``
    line), or None on a machine without one."""
    for line in text.splitlines():
        if line.startswith("0::"):
            return line[3:].strip() or None
    return None


def _read_own() -> str | None:
    try:
        with open("/proc/self/cgroup") as handle:
            return own_cgroup(handle.read())
    except OSError:
        return None


class SessionCgroups:
    """The sessions' cgroups under the service's own (``own``: its path
    below ``root``, read from /proc/self/cgroup unless given)."""

    def __init__(self, root: str = ROOT, own: str | None = None) -> None:
        self.root = root
        self.own = own if own is not None else _read_own()
        self.base = os.path.join(root, (self.own or "/").lstrip("/"))
        self.parent = os.path.join(self.base, SESSIONS_GROUP)

    def unavailable(self, limits: dict[str, str]) -> str | None:
        """None if ``limits`` can be applied here, else why not."""
        if not os.path.exists(os.path.join(self.root, "cgroup.controllers")):
            return f"{self.root} is not a cgroup v2 hierarchy (cgroup v1 or hybrid)"
        if self.own is None or self.own == "/":
            return ("the gateway runs in the root cgroup; run it as the systemd service, whose Delegate=yes "
                    "gives it a cgroup subtree of its own")
        try:
            with open(os.path.join(self.base, "cgroup.controllers")) as handle:
                present = set(handle.read().split())
        except OSError as error:
            return f"the gateway's cgroup {self.base} cannot be read: {error.strerror}"
        missing = sorted({CONTROLLERS[name] for name in limits} - present)
        if missing:
            return (f"the cgroup v2 controllers {', '.join(missing)} are not delegated to {self.base} "
                    "(the unit needs Delegate=yes)")
        if not os.access(self.base, os.W_OK):
            return f"{self.base} is not writable (the unit needs Delegate=yes and ProtectControlGroups=no)"
        return None

    def create(self, session_id: str, limits: dict[str, str]) -> str:
        """Make the session's cgroup with ``limits``; the path of its
        ``cgroup.procs``, which the launcher joins (raises OSError)."""
        controllers = " ".join(sorted(f"+{CONTROLLERS[name]}" for name in limits))
        self._leave_the_inner_node()
        _write(os.path.join(self.base, "cgroup.subtree_control"), controllers)
        os.makedirs(self.parent, mode=0o755, exist_ok=True)
        _write(os.path.join(self.parent, "cgroup.subtree_control"), controllers)
        group = os.path.join(self.parent, session_id)
        os.makedirs(group, mode=0o755, exist_ok=True)
        for name, value in limits.items():
            _write(os.path.join(group, name), value)
        return os.path.join(group, "cgroup.procs")

    def _leave_the_inner_node(self) -> None:
        """Every process still in the service's cgroup goes to ``gateway``
        (cgroup v2: a group that gives controllers to its children holds
        no processes itself)."""
        gateway = os.path.join(self.base, GATEWAY_GROUP)
        os.makedirs(gateway, mode=0o755, exist_ok=True)
        with open(os.path.join(self.base, "cgroup.procs")) as handle:
            pids = handle.read().split()
        for pid in pids:
            try:
                _write(os.path.join(gateway, "cgroup.procs"), pid)
            except ProcessLookupError:
                continue  # it ended meanwhile

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
