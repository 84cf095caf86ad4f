#!/usr/bin/env python3
"""Printing through NX: from ``lp`` in the session to the job's arrival at
the client's printer, against the same job printed on the client directly
(issue 14).

A real gateway and two console sessions of two users printing to the same
private CUPS with one raw queue to ``ippeveprinter`` (tests/harness/cups.py):
one attached by the real ``nxgate-client --print`` (the jobs on an SSH
channel of their own, issue 25), one by OpenSSH and the real ``nxproxy -S``
with ``cups=PORT`` onto nxgate-client's gate (the NX cups channel, as
NoMachine's and OpenNX's clients use it).  Each run prints a fresh small text with ``lp``
as the user in the session's environment (its own cupsd, its raw queue, CUPS's
ipp backend, the NX cups channel, the gate, the client's CUPS) and waits for
the file holding it in the printer's spool directory; the baseline prints
the same kind of text with ``lp`` straight into the client's CUPS (no NX,
no session cupsd).  Both include starting ``lp`` (and, in the session,
runuser); each job starts with every queue idle (CUPS's ipp backend stays
with a job until the printer reports it done, and the next job on that
queue waits for it); the three ways alternate, median and p90 of --runs.

    .venv/bin/python bench/printing_latency.py [--runs 10] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from tests.harness.cups import QUEUE, ClientCups, ClientPrinter, GateProcess  # noqa: E402
from tests.harness.gateway import Gateway  # noqa: E402
from tests.harness.process import wait_for  # noqa: E402
from tests.harness.ssh import Attachment, NXClient, SessionInfo  # noqa: E402
from tests.harness.users import create_user  # noqa: E402
from tests.harness.x11 import ClientScreen  # noqa: E402
from tests.test_e2e_sessions import RED, START, proc_environ  # noqa: E402
from tests.test_e2e_sound import session_program  # noqa: E402


def p90(values: list[float]) -> float:
    return sorted(values)[max(0, int(round(0.9 * len(values))) - 1)]


def session_env(user: str) -> list[str]:
    environ = proc_environ(session_program(user))
    return [f"{key}={environ[key]}" for key in ("CUPS_SERVER", "HOME")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--json", default=os.path.join(REPO, "bench", "results", "printing.json"))
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # the clean-up below runs on a kill too
    if os.geteuid() != 0:
        print("bench/printing_latency.py needs root (it creates a Unix user)", file=sys.stderr)
        return 2
    nx_user, tunnel_user = create_user(), create_user()
    gateway = Gateway({"sessions": {"display_base": "1560", "display_limit": "20"},
                       "types": {"unix-console": "xterm -bg #ff0000 -geometry 60x15+10+10"}}).start()
    screen, tunnel_screen = ClientScreen(800, 600), ClientScreen(800, 600)
    workdir = tempfile.mkdtemp(prefix="printing-bench-")
    os.chmod(workdir, 0o711)
    printer = ClientPrinter(workdir)
    cups = ClientCups(printer, workdir)
    gate = client = None
    try:
        # The NX cups channel, as NoMachine's and OpenNX's clients use it: OpenSSH, nxproxy -S cups=, the gate.
        nx_client = NXClient(gateway.port)
        nx_client.greet()
        nx_client.login(nx_user.name, nx_user.password)
        nx_client.prompt()
        reply = nx_client.command(START.format(name="bench", type="unix-console", extra='--cups="1"'), timeout=60)
        info = SessionInfo.parse(reply)
        gate = GateProcess(info.cookie, cups.server)
        attachment = Attachment(nx_client, info, screen.name, workdir, options=f"cups={gate.port}")
        # The real nxgate-client --print: the jobs on an SSH channel of their own.
        env = dict(os.environ, PYTHONPATH=REPO, TMPDIR=workdir, NXGATE_PASSWORD=tunnel_user.password,
                   DISPLAY=tunnel_screen.name)
        client = subprocess.Popen([sys.executable, "-m", "nxgate.clients.nx", "--accept-any-host-key", "--type",
                                   "unix-console", "--geometry", "800x600", "--print", "--print-server", cups.server,
                                   f"{tunnel_user.name}@127.0.0.1:{gateway.port}"], env=env,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        screen.wait_for_colour(RED, 20000)
        tunnel_screen.wait_for_colour(RED, 20000)
        ways = {}
        for tag, user in (("nx", nx_user), ("tunnel", tunnel_user)):
            environ = wait_for(lambda u=user: session_env(u.name), 20, "the session program")
            ways[tag] = ["runuser", "-u", user.name, "--", "env", "-i", "PATH=/usr/bin:/bin", *environ, "lp", "-d",
                         QUEUE]
        ways["direct"] = ["env", "-i", "PATH=/usr/bin:/bin", f"CUPS_SERVER={cups.server}", "lp", "-d", QUEUE]
        for tag in ("nx", "tunnel"):
            argv = ways[tag]
            wait_for(lambda a=argv: subprocess.run([*a[:-3], "lpstat", "-a"], capture_output=True, text=True
                                                   ).stdout.startswith(QUEUE), 60, "the client's queue in the session")

        def idle() -> None:
            """Each job starts on idle queues: CUPS's ipp backend stays with a
            job until the printer has finished it, and a job behind it waits."""
            for argv in ways.values():
                lpstat = [*argv[:argv.index("lp")], "lpstat", "-o"]
                wait_for(lambda a=lpstat: subprocess.run(a, capture_output=True, text=True).stdout.strip() == "", 60,
                         "the queues to be idle", interval=0.1)

        def latency(argv: list[str]) -> float:
            idle()
            text = f"bench {uuid.uuid4().hex}\n"
            path = os.path.join(workdir, f"{uuid.uuid4().hex[:8]}.txt")
            with open(path, "w") as handle:
                handle.write(text)
            os.chmod(path, 0o644)
            started = time.monotonic()
            subprocess.run([*argv, path], check=True, capture_output=True, timeout=30)
            printer.wait_for_text(text.encode(), timeout=60, interval=0.005)
            return (time.monotonic() - started) * 1000

        latency(ways["nx"])  # warm-up: the first job starts the session's backend
        latency(ways["tunnel"])
        figures: dict[str, list[float]] = {tag: [] for tag in ways}
        for _ in range(args.runs):  # alternating: the machine's load hits all three alike
            for tag in ("tunnel", "direct", "nx"):
                figures[tag].append(latency(ways[tag]))
        attachment.detach()
        nx_client.close()
    finally:
        if client is not None:
            client.terminate()
            client.wait(30)
        if gate is not None:
            gate.close()
        cups.close()
        printer.close()
        screen.close()
        tunnel_screen.close()
        gateway.stop()
        nx_user.remove()
        tunnel_user.remove()

    median = {tag: statistics.median(values) for tag, values in figures.items()}
    result = {
        "session_ms_median": median["tunnel"], "session_ms_p90": p90(figures["tunnel"]),
        "nx_channel_ms_median": median["nx"], "nx_channel_ms_p90": p90(figures["nx"]),
        "direct_ms_median": median["direct"], "direct_ms_p90": p90(figures["direct"]),
        "ratio": median["tunnel"] / median["direct"], "nx_channel_ratio": median["nx"] / median["direct"],
        "runs": figures,
    }
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as handle:
        json.dump(result, handle, indent=2)
    print(f"lp in the session -> the client's printer, own SSH channel: median {median['tunnel']:.0f} ms, "
          f"p90 {result['session_ms_p90']:.0f} ms ({result['ratio']:.2f}x direct)")
    print(f"lp in the session -> the client's printer, NX cups channel: median {median['nx']:.0f} ms, "
          f"p90 {result['nx_channel_ms_p90']:.0f} ms ({result['nx_channel_ratio']:.2f}x direct)")
    print(f"lp straight into the client's CUPS:                        median {median['direct']:.0f} ms, "
          f"p90 {result['direct_ms_p90']:.0f} ms")
    print(f"(JSON: {args.json})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
