#!/usr/bin/env python3
"""X2Go on this machine, measured as the peer script measures it.

The peer script (/work/shared/peers/x2go_bench.sh) drives X2Go's own
command-line client, pyhoca-cli, against a private sshd with password
authentication and takes screenshots of the client's screen:

* new session -> picture: from starting ``pyhoca-cli -c APP -t application``
  until the client screen shows more than 5000 magenta pixels;
* list: how long ``pyhoca-cli --list-sessions`` takes;
* suspend: how long ``pyhoca-cli -S NAME`` (a second client) takes; the first
  client is then killed and the picture must go;
* resume -> picture: from starting ``pyhoca-cli -R NAME`` to the picture;
  that client is killed again (the session suspends with its link);
* resume -> picture with pyhoca-cli's default link (``adsl``, no ``-q``),
  as a user who keeps the defaults resumes: a first such resume leaves the
  link's saved caches behind, the second one is timed;
* terminate: how long ``pyhoca-cli -T NAME`` takes.

Medians of --runs (>= 5).  The memory of X2Go's sessions is measured by
bench/memory.py (PSS, beside nxgate's in the same run), with this module's
setup of both servers.

The X2Go server runs as a Debian installation does: x2goserver's session
scripts over sshd, and x2gocleansessions (started here in the foreground, as
systemd would run it, and stopped at the end).

The same pyhoca-cli then runs against nxgate's X2Go door (the real
gateway) and against pyhoca-cli's floor (bench/x2go_floor.py: a server that
checks the password with PAM and then answers every command at once, doing
only the agent's and the program's own work), the runs alternating with
X2Go's, the order turning each run (``--no-nxgate``, ``--no-floor`` leave
them out).  The door's medians and their ratios to X2Go's are in the JSON
under ``nxgate_x2go_door``; what the door and x2goserver add to the floor
(the median over runs of each run's difference, paired) under
``nxgate_x2go_door.share`` and ``floor.x2goserver_share``, and pyhoca-cli's
start-up alone (its exec to its SSH connection) under ``floor.startup``.

Needs root.  With --install (make bench passes it) the Debian packages
x2goserver, x2goserver-xsession and pyhoca-cli are installed if missing.  If
X2Go cannot be installed or run, the reason is reported and the reference
figures from the issue are used instead, marked "reference, not measured".

    .venv/bin/python bench/x2go.py [--runs 5] [--install] [--json FILE]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
sys.path.insert(0, HERE)

from relay import PrivateSshd, ensure_packages  # noqa: E402

from tests.harness.process import stop, wait_for  # noqa: E402
from tests.harness.users import create_user  # noqa: E402
from tests.harness.x11 import ClientScreen  # noqa: E402

PACKAGES = ["x2goserver", "x2goserver-xsession", "pyhoca-cli"]
MAGENTA = (255, 0, 255)
APP = "xterm -bg magenta -fg magenta -geometry 200x60+0+0"
# The figures given in the issue for X2Go on the reference machine.
REFERENCE = {"new_to_picture": 3.51, "suspend": 2.80, "resume_to_picture": 3.03, "terminate": 2.68}


def newest(pattern: str) -> str | None:
    """The file matching ``pattern`` changed last, if any."""
    found = glob.glob(pattern)
    return max(found, key=os.path.getmtime) if found else None


def user_processes(user: str) -> list[tuple[int, str]]:
    out = subprocess.run(["ps", "-u", user, "-o", "pid=,comm="], capture_output=True, text=True).stdout
    processes = []
    for line in out.splitlines():
        pid, _, name = line.strip().partition(" ")
        if pid.isdigit():
            processes.append((int(pid), name.strip()))
    return processes


class X2GoBench:
    """pyhoca-cli against X2Go's server (x2goserver over a private sshd)."""

    label = "x2go"
    agent_name = "x2goagent"

    @property
    def port(self) -> int:
        return self.sshd.port

    def __init__(self, session_environment: dict[str, str] | None = None, lang: str | None = None) -> None:
        """``session_environment``: variables X2Go's sshd gives the sessions
        (``SetEnv``, as pam_env gives /etc/default/locale's LANG on an
        installed system); ``lang``: nxgate's [sessions] lang (the door)."""
        self.session_environment = session_environment or {}
        self.lang = lang
        self.cleanups: list = []
        self.clients: list[subprocess.Popen] = []
        self.launches: list[tuple[str, float]] = []
        self.user = None
        try:
            self._setup()
        except BaseException:
            self.close()
            raise

    def _setup(self) -> None:
        self.user = create_user(prefix="x2b")
        self.cleanups.append(self.user.remove)
        setenv = "".join(f"SetEnv {key}={value}\n" for key, value in self.session_environment.items())
        self.sshd = PrivateSshd(password_auth=True, max_startups="50:30:100",
                                extra=f"Subsystem sftp /usr/lib/openssh/sftp-server\n{setenv}")
        self.cleanups.append(self.sshd.close)
        self.workdir = tempfile.mkdtemp(prefix="nxgate-bench-x2go-")
        self.cleanups.append(lambda: shutil.rmtree(self.workdir, ignore_errors=True))
        self.cleaner = None
        if shutil.which("x2gocleansessions") or os.path.exists("/usr/sbin/x2gocleansessions"):
            # What x2goserver.service runs; -d keeps it in the foreground, so it is our child.
            self.cleaner = subprocess.Popen(["/usr/sbin/x2gocleansessions", "-d"], stdin=subprocess.DEVNULL,
                                            stdout=open(os.path.join(self.workdir, "cleansessions.log"), "wb"),
                                            stderr=subprocess.STDOUT)
            self.cleanups.append(lambda: stop(self.cleaner))
        self.client_screen()

    def client_screen(self) -> None:
        """The client's screen (an Xvfb) and pyhoca-cli's environment, its home in the workdir."""
        self.screen = ClientScreen(1024, 768)
        self.cleanups.append(self.screen.close)
        home = os.path.join(self.workdir, "client-home")
        os.makedirs(home)
        self.env = dict(os.environ, DISPLAY=self.screen.name, HOME=home)

    # ------------------------------------------------------------ client
    def cli(self, *args: str, log: str, wait: bool = True):
        argv = ["pyhoca-cli", "--server", "127.0.0.1", "-p", str(self.port), "-l", self.user.name,
                "--password", self.user.password, "--add-to-known-hosts", *args]
        handle = open(os.path.join(self.workdir, log), "wb")
        self.launches.append((log, time.monotonic()))
        if wait:
            try:
                return subprocess.run(argv, env=self.env, stdin=subprocess.DEVNULL, stdout=handle,
                                      stderr=subprocess.STDOUT, timeout=120)
            finally:
                handle.close()
        process = subprocess.Popen(argv, env=self.env, stdin=subprocess.DEVNULL, stdout=handle,
                                   stderr=subprocess.STDOUT)
        handle.close()
        self.clients.append(process)
        return process

    def read_log(self, log: str) -> str:
        with open(os.path.join(self.workdir, log), errors="replace") as handle:
            return handle.read()

    def magenta(self) -> int:
        return self.screen.shot().count(MAGENTA)

    def blank(self) -> None:
        subprocess.run(["xsetroot", "-solid", "black"], env=self.env, check=False)

    def picture_after(self, started: float, process: subprocess.Popen, log: str) -> float:
        def seen() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"pyhoca-cli exited {process.returncode}: {self.read_log(log)[-1500:]}")
            return self.magenta() > 5000

        wait_for(seen, 60, "the X2Go picture", interval=0.02)
        return time.monotonic() - started

    def session_name(self, log: str) -> str:
        def name() -> str | None:
            match = re.search(r"Using session (\S+)", self.read_log(log))
            return match.group(1) if match else None

        return wait_for(name, 30, "the X2Go session name")

    @staticmethod
    def kill(process: subprocess.Popen) -> None:
        process.terminate()  # the peer script: kill $pid (SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)

    # -------------------------------------------------------------- runs
    def one_run(self, index: int) -> dict[str, float | str]:
        times: dict[str, float | str] = {}
        for _ in self.steps(index, times):
            pass
        return self.finish_run(index, times)

    def steps(self, index: int, times: dict[str, float | str]):
        """One cycle, a step per timed operation (``measure`` runs the sides'
        steps in turn, so that each operation's figures on each side are
        taken within seconds of each other): new -> picture, list, suspend,
        resume -> picture (``-q lan``, as before), then two resumes with
        pyhoca-cli's default link (adsl): the first one's link leaves saved
        caches behind, which the second one meets (every resume of a user
        who keeps the defaults), terminate."""
        self.blank()
        started = time.monotonic()
        first = self.cli("-c", APP, "-t", "application", "-g", "1024x768", "-q", "lan", "--sound", "none",
                         log=f"new{index}.log", wait=False)
        times["new_to_picture"] = self.picture_after(started, first, f"new{index}.log")
        name = times["session"] = self.session_name(f"new{index}.log")
        yield
        started = time.monotonic()
        result = self.cli("--list-sessions", log=f"list{index}.log")
        times["list"] = time.monotonic() - started
        if result.returncode != 0 or name not in self.read_log(f"list{index}.log"):
            raise RuntimeError(f"listing failed: {self.read_log(f'list{index}.log')[-1500:]}")
        yield
        started = time.monotonic()
        result = self.cli("-S", name, log=f"sus{index}.log")
        times["suspend"] = time.monotonic() - started
        if result.returncode != 0:
            raise RuntimeError(f"suspend failed: {self.read_log(f'sus{index}.log')[-1500:]}")
        self.kill(first)
        yield
        times["resume_to_picture"] = self.resume(name, f"res{index}", "-q", "lan")
        yield
        self.resume(name, f"res{index}-adsl-first")
        yield
        times["resume_default_link_to_picture"] = self.resume(name, f"res{index}-adsl")
        yield
        time.sleep(1)
        started = time.monotonic()
        result = self.cli("-T", name, log=f"term{index}.log")
        times["terminate"] = time.monotonic() - started
        if result.returncode != 0:
            raise RuntimeError(f"terminate failed: {self.read_log(f'term{index}.log')[-1500:]}")
        wait_for(lambda: not [p for p, n in user_processes(self.user.name) if n == self.agent_name], 30,
                 f"the {self.agent_name} to end")

    def finish_run(self, index: int, times: dict[str, float | str]) -> dict[str, float | str]:
        run = {**times, "load": os.getloadavg()[0]}
        print(f"{self.label} run {index}: new->picture {run['new_to_picture']:.2f}s list {run['list']:.2f}s "
              f"suspend {run['suspend']:.2f}s resume->picture {run['resume_to_picture']:.2f}s "
              f"(client's default link {run['resume_default_link_to_picture']:.2f}s) "
              f"terminate {run['terminate']:.2f}s [load {run['load']:.1f}]", flush=True)
        return run

    def resume(self, name: str, log: str, *options: str) -> float:
        """Resume -> picture of the suspended session ``name``; the client is
        killed afterwards and the picture waited away (the session is
        suspended again by its lost link, as when a user closes the client)."""
        wait_for(lambda: self.magenta() < 100, 30, "the picture to go")
        try:
            wait_for(lambda: self.agent_suspended(name), 60, f"the {self.label} agent to say it suspended")
        except AssertionError:
            raise RuntimeError(f"the {self.label} agent of {name} did not say it suspended; its last words: "
                               f"{self.agent_words(name)[-6:]}") from None
        self.blank()
        time.sleep(1)
        started = time.monotonic()
        client = self.cli("-R", name, "-g", "1024x768", *options, "--sound", "none", log=f"{log}.log", wait=False)
        seconds = self.picture_after(started, client, f"{log}.log")
        self.kill(client)
        return seconds

    def agent_log(self, name: str) -> str | None:
        """The log of the agent of session ``name`` (x2goserver: ~/.x2go/C-<name>/session.log)."""
        return f"/home/{self.user.name}/.x2go/C-{name}/session.log"

    def agent_suspended(self, name: str) -> bool:
        """Whether the session's agent said last that it is suspended: a
        resume timed before would time the end of the suspend too (and a
        client that lists it as running may give up on it)."""
        said = [line for line in self.agent_words(name) if line.startswith("Session: ")]
        return bool(said) and said[-1].startswith("Session: Session suspended")

    def agent_words(self, name: str) -> list[str]:
        path = self.agent_log(name)
        try:
            with open(path, "rb") as handle:  # type: ignore[arg-type]
                return handle.read().decode("utf-8", "replace").splitlines()
        except (OSError, TypeError):
            return []

    def terminate_all(self) -> None:
        """End every X2Go session of the bench user with X2Go's own scripts."""
        out = subprocess.run(["runuser", "-u", self.user.name, "--", "x2golistsessions"], capture_output=True,
                             text=True, timeout=60).stdout
        for line in out.splitlines():
            fields = line.split("|")
            if len(fields) > 1:
                subprocess.run(["runuser", "-u", self.user.name, "--", "x2goterminate-session", fields[1]],
                               capture_output=True, timeout=60, check=False)

    def close(self) -> None:
        for client in self.clients:
            if client.poll() is None:
                self.kill(client)
        try:
            if self.user is not None:
                self.terminate_all()
        except Exception as error:  # noqa: BLE001
            print(f"x2go cleanup: {error}", file=sys.stderr)
        for cleanup in reversed(self.cleanups):
            try:
                cleanup()
            except Exception as error:  # noqa: BLE001
                print(f"cleanup: {error}", file=sys.stderr)


class NxgateX2GoBench(X2GoBench):
    """The same pyhoca-cli against nxgate's X2Go door (the real gateway, ``twistd nxgate``)."""

    label = "nxgate"
    agent_name = "nxagent"

    @property
    def port(self) -> int:
        return self.gateway.port

    def _setup(self) -> None:
        from tests.harness.gateway import Gateway

        self.user = create_user(prefix="x2n")
        self.cleanups.append(self.user.remove)
        sessions = {"max_sessions_per_user": "0", **({"lang": self.lang} if self.lang else {})}
        self.gateway = Gateway({"sessions": sessions}).start()
        self.cleanups.append(self.gateway.stop)
        self.workdir = tempfile.mkdtemp(prefix="nxgate-bench-x2go-nxgate-")
        self.cleanups.append(lambda: shutil.rmtree(self.workdir, ignore_errors=True))
        self.client_screen()
        self.cleaner = None

    def agent_log(self, name: str) -> str | None:
        """The newest agent log of the gateway (the bench runs one session at a time)."""
        return newest(os.path.join(self.gateway.state_dir, "logs", "*.agent.log"))

    def terminate_all(self) -> None:
        listing = self.cli("--list-sessions", log="cleanup-list.log")
        for name in re.findall(r"Session Name: (\S+)", self.read_log("cleanup-list.log")) if listing else []:
            self.cli("-T", name, log="cleanup-term.log")


class FloorX2GoBench(X2GoBench):
    """The same pyhoca-cli against an X2Go server that answers at once
    (bench/x2go_floor.py): pyhoca-cli's own floor for each operation, and its
    start-up alone (from its exec to its SSH connection)."""

    label = "floor"
    agent_name = "nxagent"

    @property
    def port(self) -> int:
        return self.floor_port

    def _setup(self) -> None:
        self.user = create_user(prefix="x2f")
        self.cleanups.append(self.user.remove)
        self.workdir = tempfile.mkdtemp(prefix="nxgate-bench-x2go-floor-")
        os.chmod(self.workdir, 0o755)  # the agent, run as the user, reaches its session directory below
        self.cleanups.append(lambda: shutil.rmtree(self.workdir, ignore_errors=True))
        self.events = os.path.join(self.workdir, "floor-events.jsonl")
        self.sessions_dir = os.path.join(self.workdir, "sessions")
        os.makedirs(self.sessions_dir, mode=0o755)
        self.server = subprocess.Popen([sys.executable, os.path.join(HERE, "x2go_floor.py"), "--user", self.user.name,
                                        "--events", self.events, "--workdir", self.sessions_dir], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                       stderr=open(os.path.join(self.workdir, "floor.log"), "wb"),
                                       env=dict(os.environ, PYTHONPATH=REPO))
        self.cleanups.append(lambda: stop(self.server))
        line = self.server.stdout.readline().decode()
        if not line.startswith("PORT "):
            raise RuntimeError(f"the floor server did not start: {line!r}")
        self.floor_port = int(line.split()[1])
        self.client_screen()
        self.cleaner = None

    def agent_log(self, name: str) -> str | None:
        return newest(os.path.join(self.sessions_dir, "*.agent.log"))

    def startups(self) -> list[float]:
        """For each pyhoca-cli run: seconds from its exec to its SSH connection."""
        with open(self.events) as handle:
            connects = [json.loads(line)["t"] for line in handle if '"connect"' in line]
        found = []
        for _, launched in self.launches:
            after = [t for t in connects if t >= launched]
            if after:
                found.append(after[0] - launched)
        return found

    def terminate_all(self) -> None:
        pass  # the floor server ends its session when it stops


def reference_result(reason: str) -> dict:
    return {
        "measured": False,
        "source": "reference, not measured (figures from the issue)",
        "reason": reason,
        "medians": {key: REFERENCE[key] for key in ("new_to_picture", "suspend", "resume_to_picture", "terminate")},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--install", action="store_true", help="apt-get install X2Go if it is missing (root)")
    parser.add_argument("--json", default=os.path.join(HERE, "results", "x2go.json"))
    parser.add_argument("--no-nxgate", action="store_true", help="X2Go's server only, not nxgate's X2Go door")
    parser.add_argument("--no-floor", action="store_true",
                        help="without the server that answers at once (pyhoca-cli's floor, bench/x2go_floor.py)")
    args = parser.parse_args(argv)
    result: dict
    if os.geteuid() != 0:
        result = reference_result("bench/x2go.py needs root (it creates a user and runs sshd)")
    else:
        missing = ensure_packages(PACKAGES, args.install)
        if missing:
            why = "not installed" + ("" if args.install else " (run with --install)")
            result = reference_result(f"Debian packages {' '.join(missing)} {why}")
        else:
            result = measure(args.runs, nxgate=not args.no_nxgate, floor=not args.no_floor)
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as handle:
        json.dump(result, handle, indent=2)
        handle.write("\n")
    label = "measured" if result["measured"] else result["source"]
    print(f"X2Go ({label}):")
    for key, value in result["medians"].items():
        print(f"  {key:<34}{value:>9.2f}s")
    door = result.get("nxgate_x2go_door")
    if door:
        print("nxgate's X2Go door, the same pyhoca-cli (ratio to x2goserver; goal <= 0.3):")
        for key, value in door["medians"].items():
            print(f"  {key:<34}{value:>9.2f}s  {door['ratio'].get(key, 0):>5.2f}x")
    floor = result.get("floor")
    if floor:
        startup = floor["startup"]["median"]
        print(f"pyhoca-cli's floor (a server that answers at once; start-up alone, exec -> SSH connection: "
              f"{startup or 0:.2f}s); what each server adds to it (paired medians; goal for nxgate <= 0.1 s):")
        share = (door or {}).get("share", {})
        for key, value in floor["medians"].items():
            print(f"  {key:<34}{value:>9.2f}s  x2goserver +{floor['x2goserver_share'][key]:.2f}s"
                  f"  nxgate +{share.get(key, float('nan')):.2f}s")
    if not result["measured"]:
        print(f"  why not measured: {result['reason']}")
    print(f"(JSON: {args.json})")
    return 0


KEYS = ("new_to_picture", "list", "suspend", "resume_to_picture", "resume_default_link_to_picture", "terminate")


def measure(runs: int, nxgate: bool = True, floor: bool = True) -> dict:
    """X2Go's server, (with ``nxgate``) nxgate's X2Go door and (with
    ``floor``) the server that answers at once (pyhoca-cli's floor), the same
    pyhoca-cli against each, each operation on every side in turn (the order
    turning each run) so that all see the same load."""
    bench = door = floor_bench = None
    try:
        bench = X2GoBench()
        door = NxgateX2GoBench() if nxgate else None
        floor_bench = FloorX2GoBench() if floor else None
        load_before = os.getloadavg()
        sides = [side for side in (bench, door, floor_bench) if side is not None]
        runs_of: dict[str, list[dict]] = {side.label: [] for side in sides}
        for index in range(runs):
            order = sides[index % len(sides):] + sides[:index % len(sides)]
            times: dict[str, dict] = {side.label: {} for side in order}
            stepping = [(side, side.steps(index, times[side.label])) for side in order]
            while stepping:  # each operation on every side in turn, then the next
                for pair in list(stepping):
                    if next(pair[1], StopIteration) is StopIteration:
                        stepping.remove(pair)
            for side in order:
                runs_of[side.label].append(side.finish_run(index, times[side.label]))
        all_runs = runs_of[bench.label]
        medians = medians_of(all_runs)
        result = {"measured": True, "source": "measured on this machine", "runs": all_runs, "medians": medians,
                  "spread": {key: [min(run[key] for run in all_runs), max(run[key] for run in all_runs)]
                             for key in KEYS},
                  "load_before": load_before, "load_after": os.getloadavg(),
                  "versions": versions()}
        floor_runs = runs_of.get("floor")
        if floor_runs:
            startups = floor_bench.startups()
            result["floor"] = {"runs": floor_runs, "medians": medians_of(floor_runs),
                               "startup": {"median": statistics.median(startups) if startups else None,
                                           "all": startups},
                               "x2goserver_share": paired_differences(all_runs, floor_runs)}
        if door is not None:
            door_runs = runs_of[door.label]
            door_medians = medians_of(door_runs)
            result["nxgate_x2go_door"] = {
                "runs": door_runs, "medians": door_medians,
                "ratio": {key: door_medians[key] / medians[key] for key in KEYS if medians[key]},
                "share": paired_differences(door_runs, floor_runs) if floor_runs else {}}
        return result
    except Exception as error:  # noqa: BLE001 - report exactly why, fall back
        traceback.print_exc()
        detail = f"{type(error).__name__}: {error}"
        return reference_result(f"X2Go could not be run here: {detail}")
    finally:
        for each in (floor_bench, door, bench):
            if each is not None:
                each.close()


def medians_of(runs: list[dict]) -> dict[str, float]:
    return {key: statistics.median(run[key] for run in runs) for key in KEYS}


def paired_differences(ours: list[dict], floor: list[dict]) -> dict[str, float]:
    """Per operation, the median over runs of (our run - the floor's run of
    the same round): what a server adds to pyhoca-cli's own time, with the
    load of each round shared by both."""
    return {key: statistics.median(a[key] - b[key] for a, b in zip(ours, floor)) for key in KEYS}


def versions() -> dict[str, str]:
    out = {}
    for package in PACKAGES + ["nxagent"]:
        result = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True)
        out[package] = result.stdout.strip()
    return out


if __name__ == "__main__":
    sys.exit(main())
