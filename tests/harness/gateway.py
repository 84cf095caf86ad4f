"""The real gateway (``twistd -n nxgate``) as a child process of a test."""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from tests.harness.process import stop, wait_for
from tests.harness.users import TestUser, create_user

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TWISTD = os.path.join(os.path.dirname(sys.executable), "twistd")
NX_KEY_FIXTURE = os.path.join(REPO, "tests", "fixtures", "nomachine-client.key")


def nx_key() -> str:
    """A 0600 copy of the NoMachine key (git does not keep file modes, and
    ssh refuses a private key that others can read)."""
    path = os.path.join(tempfile.gettempdir(), f"nxgate-test-nx-key-{os.getuid()}")
    if not os.path.exists(path):
        fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle, open(NX_KEY_FIXTURE, "rb") as source:
            handle.write(source.read())
        os.replace(path + ".tmp", path)
    return path
_LISTENING = re.compile(r"NXSSHFactory starting on (\d+)")


class Gateway:
    """Starts a gateway on a free loopback port with its own state directory.

    ``options`` are INI sections to add, e.g. ``{"auth": {"failed_login_delay": "0.2"}}``.
    """

    def __init__(self, options: dict[str, dict[str, str]] | None = None, state_dir: str | None = None,
                 file_limit: int | None = None) -> None:
        """``file_limit``: the gateway's RLIMIT_NOFILE (soft and hard), e.g.
        the 1024 of a service without LimitNOFILE."""
        self.file_limit = file_limit
        self.workdir = tempfile.mkdtemp(prefix="nxgate-test-")
        os.chmod(self.workdir, 0o755)
        self.state_dir = state_dir or os.path.join(self.workdir, "state")
        self.logfile = os.path.join(self.workdir, "gateway.log")
        sections: dict[str, dict[str, str]] = {
            "server": {"listen": "tcp:0:interface=127.0.0.1", "state_dir": self.state_dir, "server_name": "nxgate.test"},
            "ssh": {"nx_authorized_keys": os.path.join(REPO, "conf", "nx_authorized_keys")},
            "auth": {"failed_login_delay": "0.3"},
        }
        for section, values in (options or {}).items():
            sections.setdefault(section, {}).update(values)
        self.config = os.path.join(self.workdir, "nxgate.conf")
        with open(self.config, "w", encoding="utf-8") as handle:
            for section, values in sections.items():
                handle.write(f"[{section}]\n")
                handle.writelines(f"{key} = {value}\n" for key, value in values.items())
        self.process: subprocess.Popen | None = None
        self.port = 0
        #: argv put before twistd's (e.g. a private mount namespace: tests.harness.accounts)
        self.wrapper: list[str] = []

    def _spawn(self, args: tuple[str, ...] = ()) -> subprocess.Popen:
        return subprocess.Popen(
            [*self.wrapper, TWISTD, "--nodaemon", "--pidfile=", "--logfile", self.logfile, "nxgate", "--config", self.config, *args],
            cwd=self.workdir, env=dict(os.environ, PYTHONPATH=REPO), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=self._limit_files if self.file_limit else None,
        )

    def _limit_files(self) -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.file_limit, self.file_limit))

    def start_refused(self, timeout: float = 30.0) -> tuple[int, str]:
        """Run a gateway that is expected to refuse to start: (exit status, stderr)."""
        process = self._spawn()
        try:
            _, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop(process)
            process.stderr.close()
            raise AssertionError(f"the gateway did not refuse to start: {self.log()}") from None
        return process.returncode, err.decode(errors="replace")

    def start(self, timeout: float = 30.0, args: tuple[str, ...] = ()) -> Gateway:
        """``args`` are more options of ``twistd nxgate`` (e.g. ``--port``)."""
        self.process = self._spawn(args)

        def listening() -> int | None:
            if self.process.poll() is not None:
                raise AssertionError(f"gateway exited {self.process.returncode}: "
                                     f"{self.process.stderr.read().decode()} {self.log()}")
            matches = _LISTENING.findall(self.log())
            return int(matches[-1]) if matches else None

        self.port = wait_for(listening, timeout, "the gateway to listen")
        return self

    def log(self) -> str:
        try:
            with open(self.logfile, encoding="utf-8", errors="replace") as handle:
                return handle.read()
        except FileNotFoundError:
            return ""

    def audit(self) -> list[dict]:
        """The audit log's records (every audit event: the main log may hold repeated lines back)."""
        try:
            with open(os.path.join(self.state_dir, "audit.log"), encoding="utf-8") as handle:
                return [json.loads(line) for line in handle if line.strip()]
        except FileNotFoundError:
            return []

    def stop(self, cleanup: bool = True) -> None:
        """Stop the gateway; remove its files unless NXGATE_KEEP_TEST_DIRS is set."""
        if self.process is not None:
            stop(self.process)
            self.process.stderr.close()
            self.process = None
        if cleanup and not os.environ.get("NXGATE_KEEP_TEST_DIRS"):
            shutil.rmtree(self.workdir, ignore_errors=True)


def user_and_gateway(options: dict[str, dict[str, str]] | None = None
                     ) -> tuple[tuple[TestUser, Gateway], Callable[[], None]]:
    """A fresh Unix user and a gateway, with the teardown of both: the
    usual shared fixture of a login test class (see ``class_fixture``)."""
    user = create_user()
    try:
        gateway = Gateway(options).start()
    except BaseException:
        user.remove()
        raise

    def teardown() -> None:
        gateway.stop()
        user.remove()

    return (user, gateway), teardown


def users_and_gateway(count: int, options: dict[str, dict[str, str]], **gateway: Any,
                      ) -> tuple[list[TestUser], Gateway, Callable[[], None]]:
    """``count`` new Unix users and a started gateway for a class fixture,
    and their teardown; the users are removed if the gateway fails to start."""
    users = [create_user() for _ in range(count)]
    try:
        started = Gateway(options, **gateway).start()
    except BaseException:
        for user in users:
            user.remove()
        raise

    def teardown() -> None:
        started.stop()
        for user in users:
            user.remove()

    return users, started, teardown
