#!/usr/bin/env python3
"""Logins under attack: how fast the gateway still serves while it is attacked.

The end-to-end tests (tests/test_e2e_dheat.py, tests/test_e2e_attacks_transport.py)
check that logins succeed under each attack; this measures how long they take,
against the quiet gateway in the same run:

* ``dheat``: 12 connections from 127.0.0.2 insisting on the largest
  Diffie-Hellman group (tests/harness/dheat.py, as ``ssh-audit --dheat 12``);
  an NX login over OpenSSH with group exchange and a portal page, quiet and
  under attack, alternating (issue 27's targets: under 2 s and 200 ms);
* ``frozen``: a group-exchange login with every key-exchange worker
  SIGSTOPped (the first pays for finding the stopped worker and starting a
  fresh one), then the next one;
* ``idle``: NX logins while 20 addresses hold 10 silent connections each on
  the SSH port (the door is full: each login displaces one of them).

    .venv/bin/python bench/attacks.py [--runs 5] [--json bench/results/attacks.json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)

from tests.harness.gateway import Gateway  # noqa: E402
from tests.harness.process import wait_for  # noqa: E402
from tests.harness.ssh import NXClient  # noqa: E402
from tests.harness.users import create_user  # noqa: E402
from tests.harness.web import web_base, web_options  # noqa: E402
from tests.test_e2e_attacks_transport import GEX_ONLY, kex_workers  # noqa: E402
from tests.test_e2e_dheat import Attacker  # noqa: E402
from tests.test_e2e_preauth import Flood  # noqa: E402


def nx_login(port: int, user, extra: list[str] | None = None) -> float:  # type: ignore[no-untyped-def]
    started = time.monotonic()
    client = NXClient(port, extra=extra)
    try:
        client.greet()
        answer = client.login(user.name, user.password)
    finally:
        client.close()
    if b"NX> 103" not in answer:
        raise SystemExit(f"the login failed: {answer!r}")
    return time.monotonic() - started


def portal_page(base: str) -> float:
    import ssl
    import urllib.request

    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    started = time.monotonic()
    with urllib.request.urlopen(base + "/login", timeout=60, context=context) as answer:
        answer.read()
    return time.monotonic() - started


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def dheat(user, runs: int) -> dict:  # type: ignore[no-untyped-def]
    gateway = Gateway({**web_options(), "server": {"preauth_exempt": "127.0.0.0/8"}}).start()
    try:
        base = web_base(gateway)
        quiet_logins = [nx_login(gateway.port, user, GEX_ONLY) for _ in range(runs)]
        quiet_pages = [portal_page(base) for _ in range(runs)]
        attacker = Attacker(gateway.port, minimum=4096)
        try:
            time.sleep(3)
            logins, pages = [], []
            for _ in range(runs):
                logins.append(nx_login(gateway.port, user, GEX_ONLY))
                pages.append(portal_page(base))
            totals = attacker.totals()
        finally:
            attacker.stop()
    finally:
        gateway.stop()
    return {"quiet_login_s": quiet_logins, "quiet_page_s": quiet_pages, "login_s": logins, "page_s": pages,
            "attacker": totals, "target_login_s": 2.0, "target_page_s": 0.2}


def frozen(user, runs: int) -> dict:  # type: ignore[no-untyped-def]
    result: dict = {"first_s": [], "next_s": []}
    for _ in range(runs):
        gateway = Gateway().start()
        try:
            workers = wait_for(lambda: len(kex_workers(gateway.process.pid)) == 2 and kex_workers(gateway.process.pid),
                               20, "the key-exchange workers")
            for pid in workers:
                os.kill(pid, signal.SIGSTOP)
            result["first_s"].append(nx_login(gateway.port, user, GEX_ONLY))
            result["next_s"].append(nx_login(gateway.port, user, GEX_ONLY))
            for pid in workers:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        finally:
            gateway.stop()
    return result


def idle(user, runs: int) -> dict:  # type: ignore[no-untyped-def]
    gateway = Gateway({"server": {"login_grace_time": "120"}}).start()
    try:
        quiet = [nx_login(gateway.port, user) for _ in range(runs)]
        flood = Flood(",".join(f"127.0.1.{n}" for n in range(1, 21)), gateway.port, 10)
        try:
            time.sleep(5)
            logins = [nx_login(gateway.port, user) for _ in range(runs)]
        finally:
            flood.close()
    finally:
        gateway.stop()
    return {"quiet_login_s": quiet, "login_s": logins}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--only", default="dheat,frozen,idle")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("attacks.py needs root: it creates a Unix user and stops the gateway's workers", file=sys.stderr)
        return 2
    user = create_user()
    results: dict = {"load_before": os.getloadavg()}
    try:
        for name, measure in (("dheat", dheat), ("frozen", frozen), ("idle", idle)):
            if name in args.only.split(","):
                results[name] = measure(user, args.runs)
                print(name, json.dumps({key: [round(v, 3) for v in value] if isinstance(value, list) else value
                                        for key, value in results[name].items()}), flush=True)
    finally:
        user.remove()
    results["load_after"] = os.getloadavg()
    for name in ("dheat", "idle"):
        if name in results:
            figures = results[name]
            print(f"{name}: NX login median {median(figures['quiet_login_s']):.3f} s quiet,"
                  f" {median(figures['login_s']):.3f} s under attack")
    if "dheat" in results:
        print(f"dheat: portal page median {median(results['dheat']['quiet_page_s']) * 1000:.0f} ms quiet,"
              f" {median(results['dheat']['page_s']) * 1000:.0f} ms under attack")
    if "frozen" in results:
        print(f"frozen workers: first group-exchange login {median(results['frozen']['first_s']):.3f} s,"
              f" the next {median(results['frozen']['next_s']):.3f} s")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)
            handle.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
