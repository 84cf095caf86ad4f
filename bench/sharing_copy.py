#!/usr/bin/env python3
"""Folder sharing: copy throughput of one file from the client's folder
into the session and back, three ways in the same run (issues 14, 25).

A real gateway with two console sessions of two users, the client's folder
mounted by the gateway at ``~/MyShares/bench`` (smbnetfs, as the user):

* own channel: the real ``nxgate-client --share`` (its private Samba; the
  SMB stream on an SSH channel of its own beside the NX stream);
* NX channel: OpenSSH + the real ``nxproxy -S smb=PORT`` onto a private
  Samba (:class:`nxgate.clients.nx.sharing.LocalShares`), as NoMachine's and
  OpenNX's clients do, the SMB stream inside nxcomp's smb channel;
* without NX or SSH (the peer): the same smbnetfs, as the same user,
  mounted straight on the private Samba's loopback port.

Each run copies with ``dd`` as the session's user: reads a --size-mb file of
random bytes from the client's folder, writes one back (``bs=1M``, the
write ends with ``conv=fsync``); the three ways alternate, and medians of
--runs are reported (MB/s = 10^6 bytes/s), with ratios to the peer and the CPU seconds per GB of every process.  Files
are checked byte for byte in the first run.

What limits the NX channel (found with this script and strace): Nagle's
algorithm on the NX stream's TCP legs (fixed: TCP_NODELAY), and in an idle
session nxagent's embedded proxy sends its flow-control token replies only
at its next timer (~2 s), so long copies stall; hence the own channel.

    .venv/bin/python bench/sharing_copy.py [--size-mb 100] [--runs 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
sys.path.insert(0, HERE)

from nxgate.clients.nx.sharing import LocalShares  # noqa: E402
from nxgate.node.extras.sharing import CLIENT_SMB_CONF, MOUNT_OPTIONS, share_path, smbnetfs_config  # noqa: E402
from nxgate.protocols.nx import client_commands as commands  # noqa: E402
from tests.harness.gateway import Gateway  # noqa: E402
from tests.harness.process import wait_for  # noqa: E402
from tests.harness.samba import open_blocking  # noqa: E402
from tests.harness.ssh import Attachment, NXClient, SessionInfo  # noqa: E402
from tests.harness.users import create_user  # noqa: E402
from tests.harness.x11 import ClientScreen  # noqa: E402
from tests.test_e2e_sessions import RED, START  # noqa: E402
from relay import CLK_TCK, PySpy, comm, descendants, pgrep, print_profile, proc_ticks  # noqa: E402

SHARE = "bench"


def as_user(user: str, *argv: str, timeout: float = 3600) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", user, "--", *argv], capture_output=True, timeout=timeout)


class Meter:
    """CPU seconds of the processes of one way over one copy, by group.

    ``groups()`` names each group's pids (looked up again at the end: a
    process born during the copy counts its whole life); the copying ``dd``
    (and its ``runuser``) is measured from this process's children's usage."""

    def __init__(self, groups: Callable[[], dict[str, list[int]]]) -> None:
        self.groups = groups
        self.before: dict[int, int] = {}
        self.children = resource.getrusage(resource.RUSAGE_CHILDREN)

    def start(self) -> None:
        self.before = {pid: proc_ticks(pid) for pids in self.groups().values() for pid in pids}
        self.children = resource.getrusage(resource.RUSAGE_CHILDREN)

    def stop(self) -> dict[str, float]:
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        used = {name: sum(max(0, proc_ticks(pid) - self.before.get(pid, 0)) for pid in set(pids)) / CLK_TCK
                for name, pids in self.groups().items()}
        used["dd"] = (children.ru_utime - self.children.ru_utime) + (children.ru_stime - self.children.ru_stime)
        return used


def timed(user: str, meter: Meter, *argv: str) -> tuple[float, dict[str, float]]:
    """(seconds, CPU seconds by group) of ``argv`` run as ``user``."""
    meter.start()
    started = time.monotonic()
    result = as_user(user, *argv)
    seconds = time.monotonic() - started
    cpu = meter.stop()
    if result.returncode != 0:
        raise RuntimeError(f"{argv}: {result.stderr.decode(errors='replace')}")
    return seconds, cpu


def digest(path: str, user: str | None = None) -> str:
    if user is None:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    return as_user(user, "sha256sum", path).stdout.split()[0].decode()


def copy_once(user: str, folder: str, where: str, size_mb: int, tag: str, check: bool, meter: Meter,
              spy: Callable[[str], Callable[[], None]] | None = None) -> dict:
    """MB/s and CPU seconds by process group of one --size-mb file read from
    ``folder`` (the client's) through ``where`` (the same folder as the
    session's user sees it), and of one written back; ``check``: compare the
    files byte for byte too; ``spy(direction)``: starts profilers, returns
    what stops them."""
    size = size_mb * 1_000_000
    # New names each run: smbnetfs caches what it saw, and these files are removed behind its back.
    name, up = f"{tag}-down-{uuid.uuid4().hex[:8]}.bin", f"{tag}-up-{uuid.uuid4().hex[:8]}.bin"
    subprocess.run(["dd", "if=/dev/urandom", f"of={os.path.join(folder, name)}", "bs=1000000",
                    f"count={size_mb}", "status=none"], check=True)
    os.chmod(os.path.join(folder, name), 0o644)
    stop = spy("read") if spy else None
    seconds, read_cpu = timed(user, meter, "dd", f"if={os.path.join(where, name)}", "of=/dev/null", "bs=1M",
                              "status=none")
    if stop:
        stop()
    read = size / seconds / 1e6
    if check and digest(os.path.join(folder, name)) != digest(os.path.join(where, name), user):
        raise RuntimeError(f"{tag}: the file read through the share differs")
    stop = spy("write") if spy else None
    seconds, write_cpu = timed(user, meter, "dd", "if=/dev/urandom", f"of={os.path.join(where, up)}", "bs=1000000",
                               f"count={size_mb}", "conv=fsync", "status=none")
    if stop:
        stop()
    write = size / seconds / 1e6
    if check and digest(os.path.join(folder, up)) != digest(os.path.join(where, up), user):
        raise RuntimeError(f"{tag}: the file written through the share differs")
    for leftover in (name, up):
        os.unlink(os.path.join(folder, leftover))
    gb = size / 1e9
    return {"read_mbps": read, "write_mbps": write,
            "read_cpu_s_per_gb": {group: used / gb for group, used in read_cpu.items()},
            "write_cpu_s_per_gb": {group: used / gb for group, used in write_cpu.items()}}


def summary(copies: list[dict]) -> dict:
    reads, writes = [c["read_mbps"] for c in copies], [c["write_mbps"] for c in copies]
    result = {"read_mbps": statistics.median(reads), "write_mbps": statistics.median(writes),
              "best_read_mbps": max(reads), "best_write_mbps": max(writes), "reads": reads, "writes": writes}
    for way in ("read", "write"):
        groups = sorted({group for c in copies for group in c[f"{way}_cpu_s_per_gb"]})
        result[f"{way}_cpu_s_per_gb"] = {group: statistics.median(c[f"{way}_cpu_s_per_gb"].get(group, 0.0)
                                                                 for c in copies) for group in groups}
    return result


def cpu_text(cpu: dict[str, float]) -> str:
    return ", ".join(f"{group} {seconds:.2f}" for group, seconds in sorted(cpu.items())) + \
        f" (all {sum(cpu.values()):.2f})"


def profile_copy(directory: str, user: str, folder: str, where: str, size_mb: int, meter: Meter,
                 pids: dict[str, int]) -> dict:
    """One more copy each way with py-spy on each of ``pids`` (raw stacks in ``directory``):
    the profiles' summaries by process and direction."""
    os.makedirs(directory, exist_ok=True)
    profiles: dict[str, dict] = {}

    def spy(direction: str) -> Callable[[], None]:
        spies = {name: PySpy(pid, os.path.join(directory, f"{name}-{direction}.txt"), rate=250)
                 for name, pid in pids.items()}

        def stop() -> None:
            for name, each in spies.items():
                profiles[f"{name}, {direction}"] = each.stop()
        return stop

    copy_once(user, folder, where, size_mb, "profiled", False, meter, spy)
    return profiles


def user_processes(user: str, name: str, mountpoint: str) -> list[int]:
    """``user``'s processes called ``name`` whose command line names ``mountpoint``
    (smbnetfs and the children it forks for its SMB connections)."""
    found = []
    for pid in pgrep(user, name):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                if os.fsencode(mountpoint) in handle.read():
                    found.append(pid)
        except OSError:
            continue
    return found


def smbd_processes(root: int) -> list[int]:
    """The private smbd started as ``root`` (or under it) and the children it forks per connection."""
    return [pid for pid in [root, *descendants(root)] if comm(pid).startswith("smbd")]


def direct_mount(user, home: str, port: int, shares: LocalShares) -> tuple[str, str]:
    """smbnetfs as ``user`` straight on the client's Samba, with the options the
    gateway mounts with: (mount point, share path)."""
    base = tempfile.mkdtemp(prefix="nxgate-bench-smb-", dir=home)
    os.makedirs(os.path.join(base, ".smb"))
    os.makedirs(os.path.join(base, "mnt"))
    config = os.path.join(base, ".smb", "smbnetfs.conf")
    with open(os.path.join(base, ".smb", "smb.conf"), "w") as handle:
        handle.write(CLIENT_SMB_CONF)
    with open(config, "w") as handle:
        handle.write(smbnetfs_config(shares.user, shares.password))
    os.chmod(config, 0o600)
    subprocess.run(["chown", "-R", f"{user.name}:", base], check=True)
    os.chmod(base, 0o700)
    subprocess.run(["runuser", "-u", user.name, "--", "env", f"HOME={base}", "smbnetfs", os.path.join(base, "mnt"),
                    "-o", f"config={config},{MOUNT_OPTIONS}"], check=True, cwd=base)
    return os.path.join(base, "mnt"), share_path(os.path.join(base, "mnt"), port, SHARE)


def client_mount(gateway: Gateway, user, screen: ClientScreen, folder: str, tmp: str) -> subprocess.Popen:
    """``nxgate-client --share`` (its private Samba, its own SSH channel for
    the folder): the real client, in the background."""
    env = dict(os.environ, PYTHONPATH=REPO, TMPDIR=tmp, NXGATE_PASSWORD=user.password, DISPLAY=screen.name)
    argv = [sys.executable, "-m", "nxgate.clients.nx", "--accept-any-host-key", "--type", "unix-console",
            "--geometry", "800x600", "--share", f"{SHARE}={folder}", f"{user.name}@127.0.0.1:{gateway.port}"]
    return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def nx_mount(gateway: Gateway, user, screen: ClientScreen, shares: LocalShares, args) -> tuple[Attachment, NXClient]:
    """The NX smb channel (as NoMachine's and OpenNX's clients use it):
    OpenSSH + the real nxproxy -S smb=PORT."""
    client = NXClient(gateway.port)
    client.greet()
    client.login(user.name, user.password)
    client.prompt()
    start = START.format(name="bench", type="unix-console", extra='--samba="1"').replace(
        '--link="lan"', f'--link="{args.link}"')
    info = SessionInfo.parse(client.command(start, timeout=60))
    reply = client.command(commands.addmount_command(info.session_id, 3000 + info.display, SHARE, shares.user,
                                                     shares.password, "bench"))
    assert b"NX> 719 SMB filesystem: running" in reply, reply
    attachment = Attachment(client, info, screen.name, gateway.workdir, options=f"smb={shares.port}")
    # As nxgate-client does: no Nagle delay on its local end of the NX stream.
    attachment.conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return attachment, client


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=100, help="the file's size in MB (default: %(default)s)")
    parser.add_argument("--runs", type=int, default=5, help="alternating runs of each path (medians are reported)")
    parser.add_argument("--link", default="lan", help="the NX session's --link (default: %(default)s)")
    parser.add_argument("--ways", default="tunnel,direct,nx",
                        help="which ways to measure, in this order each run (default: %(default)s; the NX channel "
                             "may stall for minutes in an idle session)")
    parser.add_argument("--json", default=os.path.join(REPO, "bench", "results", "sharing.json"))
    parser.add_argument("--profile", default="", metavar="DIR",
                        help="after the measured runs, one more copy through the own channel with py-spy on the "
                             "gateway and nxgate-client (raw stacks into DIR; pip install py-spy)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # the clean-up below runs on a kill too
    ways = [way for way in args.ways.split(",") if way]
    if not ways or set(ways) - {"tunnel", "direct", "nx"}:
        parser.error("--ways: tunnel, direct and/or nx")
    if os.geteuid() != 0:
        print("needs root (a Unix user, a gateway)", file=sys.stderr)
        return 2
    if os.stat("/dev/fuse").st_mode & 0o006 != 0o006:
        os.chmod("/dev/fuse", 0o666)
    nx_user, tunnel_user = create_user(), create_user()
    gateway = Gateway({"sessions": {"display_base": "1560", "display_limit": "20", "connect_timeout": "60"},
                       "types": {"unix-console": "xterm -bg #ff0000 -geometry 60x15+10+10"}}).start()
    screen, tunnel_screen = ClientScreen(800, 600), ClientScreen(800, 600)
    folder = tempfile.mkdtemp(prefix="nxgate-bench-share-")
    os.chmod(folder, 0o755)
    client_dir = tempfile.mkdtemp(prefix="nxgate-bench-client-")
    shares = LocalShares({SHARE: folder}, client_dir)
    direct = client = None
    try:
        open_blocking(shares)
        attachment, nx_client = nx_mount(gateway, nx_user, screen, shares, args)
        client = client_mount(gateway, tunnel_user, tunnel_screen, folder, client_dir)
        screen.wait_for_colour(RED, 20000)
        nx_link = os.path.join(nx_user.home, "MyShares", SHARE)
        tunnel_link = os.path.join(tunnel_user.home, "MyShares", SHARE)
        for user, link in ((nx_user, nx_link), (tunnel_user, tunnel_link)):
            wait_for(lambda u=user, l=link: as_user(u.name, "test", "-d", l + "/").returncode == 0, 60, "the mount")
        direct, where = direct_mount(nx_user, nx_user.home, shares.port, shares)
        print(f"copying {args.size_mb} MB files, {args.runs} alternating runs, medians; NX link={args.link}; "
              f"load {os.getloadavg()[0]:.1f}", flush=True)
        figures: dict[str, list[dict]] = {"nx": [], "tunnel": [], "direct": []}
        paths = {"tunnel": (tunnel_user, tunnel_link), "direct": (nx_user, where), "nx": (nx_user, nx_link)}
        gateway_pid = gateway.process.pid
        meters = {
            "tunnel": Meter(lambda: {"gateway": [gateway_pid], "nxgate-client": [client.pid],
                                     "smbd": smbd_processes(client.pid),
                                     "smbnetfs": user_processes(tunnel_user.name, "smbnetfs", "/shares/")}),
            "direct": Meter(lambda: {"smbd": smbd_processes(shares.pid),
                                     "smbnetfs": user_processes(nx_user.name, "smbnetfs", direct)}),
            "nx": Meter(lambda: {"gateway": [gateway_pid], "smbd": smbd_processes(shares.pid),
                                 "smbnetfs": user_processes(nx_user.name, "smbnetfs", "/shares/")}),
        }
        loads = []
        for run in range(args.runs):
            for tag in ways:
                user, where_ = paths[tag]
                loads.append(os.getloadavg()[0])
                copy = copy_once(user.name, folder, where_, args.size_mb, tag, run == 0, meters[tag])
                figures[tag].append(copy)
                print(f"  run {run + 1} {tag:>6}: read {copy['read_mbps']:7.2f} MB/s, write {copy['write_mbps']:6.2f} "
                      f"MB/s; CPU s/GB read {cpu_text(copy['read_cpu_s_per_gb'])}; write "
                      f"{cpu_text(copy['write_cpu_s_per_gb'])}; load {loads[-1]:.1f}", flush=True)
        profiles = {}
        if args.profile:
            profiles = profile_copy(args.profile, tunnel_user.name, folder, tunnel_link, args.size_mb,
                                    meters["tunnel"], {"gateway": gateway_pid, "nxgate-client": client.pid})
        nx, tunnel, plain = (summary(figures[tag]) if figures[tag] else None for tag in ("nx", "tunnel", "direct"))
        attachment.detach()
        nx_client.close()
        wait_for(lambda: not os.path.lexists(nx_link), 30, "the mount to go at suspend")
    finally:
        if client is not None:
            client.terminate()
            client.wait(30)
        if direct is not None:
            subprocess.run(["umount", "-l", direct], capture_output=True)
        with open("/proc/mounts") as handle:  # none should be left; none may outlive the bench
            left = [line.split()[1] for line in handle if line.split()[2] == "fuse.smbnetfs"
                    and any(f"user_id={u.entry.pw_uid}," in line.split()[3] for u in (nx_user, tunnel_user))]
        for mount in left:
            subprocess.run(["umount", "-l", mount], capture_output=True)
        shares.close()
        screen.close()
        tunnel_screen.close()
        gateway.stop()
        for user in (nx_user, tunnel_user):
            user.remove()
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(client_dir, ignore_errors=True)
    result: dict = {"size_mb": args.size_mb, "runs": args.runs, "link": args.link, "nx": nx, "tunnel": tunnel,
                    "direct": plain, "load": {"median": statistics.median(loads), "min": min(loads),
                                              "max": max(loads)}, "profiles": profiles}
    for tag in ("tunnel", "nx"):
        if result[tag] is not None and plain is not None:
            result[f"{tag}_read_ratio"] = result[tag]["read_mbps"] / plain["read_mbps"]
            result[f"{tag}_write_ratio"] = result[tag]["write_mbps"] / plain["write_mbps"]
            for way in ("read", "write"):  # each run's copy against the peer's copy of the same run
                result[f"{tag}_{way}_paired_ratio"] = statistics.median(
                    ours / theirs for ours, theirs in zip(result[tag][f"{way}s"], plain[f"{way}s"]))
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as handle:
        json.dump(result, handle, indent=2)
    for tag, label in (("tunnel", "nxgate-client (own SSH channel)"), ("nx", "NX smb channel"),
                       ("direct", "without NX or SSH")):
        if result[tag] is not None:
            print(f"{label:>32}: read {result[tag]['read_mbps']:7.2f} MB/s, write {result[tag]['write_mbps']:6.2f} MB/s"
                  + (f"  ({result[tag + '_read_ratio']:.3f}x, {result[tag + '_write_ratio']:.3f}x without; paired "
                     f"{result[tag + '_read_paired_ratio']:.3f}x, {result[tag + '_write_paired_ratio']:.3f}x)"
                     if tag + "_read_ratio" in result else ""))
            print(f"{'CPU s/GB':>32}: read {cpu_text(result[tag]['read_cpu_s_per_gb'])}; "
                  f"write {cpu_text(result[tag]['write_cpu_s_per_gb'])}")
    print(f"load (1-minute average) over the runs: median {result['load']['median']:.1f}, "
          f"{result['load']['min']:.1f}-{result['load']['max']:.1f}")
    for title, profile in profiles.items():
        print_profile(title, profile)
    print(f"(JSON: {args.json})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
