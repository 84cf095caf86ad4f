#!/usr/bin/env python3
"""nxgate at scale: many sessions, many parallel logins, a big session store.

1. ``sessions``: 1, 10, 50 and then 100 small application sessions of one
   user (``xterm -geometry 10x2``), each started and drawn by an NX client
   as nxssh-based clients do (OpenSSH client + nxproxy through the SSH
   channel, onto one Xvfb), then suspended (the clients go), as a gateway
   holds most of its sessions: at each count the gateway's RSS and PSS, its
   idle CPU, and a new login + ``listsession`` (median); the growth per
   added session between counts; per session (shown rootless, as X2Go's
   are) the agent's PSS and that of all the user's processes.
2. ``logins``: 200 full NX logins in parallel (OpenSSH client, nx key, NX
   login with a password checked by PAM, ``listsession``, ``quit``) spread
   over 10 users: failures (must be 0), p50/p99 of the login time (ssh
   started -> listsession answered) and of its phases.
3. ``store``: the gateway with 10 live sessions (real agents) and 10 000
   ended sessions in its SQLite store (written with nxgate's own
   SessionStore while the gateway is stopped): the gateway's start time
   (process start -> listening, reconcile included) and ``listsession``
   times, each against the same gateway with the 10 live sessions only; then
   --dead rows that look live but whose agents are gone (as after a reboot):
   how long reconcile takes to end them.

Limits are raised in the gateway's config (display_limit, max_sessions,
max_sessions_per_user, pam_threads).  Needs root.  Prints a table, writes JSON.

    .venv/bin/python bench/scale.py [--sessions 1,10,50,100] [--logins 200] [--ended 10000] [--json FILE]
    .venv/bin/python bench/scale.py --only logins --profile    # py-spy on the gateway during the logins
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import sqlite3
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
sys.path.insert(0, HERE)

import pss  # noqa: E402
from relay import CLK_TCK, PY_SPY, PySpy, pgrep, print_profile, proc_ticks, rss_kb  # noqa: E402

from tests.harness.gateway import Gateway  # noqa: E402
from tests.harness.process import Timeout, stop, wait_for  # noqa: E402
from tests.harness.ssh import Attachment, NXClient, SessionInfo  # noqa: E402
from tests.harness.users import create_user  # noqa: E402
from tests.harness.x11 import ClientScreen  # noqa: E402

START = ('startsession --session="{name}" --type="unix-application" --application="{app}" --geometry="{geometry}" '
         '--screeninfo="{geometry}x24+render" --link="lan" --encryption="1" --cache="16M" --images="64M" '
         '--keyboard="pc105/us" --client="linux" --media="0" --backingstore="1"')
# The sessions whose memory is measured are shown rootless, as X2Go's application
# sessions are: a desktop-mode agent keeps a framebuffer of the client's whole screen
# (nxagent forces full screen without a window manager there), 3.8 MB more per agent
# (bench/agent_memory.py's "desktop").
ROOTLESS_START = START + ' --rootless="1"'



def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100.0 * (len(ordered) - 1))))]


def login(port: int, user, timeout: float = 120.0) -> tuple[NXClient, dict[str, float]]:
    """A full NX login through the OpenSSH client; returns the client (at the
    prompt) and the phases' durations."""
    started = time.monotonic()
    client = NXClient(port)
    try:
        client.prompt(timeout)  # ssh connected, key exchange, nx key accepted, shell: HELLO NXSERVER
        connected = time.monotonic()
        client.command("hello NXCLIENT - Version 3.0.0", timeout)
        client.command("SET SHELL_MODE SHELL", timeout)
        client.command("SET AUTH_MODE PASSWORD", timeout)
        greeted = time.monotonic()
        answer = client.login(user.name, user.password)
        if b"NX> 103" not in answer:
            raise RuntimeError(f"login refused: {answer!r}")
        client.prompt(timeout)
        logged_in = time.monotonic()
    except BaseException:
        client.close()
        raise
    return client, {"ssh": connected - started, "hello": greeted - connected, "login": logged_in - greeted}


def make_gateway(extra: dict[str, dict[str, str]] | None = None, state_dir: str | None = None) -> Gateway:
    options = {
        # Hundreds of logins at once from one address: the throttle, which
        # counts logins in progress against the address and the account
        # (issue 22), would refuse all but a few; a capacity test turns it off.
        "auth": {"failed_login_delay": "0.3", "pam_threads": "32", "throttle_per_address": "0",
                 "throttle_per_account": "0"},
        # Hundreds of clients from one address at once, as behind a NAT, all of them unauthenticated
        # for a moment: above the default caps (README, "Unauthenticated connections").
        # One user holds a client connection per session while they start (up to 100): above the
        # per-user cap on authenticated connections (README, "Authenticated connections").
        "server": {"preauth_exempt": "127.0.0.1", "max_startups": "1000", "max_connections_per_user": "0"},
        "sessions": {"display_base": "2000", "display_limit": "300", "max_sessions": "300",
                     "max_sessions_per_user": "300", "agent_start_timeout": "120", "connect_timeout": "3600"},
    }
    for section, values in (extra or {}).items():
        options.setdefault(section, {}).update(values)
    return Gateway(options, state_dir=state_dir)


# ----------------------------------------------------------------- 1. sessions
def pss_kb(pid: int) -> int:
    """Proportional set size (shared pages divided among their users): what the process adds."""
    with open(f"/proc/{pid}/smaps_rollup") as handle:
        for line in handle:
            if line.startswith("Pss:"):
                return int(line.split()[1])
    return 0


def idle_cpu_pct(pid: int, seconds: float = 5.0) -> float:
    """The process's CPU over ``seconds`` while nobody uses it (% of one CPU)."""
    before = proc_ticks(pid)
    time.sleep(seconds)
    return (proc_ticks(pid) - before) / CLK_TCK / seconds * 100


def login_and_list(port: int, user) -> tuple[float, float, bytes]:
    """A new NX login and one ``listsession``: (seconds for both, seconds for the listsession, its reply)."""
    started = time.monotonic()
    client, _ = login(port, user)
    try:
        listed = time.monotonic()
        reply = client.command('listsession --type="unix-application"')
        done = time.monotonic()
    finally:
        client.close()
    return done - started, done - listed, reply


def suspended(port: int, user) -> int:
    """How many of the user's sessions ``listsession`` shows suspended (0 if the login fails: a
    loaded machine may time one out while the sessions suspend)."""
    try:
        return login_and_list(port, user)[2].count(b"Suspended")
    except (Timeout, RuntimeError, OSError) as error:
        print(f"  (a login to count the suspended sessions failed: {error!s:.200})", flush=True)
        return 0


def growth(counts: dict[str, dict], key: str) -> list[float]:
    """Per added session, between each count and the one before it (the first from 0 sessions' ``base``)."""
    slopes, previous, before = [], 0, None
    for count, figures in counts.items():
        if before is not None and int(count) > previous:
            slopes.append((figures[key] - before) / (int(count) - previous))
        previous, before = int(count), figures[key]
    return slopes


def bench_sessions(counts: list[int], parallel: int, lists: int = 7) -> dict:
    """One user's application sessions, started and drawn (attached), then suspended, as a gateway
    holds them most of the time; at each count: the gateway's memory (RSS and PSS) and idle CPU,
    and a new login + ``listsession`` (median of ``lists``), so that growth per added session shows."""
    user = create_user(prefix="nxc")
    gateway = make_gateway().start()
    screen = ClientScreen(1024, 768)
    lock = threading.Lock()
    started_clients: list[tuple[NXClient, Attachment]] = []
    out: dict = {"counts": {}, "suspended": True}
    pid = gateway.process.pid
    try:
        time.sleep(2)
        login_and_list(gateway.port, user)  # PAM and the gateway warm, as on a server that has been up
        idle = rss_kb(pid)
        out["gateway_rss_mb_idle"] = idle / 1024
        out["base"] = {"gateway_rss_mb": idle / 1024, "gateway_pss_mb": pss_kb(pid) / 1024,
                       "gateway_idle_cpu_pct": idle_cpu_pct(pid)}
        lists_at_zero = [login_and_list(gateway.port, user) for _ in range(lists)]
        out["base"]["login_list_s"] = statistics.median(t for t, _, _ in lists_at_zero)
        out["base"]["list_ms"] = statistics.median(t for _, t, _ in lists_at_zero) * 1000

        def one(index: int) -> float:
            started = time.monotonic()
            client, _ = login(gateway.port, user)
            app = f"xterm -geometry 10x2+{(index * 7) % 900}+{(index * 13) % 700}"
            reply = client.command(ROOTLESS_START.format(name=f"s{index}", app=app, geometry="320x240"), timeout=180)
            if b"NX> 710" not in reply:
                client.close()
                raise RuntimeError(f"session {index} did not start: {reply[-300:]!r}")
            attachment = Attachment(client, SessionInfo.parse(reply), screen.name, gateway.workdir)
            with lock:
                started_clients.append((client, attachment))
            return time.monotonic() - started

        done = 0
        for count in counts:
            started = time.monotonic()
            with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
                start_times = list(pool.map(one, range(done, count)))
            wait_for(lambda c=count: len(pgrep(user.name, "xterm")) >= c, 300, f"{count} programs")
            ramp = time.monotonic() - started
            done = count
            time.sleep(2)  # drawn
            for client, attachment in started_clients:  # the clients go: the sessions suspend
                attachment.detach()
                client.close()
            started_clients.clear()
            wait_for(lambda c=count: suspended(gateway.port, user) >= c, 180, f"{count} suspended sessions",
                     interval=1.0)
            time.sleep(3)
            agents = pgrep(user.name, "nxagent")
            mine = pss.by_name(pss.user_pids(user.entry.pw_uid))
            gateway_kb = rss_kb(pid)
            idle_pct = idle_cpu_pct(pid)
            timed = [login_and_list(gateway.port, user) for _ in range(lists)]
            figures = {
                "sessions": len(agents),
                "ramp_seconds": ramp,
                "start_to_attached_p50_s": statistics.median(start_times),
                "gateway_rss_mb": gateway_kb / 1024,
                "gateway_pss_mb": pss_kb(pid) / 1024,
                "gateway_mb_per_session": (gateway_kb - idle) / 1024 / count,
                "gateway_idle_cpu_pct": idle_pct,
                "login_list_s": statistics.median(t for t, _, _ in timed),
                "login_list_all_s": [t for t, _, _ in timed],
                "list_ms": statistics.median(t for _, t, _ in timed) * 1000,
                "agent_pss_mb_median": statistics.median(pss.rollup(p)["pss"] for p in agents) / 1024,
                "session_pss_mb_user_processes": pss.total(mine) / 1024 / count,
                "gateway_threads": len(os.listdir(f"/proc/{pid}/task")),
                "gateway_fds": len(os.listdir(f"/proc/{pid}/fd")),
                "load_1min": os.getloadavg()[0],
            }
            out["counts"][str(count)] = figures
            print(f"sessions {count} (suspended): gateway RSS {figures['gateway_rss_mb']:.1f} MB, PSS "
                  f"{figures['gateway_pss_mb']:.1f} MB, idle CPU {idle_pct:.2f}%, login + listsession "
                  f"{figures['login_list_s'] * 1000:.0f} ms (listsession {figures['list_ms']:.1f} ms); agent "
                  f"{figures['agent_pss_mb_median']:.1f} MB PSS, the user's processes "
                  f"{figures['session_pss_mb_user_processes']:.1f} MB PSS/session; ramp {ramp:.0f}s; load {figures['load_1min']:.1f}",
                  flush=True)
        with_base = {"0": out["base"], **out["counts"]}
        out["per_added_session"] = {
            "gateway_rss_kb": [v * 1024 for v in growth(with_base, "gateway_rss_mb")],
            "gateway_pss_kb": [v * 1024 for v in growth(with_base, "gateway_pss_mb")],
            "gateway_idle_cpu_pct": growth(with_base, "gateway_idle_cpu_pct"),
            "login_list_ms": [v * 1000 for v in growth(with_base, "login_list_s")],
            "list_ms": growth(with_base, "list_ms"),
        }
        print("per added session (each step): " + "; ".join(
            f"{key} {', '.join(f'{v:.3g}' for v in values)}" for key, values in out["per_added_session"].items()))
    finally:
        for client, attachment in started_clients:
            attachment.detach()
            client.close()
        subprocess.run(["pkill", "-TERM", "-u", user.name, "-x", "nxagent"], check=False)
        try:
            wait_for(lambda: not pgrep(user.name, "nxagent"), 60, "the agents to end")
        except AssertionError:
            pass
        screen.close()
        gateway.stop()
        user.remove()
    return out


# ------------------------------------------------------------------- 2. logins
def listen_overflows() -> dict[str, int]:
    """The kernel's counters of connections dropped because an accept queue was full."""
    with open("/proc/net/netstat") as handle:
        lines = handle.read().splitlines()
    for names, values in zip(lines[::2], lines[1::2]):
        if names.startswith("TcpExt:"):
            table = dict(zip(names.split()[1:], map(int, values.split()[1:])))
            return {key: table.get(key, 0) for key in ("ListenOverflows", "ListenDrops")}
    return {}


def bench_logins(total: int, users: int, pam_threads: int, profile_dir: str | None, backlog: int = 0) -> dict:
    accounts = [create_user(prefix="nxl") for _ in range(users)]
    extra: dict[str, dict[str, str]] = {"auth": {"pam_threads": str(pam_threads)}}
    if backlog:
        extra["server"] = {"listen": f"tcp:0:interface=127.0.0.1:backlog={backlog}"}
    gateway = make_gateway(extra).start()
    out: dict = {"logins": total, "users": users, "pam_threads": pam_threads,
                 "listen": extra.get("server", {}).get("listen", "default backlog (Twisted: 50)")}
    try:
        # One login first: PAM and the gateway warm, as on a server that has been up.
        client, _ = login(gateway.port, accounts[0])
        client.command('listsession --type="unix-application"')
        client.close()
        barrier = threading.Barrier(total)
        results: list[dict] = [{} for _ in range(total)]

        def one(index: int) -> None:
            account = accounts[index % users]
            barrier.wait()
            started = time.monotonic()
            try:
                client, phases = login(gateway.port, account)
                listed = time.monotonic()
                reply = client.command('listsession --type="unix-application"')
                if b"NX> 148" not in reply and b"NX> 127" not in reply:
                    raise RuntimeError(f"listsession: {reply[-200:]!r}")
                phases["listsession"] = time.monotonic() - listed
                phases["total"] = time.monotonic() - started
                client.send("quit")
                client.close()
                results[index] = {"ok": True, **phases}
            except Exception as error:  # noqa: BLE001 - counted as a failure
                results[index] = {"ok": False, "error": f"{type(error).__name__}: {str(error)[:300]}",
                                  "after": time.monotonic() - started}

        spy = PySpy(gateway.process.pid, os.path.join(profile_dir, "logins.raw")) if profile_dir else None
        threads = [threading.Thread(target=one, args=(index,)) for index in range(total)]
        overflows = listen_overflows()
        ticks = proc_ticks(gateway.process.pid)
        wall = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(600)
        wall = time.monotonic() - wall
        out["gateway_cpu_s_per_login"] = (proc_ticks(gateway.process.pid) - ticks) / CLK_TCK / total
        # Machine-wide counters: other programs' listeners may add to them.
        out["listen_overflows"] = {key: value - overflows.get(key, 0) for key, value in listen_overflows().items()}
        if spy is not None:
            out["profile"] = spy.stop()
            print_profile("gateway during the parallel logins", out["profile"])
        ok = [r for r in results if r.get("ok")]
        failures = [r for r in results if not r.get("ok")]
        out.update({
            "failures": len(failures),
            "failure_examples": sorted({r.get("error", "?") for r in failures})[:5],
            "wall_seconds": wall,
            "logins_per_second": len(ok) / wall if wall else None,
        })
        for phase in ("total", "ssh", "hello", "login", "listsession"):
            values = [r[phase] for r in ok]
            if values:
                out[f"{phase}_p50_s"] = pct(values, 50)
                out[f"{phase}_p99_s"] = pct(values, 99)
                out[f"{phase}_max_s"] = max(values)
        print(f"logins: {total} in parallel, {len(failures)} failed, p50 {out.get('total_p50_s', 0):.2f}s "
              f"p99 {out.get('total_p99_s', 0):.2f}s (ssh p50 {out.get('ssh_p50_s', 0):.2f}s p99 "
              f"{out.get('ssh_p99_s', 0):.2f}s, PAM login p50 {out.get('login_p50_s', 0):.2f}s p99 "
              f"{out.get('login_p99_s', 0):.2f}s), wall {wall:.1f}s, gateway CPU {out['gateway_cpu_s_per_login'] * 1000:.0f} ms/login, "
              f"listen overflows {out['listen_overflows']}",
              flush=True)
        # One login alone, for comparison.
        singles = []
        for _ in range(5):
            started = time.monotonic()
            client, phases = login(gateway.port, accounts[0])
            client.command('listsession --type="unix-application"')
            singles.append({"total": time.monotonic() - started, **phases})
            client.close()
        for phase in ("total", "ssh", "hello", "login"):
            out[f"single_{phase}_median_s"] = statistics.median(s[phase] for s in singles)
    finally:
        gateway.stop()
        for account in accounts:
            account.remove()
    return out


# -------------------------------------------------------------------- 3. store
def fill_store(path: str, user, count: int, state: str, dead_agents: bool) -> float:
    """Rows written with nxgate's own store and row format (the gateway is stopped), in one transaction."""
    import secrets

    from nxgate.vocabulary.model import Session, State
    from nxgate.store.factory import sqlite_store

    store = sqlite_store(path, None, inline=True)
    now = time.time()
    entry = user.entry
    started = time.monotonic()
    sessions = []
    for index in range(count):
        age = (index % 6 * 86400) + index  # spread over the last six days: inside history_days
        session = Session(
            id=secrets.token_hex(16).upper(), user=user.name, uid=entry.pw_uid, gid=entry.pw_gid,
            type="unix-application", name=f"old{index}", display=5000 + index % 1000, server_name="nxgate.test",
            cookie=secrets.token_hex(16), state=State(state), created=now - age - 3600, changed=now - age,
            client_address="127.0.0.1", ever_attached=True,
            agent_pid=1 if dead_agents else 0, agent_started=-1,  # pid 1 never has this start time: gone
            failure="" if dead_agents else "user request",
            options={"display": {}, "plan": {"mode": "-D", "program": ["xterm"]}},
        )
        sessions.append(session)

    def insert_all(cursor) -> None:
        for session in sessions:
            cursor.execute(store._insert, session_row(session))

    from nxgate.store.rows import session_row

    store.connections.run(insert_all)
    store.close()
    return time.monotonic() - started


def live_rows(path: str) -> int:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        (count,) = db.execute("SELECT COUNT(*) FROM sessions WHERE state NOT IN ('terminated', 'failed')").fetchone()
        return count
    finally:
        db.close()


def stop_gateway(gateway: Gateway) -> None:
    """Stop the gateway but keep its state (its sessions live on); set its log
    aside, since Gateway.start() looks for the last "listening" line in it."""
    stop(gateway.process)
    gateway.process.stderr.close()
    gateway.process = None
    index = 1
    while os.path.exists(f"{gateway.logfile}.{index}"):
        index += 1
    os.rename(gateway.logfile, f"{gateway.logfile}.{index}")


def timed_start(gateway: Gateway) -> float:
    started = time.monotonic()
    gateway.start(timeout=600)
    return time.monotonic() - started


def listsession_times(gateway: Gateway, user, count: int = 20) -> dict[str, float]:
    client, _ = login(gateway.port, user)
    try:
        times = []
        rows = 0
        for _ in range(count):
            started = time.monotonic()
            reply = client.command('listsession --status="suspended,running" --type="unix-application"')
            times.append(time.monotonic() - started)
            rows = len(re.findall(rb"^\d+ +unix-application", reply, re.M))
        return {"median_ms": statistics.median(times) * 1000, "p99_ms": pct(times, 99) * 1000, "rows_listed": rows}
    finally:
        client.close()


def bench_store(live: int, ended: int, dead: int) -> dict:
    user = create_user(prefix="nxd")
    gateway = make_gateway()
    state_dir = gateway.state_dir
    out: dict = {"live": live, "ended": ended, "dead": dead}
    try:
        out["start_s_empty_store"] = timed_start(gateway)
        client, _ = login(gateway.port, user)
        for index in range(live):
            reply = client.command(START.format(name=f"live{index}", app="xterm -geometry 10x2", geometry="320x240"),
                                   timeout=120)
            if b"NX> 710" not in reply:
                raise RuntimeError(f"live session {index}: {reply[-300:]!r}")
        client.close()
        store_path = os.path.join(state_dir, "nxgate.sqlite")
        out["list_live_only"] = listsession_times(gateway, user)
        starts = []
        for _ in range(3):
            stop_gateway(gateway)
            starts.append(timed_start(gateway))
        out["start_s_live_only"] = statistics.median(starts)
        out["start_s_live_only_all"] = starts
        stop_gateway(gateway)
        out["fill_seconds"] = fill_store(store_path, user, ended, "terminated", dead_agents=False)
        out["store_mb"] = os.path.getsize(store_path) / 1e6
        starts = []
        for _ in range(3):
            starts.append(timed_start(gateway))
            if _ < 2:
                stop_gateway(gateway)
        out["start_s_with_ended"] = statistics.median(starts)
        out["start_s_with_ended_all"] = starts
        out["list_with_ended"] = listsession_times(gateway, user)
        if dead:
            stop_gateway(gateway)
            fill_store(store_path, user, dead, "suspended", dead_agents=True)
            started = time.monotonic()
            gateway.start(timeout=600)
            out["start_s_with_dead"] = time.monotonic() - started
            wait_for(lambda: live_rows(store_path) <= live, 1800, "reconcile to end the dead sessions", interval=0.2)
            out["reconcile_dead_s"] = time.monotonic() - started
            out["list_after_dead"] = listsession_times(gateway, user)
        print(f"store: start {out['start_s_live_only']:.2f}s with {live} live, {out['start_s_with_ended']:.2f}s with "
              f"{ended} ended more; listsession {out['list_live_only']['median_ms']:.1f} ms vs "
              f"{out['list_with_ended']['median_ms']:.1f} ms"
              + (f"; {dead} dead-agent rows ended in {out['reconcile_dead_s']:.1f}s" if dead else ""), flush=True)
    finally:
        subprocess.run(["pkill", "-TERM", "-u", user.name, "-x", "nxagent"], check=False)
        try:
            wait_for(lambda: not pgrep(user.name, "nxagent"), 30, "the agents to end")
        except AssertionError:
            pass
        gateway.stop()
        user.remove()
    return out


# ------------------------------------------------------------------- 4. phases
MAGENTA = (255, 0, 255)
BIG_APP = "xterm -bg #ff00ff -fg #ff00ff -geometry 200x60+0+0"


class LogWatch(threading.Thread):
    """Timestamps (monotonic, ``interval`` polling) of the lines an agent log gets."""

    def __init__(self, path: str, interval: float = 0.005) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.interval = interval
        self.lines: list[tuple[float, str]] = []
        self.done = threading.Event()
        self.start()

    def run(self) -> None:
        offset, partial = 0, b""
        while not self.done.is_set():
            try:
                with open(self.path, "rb") as handle:
                    handle.seek(offset)
                    data = handle.read()
            except OSError:
                data = b""
            if data:
                now = time.monotonic()
                offset += len(data)
                *complete, partial = (partial + data).split(b"\n")
                self.lines += [(now, line.decode(errors="replace")) for line in complete]
            time.sleep(self.interval)

    def when(self, text: str, after: float, timeout: float = 2.0) -> float | None:
        """When the first line with ``text`` after ``after`` was read (waits a
        little: the gateway may react to a line before our poller reads it)."""
        deadline = time.monotonic() + timeout
        while True:
            found = next((t for t, line in list(self.lines) if t >= after and text in line), None)
            if found is not None or time.monotonic() > deadline:
                return found
            time.sleep(0.01)

    def stop(self) -> None:
        self.done.set()
        self.join(2)


class PromptAttachment(Attachment):
    """The harness's attachment, except that when nxproxy closes its end the
    SSH channel gets its EOF at once, as nxgate-client does (it closes the
    channel when nxproxy's connection closes).  The harness first waits for
    nxproxy to exit -- nxcomp sleeps 200 ms after closing -- and only then
    ends ssh: nxagent, which waits for its peer to close before it says
    suspended or terminated, would be timed with those 200 ms of the test
    client in it."""

    def upstream_ended(self) -> None:
        self.send_eof()
        self.detach()


def spawned_at(pid: int) -> float | None:
    """When a process was forked, on the monotonic clock (10 ms resolution)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return None
    ticks = int(stat[stat.rindex(b")") + 2:].split()[19])
    offset = time.clock_gettime(time.CLOCK_BOOTTIME) - time.monotonic()
    return ticks / os.sysconf("SC_CLK_TCK") - offset


def median_run(argv: list[str], runs: int = 5, env: dict[str, str] | None = None) -> float:
    times = []
    for _ in range(runs):
        started = time.monotonic()
        subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=120, check=False)
        times.append(time.monotonic() - started)
    return statistics.median(times)


def bench_phases(runs: int, profile_dir: str | None) -> dict:
    """Where the time of bench/sessions.py's operations goes, seen from the
    server side (an OpenSSH client doing what nxgate-client does, with
    timestamps between the steps) and from nxgate-client's own costs."""
    user = create_user(prefix="nxp")
    gateway = make_gateway({"server": {"log_level": "debug"},
                            "sessions": {"display_base": "2400", "connect_timeout": "120"}}).start()
    screen = ClientScreen(1024, 768)
    env = dict(os.environ, PYTHONPATH=REPO, DISPLAY=screen.name, NXGATE_PASSWORD=user.password)
    client_argv = [sys.executable, "-m", "nxgate.clients.nx", "--accept-any-host-key", "--port", str(gateway.port)]
    out: dict = {"runs": []}
    spy = None
    try:
        out["python_start_s"] = median_run([sys.executable, "-c", "pass"])
        out["client_import_s"] = median_run([sys.executable, "-c", "import nxgate.clients.nx.main"], env=env)
        out["client_help_s"] = median_run(client_argv + ["--help"], env=env)
        out["launcher_start_s"] = median_run([sys.executable, "-m", "nxgate.host.runas"], env=env)
        out["client_list_s"] = median_run(client_argv + ["--list", f"{user.name}@127.0.0.1"], env=env)
        if profile_dir:
            spy = PySpy(gateway.process.pid, os.path.join(profile_dir, "sessions.raw"))

        def picture() -> int:
            return screen.shot().count(MAGENTA)

        for index in range(runs):
            run: dict[str, float] = {}
            started = time.monotonic()
            client, phases = login(gateway.port, user)
            run.update({f"login_{k}": v for k, v in phases.items()})
            mark = time.monotonic()
            reply = client.command(START.format(name=f"p{index}", app=BIG_APP, geometry="1024x768"), timeout=120)
            run["startsession_to_710"] = time.monotonic() - mark
            info = SessionInfo.parse(reply)
            watch = LogWatch(os.path.join(gateway.state_dir, "logs", f"{info.session_id}.agent.log"))
            mark = time.monotonic()
            attachment = PromptAttachment(client, info, screen.name, gateway.workdir)
            run["bye_and_proxy"] = time.monotonic() - mark
            wait_for(lambda: picture() > 5000, 60, "the picture", interval=0.02)
            seen = time.monotonic()
            run["attached_to_picture"] = seen - mark
            run["new_to_picture_openssh"] = seen - started
            agent_running = watch.when("Session: Session started", mark)
            programs = pgrep(user.name, "xterm")
            program_spawned = spawned_at(programs[0]) if programs else None
            if agent_running and program_spawned:
                run["new:proxy_handshake_to_agent_running"] = agent_running - mark
                run["new:agent_running_to_program_spawned"] = program_spawned - agent_running
                run["new:program_spawned_to_picture_seen"] = seen - program_spawned
            # suspend from a second connection, as nxgate-client --suspend does
            mark = time.monotonic()
            other, _ = login(gateway.port, user)
            run["suspend_login"] = time.monotonic() - mark
            mark2 = time.monotonic()
            reply = other.command(f'suspend --sessionid="{info.session_id}"', timeout=60)
            run["suspend_command"] = time.monotonic() - mark2
            suspending = watch.when("Session: Suspending session", mark2)
            suspended = watch.when("Session: Session suspended", mark2)
            if suspending and suspended:
                run["suspend:sighup_to_agent_suspending"] = suspending - mark2
                run["suspend:agent_suspending_to_suspended"] = suspended - suspending
                run["suspend:agent_suspended_to_reply"] = mark2 + run["suspend_command"] - suspended
            other.close()
            run["suspend_openssh"] = time.monotonic() - mark
            attachment.detach()
            client.close()
            wait_for(lambda: picture() < 100, 30, "the picture to go")
            subprocess.run(["xsetroot", "-solid", "black"], env=env, check=False)
            started = time.monotonic()
            client, _ = login(gateway.port, user)
            run["resume_login"] = time.monotonic() - started
            mark = time.monotonic()
            reply = client.command(START.format(name="r", app=BIG_APP, geometry="1024x768").replace(
                "startsession", "restoresession") + f' --id="{info.session_id}"', timeout=60)
            run["restoresession_to_710"] = time.monotonic() - mark
            info = SessionInfo.parse(reply)
            mark = time.monotonic()
            attachment = PromptAttachment(client, info, screen.name, gateway.workdir)
            run["resume_bye_and_proxy"] = time.monotonic() - mark
            wait_for(lambda: picture() > 5000, 60, "the picture", interval=0.02)
            seen = time.monotonic()
            run["resume_attached_to_picture"] = seen - mark
            run["resume_to_picture_openssh"] = seen - started
            resumed = watch.when("Session: Session resumed", mark)
            if resumed:
                run["resume:proxy_handshake_to_agent_resumed"] = resumed - mark
                run["resume:agent_resumed_to_picture_seen"] = seen - resumed
            mark = time.monotonic()
            other, _ = login(gateway.port, user)
            mark2 = time.monotonic()
            other.command(f'terminate --sessionid="{info.session_id}"', timeout=60)
            run["terminate_command"] = time.monotonic() - mark2
            terminating = watch.when("Session: Terminating session", mark2)
            terminated = watch.when("Session: Session terminated", mark2)
            if terminating and terminated:
                run["terminate:sigterm_to_agent_terminating"] = terminating - mark2
                run["terminate:agent_terminating_to_terminated"] = terminated - terminating
                run["terminate:agent_terminated_to_reply"] = mark2 + run["terminate_command"] - terminated
            watch.stop()
            if index == 0:  # one agent log with our timestamps, to read what the agent does meanwhile
                base = watch.lines[0][0] if watch.lines else 0.0
                out["agent_log_first_run"] = [f"{t - base:8.3f} {line}" for t, line in watch.lines]
            other.close()
            run["terminate_openssh"] = time.monotonic() - mark
            attachment.detach()
            client.close()
            wait_for(lambda: picture() < 100, 30, "the picture to go")
            out["runs"].append(run)
            print(f"phases run {index}: " + ", ".join(f"{k} {v:.3f}" for k, v in run.items()), flush=True)
        if spy is not None:
            out["profile"] = spy.stop()
            print_profile("gateway during the session operations", out["profile"])
        keys = sorted({key for run in out["runs"] for key in run}, key=lambda k: list(out["runs"][0]).index(k)
                      if k in out["runs"][0] else 999)
        out["medians"] = {key: statistics.median(run[key] for run in out["runs"] if key in run) for key in keys}
        out["spread"] = {key: [min(run[key] for run in out["runs"] if key in run),
                               max(run[key] for run in out["runs"] if key in run)] for key in keys}
        log = gateway.log()
        out["sighup_retries"] = log.count("not taken yet")
        out["watchdog_kills"] = log.count("ending nxagent's watchdog")
        out["second_sigterm_or_kill"] = log.count("ignored SIGTERM") + log.count("still running after it ended")
        out["second_sigterm"] = log.count("has not terminated after")
    finally:
        subprocess.run(["pkill", "-TERM", "-u", user.name, "-x", "nxagent"], check=False)
        screen.close()
        gateway.stop()
        user.remove()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", default="1,10,50,100", help="session counts, measured in turn")
    parser.add_argument("--parallel", type=int, default=4, help="sessions started at once")
    parser.add_argument("--logins", type=int, default=200)
    parser.add_argument("--login-users", type=int, default=10)
    parser.add_argument("--pam-threads", type=int, default=32)
    parser.add_argument("--listen-backlog", type=int, default=0,
                        help="listen with tcp:...:backlog=N (default: the gateway's default endpoint)")
    parser.add_argument("--live", type=int, default=10)
    parser.add_argument("--ended", type=int, default=10000)
    parser.add_argument("--dead", type=int, default=100, help="live-looking rows whose agents are gone")
    parser.add_argument("--only", default="sessions,logins,store",
                        help="parts to run: sessions,logins,store and phases (where the session times go)")
    parser.add_argument("--phase-runs", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="py-spy on the gateway during the parallel logins")
    parser.add_argument("--json", default=os.path.join(HERE, "results", "scale.json"))
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("bench/scale.py needs root (it creates Unix users)", file=sys.stderr)
        return 2
    only = set(args.only.split(","))
    profile_dir = None
    if args.profile and os.access(PY_SPY, os.X_OK):
        profile_dir = os.path.join(os.path.dirname(os.path.abspath(args.json)), "profile")
        os.makedirs(profile_dir, exist_ok=True)
    result: dict = {"load_before": os.getloadavg()}
    if "sessions" in only:
        result["sessions"] = bench_sessions([int(c) for c in args.sessions.split(",")], args.parallel)
    if "logins" in only:
        result["logins"] = bench_logins(args.logins, args.login_users, args.pam_threads, profile_dir,
                                        args.listen_backlog)
    if "store" in only:
        result["store"] = bench_store(args.live, args.ended, args.dead)
    if "phases" in only:
        result["phases"] = bench_phases(args.phase_runs, profile_dir)
    result["load_after"] = os.getloadavg()
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as handle:
        json.dump(result, handle, indent=2)
        handle.write("\n")
    print(f"(JSON: {args.json})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
