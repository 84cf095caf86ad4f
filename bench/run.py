#!/usr/bin/env python3
"""``make bench``: every benchmark, one table against the project's targets.

Runs, each as its own process with its own JSON in bench/results/:

* bench/relay.py     throughput, CPU/GB and latency of the relays (Conch
                     gateway, OpenSSH mode's nxcopy, OpenSSH + nc, socat,
                     splice loop; it uses bench/relay_nxcopy.py's harness);
* bench/sessions.py  nxgate's session timings with nxgate-client;
* bench/new_session.py  new session -> picture with nxgate-client against the
                     floor (nxagent + nxproxy + the program by hand, alternating),
                     where every 50 ms goes, and suspend/terminate with nx-libs'
                     own waits (issue 34);
* bench/x2go.py      the same for X2Go (installed if missing, as root);
* bench/memory.py    memory per session as PSS, attached and suspended:
                     nxgate-client, x2goserver and nxgate's X2Go door with
                     pyhoca-cli, all measured together (issue 34);
* bench/agent_memory.py  what each nxagent option, argument, environment
                     variable and X client costs, one difference at a time;
* bench/scale.py     growth over 1/10/50/100 suspended sessions, 200 parallel logins, a 10 000-row
                     store, and where the session times go (phases);
* bench/store_listing.py  the session store's listsession query with 10 000
                     stored sessions on SQLite, PostgreSQL and MariaDB (issue 13);
* bench/cluster_relay.py  the cluster stream (gateway -> a node's TLS stream
                     endpoint -> the agent) vs the single-box relay, through
                     Conch and plain: throughput, added latency, opening, with the
                     node alone on one CPU and the bound the gateway's CPU sets;
* bench/cluster_placement.py  placement decision time with 1,000 live sessions,
                     pure and with PostgreSQL reads (issue 13);
* bench/cluster_picture.py  start/resume -> picture through a gateway to another
                     node vs one box, and a node's death -> its sessions lost (issue 13);
* bench/sound_latency.py  a click from the session to the client's sound
                     server (latency) and a stream's bandwidth (issue 14);
* bench/x2go_sound.py  the same click through X2Go's door to pyhoca-cli's
                     PulseAudio (the reverse streams), against it played locally;
* bench/web_viewer.py  the in-browser viewer in headless Chromium: open ->
                     first picture (and each step of it), keystroke -> echo,
                     full-screen fps, server memory and idle CPU per browser
                     viewer, against Apache Guacamole in the same run;
* bench/printing_latency.py  lp in the session -> the job at the client's
                     printer, against lp straight into the client's CUPS (issue 14);
* bench/sharing_copy.py  copying a file through the smb channel (the client's
                     folder in the session) against the same SMB copy without NX
                     (issue 14);
* bench/x2go_folders.py  X2Go's shared folders: x2goclient's folder read and
                     written in the session through the door, against sshfs
                     straight to the same client sshd (issue 33);
* bench/display_search.py  a new session's display search with 50,000 Unix
                     sockets on the machine: how long the reactor stalls, the
                     search on its thread (as before) and in the thread pool;
* bench/attacks.py   NX logins and portal pages under DHEat, with the key-exchange
                     workers stopped and under idle connections from many
                     addresses, against the quiet gateway (issues 27 and 31);

then prints ONE table: each figure, its peer (X2Go measured here, X2Go's
reference figures from the issue, OpenSSH...), the ratio, the target and
whether it is met, with the spread of the repeated measurements; and writes
everything to bench/results/bench.json.

    .venv/bin/python bench/run.py [--quick] [--profile] [--no-install] [--skip x2go,scale]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")

# The X2Go figures (reference machine) and the targets.
X2GO_REFERENCE = {"new_to_picture": 3.51, "suspend": 2.80, "resume_to_picture": 3.03, "terminate": 2.68}
#: The agent variants make bench times (all of them: bench/agent_memory.py alone).
AGENT_VARIANTS = "baseline,x2go,argv0_x2goagent,x2go_options,program_lang_c,no_compose_cache,glx_off,desktop,x11vnc"
TIME_TARGETS = [  # key, label, ratio target
    ("new_to_picture", "login -> picture", 0.2),
    ("suspend", "suspend", 0.3),
    ("resume_to_picture", "resume -> picture", 0.15),
    ("terminate", "terminate", 0.3),
]


def run_step(name: str, argv: list[str], log_dir: str) -> dict:
    """Runs one benchmark; its output goes to the terminal and to a log."""
    print(f"\n=== {name}: {' '.join(argv[1:])}", flush=True)
    started = time.monotonic()
    log_path = os.path.join(log_dir, f"{name}.log")
    env = dict(os.environ, PYTHONPATH=REPO, PYTHONUNBUFFERED="1")
    with open(log_path, "wb") as log:
        process = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for line in process.stdout:
            sys.stdout.buffer.write(line)
            sys.stdout.flush()
            log.write(line)
        process.wait()
    seconds = time.monotonic() - started
    print(f"=== {name}: exit {process.returncode} after {seconds:.0f}s", flush=True)
    return {"argv": argv, "exit_code": process.returncode, "seconds": seconds, "log": log_path}


def load(path: str) -> dict | None:
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def spread_pct(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    if len(values) < 2:
        return None
    middle = statistics.median(values)
    return (max(values) - min(values)) / middle * 100 if middle else None


class Table:
    def __init__(self) -> None:
        self.rows: list[dict] = []

    def section(self, title: str) -> None:
        self.rows.append({"section": title})

    def add(self, measure: str, value, unit: str, peer=None, peer_label: str = "", ratio=None, target: str = "",
            met: bool | None = None, spread: float | None = None, note: str = "") -> None:
        self.rows.append({"measure": measure, "value": value, "unit": unit, "peer": peer, "peer_label": peer_label,
                          "ratio": ratio, "target": target, "met": met, "spread_pct": spread, "note": note})

    def print(self) -> None:
        header = (f"{'measure':<40}{'nxgate':>10} {'unit':<6}{'peer':>10}  {'peer is':<22}{'ratio':>8}  "
                  f"{'target':<22}{'met':<6}{'spread':>7}")
        print(header)
        print("=" * len(header))
        for row in self.rows:
            if "section" in row:
                print(f"-- {row['section']}")
                continue

            def num(value) -> str:
                if value is None:
                    return "-"
                if isinstance(value, str):
                    return value
                return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"

            met = {True: "yes", False: "NO", None: ""}[row["met"]]
            spread = "" if row["spread_pct"] is None else f"{row['spread_pct']:.0f}%"
            ratio = "" if row["ratio"] is None else f"{row['ratio']:.2f}x"
            print(f"{row['measure']:<40}{num(row['value']):>10} {row['unit']:<6}{num(row['peer']):>10}  "
                  f"{row['peer_label']:<22}{ratio:>8}  {row['target']:<22}{met:<6}{spread:>7}")
            if row["note"]:
                print(f"{'':<4}{row['note']}")


def ratio(a, b):
    return None if a is None or b in (None, 0) else a / b


def memory_rows(table: Table, memory: dict | None, agents: dict | None) -> None:
    """Issue 34: memory per session as PSS, nxgate beside x2goserver measured together."""
    if memory and "labels" in memory:
        ours = memory["attached"]["nxgate"]
        table.section(f"memory per session, PSS ({ours['sessions']} sessions per side, all measured together, "
                      f"LANG={memory['locale']} on every side, load {memory['load_before'][0]:.1f})")
        if not memory["x2go_measured"]:
            table.add("X2Go", "not measured", "", note=f"Debian packages {' '.join(memory['x2go_missing'])} missing")

        def mb(row: dict | None, key: str) -> float | None:
            return None if row is None else row[key] / 1024

        def agent_note(row: dict) -> str:
            return (f"agent {row['agent_kb']['pss'] / 1024:.2f} (anon {row['agent_kb']['anon'] / 1024:.2f}) + program "
                    f"{row['program_kb']['pss'] / 1024:.2f}")

        for state in ("attached", "suspended"):
            here, peer, door, plain = (memory[state].get(key) for key in ("nxgate", "x2go", "door", "x2go_no_lang"))
            for key, label in (("agent_plus_program_kb", "agent + program"), ("every_process_kb", "every process")):
                value, other = mb(here, key), mb(peer, key)
                if key == "agent_plus_program_kb":
                    note = f"nxgate {agent_note(here)}" + (f"; X2Go {agent_note(peer)}" if peer else "")
                else:
                    note = (f"nxgate: user's {mb(here, 'user_processes_kb'):.2f} + gateway {mb(here, 'server_growth_kb'):.2f}"
                            + ("" if peer is None else f"; X2Go: user's {mb(peer, 'user_processes_kb'):.2f} "
                               f"(x2goruncommand; attached sshd, sftp-server) + sshd [priv] {mb(peer, 'server_growth_kb'):.2f}"))
                table.add(f"{label}, {state}", value, "MB", other, "x2goserver, same run" if peer else "",
                          ratio(value, other), "<= 1.0x" if peer else "(info)",
                          None if other is None else value <= other, note=note)
                if plain is not None:
                    table.add("  vs x2goserver without LANG", value, "MB", mb(plain, key), "x2goserver, no LANG",
                              ratio(value, mb(plain, key)), "(info)",
                              note="X2Go's sessions as this machine's PAM leaves them (C locale, no compose table);"
                                   " nxgate's user's first Xlib program keeps the one it parsed for the cache")
            if door is not None and peer is not None:
                value, other = mb(door, "every_process_kb"), mb(peer, "every_process_kb")
                table.add(f"pyhoca-cli via the door, {state}", value, "MB", other, "x2goserver, same client",
                          ratio(value, other), "<= 1.0x", value <= other,
                          note=f"user's processes {mb(door, 'user_processes_kb'):.2f} + gateway growth "
                               f"{mb(door, 'server_growth_kb'):.2f}; {agent_note(door)}")
        peer = memory["attached"].get("x2go")
        if peer:
            table.add("summed RSS, attached (not a measure)", ours["rss_sum_kb"] / 1024, "MB", peer["rss_sum_kb"] / 1024,
                      "x2goserver", ratio(ours["rss_sum_kb"], peer["rss_sum_kb"]), "(info)",
                      note="RSS counts shared libraries once per process: it favours the side with fewer processes")
    if agents:
        variants = agents["variants"]
        base = variants.get("baseline")
        if not base:
            return
        table.section(f"nxagent started by hand, one difference at a time (bench/agent_memory.py, medians of "
                      f"{agents['runs']}): anonymous + shared memory, attached")
        for name, entry in variants.items():
            attached, suspended = entry["attached"], entry["suspended"]
            value = (attached["anon"] + attached["shmem"]) / 1024
            peer = (base["attached"]["anon"] + base["attached"]["shmem"]) / 1024
            table.add(name, value, "MB", peer, "nxgate's agent", ratio(value, peer), "(info)",
                      note=f"{entry['what']}: {attached['delta_anon_shmem']:+.0f} kB attached, "
                           f"{suspended['delta_anon_shmem']:+.0f} kB suspended, program "
                           f"{attached.get('delta_program_anon', 0):+.0f} kB")


def store_rows(table: Table, store: dict | None) -> None:
    """Issue 13: the shared store's listsession query, per back end."""
    if not store:
        return
    table.section("session store: live(user) with 10 000 stored sessions (the listsession query), median")
    for kind, label in (("sqlite", "SQLite"), ("postgresql", "PostgreSQL"), ("mysql", "MariaDB")):
        figures = store.get(kind) or {}
        if "live_user" not in figures:
            table.add(label, "not measured", "", note=figures.get("skipped", ""))
            continue
        median = figures["live_user"]["median_ms"]
        target = "< 20 ms" if kind == "postgresql" else ""
        table.add(f"{label} live(user)", median, "ms", None, "", None, target or "(info)",
                  (median < 20) if kind == "postgresql" else None,
                  note=f"p95 {figures['live_user']['p95_ms']:.2f} ms; admit {figures['admit']['median_ms']:.2f} ms,"
                       f" swap {figures['swap']['median_ms']:.2f} ms, all live {figures['live_all']['median_ms']:.0f} ms")


def display_search_rows(table: Table, search: dict | None) -> None:
    """A new session's display search on a machine with many Unix sockets: the reactor's stall."""
    if not search:
        return
    table.section(f"display search, {search['unix_sockets']} Unix sockets and {search['planted_locks']} planted "
                  f"locks: reactor stall (median of {search['runs']})")
    before, now = search["ways"]["on the reactor"], search["ways"]["in the thread pool"]
    table.add("search on the reactor's thread (before)", before["stall_median_ms"], "ms", target="(info)",
              note=f"max {before['stall_max_ms']:.1f} ms")
    table.add("search in the thread pool", now["stall_median_ms"], "ms", before["stall_median_ms"], "on the reactor",
              now["stall_median_ms"] / before["stall_median_ms"] if before["stall_median_ms"] else None,
              "(info)", note=f"max {now['stall_max_ms']:.1f} ms; the search itself "
                             f"{now['allocation_median_ms']:.0f} ms")


def cluster_relay_rows(table: Table, cluster: dict | None) -> None:
    """The stream to a session on another member vs on the gateway's own box (issues 13, 34)."""
    if not cluster:
        return
    rows, ratios = cluster.get("rows", {}), cluster.get("ratios", {})
    size_mib = cluster["size"] / (1 << 20)
    pinned = cluster.get("pinned")
    load = cluster.get("load_before", [None])[0]
    table.section(f"cluster stream: gateway -> node (TLS) -> agent vs one box ({size_mib:g} MiB per run, median of "
                  f"{cluster['repeat']}{'; node alone on one CPU, the rest on the other' if pinned else ''}"
                  f"{f'; load {load:.1f}' if load is not None else ''}){' [profiled]' if cluster.get('profiled') else ''}")
    target = cluster.get("target_ratio", 0.9)
    for kind, label in (("conch", "through SSH (Conch)"), ("plain", "plain (no SSH)")):
        here, there = rows.get(f"{kind} one box"), rows.get(f"{kind} via node")
        if not here or not there:
            continue
        for direction in ("up", "down"):
            if direction not in there["directions"]:
                continue
            ours, peer = there["directions"][direction]["gb_per_s"], here["directions"][direction]["gb_per_s"]
            is_target = kind == "conch"
            paired = ratios.get(f"{kind}_{direction}_paired")
            bound = ratios.get(f"{kind}_{direction}_front_cpu_bound")
            loads = there["directions"][direction].get("load_1min") or []
            table.add(f"{label} {direction} GB/s", ours, "GB/s", peer, "same path, one box", ratio(ours, peer),
                      f">= {target:g}x one box" if is_target else "(info)",
                      (ours >= target * peer) if is_target else None,
                      spread_pct(there["directions"][direction]["all_gb_per_s"]),
                      note=f"CPU s/GB {there['directions'][direction]['cpu_s_per_gb']:.2f} via node, "
                           f"{here['directions'][direction]['cpu_s_per_gb']:.2f} one box"
                           + (f"; paired {paired:.2f}x" if paired else "")
                           + (f"; bound (gateway + client CPU/GB one box / via node) {bound:.2f}x" if bound and pinned
                              else "")
                           + (f"; load {min(loads):.1f}-{max(loads):.1f}" if loads else ""))
        cpu = [ratios.get(f"{kind}_{direction}_gateway_cpu_ratio") for direction in ("up", "down")]
        if all(cpu):
            table.add(f"{label} gateway CPU/GB one box / via node", f"{cpu[0]:.2f}/{cpu[1]:.2f}", "up/dn", None,
                      "", None, "(info)", note="the bound on the ratio with the node on its own machine")
        table.add(f"{label} latency p50 / p99", f"{there['latency_p50_us']:.0f}/{there['latency_p99_us']:.0f}", "us",
                  f"{here['latency_p50_us']:.0f}/{here['latency_p99_us']:.0f}", "one box", None, "(info)",
                  note=f"added p50 {ratios.get(f'{kind}_added_latency_p50_us', 0):.0f} us, p99 "
                       f"{ratios.get(f'{kind}_added_latency_p99_us', 0):.0f} us (1-byte round trips)")
        table.add(f"{label} stream opening", there["open"]["median_ms"], "ms", here["open"]["median_ms"], "one box",
                  ratio(there["open"]["median_ms"], here["open"]["median_ms"]), "(info)",
                  note=f"bye/request -> agent socket accepted, median of {len(there['open']['all_ms'])}")


#: pyhoca-cli through nxgate's X2Go door vs x2goserver: key, label.
X2GO_DOOR_ROWS = [
    ("new_to_picture", "new->picture"),
    ("list", "list (-L)"),
    ("suspend", "suspend"),
    ("resume_to_picture", "resume->picture -q lan"),
    ("resume_default_link_to_picture", "resume->picture default link"),
    ("terminate", "terminate"),
]


def x2go_door_rows(table: Table, door: dict, x2go: dict, sessions: dict | None) -> None:
    """pyhoca-cli against nxgate's X2Go door, x2goserver and pyhoca-cli's
    floor (a server that answers at once, bench/x2go_floor.py), alternating:
    the ratio to x2goserver (goal <= 0.3x) and, since pyhoca-cli's own time
    is above that bound, what the door adds to the floor (goal <= 0.1 s)."""
    table.section("X2Go's pyhoca-cli against nxgate's X2Go door vs x2goserver and vs pyhoca-cli's floor "
                  "(same client, alternating)")
    floor = x2go.get("floor") or {}
    share = door.get("share") or {}
    for key, label in X2GO_DOOR_ROWS:
        if key not in door["medians"] or key not in x2go["medians"]:
            continue
        ours, peer = door["medians"][key], x2go["medians"][key]
        note = ""
        if floor and key in share:
            note = (f"floor {floor['medians'][key]:.2f} s: nxgate adds {share[key]:+.2f} s (goal <= 0.1 s), "
                    f"x2goserver {floor['x2goserver_share'][key]:+.2f} s (paired medians)")
        table.add(f"pyhoca-cli {label}", ours, "s", peer, "x2goserver here", ratio(ours, peer), "<= 0.3x",
                  ours <= 0.3 * peer, spread_pct([run[key] for run in door["runs"]]), note=note)
    for key, label in X2GO_DOOR_ROWS:
        if key in share:
            table.add(f"door-floor {label}", share[key], "s", floor["medians"][key],
                      "pyhoca-cli's floor", None, "<= 0.1 s", share[key] <= 0.1)
    startup = (floor.get("startup") or {}).get("median")
    if startup is not None:
        table.add("pyhoca-cli start-up alone", startup, "s", None, "", None, "(info)",
                  note="from its exec to its SSH connection, against the floor, median of every run")
    ours = door["medians"].get("resume_default_link_to_picture")
    client = (sessions or {}).get("medians", {}).get("resume_to_picture")
    if ours is not None and client is not None and startup is not None:
        bound = 2 * client + startup
        table.add("resume via the door vs nxgate-client", ours, "s", bound, "2x nxgate-client + start-up",
                  ratio(ours, bound), "<= 1.0x", ours <= bound,
                  note=f"nxgate-client resume -> picture {client:.2f} s (sessions step), pyhoca-cli start-up "
                       f"{startup:.2f} s; the door's resume with pyhoca-cli's default link")


def build_table(relay: dict | None, sessions: dict | None, x2go: dict | None, scale: dict | None) -> Table:
    table = Table()
    # ---------------------------------------------------------------- sessions
    table.section("session operations (nxgate-client vs X2Go's pyhoca-cli, medians; 'here' = this machine)")
    x2go_measured = bool(x2go and x2go.get("measured"))
    for key, label, target in TIME_TARGETS:
        ours = sessions["medians"].get(key) if sessions else None
        spread = spread_pct([run[key] for run in sessions["runs"]]) if sessions else None
        if x2go_measured:
            peer = x2go["medians"][key]
            table.add(f"{label}", ours, "s", peer, "X2Go measured here", ratio(ours, peer), f"<= {target}x X2Go",
                      None if ours is None else ours <= target * peer, spread)
        reference = X2GO_REFERENCE[key]
        absolute = target * reference
        table.add(f"{label} (vs reference)", ours, "s", reference, "X2Go reference (issue)", ratio(ours, reference),
                  f"<= {absolute:.2f} s", None if ours is None else ours <= absolute)
    if x2go_measured:
        x2go_spread = {key: spread_pct([run[key] for run in x2go["runs"]]) for key, _, _ in TIME_TARGETS}
        table.add("X2Go here: new/suspend/resume/terminate", "/".join(
            f"{x2go['medians'][key]:.2f}" for key, _, _ in TIME_TARGETS), "s", note="spread " + ", ".join(
            f"{key} {x2go_spread[key]:.0f}%" for key, _, _ in TIME_TARGETS if x2go_spread[key] is not None))
    elif x2go:
        table.add("X2Go", "not measured", "", note=f"{x2go.get('source')}: {x2go.get('reason')}")
    door = (x2go or {}).get("nxgate_x2go_door") if x2go_measured else None
    if door:
        x2go_door_rows(table, door, x2go, sessions)
    # ------------------------------------------------------------------- relay
    if relay:
        results = {row["relay"]: row for row in relay["results"]}

        def figure(name: str, direction: str, key: str = "gb_per_s"):
            row = results.get(name)
            if not row or direction not in row["directions"]:
                return None
            return row["directions"][direction].get(key)

        def spread_of(name: str, direction: str):
            row = results.get(name)
            if not row or direction not in row["directions"]:
                return None
            return spread_pct(row["directions"][direction]["all_gb_per_s"])

        size_gib = relay["size"] / (1 << 30)
        table.section(f"encrypted relay on loopback ({size_gib:g} GiB per run, median of {relay['repeat']})")
        conch = "conch (gateway relay)"
        for direction in ("up", "down"):
            ours = figure(conch, direction)
            if ours is None:
                continue
            for peer_name, label, is_target in (("sshd+nc aes128-ctr", "OpenSSH+nc same cipher", True),
                                                ("sshd+nc (FreeNX/Neatx)", "OpenSSH+nc chacha20", False)):
                peer = figure(peer_name, direction)
                table.add(f"Conch relay {direction} GB/s", ours, "GB/s", peer, label, ratio(ours, peer),
                          ">= 1.0x OpenSSH+nc" if is_target else "(info)",
                          (None if peer is None else ours >= peer) if is_target else None,
                          spread_of(conch, direction) if is_target else spread_of(peer_name, direction))
            cpu, peer_cpu = figure(conch, direction, "cpu_s_per_gb"), figure("sshd+nc aes128-ctr", direction,
                                                                                "cpu_s_per_gb")
            table.add(f"Conch relay {direction} CPU s/GB", cpu, "s/GB", peer_cpu, "OpenSSH+nc same cipher",
                      ratio(cpu, peer_cpu), "(info: lower is better)")
        for name in ("sshd+nxcopy aes128-ctr", "sshd+nxcopy (OpenSSH mode)"):
            for direction in ("up", "down"):
                ours = figure(name, direction)
                peer_name = "sshd+nc aes128-ctr" if "aes" in name else "sshd+nc (FreeNX/Neatx)"
                peer = figure(peer_name, direction)
                if ours is not None:
                    table.add(f"OpenSSH mode {'aes' if 'aes' in name else 'chacha'} {direction} GB/s", ours, "GB/s",
                              peer, "OpenSSH+nc same cipher", ratio(ours, peer), "(info)",
                              spread=spread_of(name, direction))
        for name, label in ((conch, "Conch"), ("sshd+nxcopy aes128-ctr", "OpenSSH mode"),
                            ("sshd+nc aes128-ctr", "OpenSSH+nc")):
            row = results.get(name)
            if row:
                table.add(f"{label} latency p50 / p99", f"{row['latency_p50_us']:.0f}/{row['latency_p99_us']:.0f}",
                          "us", None, "1-byte round trips", None, "(info)", note=f"cipher: {row.get('algorithms', '')}")
        paired = relay.get("ratios") or {}
        for direction in ("up", "down"):
            value = paired.get(f"paired_conch_vs_openssh_nc_same_cipher_{direction}")
            if value is not None:
                table.add(f"Conch relay {direction}, paired runs", None, "", None, "OpenSSH+nc same cipher", value,
                          ">= 1.0x", value >= 1.0, note="median over repetitions of the ratio of the runs made "
                                                        "next to each other (less load drift)")
        table.section("plain relays on loopback (no SSH)")
        nxcopy = figure("nxcopy (splice)", "up")
        candidates = [(figure(n, "up"), n) for n in ("python os.splice loop", "socat -b 262144")]
        candidates = [c for c in candidates if c[0] is not None]
        if nxcopy is not None and candidates:
            best, best_name = max(candidates)
            table.add("nxcopy vs best(splice loop, socat 256k)", nxcopy, "GB/s", best, best_name,
                      ratio(nxcopy, best), ">= 0.9x", nxcopy >= 0.9 * best, spread_of("nxcopy (splice)", "up"))
        value = paired.get("paired_nxcopy_vs_best_of_splice_loop_and_socat_256k")
        if value is not None:
            table.add("nxcopy vs best, paired runs", None, "", None, "splice loop / socat 256k", value, ">= 0.9x",
                      value >= 0.9)
        socat = figure("socat (default)", "up")
        if nxcopy is not None and socat is not None:
            table.add("nxcopy vs default socat", nxcopy, "GB/s", socat, "socat (default)", ratio(nxcopy, socat),
                      ">= 2x", nxcopy >= 2 * socat, spread_of("socat (default)", "up"))
        for name in ("nxcopy (splice)", "socat (default)", "socat -b 262144", "python os.splice loop",
                     "direct (no relay)"):
            row = results.get(name)
            if row:
                cpu = figure(name, "up", "cpu_s_per_gb")
                table.add(f"  {name}", figure(name, "up"), "GB/s", None,
                          "" if cpu is None else f"CPU {cpu:.2f} s/GB", None,
                          f"p50/p99 {row['latency_p50_us']:.0f}/{row['latency_p99_us']:.0f} us")
    # ------------------------------------------------------------------- scale
    if scale:
        table.section("scale (each count's load in its note)")
        logins = scale.get("logins")
        if logins:
            table.add(f"{logins['logins']} parallel logins: failures", logins["failures"], "", None, "", None, "0",
                      logins["failures"] == 0,
                      note="; ".join(logins.get("failure_examples", []))[:300])
            table.add("  login time p50 / p99", f"{logins.get('total_p50_s', 0):.2f}/{logins.get('total_p99_s', 0):.2f}",
                      "s", f"{logins.get('single_total_median_s', 0):.2f}", "one login alone", None, "(info)",
                      note=f"phases p50/p99: ssh {logins.get('ssh_p50_s', 0):.2f}/{logins.get('ssh_p99_s', 0):.2f}, "
                           f"PAM login {logins.get('login_p50_s', 0):.2f}/{logins.get('login_p99_s', 0):.2f}, "
                           f"listsession {logins.get('listsession_p50_s', 0):.2f}/"
                           f"{logins.get('listsession_p99_s', 0):.2f} s; "
                           f"{logins.get('logins_per_second', 0):.0f} logins/s, pam_threads {logins['pam_threads']}")
        sessions_part = scale.get("sessions") or {}
        sess = sessions_part.get("counts") or {}
        for count, figures in sess.items():
            if "gateway_idle_cpu_pct" not in figures:  # a scale.json from before the growth figures
                table.add(f"{count} sessions: gateway RSS", figures["gateway_rss_mb"], "MB", None,
                          f"{figures['gateway_mb_per_session']:.2f} MB/session", None, "(info)")
                continue
            table.add(f"{count} suspended sessions: gateway RSS / PSS",
                      f"{figures['gateway_rss_mb']:.1f}/{figures['gateway_pss_mb']:.1f}", "MB", None, "", None,
                      "(info)", note=f"idle CPU {figures['gateway_idle_cpu_pct']:.2f} %; login + listsession "
                                     f"{figures['login_list_s'] * 1000:.0f} ms (listsession alone "
                                     f"{figures['list_ms']:.1f} ms); agent {figures['agent_pss_mb_median']:.1f} MB "
                                     f"PSS, the user's processes {figures['session_pss_mb_user_processes']:.1f} MB "
                                     f"PSS/session (rootless); "
                                     f"{figures['gateway_fds']} fds; load {figures.get('load_1min', 0):.1f}")
        growth = sessions_part.get("per_added_session")
        if growth and sess:
            counts = "/".join(sess)
            points = {"0": sessions_part.get("base", {}), **sess}

            def slope(key: str, scale_by: float = 1.0) -> float | None:
                """Least-squares growth of ``key`` per added session over the counts (from the first
                session on: the gateway's first session also pays one-time allocations)."""
                xy = [(int(c), f[key] * scale_by) for c, f in sess.items() if key in f]
                if len(xy) < 2:
                    return None
                mx, my = sum(x for x, _ in xy) / len(xy), sum(y for _, y in xy) / len(xy)
                den = sum((x - mx) ** 2 for x, _ in xy)
                return sum((x - mx) * (y - my) for x, y in xy) / den if den else None

            rows = (("gateway RSS", "gateway_rss_mb", 1024, "kB", 100, "gateway_rss_kb", "{:.0f}"),
                    ("gateway idle CPU", "gateway_idle_cpu_pct", 1, "% CPU", 0.01, "gateway_idle_cpu_pct", "{:.3f}"),
                    ("login + listsession", "login_list_s", 1000, "ms", 1.0, "login_list_ms", "{:.2f}"))
            for label, key, factor, unit, limit, steps, shown in rows:
                value = slope(key, factor)
                if value is None:
                    continue
                # Flat or linear with a small slope over 0..N sessions; each step's own growth in the note.
                table.add(f"{label} per added session ({counts})", value, unit, None, "", None,
                          f"<= {limit:g} {unit}/session", value <= limit,
                          note=f"each step 0->{counts}: " + "/".join(shown.format(v) for v in growth[steps])
                               + (f"; medians {', '.join(f'{c}: {f[key] * factor:.0f}' for c, f in points.items() if key in f)} {unit}"
                                  if key == "login_list_s" else ""))
        store = scale.get("store")
        if store:
            table.add(f"listsession, {store['live']} live + {store['ended']} ended",
                      store["list_with_ended"]["median_ms"], "ms", store["list_live_only"]["median_ms"],
                      f"{store['live']} live only", ratio(store["list_with_ended"]["median_ms"],
                                                          store["list_live_only"]["median_ms"]), "(info)")
            table.add("gateway start (reconcile) with that store", store["start_s_with_ended"], "s",
                      store["start_s_live_only"], f"{store['live']} live only",
                      ratio(store["start_s_with_ended"], store["start_s_live_only"]), "(info)",
                      spread=spread_pct(store["start_s_with_ended_all"]))
            if store.get("dead"):
                table.add(f"reconcile of {store['dead']} dead-agent rows", store["reconcile_dead_s"], "s", None,
                          "start to all ended", None, "(info)")
        phases = scale.get("phases")
        if phases:
            m = phases["medians"]
            table.section("where the session time goes (server side, OpenSSH client; medians)")
            for key, label in (("new_to_picture_openssh", "new -> picture without nxgate-client"),
                               ("suspend_command", "suspend command (server)"),
                               ("suspend:agent_suspending_to_suspended", "  nxagent suspending -> suspended"),
                               ("resume_to_picture_openssh", "resume -> picture without nxgate-client"),
                               ("resume:proxy_handshake_to_agent_resumed", "  proxy connect -> agent resumed"),
                               ("terminate_command", "terminate command (server)"),
                               ("terminate:agent_terminating_to_terminated", "  nxagent terminating -> gone"),
                               ("new:proxy_handshake_to_agent_running", "  new: proxy connect -> agent running"),
                               ("new:program_spawned_to_picture_seen", "  new: program spawned -> picture"),
                               ("startsession_to_710", "  startsession -> 710 (agent up)"),
                               ("login_login", "  NX login (PAM)")):
                if key in m:
                    table.add(label, m[key], "s", None, "", None, "(info)",
                              spread=spread_pct(phases["spread"][key]) if key in phases.get("spread", {}) else None)
            table.add("nxgate-client: import / --list", f"{phases['client_import_s']:.2f}/{phases['client_list_s']:.2f}",
                      "s", f"{phases['python_start_s']:.2f}", "bare python start", None, "(info)")
    return table


def cluster_rows(table: Table, cluster: dict | None) -> None:
    """Issue 13: where a new session goes, and what deciding it costs."""
    if not cluster:
        return
    table.section(f"cluster placement with {cluster.get('sessions', 1000)} live sessions, median")
    for name, figure in sorted((cluster.get("pure") or {}).items()):
        table.add(f"pure, {name.replace('_', ' ')}", figure["median_ms"], "ms", None, "", None, "(info)", None,
                  note=f"p95 {figure['p95_ms']:.4f} ms")
    figure = cluster.get("postgresql") or {}
    if "median_ms" in figure:
        target = cluster.get("target_ms", 5.0)
        table.add("with PostgreSQL reads", figure["median_ms"], "ms", None, "", None, f"< {target:g} ms",
                  figure["median_ms"] < target, note=f"p95 {figure['p95_ms']:.2f} ms")
    else:
        table.add("with PostgreSQL reads", "not measured", "", note=figure.get("skipped", ""))


def cluster_picture_rows(table: Table, picture: dict | None) -> None:
    """Issue 13: a session on another node through a gateway, against one box."""
    if not picture or "skipped" in picture:
        return
    table.section("several machines: through a gateway to another node vs one box (medians)")
    target = picture.get("target_ratio", 1.15)
    for key, label in (("start_to_picture", "start -> picture"), ("resume_to_picture", "resume -> picture")):
        figure = picture.get(key)
        if figure:
            table.add(label, figure["cluster"]["median_s"], "s", figure["single"]["median_s"], "one box",
                      figure["ratio"], f"<= {target:g}x", figure["ratio"] <= target)
    death = picture.get("node_death_to_lost") or {}
    for key, label in (("through_connected_gateway_s", "node death -> lost (its gateway)"),
                       ("through_other_gateway_s", "node death -> lost (another gateway)")):
        if key in death:
            value = death[key]
            table.add(label, value if value is not None else "not seen", "s", None, "", None,
                      f"<= {death['target_s']:g} s", value is not None and value <= death["target_s"],
                      note=f"heartbeat {death['heartbeat_s']:g} s")


def sound_rows(table: Table, sound: dict | None) -> None:
    """Issue 14's sound figures (bench/sound_latency.py)."""
    if not sound:
        return
    table.section("sound through the NX media channel (session -> client's PulseAudio, loopback)")
    table.add("click: paplay in the session -> client's sink", sound["latency_ms_median"], "ms",
              sound["local_ms_median"], "same click played locally", ratio(sound["latency_ms_median"],
                                                                          sound["local_ms_median"]),
              f"< {sound['target_ms']} ms", sound["latency_ms_median"] < sound["target_ms"],
              spread_pct(sound["runs"]["session"]))
    table.add("stream bandwidth on the NX link (44.1 kHz stereo)", sound["link_kbps"], "kbit/s",
              sound["stream_pcm_kbps"], "the PCM itself", ratio(sound["link_kbps"], sound["stream_pcm_kbps"]),
              "(info)")


def x2go_sound_rows(table: Table, sound: dict | None) -> None:
    """X2Go's sound back through the door (bench/x2go_sound.py)."""
    if not sound:
        return
    table.section(f"X2Go sound: the session's PulseAudio -> pyhoca-cli's forward, reverse streams (load {sound['load_1min']:.1f})")
    table.add("click: paplay in the session -> client's sink", sound["latency_ms_median"], "ms",
              sound["local_ms_median"], "same click played locally", ratio(sound["latency_ms_median"],
                                                                          sound["local_ms_median"]),
              "(info)", None, spread_pct(sound["runs"]["session"]))


def new_session_rows(table: Table, result: dict | None) -> None:
    """Issue 34: a new session against its floor, and where suspend and
    terminate go (bench/new_session.py)."""
    if not result:
        return
    load = f"load {result['load_before'][0]:.1f} -> {result['load_after'][0]:.1f}"
    table.section("new session -> picture vs the floor (nxagent + nxproxy + the program by hand, no SSH; "
                  "same Xvfb, alternating)")
    pairs = result["pairs"]
    paired = result["paired_ratio_median"]
    parts = result["floor_parts_median_s"]
    table.add("new session -> picture, nxgate-client", result["client_median_s"], "s", result["floor_median_s"],
              "the floor, measured here", paired, "<= 1.3x floor", paired <= 1.3,
              spread_pct([pair["client"]["new_to_picture"] for pair in pairs]),
              note=f"paired ratio (median of {len(pairs)} pairs; ratio of medians {result['ratio_of_medians']:.2f}x); "
                   f"floor: agent {parts['agent_listening'] * 1000:.0f} ms + link "
                   f"{parts['link_up'] * 1000:.0f} + program {parts['program_to_picture'] * 1000:.0f}; {load}")
    steps = [row for row in result.get("breakdown", []) if row["length_s"]]
    if steps:
        biggest = sorted(steps, key=lambda row: -row["length_s"])[:5]
        table.add("  where it goes (traced, largest steps)", "", "", target="(info)", note="; ".join(
            f"{row['step']} {row['length_s'] * 1000:.0f} ms" for row in biggest))
    for verb in ("suspend", "terminate"):
        part = result.get(verb)
        if not part:
            continue
        sleeps = "; ".join(f"{call} {ms} ms in {count}/{len(part['runs'])}" for call, ms, count in part["agent_sleeps"])
        shutdown = next((row for row in part["breakdown"] if row["step"].startswith("agent: nx-libs")), None)
        table.add(f"{verb}, nxgate-client (traced)", part["median_s"], "s", target="(info)",
                  spread=spread_pct([run["seconds"] for run in part["runs"]]),
                  note=(f"the agent's own shutdown {shutdown['length_s'] * 1000:.0f} ms" if shutdown and
                        shutdown["length_s"] is not None else "") + (f" (nx-libs' sleeps: {sleeps})" if sleeps else ""))


def web_viewer_rows(table: Table, web: dict | None) -> None:
    """Issue 15's browser viewer figures (bench/web_viewer.py)."""
    if not web:
        return
    load = f", load {web['load_1min']:.1f}" if "load_1min" in web else ""
    table.section(f"the in-browser viewer (headless Chromium, noVNC <- x11vnc on the session's display, loopback{load})")
    table.add("open -> first picture (suspended session)", web["first_picture_s_median"], "s",
              target=f"<= {web['target_first_picture_s']} s",
              met=web["first_picture_s_median"] <= web["target_first_picture_s"],
              spread=spread_pct(web["first_picture_s"]))
    table.add("keystroke -> echo in the page, p50 / p99", f"{web['echo_ms_p50']:.0f}/{web['echo_ms_p99']:.0f}",
              "ms", target="(info)")
    table.add(f"full-screen change ({web['source_rate']:.0f}/s source)", web["fps"], "frames/s", target="(info)")
    if "clipboard_ms_median" in web:
        table.add("copy in the session -> page's clipboard", web["clipboard_ms_median"], "ms", target="(info)")
    table.add("server memory per browser viewer (PSS)", web["viewer_pss_mb"], "MB", target="(info)")
    if "idle_cpu_pct" in web:
        table.add("server CPU per idle browser viewer", web["idle_cpu_pct"], "% CPU", target="(info)")
    for row in web.get("comparison", []):  # issue 25: against Apache Guacamole, measured in the same run
        note = ""
        if row["figure"].startswith("open") and "steps_ms" in web:
            def steps(figures: dict) -> str:
                names = ("page", "dom_ready", "scripts", "socket_open", "socket_message", "picture")
                return ", ".join(f"{name} {figures[name]:.0f}" for name in names if name in figures)
            note = (f"paired {web.get('first_picture_paired_ratio', 0):.2f}x; load {web.get('load_1min', 0):.1f}; "
                    f"steps (ms after the click, medians): nxgate {steps(web['steps_ms'])}; Guacamole "
                    f"{steps((web.get('guacamole') or {}).get('steps_ms', {}))}")
        table.add(f"vs Guacamole: {row['figure']}", row["nxgate"], "", row["guacamole"], "Guacamole (guacd 1.6)",
                  row["ratio"], row["goal"], row["met"], note=note)


def printing_rows(table: Table, printing: dict | None) -> None:
    """Issue 14's printing figure (bench/printing_latency.py)."""
    if not printing:
        return
    table.section("printing (session -> client's printer, loopback)")
    runs = printing.get("runs")
    spread = spread_pct(runs["session"]) if isinstance(runs, dict) and "session" in runs else None
    session_ratio = ratio(printing["session_ms_median"], printing["direct_ms_median"])
    table.add("lp in the session -> job at the client's printer (its own SSH channel)",
              printing["session_ms_median"], "ms", printing["direct_ms_median"], "lp into the client's CUPS",
              session_ratio, "<= 3x", session_ratio is not None and session_ratio <= 3.0, spread)
    if "nx_channel_ms_median" in printing:
        table.add("the same through the NX cups channel (other NX clients)", printing["nx_channel_ms_median"], "ms",
                  printing["direct_ms_median"], "lp into the client's CUPS",
                  ratio(printing["nx_channel_ms_median"], printing["direct_ms_median"]), "(info)", None, None)


def sharing_rows(table: Table, sharing: dict | None) -> None:
    """Issue 14's folder sharing figures (bench/sharing_copy.py): each way beside the same
    smbnetfs on the same Samba without NX or SSH, from the same run (the ways alternate), with
    the paired ratio and the CPU seconds per GB of every process of the copy."""
    if not sharing:
        return
    load = sharing.get("load")
    table.section(f"folder sharing: a {sharing['size_mb']} MB file, the session's smbnetfs to the client's Samba "
                  f"(loopback, link={sharing['link']})" + (f"; load {load['median']:.1f} ({load['min']:.1f}-"
                                                          f"{load['max']:.1f})" if load else ""))

    def cpu(figures: dict, way: str) -> str:
        used = figures.get(f"{way}_cpu_s_per_gb") or {}
        return ", ".join(f"{name} {seconds:.2f}" for name, seconds in sorted(used.items())) + \
            f" (all {sum(used.values()):.2f})" if used else "-"

    for way, label in (("read", "client's folder -> session (read)"), ("write", "session -> client's folder (write)")):
        for path, how, target in (("tunnel", "its own SSH channel", ">= 0.5x"), ("nx", "the NX smb channel", "(info)")):
            if not sharing.get(path):
                continue
            share = sharing.get(f"{path}_{way}_ratio")
            paired = sharing.get(f"{path}_{way}_paired_ratio")
            note = (f"paired {paired:.2f}x; " if paired is not None else "") + \
                f"CPU s/GB {cpu(sharing[path], way)}; without NX {cpu(sharing['direct'], way)}"
            table.add(f"{label}, {how}", sharing[path][f"{way}_mbps"], "MB/s", sharing["direct"][f"{way}_mbps"],
                      "the same SMB copy without NX", share, target,
                      (share >= 0.5) if share is not None and target != "(info)" else None,
                      spread_pct(sharing[path].get(f"{way}s") or []), note=note)


def x2go_folders_rows(table: Table, folders: dict | None) -> None:
    """X2Go's shared folders through the door (bench/x2go_folders.py)."""
    if not folders:
        return
    table.section(f"X2Go shared folders: a {folders['size_mb']} MB file, the session's sshfs to x2goclient's sshd "
                  f"(loopback; load {folders['load_min']:.1f}-{folders['load_max']:.1f} on {folders['cores']} cores)")
    for way, label in (("read", "client's folder -> session (read)"), ("write", "session -> client's folder (write)")):
        spread = spread_pct(folders["door"][f"{way}s"])
        table.add(f"{label}, through the door", folders["door"][f"{way}_mbps"], "MB/s",
                  folders["direct"][f"{way}_mbps"], "sshfs straight to the client's sshd",
                  folders.get(f"{way}_ratio"), "(info)", None, spread)


def attack_rows(table: Table, attacks: dict | None) -> None:
    """Logins while the gateway is attacked (bench/attacks.py); the tests only check that they succeed."""
    if not attacks:
        return
    table.section("logins under attack (medians)")
    dheat = attacks.get("dheat")
    if dheat:
        login, page = statistics.median(dheat["login_s"]), statistics.median(dheat["page_s"])
        quiet_login, quiet_page = statistics.median(dheat["quiet_login_s"]), statistics.median(dheat["quiet_page_s"])
        table.add("NX login (group exchange) under DHEat", login, "s", quiet_login, "quiet", ratio(login, quiet_login),
                  f"< {dheat['target_login_s']:g} s", login < dheat["target_login_s"], spread_pct(dheat["login_s"]))
        table.add("portal page under DHEat", page * 1000, "ms", quiet_page * 1000, "quiet", ratio(page, quiet_page),
                  f"< {dheat['target_page_s'] * 1000:g} ms", page < dheat["target_page_s"], spread_pct(dheat["page_s"]))
    frozen = attacks.get("frozen")
    if frozen:
        table.add("group-exchange login, workers SIGSTOPped", statistics.median(frozen["first_s"]), "s", target="(info)",
                  spread=spread_pct(frozen["first_s"]),
                  note=f"the next login {statistics.median(frozen['next_s']):.3f} s")
    idle = attacks.get("idle")
    if idle:
        login, quiet = statistics.median(idle["login_s"]), statistics.median(idle["quiet_login_s"])
        table.add("NX login, 20 x 10 idle connections", login, "s", quiet, "quiet", ratio(login, quiet), "(info)",
                  spread=spread_pct(idle["login_s"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes and counts: a smoke run (minutes)")
    parser.add_argument("--runs", type=int, default=5, help="session timing runs (nxgate and X2Go)")
    parser.add_argument("--sessions", type=int, default=10, help="sessions per side for the memory figures")
    parser.add_argument("--size", default="2G", help="bytes per relay throughput run")
    parser.add_argument("--repeat", type=int, default=3, help="relay throughput runs per row")
    parser.add_argument("--skip", default="", help="comma-separated steps to skip: relay,sessions,new_session,x2go,memory,agent_memory,scale,store,cluster,cluster_picture,cluster_relay,sound,x2go_sound,web,printing,sharing,x2go_folders,attacks,displays")
    parser.add_argument("--no-install", action="store_true", help="never apt-get install bench packages")
    parser.add_argument("--profile", action="store_true", help="py-spy the gateway (relay, logins, sessions)")
    parser.add_argument("--table-only", action="store_true", help="rebuild the table from bench/results/*.json")
    args = parser.parse_args(argv)
    if os.geteuid() != 0 and not args.table_only:
        print("make bench needs root: the benchmarks create Unix users and run sshd and X2Go", file=sys.stderr)
        return 2
    os.makedirs(RESULTS, exist_ok=True)
    python = sys.executable
    skip = set(filter(None, args.skip.split(",")))
    install = [] if args.no_install else ["--install"]
    profile = ["--profile"] if args.profile else []
    runs, sessions, size, repeat = args.runs, args.sessions, args.size, args.repeat
    scale_args = []
    if args.quick:
        runs, sessions, size, repeat = 2, 3, "256M", 1
        scale_args = ["--sessions", "1,5,10", "--logins", "40", "--ended", "1000", "--dead", "10", "--phase-runs", "2"]
    steps = {
        "relay": [python, os.path.join(HERE, "relay.py"), "--size", size, "--repeat", str(repeat),
                  "--json", os.path.join(RESULTS, "relay.json"), *install, *profile],
        "sessions": [python, os.path.join(HERE, "sessions.py"), "--runs", str(runs),
                     "--json", os.path.join(RESULTS, "sessions.json")],
        "new_session": [python, os.path.join(HERE, "new_session.py"), "--runs", str(3 if args.quick else 9),
                        "--breakdown", str(1 if args.quick else 5), "--operations", str(1 if args.quick else 3),
                        "--json", os.path.join(RESULTS, "new_session.json")],
        "x2go": [python, os.path.join(HERE, "x2go.py"), "--runs", str(runs),
                 "--json", os.path.join(RESULTS, "x2go.json"), *install],
        "memory": [python, os.path.join(HERE, "memory.py"), "--sessions", str(sessions),
                   "--json", os.path.join(RESULTS, "memory.json"), *install],
        "agent_memory": [python, os.path.join(HERE, "agent_memory.py"), "--runs", "1" if args.quick else "2",
                         "--only", AGENT_VARIANTS, "--json", os.path.join(RESULTS, "agent_memory.json")],
        "scale": [python, os.path.join(HERE, "scale.py"), "--only", "sessions,logins,store,phases",
                  "--json", os.path.join(RESULTS, "scale.json"), *scale_args, *profile],
        "store": [python, os.path.join(HERE, "store_listing.py"), "--json", os.path.join(RESULTS, "store.json"),
                  *(["--calls", "50"] if args.quick else [])],
        "cluster_relay": [python, os.path.join(HERE, "cluster_relay.py"), "--size",
                          "128M" if args.quick else "512M", "--repeat", str(repeat), *(["--rounds", "300"] if args.quick else []),
                          "--pin", "--json", os.path.join(RESULTS, "cluster_relay.json")],
        "cluster": [python, os.path.join(HERE, "cluster_placement.py"), "--json", os.path.join(RESULTS, "cluster.json"),
                    *(["--calls", "50"] if args.quick else [])],
        "cluster_picture": [python, os.path.join(HERE, "cluster_picture.py"), "--runs", str(runs),
                            "--json", os.path.join(RESULTS, "cluster_picture.json")],
        "sound": [python, os.path.join(HERE, "sound_latency.py"), "--runs", str(runs * 2),
                  "--json", os.path.join(RESULTS, "sound.json")],
        "x2go_sound": [python, os.path.join(HERE, "x2go_sound.py"), "--runs", str(runs * 2),
                       "--json", os.path.join(RESULTS, "x2go_sound.json")],
        "web": [python, os.path.join(HERE, "web_viewer.py"), "--runs", str(runs + 2),
                "--keys", "30" if args.quick else "200", "--json", os.path.join(RESULTS, "web_viewer.json")],
        "printing": [python, os.path.join(HERE, "printing_latency.py"), "--runs", str(runs * 2),
                     "--json", os.path.join(RESULTS, "printing.json")],
        "sharing": [python, os.path.join(HERE, "sharing_copy.py"), "--size-mb", "10" if args.quick else "100",
                    "--json", os.path.join(RESULTS, "sharing.json")],
        "x2go_folders": [python, os.path.join(HERE, "x2go_folders.py"), "--size-mb", "10" if args.quick else "50",
                         "--runs", "2" if args.quick else "4", "--json", os.path.join(RESULTS, "x2go_folders.json")],
        "displays": [python, os.path.join(HERE, "display_search.py"), "--runs", "3" if args.quick else "10",
                     "--json", os.path.join(RESULTS, "displays.json")],
        "attacks": [python, os.path.join(HERE, "attacks.py"), "--runs", str(runs),
                    "--json", os.path.join(RESULTS, "attacks.json")],
    }
    log_dir = os.path.join(RESULTS, "logs")
    os.makedirs(log_dir, exist_ok=True)
    steps_run: dict[str, dict] = {}
    started = time.time()
    load_before = os.getloadavg()
    if not args.table_only:
        for name, step in steps.items():
            if name in skip:
                continue
            # A step's old JSON must not pass for this run's.
            path = step[step.index("--json") + 1]
            if os.path.exists(path):
                os.replace(path, path + ".previous")
            steps_run[name] = run_step(name, step, log_dir)
    relay = load(os.path.join(RESULTS, "relay.json"))
    sessions_result = load(os.path.join(RESULTS, "sessions.json"))
    new_session = load(os.path.join(RESULTS, "new_session.json"))
    x2go = load(os.path.join(RESULTS, "x2go.json"))
    memory = load(os.path.join(RESULTS, "memory.json"))
    agent_memory = load(os.path.join(RESULTS, "agent_memory.json"))
    scale = load(os.path.join(RESULTS, "scale.json"))
    store = load(os.path.join(RESULTS, "store.json"))
    sound = load(os.path.join(RESULTS, "sound.json"))
    x2go_sound = load(os.path.join(RESULTS, "x2go_sound.json"))
    cluster_relay = load(os.path.join(RESULTS, "cluster_relay.json"))
    placement = load(os.path.join(RESULTS, "cluster.json"))
    cluster_picture = load(os.path.join(RESULTS, "cluster_picture.json"))
    web = load(os.path.join(RESULTS, "web_viewer.json"))
    printing = load(os.path.join(RESULTS, "printing.json"))
    sharing = load(os.path.join(RESULTS, "sharing.json"))
    display_search = load(os.path.join(RESULTS, "displays.json"))
    attacks = load(os.path.join(RESULTS, "attacks.json"))
    x2go_folders = load(os.path.join(RESULTS, "x2go_folders.json"))
    table = build_table(relay, sessions_result, x2go, scale)
    new_session_rows(table, new_session)
    memory_rows(table, memory, agent_memory)
    store_rows(table, store)
    cluster_rows(table, placement)
    cluster_picture_rows(table, cluster_picture)
    cluster_relay_rows(table, cluster_relay)
    sound_rows(table, sound)
    x2go_sound_rows(table, x2go_sound)
    web_viewer_rows(table, web)
    printing_rows(table, printing)
    sharing_rows(table, sharing)
    x2go_folders_rows(table, x2go_folders)
    display_search_rows(table, display_search)
    attack_rows(table, attacks)
    print()
    print(f"nxgate benchmark — {platform.node()}, {os.cpu_count()} CPUs, kernel {platform.release()}, "
          f"load {load_before[0]:.2f} -> {os.getloadavg()[0]:.2f}")
    table.print()
    if args.table_only:  # keep what the last full run said about its steps
        steps_run = (load(os.path.join(RESULTS, "bench.json")) or {}).get("steps", {})
    failed = [name for name, step in steps_run.items() if step["exit_code"] != 0]
    if failed:
        print(f"\nsteps that failed: {', '.join(failed)} (see bench/results/logs/)")
    summary = {
        "started": started, "seconds": time.time() - started, "cpus": os.cpu_count(), "kernel": platform.release(),
        "load_before": load_before, "load_after": os.getloadavg(), "quick": args.quick,
        "steps": steps_run, "table": table.rows,
        "results": {"relay": relay, "sessions": sessions_result, "new_session": new_session, "x2go": x2go,
                    "memory": memory, "agent_memory": agent_memory, "scale": scale, "store": store,
                    "displays": display_search,
                    "cluster": placement, "cluster_picture": cluster_picture,
                    "cluster_relay": cluster_relay, "sound": sound, "x2go_sound": x2go_sound, "web_viewer": web, "printing": printing, "sharing": sharing,
                    "x2go_folders": x2go_folders, "attacks": attacks},
        "x2go_reference": X2GO_REFERENCE,
    }
    out = os.path.join(RESULTS, "bench.json")
    with open(out, "w") as handle:
        json.dump(summary, handle, indent=2)
        handle.write("\n")
    print(f"\n(JSON: {out})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
