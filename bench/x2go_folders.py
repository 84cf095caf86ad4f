#!/usr/bin/env python3
"""X2Go's shared folders: read and write throughput of the client's folder in
the session through nxgate's door, against sshfs straight to the same SFTP
server, alternating in one run.

A real gateway, a real session user, and Debian's x2goclient as a client
user of its own sharing a folder (its profile's ``export``): x2goclient serves
the folder with its own sshd (OpenSSH, as the client's user, from
``~/.x2go/etc``) and the session's sshfs reaches it back through the door
(the session's reverse listener, the reverse stream, a ``forwarded-tcpip``
channel of x2goclient's SSH connection to the gateway, libssh, then TCP to
that sshd).  The peer is the same sshfs (the node's own options and ssh
configuration), as the same user, mounted straight on that sshd's loopback
port with a key of its own: what X2Go's server does when the client is on
the same network (``__SSH_PORT__``), the cost of the SSH leg alone.

Each run copies with ``dd`` as the session's user (bench/sharing_copy.py's
``copy_once``): reads a --size-mb file of random bytes from the client's
folder, writes one back (``conv=fsync``); the two ways alternate, which goes
first alternates too, and medians of --runs are reported (MB/s = 10^6 B/s),
with the ratio to the peer, the CPU seconds per GB of each process group of
a way (the gateway, x2goclient, its sshd and sftp-server, the session's
sshfs, ``dd``) and the machine's load average around each copy.
Files are compared byte for byte in the first run.

    .venv/bin/python bench/x2go_folders.py [--size-mb 50] [--runs 4] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
sys.path.insert(0, HERE)

from nxgate.node.services.x2go_folders import HOST_ALIAS, mount_point, ssh_config  # noqa: E402
from nxgate.vocabulary.requests import SharedFolder  # noqa: E402
from sharing_copy import Meter, copy_once, cpu_text, summary, user_processes  # noqa: E402
from tests.harness.gateway import Gateway  # noqa: E402
from tests.harness.process import stop, wait_for  # noqa: E402
from tests.harness.users import create_user  # noqa: E402
from tests.harness.x11 import ClientScreen  # noqa: E402
from tests.harness.x2goclient import X2GoClientMachine  # noqa: E402
from tests.test_e2e_x2go_folders import mounted  # noqa: E402


class Cleanups:
    """What X2GoClientMachine asks of a test case: clean-ups, run last first."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def addCleanup(self, function, *args) -> None:  # noqa: N802 (the test case's name)
        self.calls.append((function, args))

    def run(self) -> None:
        for function, args in reversed(self.calls):
            try:
                function(*args)
            except Exception as error:  # clean up the rest all the same
                print(f"clean-up {function.__name__}: {error}", file=sys.stderr)


def client_sshd_port(machine: X2GoClientMachine) -> int:
    for line in machine.sshd():
        found = re.search(r"-p\s+(\d+)", line)
        if found:
            return int(found.group(1))
    raise RuntimeError(f"no sshd of x2goclient's user: {machine.sshd()}")


def direct_mount(session_user, machine: X2GoClientMachine, share: str, port: int) -> str:
    """sshfs as the session's user straight on x2goclient's sshd, with the node's ssh configuration and options
    (a key of its own, added to x2goclient's authorized keys; the sshd's host key pinned)."""
    base = tempfile.mkdtemp(prefix="nxgate-bench-x2go-direct-", dir="/tmp")
    key = os.path.join(base, "key")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key], check=True)
    with open(key + ".pub") as public:
        line = public.read()
    authorized = os.path.join(machine.home, ".x2go", ".ssh", "authorized_keys")
    with open(authorized, "a") as handle:
        handle.write(line)
    host_keys = [name for name in os.listdir(os.path.join(machine.home, ".x2go", "etc")) if name.endswith("_key.pub")]
    with open(os.path.join(machine.home, ".x2go", "etc", host_keys[0])) as handle:
        host_key = " ".join(handle.read().split()[:2])
    known = os.path.join(base, "known_hosts")
    with open(known, "w") as handle:
        handle.write(f"{HOST_ALIAS} {host_key}\n")
    config = os.path.join(base, "config")
    with open(config, "w") as handle:
        handle.write(ssh_config(key, known))
    point = os.path.join(base, "mnt")
    os.makedirs(point)
    entry = session_user.entry
    subprocess.run(["chown", "-R", f"{entry.pw_uid}:{entry.pw_gid}", base], check=True)
    os.chmod(base, 0o700)
    options = ",".join(["idmap=user", f"uid={entry.pw_uid}", f"gid={entry.pw_gid}", "default_permissions",
                        "fsname=nxgate-bench-direct", "subtype=sshfs"])
    subprocess.run(["runuser", "-u", session_user.name, "--", "sshfs", "-F", config, "-p", str(port), "-o", options,
                    f"{machine.user.name}@127.0.0.1:{share}", point], check=True, timeout=60)
    return point


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=50, help="the file's size in MB (default: %(default)s)")
    parser.add_argument("--runs", type=int, default=4, help="alternating runs of each way (medians are reported)")
    parser.add_argument("--json", default=os.path.join(HERE, "results", "x2go_folders.json"))
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # the clean-up below runs on a kill too
    if os.geteuid() != 0:
        print("needs root (Unix users, a gateway)", file=sys.stderr)
        return 2
    for program in ("x2goclient", "sshfs", "sshd"):
        if shutil.which(program, path="/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin") is None:
            print(f"needs {program} (Debian: x2goclient, sshfs, openssh-server)", file=sys.stderr)
            return 2
    if os.stat("/dev/fuse").st_mode & 0o006 != 0o006:
        os.chmod("/dev/fuse", 0o666)
    cleanups = Cleanups()
    direct = None
    try:
        user = create_user()
        cleanups.addCleanup(user.remove)
        gateway = Gateway().start()
        cleanups.addCleanup(gateway.stop)
        screen = ClientScreen(1024, 768, window_manager=True)
        cleanups.addCleanup(screen.close)
        cleanups.addCleanup(shutil.rmtree, f"/tmp/.x2go-{user.name}", True)
        machine = X2GoClientMachine(cleanups, screen, gateway.port, user,
                                    X2GoClientMachine.TERMINAL + "print=false\nfstunnel=true\n")
        share = os.path.dirname(machine.write("bench share/.keep", b""))
        os.chmod(share, 0o755)
        with open(os.path.join(machine.home, ".x2goclient", "sessions"), "a") as handle:
            handle.write(f"export=\"{share}:1;\"\n")
        client = machine.start()
        through = mount_point(user.name, "", SharedFolder(share, "disk"))
        wait_for(lambda: mounted(through) or client.poll() is not None, 180, "x2goclient's folder in the session")
        if not mounted(through):
            raise RuntimeError(f"x2goclient ended: {machine.text()[-2000:]}")
        port = client_sshd_port(machine)
        direct = direct_mount(user, machine, share, port)
        print(f"copying {args.size_mb} MB files, {args.runs} alternating runs; x2goclient's sshd on port {port}",
              flush=True)
        figures: dict[str, list[dict]] = {"door": [], "direct": []}
        gateway_pid, client_user = gateway.process.pid, machine.user.name

        def client_sshd() -> list[int]:
            """x2goclient's sshd as its user: the listener, each connection's child and its sftp-server."""
            return user_processes(client_user, "sshd", "") + user_processes(client_user, "sftp-server", "")

        meters = {
            "door": Meter(lambda: {"gateway": [gateway_pid], "x2goclient": [client.pid], "sshd": client_sshd(),
                                   "sshfs": user_processes(user.name, "sshfs", through)}),
            "direct": Meter(lambda: {"sshd": client_sshd(), "sshfs": user_processes(user.name, "sshfs", direct)}),
        }
        loads: list[float] = []
        for run in range(args.runs):
            order = ["door", "direct"] if run % 2 == 0 else ["direct", "door"]
            for way in order:
                loads.append(os.getloadavg()[0])
                where = through if way == "door" else direct
                copy = copy_once(user.name, share, where, args.size_mb, way, run == 0, meters[way])
                figures[way].append(copy)
                print(f"  run {run + 1} {way:>6}: read {copy['read_mbps']:7.1f} MB/s, write "
                      f"{copy['write_mbps']:7.1f} MB/s; CPU s/GB read {cpu_text(copy['read_cpu_s_per_gb'])}; write "
                      f"{cpu_text(copy['write_cpu_s_per_gb'])} (load {loads[-1]:.1f})", flush=True)
        loads.append(os.getloadavg()[0])
        result = {"size_mb": args.size_mb, "runs": args.runs, "cores": os.cpu_count(),
                  "load_min": min(loads), "load_max": max(loads), "load_median": statistics.median(loads),
                  "door": summary(figures["door"]), "direct": summary(figures["direct"])}
        for direction in ("read", "write"):
            result[f"{direction}_ratio"] = (result["door"][f"{direction}_mbps"] /
                                            result["direct"][f"{direction}_mbps"])
        print(f"through the door: read {result['door']['read_mbps']:.1f} MB/s, write "
              f"{result['door']['write_mbps']:.1f} MB/s; sshfs straight to the client's sshd: read "
              f"{result['direct']['read_mbps']:.1f} MB/s, write {result['direct']['write_mbps']:.1f} MB/s; "
              f"ratios {result['read_ratio']:.2f} / {result['write_ratio']:.2f}; load average "
              f"{result['load_min']:.1f}-{result['load_max']:.1f} on {result['cores']} cores")
        os.makedirs(os.path.dirname(args.json), exist_ok=True)
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=2)
        stop(client)
        return 0
    finally:
        if direct is not None:
            subprocess.run(["fusermount3", "-u", "-z", direct], check=False)
            shutil.rmtree(os.path.dirname(direct), ignore_errors=True)
        cleanups.run()


if __name__ == "__main__":
    sys.exit(main())
