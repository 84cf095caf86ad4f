"""The client's private Samba of ``nxgate-client --share``, started from a
blocking test or benchmark (issue 23: the client starts it asynchronously).

It runs exactly the commands :meth:`nxgate.clients.nx.sharing.LocalShares.prepare`
plans (the same smb.conf, account and smbd), with ``subprocess`` instead of
the client's reactor, so tests that drive nxproxy themselves keep a plain
``shares.port``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time

from nxgate.clients.nx.sharing import LocalShares, SharingError


def open_blocking(shares: LocalShares, timeout: float = 15.0) -> int:
    """Start ``shares``' smbd and wait until it listens; its port."""
    plan = shares.prepare()
    added = subprocess.run(plan.pdbedit, input=plan.password_input, capture_output=True, timeout=30)
    if added.returncode != 0:
        raise SharingError(f"pdbedit refused the share account: {added.stderr.decode(errors='replace')}")
    with open(plan.log, "wb") as log:
        process = subprocess.Popen(plan.smbd, stdin=subprocess.PIPE, stdout=log, stderr=log)
    shares.pid = process.pid
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SharingError(f"smbd ended at once (exit {process.returncode})")
        try:
            socket.create_connection(("127.0.0.1", shares.port), timeout=1).close()
            return shares.port
        except OSError:
            time.sleep(0.1)
    raise SharingError(f"smbd did not listen on 127.0.0.1:{shares.port}")
