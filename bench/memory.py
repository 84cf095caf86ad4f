#!/usr/bin/env python3
"""Memory per session, nxgate beside x2goserver in the same run, as PSS.

The sides, their sessions up at the same time and measured at the same
moment (the agents share one binary, so the file part of their PSS depends
on how many run: measured together, every side gets the same share):

* ``nxgate``: nxgate-client application sessions shown rootless
  (``--rootless``) through the real gateway;
* ``x2go``: x2goserver over a private sshd, with pyhoca-cli
  (``-t application``: x2goagent ``-R``);
* ``door``: the same pyhoca-cli against nxgate's X2Go door.

Each side runs ``--sessions`` sessions of ``xterm -geometry 40x10`` at
800x600, all attached, then all suspended (the clients go away as a user's
do), and is measured in both states from /proc/PID/smaps_rollup:

* ``agent + program``: the agent, the xterm and its shell (the same
  processes on every side);
* ``every process``: every process of the session's user (X2Go's also has
  its wrapper script ``x2goruncommand`` and, attached, the user's ``sshd``
  and ``sftp-server``), plus the private memory the server's process tree
  (the gateway and its children; sshd and its per-connection ``[priv]``
  processes) gained since it served one login and held still; both divided
  by the number of sessions.

Both sides' sessions run with the same LANG (``--locale``, C.UTF-8 by
default): nxgate's sessions take [sessions] lang when PAM sets none, and
X2Go's private sshd gets ``SetEnv LANG=...``, as ``pam_env`` would give both
from /etc/default/locale on an installed system (this machine has none,
so X2Go's programs would otherwise run in the C locale, where Xlib loads no
compose table).  A fourth side, ``x2go_no_lang``, is x2goserver with no
LANG at all, as this machine's PAM leaves its sessions.

Needs root.  With --install the Debian packages x2goserver,
x2goserver-xsession and pyhoca-cli are installed when missing; without
them the X2Go sides are reported as not measured.

    .venv/bin/python bench/memory.py [--sessions 10] [--locale C.UTF-8] [--sides ...] [--install] [--json FILE]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import time
import traceback
from collections.abc import Iterable

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
sys.path.insert(0, HERE)

import pss  # noqa: E402
from relay import ensure_packages  # noqa: E402
from sessions import Bench  # noqa: E402
from x2go import PACKAGES, NxgateX2GoBench, X2GoBench  # noqa: E402

from tests.harness.process import wait_for  # noqa: E402

GEOMETRY = "800x600"
SETTLE = 5.0
AGENTS = ("nxagent", "x2goagent")
PROGRAM = ("xterm", "bash")


def application(index: int) -> str:
    return f"xterm -geometry 40x10+{index * 3}+0"


class Side:
    """One product's sessions: how to start and suspend them, whose processes they are."""

    key = ""
    label = ""

    def __init__(self, count: int, locale: str) -> None:
        self.count = count
        self.locale = locale
        self.clients: list[subprocess.Popen] = []
        self.retried: list[int] = []  # sessions whose client gave up once and were started again
        self.server_idle: dict[int, dict[str, int]] = {}

    # what subclasses say
    @property
    def uid(self) -> int:
        raise NotImplementedError

    def server_root(self) -> int:
        raise NotImplementedError

    def launch(self, index: int) -> subprocess.Popen:
        """Start the client of session ``index``."""
        raise NotImplementedError

    def start(self, index: int) -> None:
        client = self.launch(index)
        if index < len(self.clients):
            self.clients[index] = client  # started again
        else:
            self.clients.append(client)

    def suspend_all(self) -> None:
        """The clients go away, as a user's do: the sessions suspend."""
        raise NotImplementedError

    def suspended(self) -> int:
        """How many of the user's sessions are suspended."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def log_tail(self, index: int) -> str:
        """The end of session ``index``'s client log, if the side keeps one."""
        return ""

    # what every side does
    def programs(self) -> int:
        return sum(1 for pid in pss.user_pids(self.uid) if pss.comm(pid) == "xterm")

    def server_pids(self) -> list[int]:
        """The server's process tree, without the user's processes."""
        return [pid for pid in pss.tree(self.server_root()) if pss.owner(pid) != self.uid]

    def warm_up(self) -> None:
        """One login with no session, so that what a server pays once (its
        first connection, workers still loading) is not counted per session."""
        raise NotImplementedError

    def private_kb(self) -> int:
        return sum(pss.rollup(pid)["anon"] + pss.rollup(pid)["shmem"] for pid in self.server_pids())

    def mark_idle(self) -> None:
        """The server's processes once their private memory holds still
        (two looks a second apart within 64 kB, or after a minute)."""
        last, deadline = self.private_kb(), time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(1)
            now = self.private_kb()
            if abs(now - last) <= 64:
                break
            last = now
        self.server_idle = {pid: pss.rollup(pid) for pid in self.server_pids()}

    def server_growth(self) -> dict[str, float]:
        """kB the server's process tree grew by since :meth:`mark_idle`: its
        private memory (anonymous + shared: ``pss``) and RSS, over every
        process in it then and now (sshd's per-connection processes come and
        go; nxgate's launcher keeps spare helpers, replaced as they are
        used).  Not PSS: the file part of a Python gateway's PSS falls when
        other Python processes (the clients, here on the same machine) map
        the same libraries, which is no saving of the server's; so new
        server processes count without their share of shared libraries."""
        def total(figures: Iterable[dict[str, int]], key: str) -> int:
            return sum(f["anon"] + f["shmem"] if key == "pss" else f[key] for f in figures)

        now = [pss.rollup(pid) for pid in self.server_pids()]
        before = list(self.server_idle.values())
        return {key: float(total(now, key) - total(before, key)) for key in ("pss", "anon", "rss")}

    def snapshot(self) -> dict:
        user = pss.by_name(pss.user_pids(self.uid))
        server = pss.by_name(self.server_pids())
        per = self.count
        agent_program = [name for name in user if name in AGENTS or name in PROGRAM]
        growth = {key: value / per for key, value in self.server_growth().items()}
        return {
            "sessions": per,
            "agents": sum(entry["n"] for name, entry in user.items() if name in AGENTS),
            "agent_kb": {key: pss.total(user, [n for n in user if n in AGENTS], key) / per
                         for key in ("pss", "anon", "shmem", "rss")},
            "program_kb": {key: pss.total(user, [n for n in user if n in PROGRAM], key) / per
                           for key in ("pss", "anon", "rss")},
            "agent_plus_program_kb": pss.total(user, agent_program) / per,
            "user_processes_kb": pss.total(user) / per,
            "server_growth_kb": growth["pss"],
            "server_growth": growth,
            "every_process_kb": pss.total(user) / per + growth["pss"],
            "rss_sum_kb": (pss.total(user, key="rss") + growth["rss"]) / per,
            "user_by_name": user,
            "server_by_name": server,
        }


class NxgateSide(Side):
    key = "nxgate"
    label = "nxgate (nxgate-client, rootless)"

    def __init__(self, count: int, locale: str) -> None:
        super().__init__(count, locale)
        self.bench = Bench(count, lang=locale)

    @property
    def uid(self) -> int:
        return self.bench.user.entry.pw_uid

    def server_root(self) -> int:
        return self.bench.gateway.process.pid

    def launch(self, index: int) -> subprocess.Popen:
        return self.bench.client("--type", "unix-application", "--rootless", "--application", application(index),
                                 "--geometry", GEOMETRY, wait=False)

    def warm_up(self) -> None:
        self.bench.client("--list")

    def suspend_all(self) -> None:
        for client in self.clients:
            client.terminate()  # nxgate-client goes: the channel closes, the session suspends
        for client in self.clients:
            client.wait(60)
            client.stdout.close()
            client.stderr.close()

    def suspended(self) -> int:
        return suspended_agents(self.bench.gateway.state_dir)

    def close(self) -> None:
        self.bench.close()


class X2GoSide(Side):
    """x2goserver with pyhoca-cli; ``door`` the same client against nxgate's X2Go door."""

    def __init__(self, count: int, locale: str, door: bool = False) -> None:
        """``locale``: the LANG of the sessions ("": X2Go's sshd sets none)."""
        super().__init__(count, locale)
        self.door = door
        if door:
            self.key, self.label = "door", "nxgate's X2Go door (pyhoca-cli)"
        elif locale:
            self.key, self.label = "x2go", "x2goserver (pyhoca-cli)"
        else:
            self.key, self.label = "x2go_no_lang", "x2goserver, no LANG (as PAM leaves it here)"
        if door:
            self.bench = NxgateX2GoBench(lang=locale)
        else:
            self.bench = X2GoBench(session_environment={"LANG": locale} if locale else {})

    @property
    def uid(self) -> int:
        return self.bench.user.entry.pw_uid

    def server_root(self) -> int:
        return self.bench.gateway.process.pid if self.door else self.bench.sshd.pid

    def launch(self, index: int) -> subprocess.Popen:
        return self.bench.cli("-c", application(index), "-t", "application", "-g", GEOMETRY, "-q", "lan",
                              "--sound", "none", log=f"memory{index}.log", wait=False)

    def warm_up(self) -> None:
        self.bench.cli("--list-sessions", log="warm-up.log")

    def suspend_all(self) -> None:
        for client in self.clients:
            self.bench.kill(client)  # as the peer script does: pyhoca-cli goes, the session suspends

    def log_tail(self, index: int) -> str:
        try:
            return self.bench.read_log(f"memory{index}.log")[-600:]
        except OSError:
            return "(no log)"

    def suspended(self) -> int:
        if self.door:
            return suspended_agents(self.bench.gateway.state_dir)
        out = subprocess.run(["runuser", "-u", self.bench.user.name, "--", "x2golistsessions"], capture_output=True,
                             text=True, timeout=60).stdout
        return sum(1 for line in out.splitlines() if len(line.split("|")) > 4 and line.split("|")[4] == "S")

    def close(self) -> None:
        self.bench.close()


def suspended_agents(state_dir: str) -> int:
    """How many of a gateway's agents said last that they are suspended
    (read from their logs, not asked through a login, which would grow the
    gateway being measured)."""
    count = 0
    for path in glob.glob(os.path.join(state_dir, "logs", "*.agent.log")):
        with open(path, errors="replace") as handle:
            states = re.findall(r"Session: Session (\w+)", handle.read())
        count += bool(states) and states[-1] == "suspended"
    return count


def wait_programs(sides: list[Side], count: int) -> None:
    """Until every side runs ``count`` programs (generous: X2Go's start takes
    ~400 processes and a loaded machine makes that minutes).  A client that
    gave up before its session was up (pyhoca-cli does, on a loaded
    machine) is said, with its log, and started once more."""
    for side in sides:
        def up(s: Side = side) -> bool:
            for index, client in enumerate(s.clients):
                if client.poll() is not None and s.programs() < count:
                    if index in s.retried:
                        raise RuntimeError(f"{s.label}: session {index} did not start twice: {s.log_tail(index)}")
                    print(f"{s.label}: the client of session {index} exited ({client.returncode}) before its "
                          f"session was up, starting it again: {s.log_tail(index)}", flush=True)
                    s.retried.append(index)
                    s.start(index)
                    return False
            return s.programs() >= count

        wait_for(up, 600, f"{side.label}: {count} sessions with their programs", interval=0.2)


#: The sides, in the order they start their sessions.
SIDES = ("nxgate", "x2go", "door", "x2go_no_lang")


def make_side(key: str, count: int, locale: str) -> Side:
    if key == "nxgate":
        return NxgateSide(count, locale)
    return X2GoSide(count, "" if key == "x2go_no_lang" else locale, door=key == "door")


def measure(count: int, locale: str, keys: list[str]) -> dict:
    sides: list[Side] = []
    try:
        for key in keys:
            sides.append(make_side(key, count, locale))
        for side in sides:
            side.warm_up()
        for side in sides:
            side.mark_idle()
        load_before = os.getloadavg()
        for index in range(count):
            for side in sides:  # one at a time: two x2goservers starting at once take the same display
                side.start(index)
                wait_programs([side], index + 1)
        time.sleep(SETTLE)
        attached = {side.key: side.snapshot() for side in sides}
        for side in sides:
            side.suspend_all()
        for side in sides:
            wait_for(lambda s=side: s.suspended() >= count, 120, f"{side.label}: {count} suspended sessions",
                     interval=1.0)
        time.sleep(SETTLE)
        suspended = {side.key: side.snapshot() for side in sides}
        return {"attached": attached, "suspended": suspended, "load_before": load_before,
                "load_after": os.getloadavg(), "sides": [side.key for side in sides],
                "started_again": {side.key: side.retried for side in sides if side.retried},
                "labels": {side.key: side.label for side in sides}}
    finally:
        for side in reversed(sides):
            try:
                side.close()
            except Exception:  # noqa: BLE001 - the other sides still need their cleanup
                traceback.print_exc()


def ratios(result: dict) -> dict:
    """Each side's figures over x2goserver's (same LANG), and nxgate's over
    x2goserver's without LANG."""
    out = {}
    pairs = [(key, "x2go") for key in ("nxgate", "door")] + [("nxgate", "x2go_no_lang")]
    for state in ("attached", "suspended"):
        for ours, peer in pairs:
            if ours not in result[state] or peer not in result[state]:
                continue
            for key in ("agent_plus_program_kb", "every_process_kb"):
                out[f"{state}_{key}_{ours}_vs_{peer}"] = result[state][ours][key] / result[state][peer][key]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10)
    parser.add_argument("--locale", default="C.UTF-8", help="LANG of every side's sessions (default: %(default)s)")
    parser.add_argument("--sides", default=",".join(SIDES),
                        help="comma-separated sides (default: %(default)s; x2go_no_lang is x2goserver with no LANG,"
                             " as this machine's PAM leaves its sessions)")
    parser.add_argument("--install", action="store_true", help="apt-get install X2Go if it is missing (root)")
    parser.add_argument("--json", default=os.path.join(HERE, "results", "memory.json"))
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("bench/memory.py needs root (it creates users and runs sshd and X2Go)", file=sys.stderr)
        return 2
    keys = [key for key in args.sides.split(",") if key]
    unknown = [key for key in keys if key not in SIDES]
    if unknown:
        parser.error(f"unknown sides: {', '.join(unknown)}")
    missing = ensure_packages(PACKAGES, args.install)
    if missing:
        keys = [key for key in keys if key == "nxgate"]
    result = measure(args.sessions, args.locale, keys)
    result.update(locale=args.locale, ratios=ratios(result), x2go_measured=not missing, x2go_missing=missing)
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as handle:
        json.dump(result, handle, indent=2)
        handle.write("\n")
    print_table(result)
    print(f"(JSON: {args.json})")
    return 0


def print_table(result: dict) -> None:
    first = result["attached"][result["sides"][0]]
    print(f"memory per session, PSS in MB ({first['sessions']} sessions each, LANG={result['locale']}, "
          f"load {result['load_before'][0]:.2f})")
    for state in ("attached", "suspended"):
        print(f"  {state}:")
        for key in result["sides"]:
            row = result[state][key]
            print(f"    {result['labels'][key]:<44} agent {row['agent_kb']['pss'] / 1024:5.2f}  agent+program "
                  f"{row['agent_plus_program_kb'] / 1024:5.2f}  every process {row['every_process_kb'] / 1024:5.2f}"
                  f"  (user's {row['user_processes_kb'] / 1024:5.2f} + server {row['server_growth_kb'] / 1024:5.2f};"
                  f" summed RSS {row['rss_sum_kb'] / 1024:5.2f})")
    for key, value in result["ratios"].items():
        print(f"  {key:<56} {value:5.2f}x")
    for state in ("attached", "suspended"):
        for key in result["sides"]:
            row = result[state][key]
            if row["agents"] != row["sessions"]:
                print(f"  warning: {result['labels'][key]} ran {row['agents']} agents for {row['sessions']} sessions"
                      f" ({state})")
    if not result["x2go_measured"]:
        print(f"  X2Go not measured: Debian packages {' '.join(result['x2go_missing'])} missing (run with --install)")


if __name__ == "__main__":
    sys.exit(main())
