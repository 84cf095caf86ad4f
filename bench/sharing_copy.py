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
--runs are reported (MB/s = 10^6 bytes/s), with ratios to the peer.  Files
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
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from nxgate.clients.nx.sharing import LocalShares  # noqa: E402
from nxgate.node.services.sharing import CLIENT_SMB_CONF, MOUNT_OPTIONS, share_path, smbnetfs_config  # noqa: E402
from nxgate.protocols.nx import client_commands as commands  # noqa: E402
from tests.harness.gateway import Gateway  # noqa: E402
from tests.harness.process import wait_for  # noqa: E402
from tests.harness.samba import open_blocking  # noqa: E402
from tests.harness.ssh import Attachment, NXClient, SessionInfo  # noqa: E402
from tests.harness.users import create_user  # noqa: E402
from tests.harness.x11 import ClientScreen  # noqa: E402
from tests.test_e2e_sessions import RED, START  # noqa: E402

SHARE = "bench"


def as_user(user: str, *argv: str, timeout: float = 3600) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", user, "--", *argv], capture_output=True, timeout=timeout)


def timed(user: str, *argv: str) -> float:
    started = time.monotonic()
    result = as_user(user, *argv)
    seconds = time.monotonic() - started
    if result.returncode != 0:
        raise RuntimeError(f"{argv}: {result.stderr.decode(errors='replace')}")
    return seconds


def digest(path: str, user: str | None = None) -> str:
    if user is None:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    return as_user(user, "sha256sum", path).stdout.split()[0].decode()


def copy_once(user: str, folder: str, where: str, size_mb: int, tag: str, check: bool) -> tuple[float, float]:
    """(read MB/s, write MB/s) of one --size-mb file between ``folder`` (the
    client's) and ``where`` (the same folder as the session's user sees it);
    ``check``: compare the files byte for byte too."""
    size = size_mb * 1_000_000
    # New names each run: smbnetfs caches what it saw, and these files are removed behind its back.
    name, up = f"{tag}-down-{uuid.uuid4().hex[:8]}.bin", f"{tag}-up-{uuid.uuid4().hex[:8]}.bin"
    subprocess.run(["dd", "if=/dev/urandom", f"of={os.path.join(folder, name)}", "bs=1000000",
                    f"count={size_mb}", "status=none"], check=True)
    os.chmod(os.path.join(folder, name), 0o644)
    read = size / timed(user, "dd", f"if={os.path.join(where, name)}", "of=/dev/null", "bs=1M", "status=none") / 1e6
    if check and digest(os.path.join(folder, name)) != digest(os.path.join(where, name), user):
        raise RuntimeError(f"{tag}: the file read through the share differs")
    write = size / timed(user, "dd", "if=/dev/urandom", f"of={os.path.join(where, up)}", "bs=1000000",
                         f"count={size_mb}", "conv=fsync", "status=none") / 1e6
    if check and digest(os.path.join(folder, up)) != digest(os.path.join(where, up), user):
        raise RuntimeError(f"{tag}: the file written through the share differs")
    for leftover in (name, up):
        os.unlink(os.path.join(folder, leftover))
    return read, write


def summary(pairs: list[tuple[float, float]]) -> dict:
    reads, writes = [p[0] for p in pairs], [p[1] for p in pairs]
    return {"read_mbps": statistics.median(reads), "write_mbps": statistics.median(writes),
            "best_read_mbps": max(reads), "best_write_mbps": max(writes), "reads": reads, "writes": writes}


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
    parser.add_argument("--runs", type=int, default=3, help="alternating runs of each path (medians are reported)")
    parser.add_argument("--link", default="lan", help="the NX session's --link (default: %(default)s)")
    parser.add_argument("--ways", default="tunnel,direct,nx",
                        help="which ways to measure, in this order each run (default: %(default)s; the NX channel "
                             "may stall for minutes in an idle session)")
    parser.add_argument("--json", default=os.path.join(REPO, "bench", "results", "sharing.json"))
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
        print(f"copying {args.size_mb} MB files, {args.runs} alternating runs, medians; NX link={args.link}",
              flush=True)
        figures: dict[str, list[tuple[float, float]]] = {"nx": [], "tunnel": [], "direct": []}
        paths = {"tunnel": (tunnel_user, tunnel_link), "direct": (nx_user, where), "nx": (nx_user, nx_link)}
        for run in range(args.runs):
            for tag in ways:
                user, where_ = paths[tag]
                figures[tag].append(copy_once(user.name, folder, where_, args.size_mb, tag, run == 0))
                print(f"  run {run + 1} {tag:>6}: read {figures[tag][-1][0]:7.2f} MB/s, "
                      f"write {figures[tag][-1][1]:6.2f} MB/s", flush=True)
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
                    "direct": plain}
    for tag in ("tunnel", "nx"):
        if result[tag] is not None and plain is not None:
            result[f"{tag}_read_ratio"] = result[tag]["read_mbps"] / plain["read_mbps"]
            result[f"{tag}_write_ratio"] = result[tag]["write_mbps"] / plain["write_mbps"]
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as handle:
        json.dump(result, handle, indent=2)
    for tag, label in (("tunnel", "nxgate-client (own SSH channel)"), ("nx", "NX smb channel"),
                       ("direct", "without NX or SSH")):
        if result[tag] is not None:
            print(f"{label:>32}: read {result[tag]['read_mbps']:7.2f} MB/s, write {result[tag]['write_mbps']:6.2f} MB/s"
                  + (f"  ({result[tag + '_read_ratio']:.3f}x, {result[tag + '_write_ratio']:.3f}x without)"
                     if tag + "_read_ratio" in result else ""))
    print(f"(JSON: {args.json})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
