#!/usr/bin/env python3
"""What each nxagent option, argument, environment variable and X client
costs in memory, one difference at a time.

No gateway: nxagent is started by hand as a bench user with nxgate's own
options line, command line and environment (built by
``nxgate.node.agents.nxagent`` exactly as the session supervisor builds
them, for an application session shown rootless, as nxgate-client asks
for one), ``nxproxy -S`` draws it onto an Xvfb (the client's screen) and
``xterm -geometry 40x10`` runs in it.  Its memory is read attached (3 s
after the xterm's window is there) and suspended (3 s after nxproxy went
and the agent logged ``Session suspended``).  Each variant changes one
thing; ``x2go`` is the agent as ``x2gostartagent`` starts it (argv[0]
``x2goagent``, X2Go's options file, arguments and environment, measured
from a running x2goserver session).  Variants run round-robin, ``--runs``
times each; medians.

The figures are kB from /proc/PID/smaps_rollup: ``anon`` (private
anonymous memory: heap, framebuffers, caches), ``shmem`` (MIT-SHM
segments that X clients attached), ``pss``.  One agent runs at a time,
so its PSS holds most of the binary's pages; differences between
variants are in ``anon`` and ``shmem``.

    .venv/bin/python bench/agent_memory.py [--runs 3] [--only baseline,x2go,...] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
sys.path.insert(0, HERE)

import pss  # noqa: E402
from relay import free_port  # noqa: E402

from nxgate.config import SessionsSection  # noqa: E402
from nxgate.node.agents import nxagent  # noqa: E402
from nxgate.node.environment import (compose_cache_environment, login_environment,  # noqa: E402
                                     prepare_compose_cache)
from nxgate.vocabulary.requests import DisplaySettings  # noqa: E402
from tests.harness.process import stop, stop_groups, wait_for  # noqa: E402
from tests.harness.users import create_user  # noqa: E402
from tests.harness.x11 import ClientScreen  # noqa: E402

PROGRAM = ("xterm", "-geometry", "40x10+0+0")
SETTLE = 3.0
#: What nxgate-client's request becomes (the NX door's DisplaySettings for
#: ``nxgate-client --type unix-application --rootless --geometry 800x600``).
CLIENT_SETTINGS = DisplaySettings(geometry="800x600", client="linux")


@dataclass
class Agent:
    """One agent to start: what differs between variants."""

    executable: str
    options: list[tuple[str, str]]  # the options file, in order, without nx/nx and :N
    args: list[str]  # between the executable and :N
    env: dict[str, str]
    program_env: dict[str, str]
    tcp: bool = False  # the agent listens on TCP (accept=/listen=PORT) instead of its Unix socket
    port: int = 0
    after_attach: tuple[str, ...] = ()  # an X client run (and kept, if it stays) once the program is up

    def line(self, display: int) -> str:
        return "nx/nx," + ",".join(f"{key}={value}" for key, value in self.options) + f":{display}\n"

    def set_option(self, key: str, value: str | None) -> None:
        """Replace (or with None drop) an option, appending it when new."""
        kept = [(k, v) for k, v in self.options if k != key]
        if value is not None:
            position = next((i for i, (k, _) in enumerate(self.options) if k == key), len(kept))
            kept.insert(min(position, len(kept)), (key, value))
        self.options = kept


@dataclass(frozen=True)
class Where:
    """One run's session: its display, its cookie and its files (named as
    the supervisor names them; the log beside them, no gateway reads it)."""

    display: int
    files: nxagent.AgentFiles
    cookie: str

    @property
    def directory(self) -> str:
        return self.files.directory

    @property
    def log(self) -> str:
        return self.files.log


@dataclass(frozen=True)
class _Session:
    """The fields nxgate.node.agents.nxagent reads of a session."""

    type: str
    display: int
    cookie: str
    rootless: bool
    server_name: str
    full_id: str


def nxgate_agent(user: pwd.struct_passwd, where: Where, compose_cache: str | None) -> Agent:
    """nxgate's agent for an application session shown rootless, built by the
    product's own functions (the supervisor's); its program shares the
    user's ``compose_cache`` as a session's does."""
    session = _Session(type="unix-application", display=where.display, cookie=where.cookie, rootless=True,
                       server_name="bench", full_id=f"bench-{where.display}-{secrets.token_hex(16).upper()}")
    files = where.files
    line = nxagent.options_line(session, CLIENT_SETTINGS, nxagent.listen_unix(files.socket))
    body = line.strip()[len("nx/nx,"):].rsplit(":", 1)[0]
    options = [tuple(item.split("=", 1)) for item in body.split(",")]
    argv = nxagent.agent_argv("nxagent", session, files, nxagent.AgentPlan(mode="-R"))
    base = login_environment(user, SessionsSection())
    return Agent(
        executable=shutil.which("nxagent") or "/usr/bin/nxagent",
        options=options,  # type: ignore[arg-type]
        args=argv[1:-1],
        env=nxagent.agent_environment(session, files, base),
        program_env=nxagent.x11_environment(session, files, {**base, **compose_cache_environment(compose_cache)}),
    )


def x2go_agent(user: pwd.struct_passwd, where: Where) -> Agent:
    """The agent as x2gostartagent starts it for ``pyhoca-cli -t application
    -g 800x600 -q lan`` (x2goserver 4.1.0.3: its options file, argv and
    environment, read from a running session); listening on TCP as X2Go's
    agents do (its client comes through an SSH tunnel)."""
    port = free_port()
    name = f"{user.pw_name}-{where.display}-bench_stRxterm_dp24"
    options = [
        ("link", "lan"), ("pack", "16m-jpeg-9"), ("limit", "0"), ("root", where.directory), ("cache", "8M"),
        ("images", "32M"), ("type", "unix-kde-depth_24"), ("id", name), ("cookie", where.cookie),
        ("errors", os.path.join(where.directory, "session.log_errors")), ("kbtype", "null/null"),
        ("geometry", "800x600"), ("xinerama", "0"), ("resize", "1"), ("fullscreen", "0"), ("accept", "localhost"),
        ("listen", str(port)), ("clipboard", "both"), ("client", "linux"), ("menu", "0"),
        ("state", os.path.join(where.directory, "state")),
    ]
    base = {"HOME": user.pw_dir, "USER": user.pw_name, "LOGNAME": user.pw_name, "SHELL": user.pw_shell,
            "PATH": "/usr/local/bin:/usr/bin:/bin"}
    env = dict(base, NX_TEMP="/tmp", NX_ROOT=where.directory, NX_CLIENT="/usr/lib/x2go/x2gosuspend-agent",
               X2GO_XINERAMA="false", DISPLAY=f"nx/nx,options={where.files.options}:{where.display}")
    return Agent(
        executable=x2goagent_path(),
        options=options,
        args=["-nolisten", "tcp", "-nolisten", "tcp", "-R", "-auth", where.files.authority, "-geometry", "800x600",
              "-name", f"X2GO-{name}"],
        env=env,
        program_env=dict(base, DISPLAY=f":{where.display}", XAUTHORITY=where.files.authority),
        tcp=True,
        port=port,
    )


def x2goagent_path() -> str:
    """x2goagent (x2goserver's link to nxagent: argv[0] is what differs); a
    private link when x2goserver is not installed."""
    for path in ("/usr/bin/x2goagent", "/usr/lib/x86_64-linux-gnu/nx/bin/x2goagent"):
        if os.path.exists(path):
            return path
    link = os.path.join(tempfile.gettempdir(), "nxgate-bench-x2goagent", "x2goagent")
    os.makedirs(os.path.dirname(link), exist_ok=True)
    if not os.path.lexists(link):
        os.symlink(shutil.which("nxagent") or "/usr/bin/nxagent", link)
    return link


# ------------------------------------------------------------------ variants
def _drop_arg(agent: Agent, *args: str) -> None:
    for index in range(len(agent.args) - len(args) + 1):
        if agent.args[index:index + len(args)] == list(args):
            del agent.args[index:index + len(args)]
            return
    raise ValueError(f"no {args} in {agent.args}")


def _mode(agent: Agent, mode: str) -> None:
    agent.args = [mode if arg in ("-R", "-D") else arg for arg in agent.args]
    agent.set_option("menu", None)
    if mode == "-D":
        for key, value in nxagent.geometry_options(CLIENT_SETTINGS):
            agent.set_option(key, value)


def _x2go_options(agent: Agent, user: pwd.struct_passwd, where: Where) -> None:
    """X2Go's options file, keeping our listening socket."""
    agent.options = [item for item in x2go_agent(user, where).options if item[0] not in ("accept", "listen")]
    agent.options.append(nxagent.listen_unix(where.files.socket))


def _tcp(agent: Agent) -> None:
    agent.set_option("listen", None)
    agent.set_option("accept", "127.0.0.1")
    agent.tcp = True


def _env(agent: Agent, **values: str | None) -> None:
    for key, value in values.items():
        if value is None:
            agent.env.pop(key, None)
        else:
            agent.env[key] = value


Change = Callable[[Agent, pwd.struct_passwd, Where], None]

#: name -> (what differs from nxgate's agent, the change); "baseline" and
#: "x2go" are the two products (the names in X2GO_BASED change X2Go's agent).
VARIANTS: dict[str, tuple[str, Change | None]] = {
    "baseline": ("nxgate's agent (-R, its options, argv and environment)", None),
    "x2go": ("X2Go's agent as x2gostartagent starts it", None),
    "argv0_x2goagent": ("argv[0] x2goagent (X2Go mode of the same binary)",
                        lambda a, u, w: setattr(a, "executable", x2goagent_path())),
    "x2go_options": ("X2Go's options file (cache/images/pack/kbtype/...)", _x2go_options),
    "x2go_environment": ("X2Go's environment (no LANG, NX_TEMP=/tmp...)",
                         lambda a, u, w: setattr(a, "env", {**x2go_agent(u, w).env, "DISPLAY": a.env["DISPLAY"]})),
    "lang_unset": ("no LANG in the agent's environment", lambda a, u, w: _env(a, LANG=None)),
    "program_lang_c": ("the program (xterm) with LANG=C instead of C.UTF-8",
                       lambda a, u, w: a.program_env.update(LANG="C")),
    "no_compose_cache": ("the program without the user's compose cache (XCOMPOSECACHE)",
                         lambda a, u, w: a.program_env.pop("XCOMPOSECACHE")),
    "xfixes_on": ("XFIXES offered (no -extension XFIXES)", lambda a, u, w: _drop_arg(a, "-extension", "XFIXES")),
    "glx_off": ("-extension GLX", lambda a, u, w: a.args.extend(["-extension", "GLX"])),
    "shm_off": ("shmem=0,shpix=0", lambda a, u, w: (a.set_option("shmem", "0"), a.set_option("shpix", "0"))),
    "x2go_caches": ("cache=8M,images=32M (X2Go's)",
                    lambda a, u, w: (a.set_option("cache", "8M"), a.set_option("images", "32M"))),
    "x2go_pack": ("pack=16m-jpeg-9 (X2Go's)", lambda a, u, w: a.set_option("pack", "16m-jpeg-9")),
    "backingstore_off": ("backingstore=0", lambda a, u, w: a.set_option("backingstore", "0")),
    "no_composite_render": ("no composite=1,render=1 options",
                            lambda a, u, w: (a.set_option("composite", None), a.set_option("render", None))),
    "default_sleep_cleanup": ("nxagent's default sleep and cleanup",
                              lambda a, u, w: (a.set_option("sleep", None), a.set_option("cleanup", None))),
    "kbtype_null": ("kbtype=null/null (X2Go's) instead of keyboard=pc105/us",
                    lambda a, u, w: (a.set_option("keyboard", None), a.set_option("kbtype", "null/null"))),
    "dpi_96": ("-dpi 96", lambda a, u, w: a.args.extend(["-dpi", "96"])),
    "tcp_listen": ("TCP 4000+N (accept=127.0.0.1) instead of its Unix socket", lambda a, u, w: _tcp(a)),
    "desktop": ("-D: a desktop (the root window's framebuffer)", lambda a, u, w: _mode(a, "-D")),
    "x2go_desktop": ("X2Go's agent with -D (a desktop)",
                     lambda a, u, w: setattr(a, "args", ["-D" if arg == "-R" else arg for arg in a.args])),
    "malloc_fixed_thresholds": ("MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_=131072 (glibc's dynamic ones off)",
                                lambda a, u, w: _env(a, MALLOC_MMAP_THRESHOLD_="131072",
                                                     MALLOC_TRIM_THRESHOLD_="131072")),
    "thumbnail": ("one xwd -root (a portal thumbnail) after the program",
                  lambda a, u, w: setattr(a, "after_attach", ("xwd", "-silent", "-root", "-out", "/dev/null"))),
    "x11vnc": ("x11vnc on the display (a browser viewer) while measured",
               lambda a, u, w: setattr(a, "after_attach", ("x11vnc", "-sb", "0", "-rfbport", "0", "-rfbportv6", "0",
                                                            "-no6", "-noipv6", "-nopw", "-q", "-forever"))),
}

#: Variants that change X2Go's agent rather than nxgate's.
X2GO_BASED = ("x2go_desktop",)


# ----------------------------------------------------------------------- runs
class Runner:
    def __init__(self, screen: ClientScreen, user_name: str) -> None:
        self.screen = screen
        self.user = pwd.getpwnam(user_name)
        self.base = tempfile.mkdtemp(prefix="nxgate-bench-agent-")
        os.chmod(self.base, 0o711)
        self.compose_cache = prepare_compose_cache(self.base, self.user.pw_uid, self.user.pw_gid)
        self._prime_compose_cache()

    def _prime_compose_cache(self) -> None:
        """The user's first Xlib program writes the compose cache (and keeps
        the table it parsed): one on the client's screen does it, so that
        every measured program finds the cache, as all but the first of a
        user's programs do."""
        env = {"PATH": "/usr/bin:/bin", "HOME": self.user.pw_dir, "LANG": "C.UTF-8", "DISPLAY": self.screen.name,
               **compose_cache_environment(self.compose_cache)}
        first = self.spawn(PROGRAM, env, self.user.pw_dir, os.path.join(self.base, "prime.log"))
        try:
            wait_for(lambda: os.listdir(self.compose_cache), 30, "the compose cache")
        finally:
            stop_groups([first])

    def _as_user(self) -> None:
        os.setgid(self.user.pw_gid)
        os.initgroups(self.user.pw_name, self.user.pw_gid)
        os.setuid(self.user.pw_uid)

    def spawn(self, argv: list[str] | tuple[str, ...], env: dict[str, str], cwd: str, log: str) -> subprocess.Popen:
        with open(log, "ab") as out:
            return subprocess.Popen(list(argv), env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, preexec_fn=self._as_user, start_new_session=True)

    def where(self) -> Where:
        display = free_display(1900 + (os.getpid() % 40) * 10)
        directory = tempfile.mkdtemp(prefix="s-", dir=self.base)
        os.chown(directory, self.user.pw_uid, self.user.pw_gid)
        os.chmod(directory, 0o700)
        files = nxagent.AgentFiles(directory=directory, log=os.path.join(directory, "session"),
                                   app_log=os.path.join(directory, "session.app"))
        return Where(display, files, secrets.token_hex(16))

    def run(self, name: str) -> dict:
        where = self.where()
        if name == "x2go" or name in X2GO_BASED:
            agent = x2go_agent(self.user, where)
        else:
            agent = nxgate_agent(self.user, where, self.compose_cache)
        change = VARIANTS[name][1]
        if change is not None:
            change(agent, self.user, where)
        with open(where.files.options, "w") as handle:
            handle.write(agent.line(where.display))
        subprocess.run(["xauth", "-q", "-f", where.files.authority, "add", f":{where.display}", "MIT-MAGIC-COOKIE-1",
                        where.cookie], check=True, stderr=subprocess.DEVNULL)
        for path in (where.files.options, where.files.authority):
            os.chown(path, self.user.pw_uid, self.user.pw_gid)
            os.chmod(path, 0o600)
        processes: list[subprocess.Popen] = []
        proxy = None
        try:
            process = self.spawn([agent.executable, *agent.args, f":{where.display}"], agent.env, where.directory,
                                 where.log)
            processes.append(process)
            wait_for(lambda: self._logged(where, "Waiting for connection", process), 30, f"{name}: the agent to listen")
            proxy = self._proxy(agent, where)
            wait_for(lambda: self._logged(where, "Session started", process), 30, f"{name}: the session to start")
            program = self.spawn(PROGRAM, agent.program_env, self.user.pw_dir, where.files.app_log)
            processes.append(program)
            wait_for(lambda: self._window(where, agent), 30, f"{name}: the program's window")
            if agent.after_attach:
                extra = self.spawn(agent.after_attach, agent.program_env, self.user.pw_dir, where.log + ".extra")
                processes.append(extra)
                if agent.after_attach[0] == "xwd":
                    extra.wait(30)
                else:
                    time.sleep(2)  # x11vnc takes its first picture
            time.sleep(SETTLE)
            attached = self._measure(process.pid, program.pid)
            stop(proxy)
            wait_for(lambda: self._logged(where, "Session suspended", process), 30, f"{name}: the agent to suspend")
            time.sleep(SETTLE)
            suspended = self._measure(process.pid, program.pid)
            return {"attached": attached, "suspended": suspended}
        finally:
            if proxy is not None:
                stop(proxy)
            stop_groups(processes)
            shutil.rmtree(where.directory, ignore_errors=True)

    @staticmethod
    def _logged(where: Where, text: str, process: subprocess.Popen) -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"the agent exited ({process.returncode}): {tail(where.log)}")
        with open(where.log, errors="replace") as handle:
            return text in handle.read()

    def _proxy(self, agent: Agent, where: Where) -> subprocess.Popen:
        home = tempfile.mkdtemp(prefix="proxy-", dir=where.directory)
        if agent.tcp:
            port = agent.port or 4000 + where.display
            target = f"connect=127.0.0.1,port={port}"
        else:
            target = f"connect=unix:{where.files.socket}"
        with open(os.path.join(home, "proxy.log"), "wb") as out:
            return subprocess.Popen(["nxproxy", "-S", f"nx/nx,{target},cookie={where.cookie}:{where.display}"],
                                    env={"DISPLAY": self.screen.name, "NX_HOME": home, "PATH": "/usr/bin:/bin"},
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)

    def _window(self, where: Where, agent: Agent) -> bool:
        tree = subprocess.run(["xwininfo", "-root", "-tree", "-display", f":{where.display}"],
                              env={"PATH": "/usr/bin:/bin", "XAUTHORITY": where.files.authority},
                              capture_output=True, text=True).stdout
        return '"xterm"' in tree

    @staticmethod
    def _measure(agent: int, program: int) -> dict:
        figures = pss.rollup(agent)
        program_tree = pss.by_name(pss.tree(program))
        figures["program_pss"] = pss.total(program_tree)
        figures["program_anon"] = pss.total(program_tree, key="anon")
        return figures

    def close(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)


def free_display(start: int) -> int:
    display = start
    while os.path.exists(f"/tmp/.X{display}-lock") or os.path.exists(f"/tmp/.X11-unix/X{display}"):
        display += 1
    return display


def tail(path: str, size: int = 800) -> str:
    try:
        with open(path, errors="replace") as handle:
            return handle.read()[-size:]
    except OSError:
        return "(no log)"


KEYS = ("anon", "shmem", "pss", "rss", "program_pss", "program_anon")


def summarise(runs: dict[str, list[dict]]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for name, results in runs.items():
        out[name] = {"what": VARIANTS[name][0], "runs": len(results)}
        for state in ("attached", "suspended"):
            out[name][state] = {key: statistics.median(r[state][key] for r in results) for key in KEYS}
    base = out.get("baseline")
    if base:
        for name, entry in out.items():
            for state in ("attached", "suspended"):
                entry[state]["delta_anon_shmem"] = (entry[state]["anon"] + entry[state]["shmem"]
                                                    - base[state]["anon"] - base[state]["shmem"])
                entry[state]["delta_pss"] = entry[state]["pss"] - base[state]["pss"]
                entry[state]["delta_program_anon"] = entry[state]["program_anon"] - base[state]["program_anon"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", default="", help="comma-separated variants (default: all): " + ",".join(VARIANTS))
    parser.add_argument("--json", default=os.path.join(HERE, "results", "agent_memory.json"))
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("bench/agent_memory.py needs root (it creates a Unix user)", file=sys.stderr)
        return 2
    names = [name for name in args.only.split(",") if name] or list(VARIANTS)
    unknown = [name for name in names if name not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants: {', '.join(unknown)}")
    if "baseline" not in names:
        names.insert(0, "baseline")
    user = create_user(prefix="nxm")
    screen = ClientScreen(1024, 768)
    runner = Runner(screen, user.name)
    runs: dict[str, list[dict]] = {name: [] for name in names}
    load_before = os.getloadavg()
    try:
        for index in range(args.runs):
            for name in names:
                result = runner.run(name)
                runs[name].append(result)
                a, s = result["attached"], result["suspended"]
                print(f"run {index + 1} {name:<24} attached anon {a['anon']:>6} shm {a['shmem']:>5} pss {a['pss']:>6}"
                      f" | suspended anon {s['anon']:>6} shm {s['shmem']:>5} pss {s['pss']:>6}"
                      f" | program anon {a['program_anon']:>5} pss {a['program_pss']:>5}", flush=True)
    finally:
        runner.close()
        screen.close()
        user.remove()
    summary = summarise(runs)
    result = {"runs": args.runs, "variants": summary, "raw": runs, "load_before": load_before,
              "load_after": os.getloadavg(), "client_screen": "1024x768x24", "program": " ".join(PROGRAM)}
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as handle:
        json.dump(result, handle, indent=2)
        handle.write("\n")
    print(f"\n{'variant':<24}{'attached: anon':>15}{'shm':>7}{'pss':>7}{'d(anon+shm)':>12}"
          f"{'suspended: anon':>17}{'shm':>7}{'pss':>7}{'d(anon+shm)':>12}{'program d(anon)':>16}  (kB, medians)")
    for name, entry in summary.items():
        a, s = entry["attached"], entry["suspended"]
        print(f"{name:<24}{a['anon']:>15.0f}{a['shmem']:>7.0f}{a['pss']:>7.0f}{a['delta_anon_shmem']:>+12.0f}"
              f"{s['anon']:>17.0f}{s['shmem']:>7.0f}{s['pss']:>7.0f}{s['delta_anon_shmem']:>+12.0f}"
              f"{a['delta_program_anon']:>+16.0f}  {entry['what']}")
    print(f"(load {load_before[0]:.2f} -> {os.getloadavg()[0]:.2f}; JSON: {args.json})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
