"""A cluster of real ``twistd nxgate`` processes on one machine (issue 13).

Every member is a :class:`tests.harness.gateway.Gateway` with its own state
directory, its own loopback address for the cluster wire (127.0.0.2,
127.0.0.3, ...), its own display range (all members share this machine's X
display numbers) and a certificate made with ``nxgate-admin cluster
ca/cert``; they share one database on a private PostgreSQL or MariaDB
server (:mod:`tests.harness.databases`).
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import Any

from tests.harness.gateway import REPO, Gateway
from tests.harness.net import free_port
from tests.harness.process import wait_for

#: Seconds between heartbeats in the tests: a member is down after three.
HEARTBEAT = 0.5


def admin_cli(*argv: str, socket: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """``nxgate-admin ARGV`` from this checkout."""
    prefix = ["--socket", socket] if socket else []
    return subprocess.run([sys.executable, "-m", "nxgate.gateway.doors.admin.cli", *prefix, *argv], capture_output=True,
                          text=True, timeout=60, check=check, env=dict(os.environ, PYTHONPATH=REPO), cwd="/")


class Member(Gateway):
    """One member; ``roles`` as in ``[cluster] roles``."""

    def __init__(self, name: str, roles: str, address: str, options: dict[str, dict[str, str]]) -> None:
        self.name, self.roles, self.address = name, roles, address
        super().__init__(options)

    def start(self, timeout: float = 30.0, args: tuple[str, ...] = ()) -> Member:
        if "gateway" in self.roles:
            super().start(timeout, args)
            return self
        self.process = self._spawn(args)  # a node only: no SSH door, it listens for gateways

        def listening() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"member {self.name} exited {self.process.returncode}: {self.log()}")
            return f"cluster member {self.name}: listening for gateways" in self.log()

        wait_for(listening, timeout, f"member {self.name} to listen")
        return self

    def kill(self) -> None:
        """SIGKILL: the member dies without a word (its agents live on)."""
        if self.process is not None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)
            self.process.stderr.close()
            self.process = None

    def admin(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        return admin_cli(*argv, socket=os.path.join(self.state_dir, "admin.sock"), check=check)


class Cluster:
    """Members sharing the database at ``url`` (``password_file`` holds its password)."""

    def __init__(self, url: str, password_file: str, options: dict[str, dict[str, str]] | None = None) -> None:
        self.url, self.password_file = url, password_file
        self.options = options or {}
        self.ca = tempfile.mkdtemp(prefix="nxgate-test-cluster-ca-")
        admin_cli("cluster", "ca", os.path.join(self.ca, "ca"))
        self.members: dict[str, Member] = {}
        self.addresses = itertools.count(2)
        self.displays = itertools.count(0)

    def certificate(self, name: str, ca: str | None = None) -> tuple[str, str]:
        """``NAME.pem`` and ``NAME.key`` signed by this cluster's CA (or by the one in ``ca``)."""
        out = tempfile.mkdtemp(prefix=f"nxgate-test-{name}-", dir=self.ca)
        made = admin_cli("cluster", "cert", name, "--ca", ca or os.path.join(self.ca, "ca"), "--out", out)
        cert, key = made.stdout.split()
        return cert, key

    def member(self, name: str, roles: str = "gateway, node", ca: str | None = None,
               options: dict[str, dict[str, str]] | None = None) -> Member:
        """A new member (not started); ``ca``: sign its certificate by another CA."""
        address = f"127.0.0.{next(self.addresses)}"
        port = free_port()
        cert, key = self.certificate(name, ca)
        base = 2400 + 40 * next(self.displays)
        sections: dict[str, dict[str, Any]] = {
            "store": {"url": self.url, "password_file": self.password_file},
            "cluster": {"name": name, "roles": roles, "listen": f"tcp:{port}:interface={address}",
                        "address": f"{address}:{port}", "ca": os.path.join(self.ca, "ca", "ca.pem"),
                        "certificate": cert, "key": key, "heartbeat": str(HEARTBEAT)},
            "sessions": {"display_base": str(base), "display_limit": "40"},
        }
        for more in (self.options, options or {}):
            for section, values in more.items():
                sections.setdefault(section, {}).update(values)
        member = self.members[name] = Member(name, roles, f"{address}:{port}", sections)
        return member

    def other_ca(self) -> str:
        """A second CA, that this cluster does not trust."""
        directory = os.path.join(self.ca, "other")
        admin_cli("cluster", "ca", directory)
        return directory

    def close(self) -> None:
        for member in self.members.values():
            member.stop()
        shutil.rmtree(self.ca, ignore_errors=True)
