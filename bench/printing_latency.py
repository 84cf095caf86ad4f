#!/usr/bin/env python3
"""Printing through NX: from ``lp`` in the session to the job's arrival at
the client's printer, against the same job printed on the client directly
(issue 14).

A real gateway, a console session attached by the real ``nxproxy -S`` with
``cups=PORT`` onto nxgate-client's gate, in front of a private CUPS with one
raw queue to ``ippeveprinter`` (tests/harness/cups.py), as in
tests/test_e2e_printing.py.  Each run prints a fresh small text with ``lp``
as the user in the session's environment (its own cupsd, its raw queue, CUPS's
ipp backend, the NX cups channel, the gate, the client's CUPS) and waits for
the file holding it in the printer's spool directory; the baseline prints
the same kind of text with ``lp`` straight into the client's CUPS (no NX,
no session cupsd).  Both include starting ``lp`` (and, in the session,
runuser); each job starts with every queue idle (CUPS's ipp backend stays
with a job until the printer reports it done, and the next job on that
queue waits for it); median and p90 of --runs.

    .venv/bin/python bench/printing_latency.py [--runs 10] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--json", default=os.path.join(REPO, "bench", "results", "printing.json"))
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench/printing_latency.py needs root (it creates a Unix user)", file=sys.stderr)
        return 2
    user = create_user()
    gateway = Gateway({"sessions": {"display_base": "1560", "display_limit": "20"},
                       "types": {"unix-console": "xterm -bg #ff0000 -geometry 60x15+10+10"}}).start()
    screen = ClientScreen(800, 600)
    workdir = tempfile.mkdtemp(prefix="printing-bench-")
    os.chmod(workdir, 0o711)
    printer = ClientPrinter(workdir)
    cups = ClientCups(printer, workdir)
    gate = None
    try:
        client = NXClient(gateway.port)
        client.greet()
        client.login(user.name, user.password)
        client.prompt()
        reply = client.command(START.format(name="bench", type="unix-console", extra='--cups="1"'), timeout=60)
        info = SessionInfo.parse(reply)
        gate = GateProcess(info.cookie, cups.server)
        attachment = Attachment(client, info, screen.name, workdir, options=f"cups={gate.port}")
        screen.wait_for_colour(RED, 20000)
        environ = proc_environ(session_program(user.name))
        env = [f"{key}={environ[key]}" for key in ("CUPS_SERVER", "HOME")]
        in_session = ["runuser", "-u", user.name, "--", "env", "-i", "PATH=/usr/bin:/bin", *env, "lp", "-d", QUEUE]
        directly = ["env", "-i", "PATH=/usr/bin:/bin", f"CUPS_SERVER={cups.server}", "lp", "-d", QUEUE]
        wait_for(lambda: subprocess.run([*in_session[:-3], "lpstat", "-a"], capture_output=True, text=True
                                        ).stdout.startswith(QUEUE), 60, "the client's queue in the session")

        def idle(argv: list[str]) -> None:
            """Each job starts on idle queues: CUPS's ipp backend stays with a
            job until the printer has finished it, and a job behind it waits."""
            lpstat = [*argv[:argv.index("lp")], "lpstat", "-o"]
            wait_for(lambda: subprocess.run(lpstat, capture_output=True, text=True).stdout.strip() == "", 60,
                     "the queue to be idle", interval=0.1)
            direct_lpstat = [*directly[:directly.index("lp")], "lpstat", "-o"]
            wait_for(lambda: subprocess.run(direct_lpstat, capture_output=True, text=True).stdout.strip() == "",
                     60, "the client's queue to be idle", interval=0.1)

        def latency(argv: list[str]) -> float:
            idle(argv)
            text = f"bench {uuid.uuid4().hex}\n"
            path = os.path.join(workdir, f"{uuid.uuid4().hex[:8]}.txt")
            with open(path, "w") as handle:
                handle.write(text)
            os.chmod(path, 0o644)
            started = time.monotonic()
            subprocess.run([*argv, path], check=True, capture_output=True, timeout=30)
            printer.wait_for_text(text.encode(), timeout=60, interval=0.005)
            return (time.monotonic() - started) * 1000

        latency(in_session)  # warm-up: the first job starts the session's backend
        session_ms = [latency(in_session) for _ in range(args.runs)]
        direct_ms = [latency(directly) for _ in range(args.runs)]
        attachment.detach()
        client.close()
    finally:
        if gate is not None:
            gate.close()
        cups.close()
        printer.close()
        screen.close()
        gateway.stop()
        user.remove()

    result = {
        "session_ms_median": statistics.median(session_ms), "session_ms_p90": p90(session_ms),
        "direct_ms_median": statistics.median(direct_ms), "direct_ms_p90": p90(direct_ms),
        "nx_adds_ms": statistics.median(session_ms) - statistics.median(direct_ms),
        "runs": {"session": session_ms, "direct": direct_ms},
    }
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as handle:
        json.dump(result, handle, indent=2)
    print(f"lp in the session -> job at the client's printer: median {result['session_ms_median']:.0f} ms, "
          f"p90 {result['session_ms_p90']:.0f} ms")
    print(f"lp straight into the client's CUPS:               median {result['direct_ms_median']:.0f} ms, "
          f"p90 {result['direct_ms_p90']:.0f} ms (the session and NX add {result['nx_adds_ms']:.0f} ms)")
    print(f"(JSON: {args.json})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
