#!/usr/bin/env python3
"""What a new session's display search costs the reactor on a busy machine.

Every start reads ``/proc/net/unix`` (the abstract and path X sockets of the
machine) and looks at each display number it passes; on a terminal server
with tens of thousands of Unix sockets that table alone took 163 ms (median,
50,000 sockets) when it was read on the reactor, and every door and session
waited.  The search now runs in the reactor's thread pool
(:class:`nxgate.node.displays.DisplayAllocator` with ``blocking``).

This bench makes ``--sockets`` Unix sockets (socket pairs, each two rows of
the table, held by helper processes within their descriptor limit), plants
``--planted`` lock files naming pid 1 in a scratch range, and allocates a
display ``--runs`` times each way, alternating: the search on the reactor's
thread (``inline``, as before) and in the thread pool.  A 1 ms timer on the
reactor records how late it fired: the longest delay during an allocation
is the stall every other connection saw.  Printed: medians and maxima of
the stall and of the allocation's own time, per way.

    .venv/bin/python bench/display_search.py [--sockets 50000] [--runs 10] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from twisted.internet import defer, reactor, task  # noqa: E402

from nxgate.node import displays  # noqa: E402
from nxgate.threads import in_thread, inline  # noqa: E402

BASE = 6200  # a scratch range: nothing of a session's here

#: A helper holding ARGV[1] socket pairs (within its descriptor limit) until it is killed.
HOLDER = """
import resource, socket, sys, time
resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
held = [socket.socketpair() for _ in range(int(sys.argv[1]))]
print("held", flush=True)
time.sleep(3600)
"""


class Stalls:
    """The reactor's lateness, from a timer that wants to run every millisecond."""

    def __init__(self) -> None:
        self.worst = 0.0
        self.last = time.monotonic()
        self.loop = task.LoopingCall(self.tick)

    def tick(self) -> None:
        now = time.monotonic()
        self.worst = max(self.worst, now - self.last - 0.001)
        self.last = now

    def reset(self) -> None:
        self.worst, self.last = 0.0, time.monotonic()


async def measure(args: argparse.Namespace) -> dict:
    stalls = Stalls()
    stalls.loop.start(0.001)
    allocators = {"on the reactor": displays.DisplayAllocator(lambda: (BASE, 4), lambda: [], inline),
                  "in the thread pool": displays.DisplayAllocator(lambda: (BASE, 4), lambda: [], in_thread(reactor))}
    found: dict[str, dict[str, list[float]]] = {way: {"stall": [], "allocation": []} for way in allocators}
    for _ in range(args.runs):
        for way, allocator in allocators.items():
            await task.deferLater(reactor, 0.05, lambda: None)
            stalls.reset()
            started = time.monotonic()
            display = await allocator.allocate(os.getuid(), os.getgid())
            found[way]["allocation"].append((time.monotonic() - started) * 1000)
            await task.deferLater(reactor, 0.01, lambda: None)
            found[way]["stall"].append(stalls.worst * 1000)
            displays.release_display(display)
            for path in (f"/tmp/.X{display}-lock", f"/tmp/.X11-unix/X{display}"):
                if os.path.lexists(path):
                    os.unlink(path)
    stalls.loop.stop()
    return {way: {f"{kind}_median_ms": statistics.median(values) for kind, values in figures.items()}
            | {f"{kind}_max_ms": max(values) for kind, values in figures.items()}
            for way, figures in found.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sockets", type=int, default=50000)
    parser.add_argument("--planted", type=int, default=300)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--json")
    args = parser.parse_args()
    helpers = []
    per_helper = max(2, (resource.getrlimit(resource.RLIMIT_NOFILE)[1] - 512) // 2 * 2)
    for start in range(0, args.sockets, per_helper):
        helper = subprocess.Popen([sys.executable, "-c", HOLDER, str(min(per_helper, args.sockets - start) // 2)],
                                  stdout=subprocess.PIPE)
        helpers.append(helper)
        helper.stdout.readline()  # "held"
    planted = []
    for n in range(BASE, BASE + args.planted):
        path = f"/tmp/.X{n}-lock"
        if not os.path.lexists(path):
            with open(path, "w") as handle:
                handle.write("%10d\n" % 1)
            planted.append(path)
    with open("/proc/net/unix") as handle:
        rows = sum(1 for _ in handle) - 1
    result: dict = {}

    async def run() -> None:
        try:
            result.update(await measure(args))
        finally:
            reactor.stop()

    reactor.callWhenRunning(lambda: defer.ensureDeferred(run()))
    reactor.run()
    for path in planted:
        if os.path.lexists(path) and os.lstat(path).st_uid == os.getuid():
            os.unlink(path)
    for helper in helpers:
        helper.kill()
        helper.wait()
    report = {"unix_sockets": rows, "planted_locks": args.planted, "runs": args.runs, "ways": result,
              "load": os.getloadavg()}
    print(f"/proc/net/unix: {rows} rows; {args.planted} planted locks (the first taken over each time)")
    for way, figures in result.items():
        print(f"  search {way:<20} reactor stall median {figures['stall_median_ms']:7.1f} ms, max "
              f"{figures['stall_max_ms']:7.1f} ms; allocation median {figures['allocation_median_ms']:7.1f} ms")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
