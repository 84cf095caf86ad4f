"""A viewer engine run as the gateway runs it, for the engines' tests."""

from __future__ import annotations

import os
import signal
import time

from tests.harness.gateway import REPO
from tests.harness.process import Pipe, wait_for

PYTHON = os.path.join(REPO, ".venv", "bin", "python")


class ViewerProcess:
    """A viewer as the gateway runs it: password on stdin, the status line
    read from its fd 3 (posix_spawn maps the pipe there), stderr kept.

    ``argv`` is the whole command line after the Python interpreter (the
    RDP engine by default), or a program of its own with ``program``."""

    def __init__(self, args: list[str], display: str, stdin: bytes = b"", program: str = PYTHON,
                 module: str | None = None) -> None:
        argv = [program, *(["-m", module] if module else []), *args]
        env = dict(os.environ, DISPLAY=display, PYTHONPATH=REPO)
        stdin_r, stdin_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        status_r, status_w = os.pipe()
        self.started = time.monotonic()
        try:
            self.pid = os.posix_spawnp(program, argv, env, setsigdef=(signal.SIGPIPE, signal.SIGUSR1), file_actions=[
                (os.POSIX_SPAWN_DUP2, stdin_r, 0),
                (os.POSIX_SPAWN_DUP2, out_w, 1),
                (os.POSIX_SPAWN_DUP2, err_w, 2),
                (os.POSIX_SPAWN_DUP2, status_w, 3),
            ])
        finally:
            for fd in (stdin_r, out_w, err_w, status_w):
                os.close(fd)
        with os.fdopen(stdin_w, "wb") as handle:
            try:
                handle.write(stdin)
            except BrokenPipeError:
                pass
        self.files = [os.fdopen(status_r, "rb"), os.fdopen(out_r, "rb"), os.fdopen(err_r, "rb")]
        self.status, self.stdout, self.stderr = (Pipe(f) for f in self.files)
        self.returncode: int | None = None

    def status_line(self, timeout: float = 20.0) -> str:
        return self.status.read_until(b"\n", timeout).decode().strip()

    def attach(self) -> None:
        os.kill(self.pid, signal.SIGUSR1)

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float) -> int:
        """The exit code, or AssertionError after ``timeout`` seconds."""
        wait_for(lambda: self.poll() is not None, timeout, "the viewer to exit", interval=0.02)
        return self.returncode  # type: ignore[return-value]

    def errors(self) -> str:
        """What the viewer wrote on stderr so far."""
        return self.output()[1]

    def output(self) -> tuple[str, str]:
        """(stdout, stderr) so far."""
        for pipe in (self.stdout, self.stderr):
            while pipe.fill(0):
                pass
        return (self.stdout.buffer.decode(errors="replace"), self.stderr.buffer.decode(errors="replace"))

    def close(self) -> None:
        if self.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.wait(5)
            except AssertionError:
                os.kill(self.pid, signal.SIGKILL)
                self.wait(5)
        self.output()
        for handle in self.files:
            handle.close()
