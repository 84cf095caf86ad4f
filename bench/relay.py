#!/usr/bin/env python3
"""Relay benchmark: nxgate's encrypted Conch tunnel against OpenSSH + netcat,
nxcopy, socat and a plain splice loop, all on loopback.

Every row moves SIZE bytes (default 2 GiB, median of --repeat runs) and does
1000 one-byte round trips, and reports GB/s, the CPU seconds per GB of all
the processes that relay (gateway, ssh, sshd, nc, nxcopy, socat...) and the
round-trip latency p50/p99.

SSH rows (the client side is an OpenSSH ``ssh`` with pipes as stdin/stdout,
as nxssh has; the far end is this program's own sink/echo server standing
where the session's agent would listen):

* ``conch``: ssh -> the real gateway (``twistd nxgate``) -> its AgentRelay ->
  the agent's Unix socket.  The client logs in as NX clients do, starts a
  ``unix-application`` session, and once the gateway has answered (710) this
  program SIGKILLs the session's nxagent, binds its own server to the
  agent's socket and sends ``bye``: the gateway then relays the channel to us.
* ``sshd+nxcopy``: the OpenSSH mode, end to end: ssh -> a private sshd ->
  ``nxgate-shell`` (the nx account's login shell) -> the gateway's shell
  socket for the dialogue -> after ``bye`` nxgate-shell execs ``nxcopy``,
  which copies sshd's pipes <-> our server with splice(2).
* ``sshd+nc``: the FreeNX/Neatx path: ssh -> sshd -> ``nc 127.0.0.1 PORT``.

The OpenSSH rows run with OpenSSH's default cipher (chacha20-poly1305) and
with aes128-ctr + hmac-sha2-256, which is what an OpenSSH client negotiates
with Conch, for an apples-to-apples ratio.  The negotiated algorithms are
read from ``ssh -v`` and reported.

Local rows (no SSH, no encryption: bench/relay_nxcopy.py's harness, whose
functions are used here): direct, nxcopy (splice), socat (default and
-b 262144), a Python os.splice loop.

Directions: ``up`` is client -> agent (what relay_nxcopy.py measures),
``down`` is agent -> client (screen updates: what NX mostly carries).

CPU: for SSH rows, user+system ticks from /proc of the relaying processes
(the ssh client, the gateway or every descendant of the private sshd), read
just before the first byte and just after the last one: login and key
exchange are not counted.  For local rows, the relay's rusage.

Needs root (creates Unix users, runs sshd).  Installs netcat-openbsd if it is
missing and --install is given (make bench does).

    .venv/bin/python bench/relay.py [--size 2G] [--repeat 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
sys.path.insert(0, HERE)

import relay_nxcopy as rn  # noqa: E402  (the local rows' harness)

from tests.harness.gateway import Gateway, nx_key  # noqa: E402
from tests.harness.process import Pipe, stop, wait_for  # noqa: E402
from tests.harness.users import create_user  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
NXGATE_SHELL = os.path.join(os.path.dirname(sys.executable), "nxgate-shell")
SSH_COMMON = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=10",
              "-o", "BatchMode=yes", "-v"]
AES_CTR = ["-c", "aes128-ctr", "-m", "hmac-sha2-256"]
START = ('startsession --session="bench" --type="unix-application" --application="sleep 100000" '
         '--geometry="640x480" --screeninfo="640x480x24+render" --link="lan" --encryption="1" --cache="16M" '
         '--images="64M" --keyboard="pc105/us" --client="linux" --media="0" --backingstore="1"')


# --------------------------------------------------------------------- processes
def proc_ticks(pid: int) -> int:
    """user+system clock ticks of a live process (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return 0
    fields = stat[stat.rindex(b")") + 2:].split()
    return int(fields[11]) + int(fields[12])


def rss_kb(pid: int) -> int:
    """Resident memory of a live process in KiB (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def pgrep(user: str, name: str) -> list[int]:
    """Pids of ``user``'s processes called exactly ``name``."""
    out = subprocess.run(["pgrep", "-u", user, "-x", name], capture_output=True, text=True).stdout
    return [int(pid) for pid in out.split()]


def children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def descendants(root: int) -> list[int]:
    kids = children_map()
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        for child in kids.get(pid, []):
            found.append(child)
            todo.append(child)
    return found


def comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as handle:
            return handle.read().strip()
    except OSError:
        return "?"


def cpu_snapshot(pids: list[int]) -> dict[int, int]:
    return {pid: proc_ticks(pid) for pid in pids}


def cpu_seconds(before: dict[int, int], pids: list[int]) -> tuple[float, dict[str, float]]:
    """CPU seconds the processes used since ``before``, in total and by name."""
    by_name: dict[str, float] = {}
    total = 0
    for pid in pids:
        used = proc_ticks(pid) - before.get(pid, 0)
        total += used
        name = comm(pid)
        by_name[name] = by_name.get(name, 0.0) + used / CLK_TCK
    return total / CLK_TCK, by_name


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def ensure_packages(packages: list[str], install: bool) -> list[str]:
    """Debian packages still missing (installed first when asked and root)."""
    def missing() -> list[str]:
        out = []
        for package in packages:
            result = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True)
            if "install ok installed" not in result.stdout:
                out.append(package)
        return out

    todo = missing()
    if todo and install and os.geteuid() == 0:
        print(f"installing Debian packages: {' '.join(todo)}", flush=True)
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update", "-q"], env=env, stdout=subprocess.DEVNULL, check=False)
        subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *todo], env=env,
                       stdout=subprocess.DEVNULL, check=False)
        todo = missing()
    return todo


# ----------------------------------------------------------------------- py-spy
PY_SPY = os.path.join(os.path.dirname(sys.executable), "py-spy")


class PySpy:
    """``py-spy record`` on a running Python process, raw (collapsed) output."""

    def __init__(self, pid: int, output: str, rate: int = 200, native: bool = False) -> None:
        self.output = output
        self.rate = rate
        argv = [PY_SPY, "record", "--pid", str(pid), "--format", "raw", "--output", output, "--rate", str(rate),
                "--nolineno", "--nonblocking"]
        if native:
            argv.append("--native")
        self.started = time.monotonic()
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(1.0)  # py-spy attaches

    def stop(self) -> dict:
        self.seconds = time.monotonic() - self.started - 1.0
        self.process.send_signal(signal.SIGINT)
        try:
            _, err = self.process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            _, err = self.process.communicate()
        if not os.path.exists(self.output):
            return {"error": err.decode(errors="replace")[-500:]}
        return summarize_profile(self.output, self.seconds * self.rate)


def _frame_name(frame: str) -> str:
    # "dataReceived (twisted/conch/ssh/transport.py)" -> "transport.py:dataReceived"
    match = re.match(r"(.*) \((.*)\)$", frame)
    if not match:
        return frame
    return f"{os.path.basename(match.group(2))}:{match.group(1)}"


# Frames every reactor callback runs under: left out of the inclusive table.
_PLUMBING_FILES = {"twistd.py", "app.py", "_twistd_unix.py", "log.py", "context.py", "threading.py", "<module>"}
_PLUMBING = {"base.py:ReactorBase.run", "base.py:ReactorBase.mainLoop", "epollreactor.py:EPollReactor.doPoll",
             "posixbase.py:_PollLikeMixin._doReadOrWrite", "base.py:ReactorBase.runUntilCurrent"}


def summarize_profile(path: str, possible_samples: float, top: int = 25) -> dict:
    """Self and inclusive shares of the busy samples, by function."""
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    with open(path, errors="replace") as handle:
        for line in handle:
            line = line.rstrip("\n")
            stack, _, count_text = line.rpartition(" ")
            if not stack or not count_text.isdigit():
                continue
            count = int(count_text)
            frames = [_frame_name(f) for f in stack.split(";")[1:]]  # the first is the thread
            if not frames:
                continue
            total += count
            own[frames[-1]] = own.get(frames[-1], 0) + count
            for name in set(frames):
                if name not in _PLUMBING and name.split(":")[0] not in _PLUMBING_FILES:
                    inclusive[name] = inclusive.get(name, 0) + count

    def table(counts: dict[str, int]) -> list[tuple[str, float]]:
        ranked = sorted(counts.items(), key=lambda item: -item[1])[:top]
        return [(name, round(100.0 * count / total, 1)) for name, count in ranked]

    return {"busy_samples": total, "busy_share_of_wall": round(total / possible_samples, 3) if possible_samples else None,
            "self_pct": table(own) if total else [], "inclusive_pct": table(inclusive) if total else [],
            "raw": path}


def print_profile(title: str, profile: dict, top: int = 12) -> None:
    print(f"profile: {title}: {profile.get('busy_samples', 0)} busy samples, "
          f"busy {100 * (profile.get('busy_share_of_wall') or 0):.0f}% of the wall time")
    for label in ("self_pct", "inclusive_pct"):
        print(f"  {label}: " + "; ".join(f"{name} {pct}%" for name, pct in profile.get(label, [])[:top]))


# ------------------------------------------------------------------ private sshd
class PrivateSshd:
    """A private sshd on a free loopback port, keys in its own directory."""

    def __init__(self, extra: str = "", password_auth: bool = False, max_startups: str = "10:30:100") -> None:
        self.dir = tempfile.mkdtemp(prefix="nxgate-bench-sshd-")
        os.chmod(self.dir, 0o755)
        self.keys = os.path.join(self.dir, "keys")
        os.makedirs(self.keys)
        os.makedirs("/run/sshd", exist_ok=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", os.path.join(self.dir, "host_key")],
                       check=True)
        self.client_key = os.path.join(self.dir, "client_key")
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", self.client_key], check=True)
        self.port = free_port()
        self.config = os.path.join(self.dir, "sshd_config")
        yes_no = "yes" if password_auth else "no"
        with open(self.config, "w") as handle:
            handle.write(f"ListenAddress 127.0.0.1\nPort {self.port}\nHostKey {self.dir}/host_key\nPidFile none\n"
                         f"UsePAM yes\nStrictModes no\nPasswordAuthentication {yes_no}\n"
                         f"KbdInteractiveAuthentication no\nAuthorizedKeysFile {self.keys}/%u\n"
                         f"MaxStartups {max_startups}\nMaxSessions 100\nLogLevel INFO\n{extra}")
        self.log = os.path.join(self.dir, "sshd.log")
        self.process = subprocess.Popen(["/usr/sbin/sshd", "-D", "-f", self.config, "-E", self.log])
        wait_for(lambda: subprocess.run(["ssh-keyscan", "-p", str(self.port), "127.0.0.1"], capture_output=True,
                                        timeout=10).stdout, 15, "sshd to listen")

    @property
    def pid(self) -> int:
        return self.process.pid

    def authorize(self, user: str, public_key_file: str | None = None) -> None:
        shutil.copy(public_key_file or self.client_key + ".pub", os.path.join(self.keys, user))

    def close(self) -> None:
        stop(self.process)
        shutil.rmtree(self.dir, ignore_errors=True)


# ------------------------------------------------------------------- the streams
class Stream:
    """One relayed connection: we write ``wfd``/read ``rfd`` on the client
    side (the ssh client's stdin/stdout), ``server`` is the accepted socket
    where the agent would be."""

    def __init__(self, process: subprocess.Popen, server: socket.socket, cpu_pids, stderr_path: str) -> None:
        self.process = process
        self.wfd = process.stdin.fileno()
        self.rfd = process.stdout.fileno()
        self.server = server
        if server.family in (socket.AF_INET, socket.AF_INET6):  # an agent's Unix socket has no Nagle (EOPNOTSUPP)
            self.server.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.cpu_pids = cpu_pids  # callable -> list of pids that relay
        self.stderr_path = stderr_path

    def algorithms(self) -> str:
        """What ssh -v says was negotiated (client->server direction)."""
        try:
            with open(self.stderr_path, errors="replace") as handle:
                text = handle.read()
        except OSError:
            return "?"
        match = re.search(r"kex: client->server cipher: (\S+) MAC: (\S+)", text)
        kex = re.search(r"kex: algorithm: (\S+)", text)
        if not match:
            return "?"
        mac = "" if match.group(2) == "<implicit>" else "+" + match.group(2)
        return f"{match.group(1)}{mac}" + (f" ({kex.group(1)})" if kex else "")

    def close(self) -> None:
        try:
            self.server.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.server.close()
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()
            except OSError:
                pass
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            stop(self.process)
        try:
            os.unlink(self.stderr_path)
        except OSError:
            pass


def spawn_ssh(argv: list[str]) -> tuple[subprocess.Popen, str]:
    fd, stderr_path = tempfile.mkstemp(prefix="nxgate-bench-ssh-", suffix=".log")
    process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=fd, bufsize=0)
    os.close(fd)
    return process, stderr_path


def accept(listener: socket.socket, timeout: float = 20.0) -> socket.socket:
    listener.settimeout(timeout)
    try:
        conn, _ = listener.accept()
    finally:
        while _STOPPED:  # the stream is ours (or never came): the stopped agents go
            with contextlib.suppress(ProcessLookupError):
                os.kill(_STOPPED.pop(), signal.SIGKILL)
    conn.settimeout(None)
    listener.close()
    return conn


class NXDialogue:
    """The NX client side of the conversation, over an ssh process's pipes."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process = process
        self.out = Pipe(process.stdout)

    def send(self, line: str) -> None:
        os.write(self.process.stdin.fileno(), line.encode() + b"\n")

    def expect(self, pattern, timeout: float = 30.0) -> bytes:
        return self.out.read_until(pattern, timeout)

    def command(self, line: str, timeout: float = 30.0) -> bytes:
        self.send(line)
        return self.expect(b"NX> 105 ", timeout)

    def start_session(self, user: str, password: str | None) -> int:
        """hello ... login ... startsession; returns the display."""
        self.expect(b"NX> 105 ")
        self.command("hello NXCLIENT - Version 3.0.0")
        self.command("SET SHELL_MODE SHELL")
        self.command("SET AUTH_MODE PASSWORD")
        self.send("login")
        self.expect(b"NX> 101 User: ")
        self.send(user)
        self.expect(b"NX> 102 Password: ")
        self.send(password or "")
        answer = self.expect(re.compile(rb"NX> (103|404|503) [^\n]*\n"))
        if b"NX> 103" not in answer:
            raise RuntimeError(f"NX login failed: {answer!r}")
        self.expect(b"NX> 105 ")
        reply = self.command(START, timeout=60)
        match = re.search(rb"NX> 705 Session display: (\d+)", reply)
        if b"NX> 710" not in reply or not match:
            raise RuntimeError(f"startsession failed: {reply[-500:]!r}")
        session = re.search(rb"NX> 700 Session id: \S*-([0-9A-F]{32})\s", reply)
        self.session_id = session.group(1).decode() if session else ""
        return int(match.group(1))

    def bye(self) -> None:
        self.send("bye")
        self.expect(b"NX> 999 Bye.\n")
        if self.out.buffer:
            raise RuntimeError(f"unexpected bytes after bye: {self.out.buffer[:100]!r}")
        os.set_blocking(self.process.stdout.fileno(), True)


def agent_pids(display: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and comm(int(entry)) == "nxagent":
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    argv = handle.read().split(b"\0")
            except OSError:
                continue
            if f":{display}".encode() in argv:
                pids.append(int(entry))
    return pids


#: Agents stopped by take_agent_port, ended by accept once their stream is ours.
_STOPPED: list[int] = []


def take_agent_port(display: int, timeout: float = 20.0) -> socket.socket:
    """Stop the session's nxagent and listen on its socket ourselves.  The
    session stays live until the stream is ours (its node opens streams of
    running sessions only): :func:`accept` ends the agent then."""
    pids = agent_pids(display)
    if not pids:
        raise RuntimeError(f"no nxagent runs for display :{display}")
    path = ""
    for pid in pids:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = handle.read().decode().split("\0")
        if "-options" not in argv:  # exiting, or not a session agent
            continue
        options = argv[argv.index("-options") + 1]
        # The agent is started in its session directory with "-options options": relative to its cwd.
        directory = os.path.dirname(os.path.join(os.readlink(f"/proc/{pid}/cwd"), options))
        path = os.path.join(directory, "agent.sock")
        os.kill(pid, signal.SIGSTOP)
        _STOPPED.append(pid)
    os.unlink(path)  # the stopped agent keeps its listener, unreachable by path
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    return listener


# -------------------------------------------------------------------- the paths
def open_nx_stream(port: int, nx_user: str, user, extra: list[str],
                   settled: Callable[[], None] = lambda: None) -> tuple[subprocess.Popen, socket.socket, str]:
    """Log in as NX clients do, start a session, take its agent's port and
    say ``bye``: the ssh process, our end of the relayed stream, ssh's stderr."""
    argv = ["ssh", *SSH_COMMON, *extra, "-T", "-p", str(port), "-i", nx_key(),
            "-o", "IdentitiesOnly=yes", "-o", "PubkeyAcceptedAlgorithms=+ssh-dss", f"{nx_user}@127.0.0.1"]
    process, stderr_path = spawn_ssh(argv)
    try:
        dialogue = NXDialogue(process)
        display = dialogue.start_session(user.name, user.password)
        listener = take_agent_port(display)
        time.sleep(0.3)  # let the gateway finish with the dead agent before the stream starts
        dialogue.bye()
        server = accept(listener)
        settled()
    except BaseException:
        stop(process)
        raise
    return process, server, stderr_path


class ConchPath:
    """ssh -> the gateway's Conch server -> its AgentRelay -> our server."""

    def __init__(self, gateway: Gateway, nx_user: str, user, extra: list[str]) -> None:
        self.gateway, self.nx_user, self.user, self.extra = gateway, nx_user, user, extra

    def open(self) -> Stream:
        process, server, stderr_path = open_nx_stream(self.gateway.port, self.nx_user, self.user, self.extra)
        gateway_pid = self.gateway.process.pid
        return Stream(process, server, lambda: [gateway_pid, process.pid], stderr_path)

    @property
    def profile_pid(self) -> int:
        return self.gateway.process.pid


class OpenSSHModePath:
    """ssh -> sshd -> nxgate-shell (dialogue with the gateway) -> exec nxcopy -> our server."""

    def __init__(self, sshd: PrivateSshd, nx_user: str, user, extra: list[str]) -> None:
        self.sshd, self.nx_user, self.user, self.extra = sshd, nx_user, user, extra

    def open(self) -> Stream:
        sshd_pid = self.sshd.pid
        process, server, stderr_path = open_nx_stream(
            self.sshd.port, self.nx_user, self.user, self.extra,
            settled=lambda: wait_for(lambda: "nxcopy" in [comm(p) for p in descendants(sshd_pid)], 10, "nxcopy"))
        return Stream(process, server, lambda: [process.pid, sshd_pid, *descendants(sshd_pid)], stderr_path)


class SshdCommandPath:
    """ssh -> sshd -> COMMAND (nc 127.0.0.1 PORT, ...) -> our server."""

    def __init__(self, sshd: PrivateSshd, user: str, command: list[str], extra: list[str]) -> None:
        self.sshd, self.user, self.command, self.extra = sshd, user, command, extra

    def open(self) -> Stream:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        command = [part.replace("{port}", str(port)) for part in self.command]
        argv = ["ssh", *SSH_COMMON, *self.extra, "-T", "-p", str(self.sshd.port), "-i", self.sshd.client_key,
                "-o", "IdentitiesOnly=yes", f"{self.user}@127.0.0.1", *command]
        process, stderr_path = spawn_ssh(argv)
        try:
            server = accept(listener)
        except BaseException:
            stop(process)
            raise
        sshd_pid = self.sshd.pid
        return Stream(process, server, lambda: [process.pid, sshd_pid, *descendants(sshd_pid)], stderr_path)


# ------------------------------------------------------------------ measurements
def drain(fd: int, size: int, is_pipe: bool) -> int:
    """Read exactly ``size`` bytes from ``fd`` into /dev/null with splice."""
    null = os.open(os.devnull, os.O_WRONLY)
    r = w = -1
    if not is_pipe:
        r, w = os.pipe()
        try:
            import fcntl
            fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, rn.CHUNK)
        except OSError:
            pass
    got = 0
    try:
        while got < size:
            want = min(rn.CHUNK, size - got)
            if is_pipe:
                n = os.splice(fd, null, want)
                if not n:
                    break
            else:
                n = os.splice(fd, w, want)
                if not n:
                    break
                left = n
                while left:
                    left -= os.splice(r, null, left)
            got += n
        return got
    finally:
        for descriptor in (r, w, null):
            if descriptor >= 0:
                os.close(descriptor)


def stream_throughput(stream: Stream, size: int, direction: str, source) -> tuple[float, float, dict[str, float]]:
    """(seconds, relay CPU seconds, CPU by process name) for ``size`` bytes."""
    if direction == "up":
        write_fd, read_fd, read_is_pipe = stream.wfd, stream.server.fileno(), False
    else:  # the client's side: ssh's stdout pipe, or a socket (plain rows of cluster_relay.py)
        write_fd, read_fd, read_is_pipe = stream.server.fileno(), stream.rfd, getattr(stream, "client_is_pipe", True)
    pids = stream.cpu_pids()
    before = cpu_snapshot(pids)
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            rn.producer(write_fd, size, source)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    thread = threading.Thread(target=produce, daemon=True)
    started = time.perf_counter()
    thread.start()
    got = drain(read_fd, size, read_is_pipe)
    elapsed = time.perf_counter() - started
    cpu, by_name = cpu_seconds(before, pids)
    thread.join(30)
    if errors:
        raise RuntimeError(f"producer failed: {errors[0]!r}")
    if got != size:
        raise RuntimeError(f"got {got} of {size} bytes")
    return elapsed, cpu, by_name


def stream_latency(stream: Stream, rounds: int) -> list[float]:
    server = stream.server
    stop_flag = threading.Event()

    def echo() -> None:
        try:
            while not stop_flag.is_set():
                data = server.recv(1)
                if not data:
                    return
                server.sendall(data)
        except OSError:
            return

    thread = threading.Thread(target=echo, daemon=True)
    thread.start()
    samples = []
    for index in range(rounds + 50):  # the first 50 are warm-up
        started = time.perf_counter()
        os.write(stream.wfd, b"x")
        if os.read(stream.rfd, 1) != b"x":
            raise RuntimeError("echo mismatch")
        if index >= 50:
            samples.append(time.perf_counter() - started)
    stop_flag.set()
    return sorted(samples)


def summarize_runs(runs: list[tuple[float, float | None, dict[str, float]]], size: int) -> dict:
    """The median run (by elapsed time) and every run's figures."""
    ordered = sorted(runs, key=lambda run: run[0])
    seconds, cpu, by_name = ordered[len(ordered) // 2]
    gb = size / 1e9
    figures = {
        "gb_per_s": gb / seconds,
        "all_gb_per_s": [gb / run[0] for run in runs],  # in the order they ran
        "cpu_s_per_gb": None if cpu is None else cpu / gb,
        "all_cpu_s_per_gb": [None if run[1] is None else run[1] / gb for run in runs],
    }
    if by_name:
        figures["cpu_s_per_gb_by_process"] = {k: v / gb for k, v in sorted(by_name.items())}
    return figures


def ssh_throughput_run(path, size: int, direction: str, source, row: dict):
    stream = path.open()
    try:
        row.setdefault("algorithms", stream.algorithms())
        return stream_throughput(stream, size, direction, source)
    finally:
        stream.close()


def ssh_latency(path, rounds: int, row: dict) -> None:
    stream = path.open()
    try:
        samples = stream_latency(stream, rounds)
    finally:
        stream.close()
    row["latency_p50_us"] = rn.pct(samples, 50) * 1e6
    row["latency_p99_us"] = rn.pct(samples, 99) * 1e6


def ssh_profile(name: str, path, size: int, directions: list[str], source, profile_dir: str, row: dict) -> None:
    """One more run per direction under py-spy (not counted: sampling costs CPU on a 2-core box)."""
    row["profile"] = {}
    for direction in directions:
        stream = path.open()
        try:
            spy = PySpy(path.profile_pid, os.path.join(profile_dir, f"conch-{direction}.raw"))
            seconds, _, _ = stream_throughput(stream, size, direction, source)
            row["profile"][direction] = spy.stop()
            row["profile"][direction]["gb_per_s_while_sampled"] = size / 1e9 / seconds
        finally:
            stream.close()
        print_profile(f"{name} {direction}", row["profile"][direction])


def measure_ssh_rows(rows: list[tuple[str, object]], size: int, repeat: int, rounds: int, directions: list[str],
                     source, profile_dir: str | None, notes: list[str]) -> list[dict]:
    """Round-robin over the rows (repeat after repeat), so that the load of a
    shared machine drifting over time hits every row alike."""
    results = {name: {"relay": name, "kind": "ssh", "bytes": size, "directions": {}} for name, _ in rows}
    runs: dict[tuple[str, str], list] = {}
    broken: set[str] = set()
    for rep in range(max(1, repeat)):
        for name, path in rows:
            for direction in directions:
                if name in broken:
                    continue
                try:
                    run = ssh_throughput_run(path, size, direction, source, results[name])
                except Exception as error:  # noqa: BLE001 - one broken row must not lose the others
                    notes.append(f"{name}: failed: {error}")
                    print(f"{name}: failed: {error}", flush=True)
                    broken.add(name)
                    continue
                runs.setdefault((name, direction), []).append(run)
                print(f"  {name:<28}{direction:>5} run {rep + 1}: {size / 1e9 / run[0]:.3f} GB/s, "
                      f"{run[1] / (size / 1e9):.2f} CPU s/GB", flush=True)
    out = []
    for name, path in rows:
        if name in broken:
            continue
        row = results[name]
        for direction in directions:
            row["directions"][direction] = summarize_runs(runs[(name, direction)], size)
        ssh_latency(path, rounds, row)
        if profile_dir and getattr(path, "profile_pid", None):
            ssh_profile(name, path, size, directions, source, profile_dir, row)
        out.append(row)
        print_table([row], directions)
    return out


def measure_local_rows(rows: list[tuple[str, list[str] | None]], size: int, repeat: int, rounds: int,
                       source) -> list[dict]:
    runs: dict[str, list] = {name: [] for name, _ in rows}
    for _ in range(max(1, repeat)):
        for name, argv in rows:
            seconds, cpu, _ = rn.throughput(argv, size, "tcp", source)
            runs[name].append((seconds, cpu, {}))
    out = []
    for name, argv in rows:
        samples = rn.latency(argv, rounds, "tcp")
        row = {"relay": name, "kind": "local", "argv": argv, "bytes": size, "algorithms": "-",
               "directions": {"up": summarize_runs(runs[name], size)},
               "latency_p50_us": rn.pct(samples, 50) * 1e6, "latency_p99_us": rn.pct(samples, 99) * 1e6}
        out.append(row)
        print_table([row], ["up"])
    return out


# ------------------------------------------------------------------------ setup
class Setup:
    """Users, the gateway (Conch + shell socket) and a private sshd."""

    def __init__(self, display_base: int) -> None:
        self.cleanups: list = []
        self.user = create_user(prefix="nxb")
        self.cleanups.append(self.user.remove)
        self.nx = create_user(prefix="nxs")
        self.cleanups.append(self.nx.remove)
        self.openssh_mode = os.access(NXGATE_SHELL, os.X_OK)
        if self.openssh_mode:
            subprocess.run(["usermod", "--shell", NXGATE_SHELL, self.nx.name], check=True)
        self.socket_dir = tempfile.mkdtemp(prefix="nxgate-bench-sock-")
        os.chmod(self.socket_dir, 0o755)
        self.cleanups.append(lambda: shutil.rmtree(self.socket_dir, ignore_errors=True))
        socket_path = os.path.join(self.socket_dir, "shell.sock")
        self.gateway = Gateway({
            "server": {"shell_socket": socket_path},
            "ssh": {"nx_user": self.nx.name},
            "auth": {"failed_login_delay": "0.3"},
            "sessions": {"display_base": str(display_base), "display_limit": "200",
                         "max_sessions_per_user": "50", "agent_start_timeout": "60"},
        }).start()
        self.cleanups.append(self.gateway.stop)
        nx_block = (f"Match User {self.nx.name}\n    PubkeyAcceptedAlgorithms +ssh-dss\n"
                    f"    SetEnv NXGATE_SOCKET={socket_path}\n")
        self.sshd = PrivateSshd(extra=nx_block)
        self.cleanups.append(self.sshd.close)
        self.sshd.authorize(self.user.name)
        self.sshd.authorize(self.nx.name, os.path.join(REPO, "conf", "nx_authorized_keys"))

    def close(self) -> None:
        for cleanup in reversed(self.cleanups):
            try:
                cleanup()
            except Exception as error:  # noqa: BLE001 - cleanup goes on
                print(f"cleanup: {error}", file=sys.stderr)


def ssh_rows(setup: Setup, only: set[str] | None) -> list[tuple[str, object]]:
    nc = shutil.which("nc")
    rows: list[tuple[str, object]] = [
        ("conch (gateway relay)", ConchPath(setup.gateway, setup.nx.name, setup.user, [])),
    ]
    if setup.openssh_mode:
        rows += [
            ("sshd+nxcopy (OpenSSH mode)", OpenSSHModePath(setup.sshd, setup.nx.name, setup.user, [])),
            ("sshd+nxcopy aes128-ctr", OpenSSHModePath(setup.sshd, setup.nx.name, setup.user, AES_CTR)),
        ]
    if nc:
        rows += [
            ("sshd+nc (FreeNX/Neatx)", SshdCommandPath(setup.sshd, setup.user.name, [nc, "127.0.0.1", "{port}"], [])),
            ("sshd+nc aes128-ctr", SshdCommandPath(setup.sshd, setup.user.name, [nc, "127.0.0.1", "{port}"], AES_CTR)),
        ]
    return [row for row in rows if only is None or row[0].split()[0] in only]


def local_rows(only: set[str] | None) -> list[tuple[str, list[str] | None]]:
    nxcopy = os.path.join(REPO, "helpers", "nxcopy")
    if not os.access(nxcopy, os.X_OK):
        subprocess.run(["make", "-C", os.path.join(REPO, "helpers"), "all"], check=True)
    target = "127.0.0.1:{port}"
    rows: list[tuple[str, list[str] | None]] = [
        ("direct (no relay)", None),
        ("nxcopy (splice)", [nxcopy, "--connect", target]),
    ]
    socat = shutil.which("socat")
    if socat:
        rows += [("socat (default)", [socat, "-", "TCP:" + target]),
                 ("socat -b 262144", [socat, "-b", "262144", "-", "TCP:" + target])]
    rows.append(("python os.splice loop", [sys.executable, os.path.join(HERE, "relay_nxcopy.py"), "--python-relay",
                                           target, "--python-pipe-size", str(128 * 1024)]))
    return [row for row in rows if only is None or row[0].split()[0] in only]


def find(results: list[dict], name: str) -> dict | None:
    return next((row for row in results if row["relay"] == name), None)


def gbps(row: dict | None, direction: str = "up") -> float | None:
    if row is None or direction not in row["directions"]:
        return None
    return row["directions"][direction]["gb_per_s"]


def ratios(results: list[dict]) -> dict[str, float | None]:
    def ratio(a, b):
        return None if a is None or not b else a / b

    conch = find(results, "conch (gateway relay)")
    nc_same = find(results, "sshd+nc aes128-ctr")
    nc_default = find(results, "sshd+nc (FreeNX/Neatx)")
    nxcopy = gbps(find(results, "nxcopy (splice)"))
    best = max(filter(None, [gbps(find(results, "python os.splice loop")), gbps(find(results, "socat -b 262144"))]),
               default=None)
    out: dict[str, float | None] = {}
    for direction in ("up", "down"):
        out[f"conch_vs_openssh_nc_same_cipher_{direction}"] = ratio(gbps(conch, direction), gbps(nc_same, direction))
        out[f"conch_vs_openssh_nc_default_{direction}"] = ratio(gbps(conch, direction), gbps(nc_default, direction))
    out["nxcopy_vs_best_of_splice_loop_and_socat_256k"] = ratio(nxcopy, best)
    out["nxcopy_vs_socat_default"] = ratio(nxcopy, gbps(find(results, "socat (default)")))
    # The same ratios from runs made next to each other (rows run round-robin):
    # on a shared machine the load drifts between repetitions, and a ratio of
    # medians taken at different moments can swing by 2x where the paired
    # ratio does not.
    for direction in ("up", "down"):
        out[f"paired_conch_vs_openssh_nc_same_cipher_{direction}"] = paired(conch, nc_same, direction)
    nxcopy_row = find(results, "nxcopy (splice)")
    out["paired_nxcopy_vs_best_of_splice_loop_and_socat_256k"] = min(
        filter(None, [paired(nxcopy_row, find(results, name)) for name in ("python os.splice loop",
                                                                          "socat -b 262144")]), default=None)
    return out


def paired(ours: dict | None, peer: dict | None, direction: str = "up") -> float | None:
    """The median over repetitions of ours/peer, each from the runs of one
    repetition (None without both)."""
    if ours is None or peer is None or direction not in ours["directions"] or direction not in peer["directions"]:
        return None
    pairs = [a / b for a, b in zip(ours["directions"][direction]["all_gb_per_s"],
                                   peer["directions"][direction]["all_gb_per_s"]) if b]
    return statistics.median(pairs) if pairs else None


def print_table(results: list[dict], directions: list[str]) -> None:
    header = f"{'relay':<28}{'dir':>5}{'GB/s':>8}{'spread':>8}{'CPU s/GB':>10}{'p50 us':>9}{'p99 us':>9}  algorithms"
    print(header)
    print("-" * len(header))
    for row in results:
        for index, (direction, figures) in enumerate(row["directions"].items()):
            values = figures["all_gb_per_s"]
            spread = (max(values) - min(values)) / statistics.median(values) * 100 if len(values) > 1 else 0.0
            cpu = figures["cpu_s_per_gb"]
            latency = (f"{row['latency_p50_us']:>9.1f}{row['latency_p99_us']:>9.1f}" if index == 0 else " " * 18)
            print(f"{row['relay'] if index == 0 else '':<28}{direction:>5}{figures['gb_per_s']:>8.3f}"
                  f"{spread:>7.0f}%{'-' if cpu is None else f'{cpu:.3f}':>10}{latency}  "
                  f"{row['algorithms'] if index == 0 else ''}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="2G", help="bytes per throughput run (default 2G; k/m/g suffixes)")
    parser.add_argument("--repeat", type=int, default=3, help="throughput runs per row and direction (median)")
    parser.add_argument("--local-repeat", type=int, default=5,
                        help="throughput runs per local (no SSH) row: they are quick (default 5)")
    parser.add_argument("--rounds", type=int, default=1000, help="latency round trips (default 1000)")
    parser.add_argument("--directions", default="up,down", help="up (client->agent), down (agent->client)")
    parser.add_argument("--only", default="", help="comma-separated first words of rows: conch,sshd+nc,nxcopy,...")
    parser.add_argument("--no-local", action="store_true", help="skip the local (no SSH) rows")
    parser.add_argument("--no-ssh", action="store_true", help="skip the SSH rows")
    parser.add_argument("--install", action="store_true", help="apt-get install netcat-openbsd if missing")
    parser.add_argument("--display-base", type=int, default=1700)
    parser.add_argument("--profile", action="store_true",
                        help="one more run of the conch row per direction under py-spy (bench/results/profile/)")
    parser.add_argument("--json", default=os.path.join(HERE, "results", "relay.json"))
    args = parser.parse_args(argv)
    size = rn.parse_size(args.size)
    directions = [d for d in args.directions.split(",") if d]
    only = {word for word in args.only.split(",") if word} or None
    notes: list[str] = []
    results: list[dict] = []
    if not args.no_ssh and os.geteuid() != 0:
        print("bench/relay.py needs root for the SSH rows (it creates users and runs sshd); use --no-ssh",
              file=sys.stderr)
        return 2
    missing = ensure_packages(["netcat-openbsd", "socat"], args.install)
    if missing:
        notes.append(f"missing Debian packages (rows skipped): {' '.join(missing)}")
    load_before = os.getloadavg()
    print(f"relay benchmark: {size} bytes per run, median of {args.repeat}, {args.rounds} round trips, "
          f"{os.cpu_count()} CPUs, load {load_before[0]:.2f}", flush=True)
    source = rn.Source()
    profile_dir = None
    if args.profile:
        if os.access(PY_SPY, os.X_OK):
            profile_dir = os.path.join(os.path.dirname(os.path.abspath(args.json or HERE)), "profile")
            os.makedirs(profile_dir, exist_ok=True)
        else:
            notes.append(f"--profile: {PY_SPY} missing (.venv/bin/pip install py-spy)")
    if not args.no_local:
        results += measure_local_rows(local_rows(only), size, args.local_repeat or args.repeat, args.rounds, source)
    if not args.no_ssh:
        setup = Setup(args.display_base)
        try:
            if not setup.openssh_mode:
                notes.append(f"{NXGATE_SHELL} missing: OpenSSH-mode rows skipped (run make install)")
            results += measure_ssh_rows(ssh_rows(setup, only), size, args.repeat, args.rounds, directions, source,
                                        profile_dir, notes)
        finally:
            setup.close()
    load_after = os.getloadavg()
    print()
    print_table(results, directions)
    computed = ratios(results)
    print()
    for key, value in computed.items():
        if value is not None:
            print(f"{key:<52}{value:>7.2f}x")
    for note in notes:
        print("note: " + note)
    if args.json:
        os.makedirs(os.path.dirname(args.json), exist_ok=True)
        with open(args.json, "w") as handle:
            json.dump({"size": size, "repeat": args.repeat, "rounds": args.rounds, "cpus": os.cpu_count(),
                       "kernel": os.uname().release, "load_before": load_before, "load_after": load_after,
                       "results": results, "ratios": computed, "notes": notes}, handle, indent=2)
            handle.write("\n")
        print(f"(JSON: {args.json})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
