#!/usr/bin/env python3
"""Folder sharing through NX: copy throughput of one file through the smb
channel, against the same SMB transfer without NX (issue 14).

A real gateway, a console session attached by the real ``nxproxy -S`` with
``smb=PORT`` onto the client's private Samba (:class:`nxgate.client.sharing.
LocalShares`), the client's folder mounted by the gateway at
``~/MyShares/bench`` (smbnetfs, as the user), as in tests/test_e2e_sharing.py.

* through NX: ``dd`` as the session's user reads a --size-mb file of random
  bytes from the client's folder (client -> session) and writes one back
  (session -> client), ``bs=1M``; the write ends with ``conv=fsync``.
* without NX: the same smbnetfs, as the same user, mounted straight on the
  client's Samba port (loopback, no nxcomp in between), the same ``dd`` runs.

Each figure is the best of --runs (MB/s = 10^6 bytes/s); the file is
checked byte for byte once each way.

What limits it (found with this script and strace): Nagle's algorithm on
the NX stream's TCP legs cost most (0.3-0.7 MB/s read before TCP_NODELAY
in the gateway's SSH transport and nxgate-client, ~10 MB/s after, 10 MB
files); bigger smbnetfs blocks (max_rw_block_size 1024) changed nothing;
and in an idle session nxagent's embedded proxy sends its flow-control
token replies only at its next timer (~2 s), so long copies still stall
now and then (link=wan/adsl do no better).

    .venv/bin/python bench/sharing_copy.py [--size-mb 100] [--runs 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from nxgate.client.sharing import LocalShares  # noqa: E402
from nxgate.node.extras.sharing import CLIENT_SMB_CONF, share_path, smbnetfs_config  # noqa: E402
from nxgate.nx import client_commands as commands  # noqa: E402
from tests.harness.gateway import Gateway  # noqa: E402
from tests.harness.process import wait_for  # noqa: E402
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


def copy_figures(user: str, folder: str, where: str, size_mb: int, runs: int, tag: str) -> dict:
    """Best read and write MB/s of a --size-mb file between ``folder`` (the
    client's) and ``where`` (the same folder as the session's user sees it)."""
    size = size_mb * 1_000_000
    reads, writes = [], []
    for run in range(runs):
        name = f"{tag}-down-{run}.bin"
        subprocess.run(["dd", "if=/dev/urandom", f"of={os.path.join(folder, name)}", "bs=1000000",
                        f"count={size_mb}", "status=none"], check=True)
        os.chmod(os.path.join(folder, name), 0o644)
        reads.append(size / timed(user, "dd", f"if={os.path.join(where, name)}", "of=/dev/null", "bs=1M",
                                  "status=none") / 1e6)
        if run == 0 and digest(os.path.join(folder, name)) != digest(os.path.join(where, name), user):
            raise RuntimeError("the file read through the share differs")
        up = f"{tag}-up-{run}.bin"
        writes.append(size / timed(user, "dd", "if=/dev/urandom", f"of={os.path.join(where, up)}", "bs=1000000",
                                   f"count={size_mb}", "conv=fsync", "status=none") / 1e6)
        if run == 0 and digest(os.path.join(folder, up)) != digest(os.path.join(where, up), user):
            raise RuntimeError("the file written through the share differs")
        for leftover in (name, up):
            os.unlink(os.path.join(folder, leftover))
    return {"read_mbps": max(reads), "write_mbps": max(writes), "reads": reads, "writes": writes}


def direct_mount(user, home: str, port: int, shares: LocalShares) -> tuple[str, str]:
    """smbnetfs as ``user`` straight on the client's Samba: (mount point, share path)."""
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
                    "-o", f"config={config}"], check=True, cwd=base)
    return os.path.join(base, "mnt"), share_path(os.path.join(base, "mnt"), port, SHARE)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=100, help="the file's size in MB (default: %(default)s)")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--link", default="lan", help="the session's --link (default: %(default)s)")
    parser.add_argument("--json", default=os.path.join(REPO, "bench", "results", "sharing.json"))
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("needs root (a Unix user, a gateway)", file=sys.stderr)
        return 2
    if os.stat("/dev/fuse").st_mode & 0o006 != 0o006:
        os.chmod("/dev/fuse", 0o666)
    user = create_user()
    gateway = Gateway({"sessions": {"display_base": "1560", "display_limit": "20", "connect_timeout": "60"},
                       "types": {"unix-console": "xterm -bg #ff0000 -geometry 60x15+10+10"}}).start()
    screen = ClientScreen(800, 600)
    folder = tempfile.mkdtemp(prefix="nxgate-bench-share-")
    os.chmod(folder, 0o755)
    client_dir = tempfile.mkdtemp(prefix="nxgate-bench-client-")
    shares = LocalShares({SHARE: folder}, client_dir)
    direct = None
    try:
        client = NXClient(gateway.port)
        client.greet()
        client.login(user.name, user.password)
        client.prompt()
        start = START.format(name="bench", type="unix-console", extra='--samba="1"').replace(
            '--link="lan"', f'--link="{args.link}"')
        info = SessionInfo.parse(client.command(start, timeout=60))
        port = shares.open()
        reply = client.command(commands.addmount_command(info.session_id, 3000 + info.display, SHARE, shares.user,
                                                         shares.password, "bench"))
        assert b"NX> 719 SMB filesystem: running" in reply, reply
        attachment = Attachment(client, info, screen.name, gateway.workdir, options=f"smb={port}")
        # As nxgate-client does: no Nagle delay on its local end of the NX stream.
        attachment.conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        screen.wait_for_colour(RED, 20000)
        link = os.path.join(user.home, "MyShares", SHARE)
        wait_for(lambda: as_user(user.name, "test", "-d", link + "/").returncode == 0, 60, "the mount")
        print(f"copying {args.size_mb} MB files, best of {args.runs}, link={args.link}", flush=True)
        nx = copy_figures(user.name, folder, link, args.size_mb, args.runs, "nx")
        print(f"through NX:  read {nx['read_mbps']:.2f} MB/s, write {nx['write_mbps']:.2f} MB/s", flush=True)
        direct, where = direct_mount(user, user.home, port, shares)
        plain = copy_figures(user.name, folder, where, args.size_mb, args.runs, "direct")
        print(f"without NX:  read {plain['read_mbps']:.2f} MB/s, write {plain['write_mbps']:.2f} MB/s", flush=True)
        attachment.detach()
        client.close()
        # The session suspends: the gateway unmounts the folder before it stops.
        wait_for(lambda: not os.path.lexists(link), 30, "the mount to go at suspend")
    finally:
        if direct is not None:
            subprocess.run(["umount", "-l", direct], capture_output=True)
        with open("/proc/mounts") as handle:  # none should be left; none may outlive the bench
            left = [line.split()[1] for line in handle if line.split()[2] == "fuse.smbnetfs"
                    and f"user_id={user.entry.pw_uid}," in line.split()[3]]
        for mount in left:
            subprocess.run(["umount", "-l", mount], capture_output=True)
        shares.close()
        screen.close()
        gateway.stop()
        user.remove()
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(client_dir, ignore_errors=True)
    result = {"size_mb": args.size_mb, "runs": args.runs, "link": args.link, "nx": nx, "direct": plain,
              "read_ratio": nx["read_mbps"] / plain["read_mbps"], "write_ratio": nx["write_mbps"] / plain["write_mbps"]}
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as handle:
        json.dump(result, handle, indent=2)
    print(f"read through NX / without: {result['read_ratio']:.3f}; write: {result['write_ratio']:.3f}")
    print(f"(JSON: {args.json})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
