"""Session timings, measured like X2Go's peer script measures X2Go.

Runs a real gateway and drives it with nxgate-client onto an Xvfb:
new session -> picture, suspend (a second client asks), resume -> picture,
terminate (the answer comes once the agent is gone); medians of N runs.
Needs root (it creates a Unix user).  Prints a table and writes JSON.
The memory of sessions is bench/memory.py's (PSS, beside x2goserver's).

The sessions are application sessions shown rootless (``--rootless``), as
X2Go's ``pyhoca-cli -t application`` ones are (x2goagent ``-R``): like for
like.  ``--mode desktop`` times desktop-mode sessions (nxgate-client's
default for an application) instead.

    .venv/bin/python bench/sessions.py [--runs 5] [--mode rootless|desktop] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from tests.harness.gateway import Gateway  # noqa: E402
from tests.harness.process import wait_for  # noqa: E402
from tests.harness.users import create_user  # noqa: E402
from tests.harness.x11 import ClientScreen  # noqa: E402

MAGENTA = (255, 0, 255)
APP = "xterm -bg #ff00ff -fg #ff00ff -geometry 200x60+0+0"


class Bench:
    def __init__(self, sessions: int, rootless: bool = True, lang: str | None = None) -> None:
        """``lang``: [sessions] lang, the sessions' LANG (PAM sets none here)."""
        self.mode = ("--rootless",) if rootless else ()
        self.user = create_user()
        options = {"display_base": "1300", "display_limit": str(sessions + 20),
                   "max_sessions_per_user": str(sessions + 10)}
        if lang:
            options["lang"] = lang
        self.gateway = Gateway({"sessions": options}).start()
        self.screen = ClientScreen(1024, 768)
        self.env = dict(os.environ, DISPLAY=self.screen.name, NXGATE_PASSWORD=self.user.password,
                        PYTHONPATH=REPO)

    def client(self, *args: str, wait: bool = True) -> subprocess.Popen | subprocess.CompletedProcess:
        argv = [sys.executable, "-m", "nxgate.clients.nx", "--accept-any-host-key", "--port", str(self.gateway.port),
                *args, f"{self.user.name}@127.0.0.1"]
        if wait:
            return subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=120)
        return subprocess.Popen(argv, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def magenta(self) -> int:
        return self.screen.shot().count(MAGENTA)

    def picture_after(self, started: float) -> float:
        wait_for(lambda: self.magenta() > 5000, 60, "the picture", interval=0.02)
        return time.monotonic() - started

    def session_id(self) -> str:
        listing = self.client("--list").stdout.split()
        return listing[0]

    def one_run(self) -> dict[str, float]:
        started = time.monotonic()
        first = self.client("--type", "unix-application", *self.mode, "--application", APP, "--geometry", "1024x768",
                            wait=False)
        new = self.picture_after(started)
        sid = self.session_id()
        started = time.monotonic()
        result = self.client("--suspend", sid)
        suspend = time.monotonic() - started
        assert result.returncode == 0, result.stderr
        first.wait(30)
        wait_for(lambda: self.magenta() < 100, 30, "the picture to go")
        started = time.monotonic()
        second = self.client("--resume", sid, "--geometry", "1024x768", wait=False)
        resume = self.picture_after(started)
        started = time.monotonic()
        result = self.client("--terminate", sid)
        terminate = time.monotonic() - started
        assert result.returncode == 0, result.stderr
        second.wait(30)
        for process in (first, second):
            process.stdout.close()
            process.stderr.close()
        wait_for(lambda: self.magenta() < 100, 30, "the picture to go")
        return {"new_to_picture": new, "suspend": suspend, "resume_to_picture": resume, "terminate": terminate}

    def close(self) -> None:
        subprocess.run(["pkill", "-u", self.user.name], check=False)
        self.screen.close()
        self.gateway.stop()
        self.user.remove()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--mode", choices=("rootless", "desktop"), default="rootless",
                        help="how the timed application sessions are shown (X2Go's are rootless)")
    parser.add_argument("--json", default=os.path.join(REPO, "bench", "results", "sessions.json"))
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench/sessions.py needs root (it creates a Unix user)", file=sys.stderr)
        return 2
    bench = Bench(1, rootless=args.mode == "rootless")
    try:
        runs = [bench.one_run() for _ in range(args.runs)]
        medians = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
    finally:
        bench.close()
    result = {"mode": args.mode, "runs": runs, "medians": medians}
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as handle:
        json.dump(result, handle, indent=2)
    print(f"{'measure':<34}{'median':>10}")
    for key, value in medians.items():
        print(f"{key:<34}{value:>9.2f}s")
    print(f"(JSON: {args.json})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
