"""New session -> picture: nxgate-client against the floor, in one run.

The floor is what no NX server can take away: nxagent, nxproxy and the
session's program started by hand, one after the other as soon as the one
before is ready, with no SSH, no login and no server in between (the agent
with the very options, argv and environment the gateway gave its agent in
this run's warm-up session, listening on its Unix socket; nxproxy connected
to that socket; the program as the user).  nxgate-client's new session is
timed from the client's start to the same picture on the same client Xvfb.
The two alternate (the first of each pair alternates too), and the ratio is
given as the median of the pairs' ratios as well as of the medians.

Pictures are seen by polling a few pixels of the client's Xvfb every 5 ms
through one X connection (not ImageMagick's 0.1 s screenshots).

``--breakdown N`` adds N traced client runs: every exec of the bench's
descendants from the kernel's process connector (CLOCK_MONOTONIC, as the
bench's own clock), the client's ``--verbose`` lines timed as they arrive,
the agent's log lines as the bench reads them (2 ms polling), and the
picture: where each 50 ms between the client's start and the picture goes.
``--operations N`` traces N suspends and terminates of an attached session
the same way, with the agent's own sleeps (nx-libs' fixed waits).

    .venv/bin/python bench/new_session.py [--runs 9] [--breakdown 5] [--operations 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)

from scale import LogWatch  # noqa: E402
from tests.harness.gateway import Gateway  # noqa: E402
from tests.harness.process import wait_for  # noqa: E402
from tests.harness.users import create_user  # noqa: E402
from tests.harness.x11 import ClientScreen  # noqa: E402

APP = "xterm -bg #ff00ff -fg #ff00ff -geometry 200x60+0+0"
MAGENTA = b"\xff\x00\xff"
PROBE = (480, 360, 16, 16)  # x, y, w, h on the client's screen: inside the xterm's window
POLL = 0.005
DISPLAY_BASE = 1500


def loadavg() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


# ------------------------------------------------------------------ picture
class Picture:
    """Whether the client's screen shows the magenta program (one X connection)."""

    def __init__(self, display: str) -> None:
        from Xlib import X, display as xdisplay

        self._zpixmap = X.ZPixmap
        self.display = xdisplay.Display(display)
        self.root = self.display.screen().root

    def shown(self) -> bool:
        x, y, width, height = PROBE
        data = self.root.get_image(x, y, width, height, self._zpixmap, 0xFFFFFFFF).data
        return all(data[i:i + 3] == MAGENTA for i in range(0, len(data), 4))

    def gone(self) -> bool:
        return not self.shown()

    def wait(self, timeout: float = 60.0) -> float:
        """The moment (monotonic) the picture is first seen."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.shown():
                return time.monotonic()
            time.sleep(POLL)
        raise AssertionError("no picture")

    def close(self) -> None:
        self.display.close()


# ------------------------------------------------------------ exec tracing
class ExecTrace:
    """Every exec of the bench's descendants (the client, the gateway and
    what they start), from the kernel's process connector (netlink, root):
    (CLOCK_MONOTONIC seconds, pid, argv).  Fork events say whose a process is."""

    NETLINK_CONNECTOR, CN_IDX_PROC, CN_VAL_PROC = 11, 1, 1
    PROC_EVENT_FORK, PROC_EVENT_EXEC = 1, 2

    def __init__(self, *roots: int) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, self.NETLINK_CONNECTOR)
        # Every fork and exec of the machine comes here: room for bursts of other work.
        self.sock.setsockopt(socket.SOL_SOCKET, 33, 16 << 20)  # SO_RCVBUFFORCE (root)
        self.sock.bind((0, self.CN_IDX_PROC))
        self._control(1)  # PROC_CN_MCAST_LISTEN
        self.mine = {os.getpid(), *roots}
        self.events: list[tuple[float, int, list[str]]] = []
        self._running = True
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _control(self, op: int) -> None:
        body = struct.pack("I", op)
        message = struct.pack("IIIIHH", self.CN_IDX_PROC, self.CN_VAL_PROC, 0, 0, len(body), 0) + body
        self.sock.send(struct.pack("IHHII", 16 + len(message), 3, 0, 0, 0) + message)

    def _read(self) -> None:
        self.sock.settimeout(0.2)
        while self._running:
            try:
                data = self.sock.recv(8192)
            except socket.timeout:
                continue
            except OSError:
                return
            what, _cpu, stamp = struct.unpack_from("IIQ", data, 36)
            if what == self.PROC_EVENT_FORK:
                _ppid, parent, _pid, child = struct.unpack_from("iiii", data, 52)
                if parent in self.mine:
                    self.mine.add(child)
                continue
            if what != self.PROC_EVENT_EXEC:
                continue
            pid = struct.unpack_from("ii", data, 52)[1]
            if pid not in self.mine:
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as handle:
                    argv = [part.decode(errors="replace") for part in handle.read().split(b"\0") if part]
            except OSError:
                argv = ["?"]
            self.events.append((stamp / 1e9, pid, argv))

    def since(self, started: float) -> list[tuple[float, int, list[str]]]:
        return [event for event in self.events if event[0] >= started]

    def close(self) -> None:
        self._running = False
        self._thread.join(1)
        self.sock.close()


class SyscallSampler:
    """What a process waits in, sampled from /proc/PID/syscall every
    millisecond in a thread (no ptrace: strace's stops widened nx-libs' own
    signal races, and a suspend then took seconds): its sleeps and select
    waits of 50 ms or more, as (monotonic start, seconds, call)."""

    NAMES = {"35": "nanosleep", "230": "clock_nanosleep", "23": "select", "270": "pselect6", "7": "poll",
             "61": "wait4"}

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.spans: list[tuple[float, float, str]] = []
        self._running = True
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        current, since = None, 0.0
        while self._running:
            try:
                with open(f"/proc/{self.pid}/syscall", encoding="ascii", errors="replace") as handle:
                    number = handle.read().split(" ", 1)[0].strip()
            except OSError:
                number = None  # gone
            now = time.monotonic()
            if number != current:
                if current in self.NAMES and now - since >= 0.05:
                    self.spans.append((since, now - since, self.NAMES[current]))
                current, since = number, now
            if number is None:
                return
            time.sleep(0.001)

    def stop(self) -> list[tuple[float, float, str]]:
        self._running = False
        self._thread.join(2)
        return self.spans


class LineClock:
    """Lines of a pipe with the moment the bench read them."""

    def __init__(self) -> None:
        self.lines: list[tuple[float, str]] = []


def first_line(lines: list[tuple[float, str]], pattern: str) -> float | None:
    """When the first line matching ``pattern`` was read."""
    regex = re.compile(pattern)
    return next((stamp for stamp, line in list(lines) if regex.search(line)), None)


def follow_pipe(pipe, clock: LineClock) -> threading.Thread:
    def read() -> None:
        for raw in iter(pipe.readline, b""):
            clock.lines.append((time.monotonic(), raw.decode(errors="replace").rstrip("\n")))

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


# ------------------------------------------------------------ breakdown
#: The steps of a new session, in order: (name, the mark that ends it).  A
#: step ends at the first mark that matches at or after the previous end.
STEPS = (
    ("Python start-up and imports (client)", r"^client: nxgate-client: connected to"),
    ("SSH key exchange", r"^client: nxgate-client: SSH: keys exchanged"),
    ("SSH login as nx (NoMachine key)", r"^client: nxgate-client: SSH: logged in"),
    ("SSH channel, NX shell, server hello", r"^client: S: HELLO NXSERVER"),
    ("NX dialogue up to the password", r"^client: C: \*+$"),
    ("PAM password check", r"^client: S: NX> 103 "),
    ("NX dialogue up to startsession", r"^client: C: startsession"),
    ("server: request, display, store, files; launcher: PAM session, setuid", r"^exec \S*nxagent "),
    ("nxagent start-up to listening", r"^agent: Info: Waiting for connection"),
    ("server answers (NX> 700..710)", r"^client: S: NX> 710 "),
    ("client starts nxproxy", r"^exec \S*nxproxy "),
    ("nxproxy connects, bye", r"^client: C: bye"),
    ("stream to the agent", r"^agent: Info: Accepted connection"),
    ("NX link handshake", r"^agent: Info: Connection with remote proxy completed"),
    ("agent opens its X display", r"^agent: Info: Listening to X11 connections"),
    ("agent's screen and keyboard set-up", r"^agent: Session: Session (started|resumed)"),
    ("server starts the program: launcher, setuid", r"^exec \S*xterm "),
    ("the program's first picture", r"^picture$"),
)


#: Suspend and terminate with nxgate-client (``{Verb}``: Suspend, Terminat; ``{verb}``: suspend, terminat).
OPERATION_STEPS = (
    ("Python start-up and imports (client)", r"^client: nxgate-client: connected to"),
    ("SSH key exchange and login as nx", r"^client: nxgate-client: SSH: logged in"),
    ("NX dialogue and PAM password check", r"^client: S: NX> 103 "),
    ("server: the request, the agent signalled", r"^agent: Session: {Verb}ing session"),
    ("agent: its watchdog, ended by the server", r"^agent: .*Child process .* died"),
    ("agent: nx-libs' shutdown of the link", r"^agent: Session: Session {verb}ed"),
    ("server answers", r"^stdout: Session \S+ {verb}ed"),
    ("client quits and exits", r"^client exited$"),
)


def operation_steps(verb: str) -> tuple[tuple[str, str], ...]:
    stem = {"suspend": "suspend", "terminate": "terminat"}[verb]
    return tuple((name, pattern.replace("{Verb}", stem.capitalize()).replace("{verb}", stem))
                 for name, pattern in OPERATION_STEPS)


READ_LAG = 0.005


def steps_of(events: list[tuple[float, str]], steps: tuple[tuple[str, str], ...] = STEPS,
             ) -> list[tuple[str, float | None, float | None]]:
    """(step, start, end) of one traced run, in seconds since the client's start.
    A step whose mark is not seen has None; the next one starts where the
    last seen one ended."""
    out: list[tuple[str, float | None, float | None]] = []
    at = 0.0
    for name, pattern in steps:
        regex = re.compile(pattern)
        # The agent's lines are stamped when the bench reads them (2 ms polling):
        # one may come a little after a mark of the client that followed it.
        end = next((stamp for stamp, text in events if stamp >= at - READ_LAG and regex.search(text)), None)
        if end is None:
            out.append((name, None, None))
            continue
        end = max(end, at)
        out.append((name, at, end))
        at = end
    return out


def breakdown_table(runs: list[list[tuple[float, str]]], steps: tuple[tuple[str, str], ...] = STEPS) -> list[dict]:
    """The median start and length of every step over the traced runs."""
    per_run = [steps_of(events, steps) for events in runs]
    table = []
    for index, (name, _pattern) in enumerate(steps):
        spans = [run[index] for run in per_run if run[index][1] is not None]
        if not spans:
            table.append({"step": name, "start_s": None, "length_s": None})
            continue
        table.append({"step": name, "start_s": round(statistics.median(span[1] for span in spans), 4),
                      "length_s": round(statistics.median(span[2] - span[1] for span in spans), 4)})
    return table


def windows(events: list[tuple[float, str]], width: float = 0.05) -> list[str]:
    """Every ``width`` seconds from the client's start to the picture: the
    steps that take it (one traced run)."""
    spans = [(name, start, end) for name, start, end in steps_of(events) if start is not None]
    if not spans:
        return []
    total = spans[-1][2]
    lines = []
    at = 0.0
    while at < total:
        inside = [(name, min(end, at + width) - max(start, at)) for name, start, end in spans
                  if start < at + width and end > at]
        parts = ", ".join(f"{name} {share * 1000:.0f}" for name, share in inside if share >= 0.0005)
        lines.append(f"{at * 1000:5.0f}-{(at + width) * 1000:4.0f} ms: {parts}")
        at += width
    return lines


# -------------------------------------------------------------------- bench
class Bench:
    def __init__(self) -> None:
        self.user = create_user()
        entry = self.user.entry
        self.uid, self.gid, self.home = entry.pw_uid, entry.pw_gid, entry.pw_dir
        self.gateway = Gateway({"sessions": {"display_base": str(DISPLAY_BASE), "display_limit": "40"}}).start()
        self.logs = os.path.join(self.gateway.state_dir, "logs")
        self.screen = ClientScreen(1024, 768)
        self.picture = Picture(self.screen.name)
        self.env = dict(os.environ, DISPLAY=self.screen.name, NXGATE_PASSWORD=self.user.password, PYTHONPATH=REPO)
        # As installed (the package ships compiled modules): a client that
        # compiles nxgate's sources at every start is not what users run.
        self.env.pop("PYTHONDONTWRITEBYTECODE", None)
        subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(REPO, "nxgate")], env=self.env,
                       check=True, stdout=subprocess.DEVNULL)
        self.template: dict | None = None  # the gateway's agent: options, argv, environment
        self.floor_dir = tempfile.mkdtemp(prefix="nxgate-floor-")
        os.chmod(self.floor_dir, 0o755)

    # ---------------------------------------------------------- the client
    def client_argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "nxgate.clients.nx", "--accept-any-host-key", "--port",
                str(self.gateway.port), *args, f"{self.user.name}@127.0.0.1"]

    def agent_logs(self) -> set[str]:
        return {name for name in os.listdir(self.logs) if name.endswith(".agent.log")}

    def client_run(self, trace: ExecTrace | None = None) -> dict:
        """One new session with nxgate-client to the picture, then terminated."""
        before = self.agent_logs()
        verbose = ("--verbose",) if trace is not None else ()
        started = time.monotonic()
        client = subprocess.Popen(self.client_argv(*verbose, "--type", "unix-application", "--rootless",
                                                   "--application", APP, "--geometry", "1024x768"),
                                  env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        stderr = LineClock()
        reader = follow_pipe(client.stderr, stderr)
        agent_log: LogWatch | None = None
        if trace is not None:
            def new_log() -> str | None:
                fresh = self.agent_logs() - before
                return fresh.pop() if fresh else None
            name = wait_for(new_log, 60, "the agent's log", interval=0.001)
            agent_log = LogWatch(os.path.join(self.logs, name), interval=0.002)
        try:
            shown = self.picture.wait()
        except AssertionError:
            client.kill()
            raise AssertionError("no picture: " + "\n".join(line for _, line in stderr.lines)) from None
        elapsed = shown - started
        fresh = self.agent_logs() - before
        session_id = fresh.pop().split(".")[0] if fresh else None
        if self.template is None and session_id:
            self.template = self._agent_template(session_id)
        if agent_log is not None:
            agent_log.stop()
        ended = subprocess.run(self.client_argv("--terminate", session_id), env=self.env, capture_output=True,
                               text=True, timeout=60)
        assert ended.returncode == 0, ended.stderr
        _, status, usage = os.wait4(client.pid, 0)
        client.returncode = os.waitstatus_to_exitcode(status)
        reader.join(5)
        client.stderr.close()
        wait_for(self.picture.gone, 30, "the picture to go", interval=0.01)
        result = {"new_to_picture": elapsed, "client_cpu": usage.ru_utime + usage.ru_stime}
        if trace is not None:
            result["events"] = self._client_events(started, shown, trace, stderr, agent_log)
        return result

    def operations(self, trace: ExecTrace) -> dict:
        """A new session, then a traced suspend, a resume and a traced
        terminate of it (attached: the slow case), with nxgate-client."""
        before = self.agent_logs()
        first = subprocess.Popen(self.client_argv("--type", "unix-application", "--rootless", "--application", APP,
                                                  "--geometry", "1024x768"),
                                 env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.picture.wait()
        name = (self.agent_logs() - before).pop()
        session_id = name.split(".")[0]
        agent_log = LogWatch(os.path.join(self.logs, name), interval=0.002)
        try:
            suspend = self._traced_op(trace, agent_log, "--suspend", session_id)
            first.wait(30)
            wait_for(self.picture.gone, 30, "the picture to go", interval=0.01)
            second = subprocess.Popen(self.client_argv("--resume", session_id, "--geometry", "1024x768"),
                                      env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.picture.wait()
            time.sleep(0.2)  # attached and idle, as sessions.py's terminate
            terminate = self._traced_op(trace, agent_log, "--terminate", session_id)
            second.wait(30)
        finally:
            agent_log.stop()
        wait_for(self.picture.gone, 30, "the picture to go", interval=0.01)
        return {"suspend": suspend, "terminate": terminate}

    def _traced_op(self, trace: ExecTrace, agent_log: LogWatch, *args: str) -> dict:
        """One ``--suspend``/``--terminate`` run: its time to the client's exit
        and its marks, with the agent's sleeps and waits of 50 ms or more
        (nx-libs' own fixed waits, seen in /proc: ptrace would change them)."""
        skip = len(agent_log.lines)
        agent = int(subprocess.run(["pgrep", "-u", self.user.name, "-x", "nxagent", "-o"], capture_output=True,
                                   text=True).stdout.split()[0])
        sampler = SyscallSampler(agent)
        stderr = LineClock()
        started = time.monotonic()
        client = subprocess.Popen(self.client_argv("--verbose", *args), env=self.env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE)
        reader = follow_pipe(client.stderr, stderr)
        out = LineClock()
        out_reader = follow_pipe(client.stdout, out)
        _, status, usage = os.wait4(client.pid, 0)
        ended = time.monotonic()
        assert os.waitstatus_to_exitcode(status) == 0, "\n".join(line for _, line in stderr.lines)
        reader.join(5)
        out_reader.join(5)
        client.stderr.close()
        client.stdout.close()
        time.sleep(0.3)  # the agent's last lines
        waits = [(round(begun - started, 4), round(length, 4), call) for begun, length, call in sampler.stop()
                 if begun + length > started]
        marks = [(stamp, f"exec {' '.join(argv[:4])[:80]}") for stamp, _pid, argv in trace.since(started - 0.01)
                 if stamp <= ended]
        marks += [(stamp, f"client: {line[:100]}") for stamp, line in stderr.lines]
        marks += [(stamp, f"stdout: {line[:100]}") for stamp, line in out.lines]
        marks += [(stamp, f"agent: {line[:100]}") for stamp, line in agent_log.lines[skip:] if line.strip()]
        marks.append((ended, "client exited"))
        return {"seconds": ended - started, "client_cpu": usage.ru_utime + usage.ru_stime, "agent_waits": waits,
                "events": [(round(stamp - started, 4), text) for stamp, text in sorted(marks)]}

    def _agent_template(self, session_id: str) -> dict:
        directory = os.path.join(self.gateway.state_dir, "sessions", session_id)
        with open(os.path.join(directory, "options"), encoding="utf-8") as handle:
            options = handle.read()
        pid = int(subprocess.run(["pgrep", "-u", self.user.name, "-x", "nxagent", "-o"], capture_output=True,
                                 text=True).stdout.split()[0])
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = [part.decode() for part in handle.read().split(b"\0") if part]
        with open(f"/proc/{pid}/environ", "rb") as handle:
            environ = dict(part.decode().split("=", 1) for part in handle.read().split(b"\0") if b"=" in part)
        return {"options": options, "argv": argv, "environ": environ, "display": int(argv[-1][1:])}

    # ----------------------------------------------------------- the floor
    def floor_run(self) -> dict:
        """nxagent, nxproxy and the program started by hand, each as soon as
        the one before is ready; the same picture."""
        assert self.template is not None
        display = self._free_display()
        cookie = secrets.token_hex(16)
        session_id = secrets.token_hex(16).upper()
        directory = os.path.join(self.floor_dir, session_id)
        os.mkdir(directory, 0o700)
        os.chown(directory, self.uid, self.gid)
        socket_path = os.path.join(directory, "agent.sock")
        options = self._floor_options(display, cookie, session_id, socket_path)
        authority = os.path.join(directory, "authority")
        for path, data in ((os.path.join(directory, "options"), options.encode()),):
            with open(path, "wb") as handle:
                handle.write(data)
            os.chown(path, self.uid, self.gid)
        subprocess.run(["xauth", "-f", authority, "add", f":{display}", "MIT-MAGIC-COOKIE-1", cookie], check=True)
        os.chown(authority, self.uid, self.gid)
        log_path = os.path.join(directory, "agent.log")
        argv = [*self.template["argv"][:-1], f":{display}"]
        env = dict(self.template["environ"])
        env.update(DISPLAY=f"nx/nx,options={os.path.join(directory, 'options')}:{display}",
                   XAUTHORITY=authority, NX_HOME=directory, NX_TEMP=directory, NX_ROOT=directory)
        proxy_home = tempfile.mkdtemp(prefix="nxgate-floor-proxy-")
        proxy_options = os.path.join(proxy_home, "options")
        with open(proxy_options, "w", encoding="utf-8") as handle:
            handle.write(f"nx/nx,session=floor,cookie={cookie},id={session_id},connect=unix:{socket_path}:{display}\n")
        processes: list[subprocess.Popen] = []
        started = time.monotonic()
        with open(log_path, "wb") as log:
            processes.append(subprocess.Popen(self._as_user(argv), env=env, cwd=directory, stdin=subprocess.DEVNULL,
                                              stdout=log, stderr=log, start_new_session=True))
        agent_log = LogWatch(log_path, interval=0.002)
        try:
            try:
                wait_for(lambda: first_line(agent_log.lines, r"^Info: Waiting for connection"), 30, "the floor agent",
                         interval=0.001)
            except AssertionError:
                raise AssertionError("the floor agent did not listen: " + "\n".join(
                    line for _, line in agent_log.lines[-20:])) from None
            listening = time.monotonic()
            with open(os.path.join(proxy_home, "nxproxy.log"), "wb") as log:
                processes.append(subprocess.Popen(
                    ["nxproxy", "-S", f"nx/nx,options={proxy_options}:{display}"], cwd=proxy_home,
                    env={"DISPLAY": self.screen.name, "NX_HOME": proxy_home, "PATH": os.defpath, "HOME": proxy_home},
                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True))
            wait_for(lambda: first_line(agent_log.lines, r"^Session: Session started"), 30, "the floor's link",
                     interval=0.001)
            linked = time.monotonic()
            program_env = {key: env[key] for key in ("HOME", "USER", "LOGNAME", "SHELL", "PATH", "LANG") if key in env}
            program_env.update(DISPLAY=f":{display}", XAUTHORITY=authority)
            processes.append(subprocess.Popen(self._as_user(APP.split()), env=program_env, cwd=self.home,
                                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                              stderr=subprocess.DEVNULL, start_new_session=True))
            shown = self.picture.wait()
        finally:
            agent_log.stop()
            for process in reversed(processes):
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGTERM)
            for process in processes:
                try:
                    process.wait(15)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait(5)
            shutil.rmtree(proxy_home, ignore_errors=True)
            shutil.rmtree(directory, ignore_errors=True)
        wait_for(self.picture.gone, 30, "the floor's picture to go", interval=0.01)
        return {"new_to_picture": shown - started, "agent_listening": listening - started,
                "link_up": linked - listening, "program_to_picture": shown - linked}

    def _floor_options(self, display: int, cookie: str, session_id: str, socket_path: str) -> str:
        line = self.template["options"].strip()
        body = line[len("nx/nx,"):line.rindex(":")]
        items = []
        for item in body.split(","):
            key, _, value = item.partition("=")
            value = {"cookie": cookie, "id": session_id, "listen": f"unix:{socket_path}"}.get(key, value)
            items.append(f"{key}={value}")
        return "nx/nx," + ",".join(items) + f":{display}\n"

    def _as_user(self, argv: list[str]) -> list[str]:
        """``argv`` as the bench's user (setpriv: an exec, no PAM, as by hand)."""
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--init-groups", "--", *argv]

    def _free_display(self) -> int:
        display = DISPLAY_BASE + 100
        while os.path.exists(f"/tmp/.X{display}-lock") or os.path.exists(f"/tmp/.X11-unix/X{display}"):
            display += 1
        return display

    # -------------------------------------------------------- breakdown
    def _client_events(self, started: float, shown: float, trace: ExecTrace, stderr: LineClock,
                       agent_log: LogWatch) -> list[tuple[float, str]]:
        """The moments of one traced run, in seconds since the client's start."""
        marks: list[tuple[float, str]] = []
        for stamp, pid, argv in trace.since(started - 0.01):
            if stamp > shown:
                break
            label = " ".join(argv[:4])[:80]
            marks.append((stamp, f"exec {label}"))
        for stamp, line in stderr.lines:
            if stamp <= shown:
                marks.append((stamp, f"client: {line[:100]}"))
        for stamp, line in agent_log.lines:
            if stamp <= shown and line.strip():
                marks.append((stamp, f"agent: {line[:100]}"))
        marks.append((shown, "picture"))
        return [(round(stamp - started, 4), text) for stamp, text in sorted(marks)]

    def import_times(self) -> dict[str, float]:
        """Where the client's imports go (``python -X importtime``, one
        ``--list`` run): self time summed by origin, in seconds."""
        run = subprocess.run([sys.executable, "-X", "importtime", *self.client_argv("--list")[1:]], env=self.env,
                             capture_output=True, text=True, timeout=60)
        totals: dict[str, float] = {}
        for line in run.stderr.splitlines():
            match = re.match(r"import time:\s+(\d+) \|\s+\d+ \|\s*(\S+)", line)
            if not match:
                continue
            top = match.group(2).split(".")[0]
            origin = {"twisted": "Twisted", "zope": "Twisted", "automat": "Twisted", "constantly": "Twisted",
                      "incremental": "Twisted", "hyperlink": "Twisted", "attr": "Twisted",
                      "cryptography": "cryptography, OpenSSL, bcrypt", "OpenSSL": "cryptography, OpenSSL, bcrypt",
                      "bcrypt": "cryptography, OpenSSL, bcrypt", "service_identity": "cryptography, OpenSSL, bcrypt",
                      "nxgate": "nxgate"}.get(top, "Python's standard library")
            totals[origin] = totals.get(origin, 0.0) + int(match.group(1)) / 1e6
        return {key: round(value, 4) for key, value in sorted(totals.items(), key=lambda item: -item[1])}

    def close(self) -> None:
        self.picture.close()
        subprocess.run(["pkill", "-u", self.user.name], check=False)
        self.screen.close()
        self.gateway.stop()
        self.user.remove()
        shutil.rmtree(self.floor_dir, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9, help="pairs of floor and client runs")
    parser.add_argument("--breakdown", type=int, default=1, help="traced client runs for the breakdown")
    parser.add_argument("--operations", type=int, default=3,
                        help="traced suspend and terminate runs (with nx-libs' own waits)")
    parser.add_argument("--json", default=os.path.join(HERE, "results", "new_session.json"))
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench/new_session.py needs root (it creates a Unix user)", file=sys.stderr)
        return 2
    result: dict = {"load_before": loadavg()}
    bench = Bench()
    try:
        bench.client_run()  # warm-up; also the agent's options, argv and environment for the floor
        pairs = []
        for index in range(args.runs):
            order = ("floor", "client") if index % 2 == 0 else ("client", "floor")
            pair = {"load": loadavg()}
            for side in order:
                pair[side] = bench.floor_run() if side == "floor" else bench.client_run()
            pair["ratio"] = pair["client"]["new_to_picture"] / pair["floor"]["new_to_picture"]
            pairs.append(pair)
            print(f"pair {index}: floor {pair['floor']['new_to_picture']:.3f} s, client "
                  f"{pair['client']['new_to_picture']:.3f} s ({pair['ratio']:.2f}x), load {pair['load'][0]}",
                  flush=True)
        traced, operations = [], []
        imports = bench.import_times() if args.breakdown else {}
        if args.breakdown or args.operations:
            trace = ExecTrace(bench.gateway.process.pid)
            try:
                for _ in range(args.breakdown):
                    traced.append(bench.client_run(trace))
                for _ in range(args.operations):
                    operations.append(bench.operations(trace))
            finally:
                trace.close()
    finally:
        bench.close()
    floor = [pair["floor"]["new_to_picture"] for pair in pairs]
    client = [pair["client"]["new_to_picture"] for pair in pairs]
    result.update({
        "pairs": pairs,
        "floor_median_s": statistics.median(floor),
        "client_median_s": statistics.median(client),
        "ratio_of_medians": statistics.median(client) / statistics.median(floor),
        "paired_ratio_median": statistics.median(pair["ratio"] for pair in pairs),
        "floor_parts_median_s": {key: statistics.median(pair["floor"][key] for pair in pairs)
                                 for key in ("agent_listening", "link_up", "program_to_picture")},
        "client_cpu_median_s": statistics.median(pair["client"]["client_cpu"] for pair in pairs),
        "breakdown": breakdown_table([run["events"] for run in traced]) if traced else [],
        "traced_runs": [run["events"] for run in traced],
        "client_imports_s": imports,
        "load_after": loadavg(),
    })
    for verb in ("suspend", "terminate"):
        if not operations:
            break
        runs = [run[verb] for run in operations]
        result[verb] = {
            "median_s": statistics.median(run["seconds"] for run in runs),
            "client_cpu_median_s": statistics.median(run["client_cpu"] for run in runs),
            "breakdown": breakdown_table([run["events"] for run in runs], operation_steps(verb)),
            "agent_sleeps": agent_sleeps(runs, verb),
            "runs": runs,
        }
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as handle:
        json.dump(result, handle, indent=2)
    print(f"floor {result['floor_median_s']:.3f} s {result['floor_parts_median_s']}")
    print(f"client {result['client_median_s']:.3f} s; ratio of medians {result['ratio_of_medians']:.2f}x, "
          f"paired {result['paired_ratio_median']:.2f}x; load {result['load_before']} -> {result['load_after']}")
    if traced:
        print(f"--- breakdown, median of {len(traced)} traced runs (ms): start, length, step")
        for row in result["breakdown"]:
            if row["start_s"] is None:
                print(f"{'':>6} {'':>6}  {row['step']} (not seen)")
            else:
                print(f"{row['start_s'] * 1000:6.0f} {row['length_s'] * 1000:6.0f}  {row['step']}")
        print("--- the client's imports (python -X importtime, self time by origin): " + ", ".join(
            f"{origin} {seconds * 1000:.0f} ms" for origin, seconds in result["client_imports_s"].items()))
        middle = sorted(traced, key=lambda run: run["new_to_picture"])[len(traced) // 2]
        print(f"--- every 50 ms of the median traced run ({middle['new_to_picture'] * 1000:.0f} ms)")
        for line in windows(middle["events"]):
            print(line)
    for verb in ("suspend", "terminate"):
        if verb not in result:
            continue
        part = result[verb]
        print(f"--- {verb} with nxgate-client: median {part['median_s'] * 1000:.0f} ms of {len(operations)} "
              f"(client CPU {part['client_cpu_median_s'] * 1000:.0f} ms); start, length, step")
        for row in part["breakdown"]:
            if row["start_s"] is None:
                print(f"{'':>6} {'':>6}  {row['step']} (not seen)")
            else:
                print(f"{row['start_s'] * 1000:6.0f} {row['length_s'] * 1000:6.0f}  {row['step']}")
        print("    the agent's sleeps of 50 ms or more after it began: " + (
            "; ".join(f"{call} {ms} ms in {count} of {len(operations)}" for call, ms, count in part["agent_sleeps"])
            or "none"))
    print(f"(JSON: {args.json})")
    return 0


def agent_sleeps(runs: list[dict], verb: str) -> list[tuple[str, int, int]]:
    """The agent's sleeps and waits of 50 ms or more from its first
    "Suspending"/"Terminating" line on: (call, ms rounded to 10 ms, in how
    many runs).  A select that long is a wait for its peer or its watchdog."""
    pattern = re.compile(dict(operation_steps(verb))["server: the request, the agent signalled"])
    seen: dict[tuple[str, int], int] = {}
    for run in runs:
        begun = next((stamp for stamp, text in run["events"] if pattern.search(text)), None)
        if begun is None:
            continue
        found = set()
        for start, length, call in run["agent_waits"]:
            if start >= begun - 0.001:
                found.add((call, int(round(length * 100)) * 10))
        for key in found:
            seen[key] = seen.get(key, 0) + 1
    return [(call, ms, count) for (call, ms), count in sorted(seen.items())]


if __name__ == "__main__":
    sys.exit(main())
