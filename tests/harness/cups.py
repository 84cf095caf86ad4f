"""The client's side of a printing test (issue 14): a real IPP printer, a
real CUPS in front of it, and nxgate-client's gate, all private to the test.

* :class:`ClientPrinter`: ``ippeveprinter`` (cups-ipp-utils) on a free
  loopback port, keeping every job it gets as a file in its spool
  directory (``-k``); its print command is ``true``, so a job is done
  at once and the next one need not wait.  It insists on DNS-SD; without a system D-Bus (as in a
  container) it aborts, so it gets a private ``dbus-daemon`` as its "system
  bus" and no registration (``-r off``).
* :class:`ClientCups`: a cupsd run as ``nobody`` on its own loopback port
  and directory, with one raw queue that sends to the printer: what a
  user's own CUPS is in front of his printer.
* :class:`GateProcess`: ``nxgate-client``'s gate (:mod:`nxgate.clients.nx.printing`)
  in a process of its own, for tests that drive nxproxy themselves
  (``python -m tests.harness.cups gate COOKIE SERVER`` prints its port).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time

from tests.harness.net import free_port, listening
from tests.harness.process import Pipe, stop, wait_for

NOBODY = "nobody"
QUEUE = "clientprinter"


def _keep() -> bool:
    return bool(os.environ.get("NXGATE_KEEP_TEST_DIRS"))


class ClientPrinter:
    def __init__(self, workdir: str | None = None, name: str = "ClientPrinter") -> None:
        self.dir = tempfile.mkdtemp(prefix="printer-", dir=workdir)
        self.spool = os.path.join(self.dir, "jobs")
        os.mkdir(self.spool)
        self.port = free_port()
        self.bus = subprocess.Popen(
            ["dbus-daemon", "--session", f"--address=unix:path={os.path.join(self.dir, 'bus')}", "--nofork"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: os.path.exists(os.path.join(self.dir, "bus")), 10, "the printer's D-Bus")
        env = {"PATH": "/usr/sbin:/usr/bin:/bin", "DBUS_SYSTEM_BUS_ADDRESS": f"unix:path={self.dir}/bus"}
        self.log = os.path.join(self.dir, "ippeveprinter.log")
        self.process: subprocess.Popen | None = None
        try:
            # Even with "-r off" ippeveprinter opens the (private) bus for DNS-SD, which may not
            # answer yet although its socket exists: "Unable to initialize DNS-SD" means try again.
            for attempt in range(3):
                self.process = subprocess.Popen(
                    ["ippeveprinter", "-r", "off", "-n", "localhost", "-p", str(self.port), "-d", self.spool, "-k",
                     "-c", "/bin/true",  # "prints" at once (without a command it idles 5-15 s per job)
                     "-f", "application/octet-stream,text/plain,application/pdf,application/postscript", name],
                    env=env, stdin=subprocess.DEVNULL, stdout=open(self.log, "wb"), stderr=subprocess.STDOUT)
                wait_for(lambda: listening(self.port) or self.process.poll() is not None, 20, "ippeveprinter")
                if self.process.poll() is None:
                    break
                said = open(self.log).read()[-500:]
                if "Unable to initialize DNS-SD" not in said or attempt == 2:
                    raise AssertionError(f"ippeveprinter ended: {said}")
                time.sleep(0.5)
        except BaseException:
            self.close()
            raise

    @property
    def uri(self) -> str:
        return f"ipp://localhost:{self.port}/ipp/print"

    def jobs(self) -> list[str]:
        """The documents the printer got, oldest first."""
        names = sorted(os.listdir(self.spool), key=lambda name: os.stat(os.path.join(self.spool, name)).st_mtime)
        return [os.path.join(self.spool, name) for name in names if not name.startswith(".")]

    def texts(self) -> list[bytes]:
        out = []
        for path in self.jobs():
            with open(path, "rb") as handle:
                out.append(handle.read())
        return out

    def wait_for_text(self, text: bytes, timeout: float = 60.0, interval: float = 0.2) -> bytes:
        return wait_for(lambda: next((data for data in self.texts() if text in data), None), timeout,
                        f"a job with {text!r} at the client's printer", interval=interval)

    def close(self) -> None:
        for process in (self.process, self.bus):
            if process is not None:
                stop(process, grace=3)
        if not _keep():
            shutil.rmtree(self.dir, ignore_errors=True)


class ClientCups:
    """A private CUPS (as ``nobody``) with one raw queue to ``printer``."""

    def __init__(self, printer: ClientPrinter, workdir: str | None = None, queue: str = QUEUE) -> None:
        self.queue = queue
        self.dir = tempfile.mkdtemp(prefix="client-cups-", dir=workdir)
        self.port = free_port()
        nobody = pwd.getpwnam(NOBODY)
        path = lambda name: os.path.join(self.dir, name)  # noqa: E731
        for name in ("spool", "cache", "state"):
            os.mkdir(path(name))
        with open(path("cupsd.conf"), "w") as handle:
            handle.write(f"Listen 127.0.0.1:{self.port}\nLogLevel warn\nBrowsing No\nWebInterface No\n"
                         "DefaultAuthType None\n<Policy default>\n<Limit All>\nOrder deny,allow\n</Limit>\n"
                         "</Policy>\n")
        with open(path("cups-files.conf"), "w") as handle:
            handle.write(f"ServerRoot {self.dir}\nRequestRoot {path('spool')}\nTempDir {path('spool')}\n"
                         f"CacheDir {path('cache')}\nStateDir {path('state')}\nErrorLog {path('error_log')}\n"
                         f"AccessLog {path('access_log')}\nPageLog {path('page_log')}\n"
                         f"Printcap {path('printcap')}\n")
        with open(path("printers.conf"), "w") as handle:
            handle.write(f"<DefaultPrinter {queue}>\nInfo The client's printer\nDeviceURI {printer.uri}\n"
                         "State Idle\nAccepting Yes\nShared No\nJobSheets none none\nErrorPolicy retry-job\n"
                         f"</DefaultPrinter>\n")
        for root, dirs, names in os.walk(self.dir):
            for name in [*dirs, *names]:
                os.chown(os.path.join(root, name), nobody.pw_uid, nobody.pw_gid)
        os.chown(self.dir, nobody.pw_uid, nobody.pw_gid)
        os.chmod(self.dir, 0o700)
        self.process = subprocess.Popen(
            ["runuser", "-u", NOBODY, "--", "cupsd", "-f", "-c", path("cupsd.conf"), "-s", path("cups-files.conf")],
            env={"PATH": "/usr/sbin:/usr/bin:/bin"}, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda: listening(self.port) or self.process.poll() is not None, 20, "the client's cupsd")
            if self.process.poll() is not None:
                raise AssertionError("the client's cupsd ended at once")
        except BaseException:
            self.close()
            raise

    @property
    def server(self) -> str:
        return f"127.0.0.1:{self.port}"

    def close(self) -> None:
        stop(self.process, grace=5)
        if not _keep():
            shutil.rmtree(self.dir, ignore_errors=True)


class GateProcess:
    """nxgate-client's printing gate in front of ``server``, for ``cookie``."""

    def __init__(self, cookie: str, server: str) -> None:
        repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        self.process = subprocess.Popen([sys.executable, "-m", "tests.harness.cups", "gate", cookie, server],
                                        cwd=repo, env={**os.environ, "PYTHONPATH": repo},
                                        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        line = Pipe(self.process.stdout).read_until(b"\n", timeout=20)
        self.port = int(line.split()[-1])

    def close(self) -> None:
        stop(self.process, grace=3)


def client_printing(case, workdir: str, name: str | None = None,
                    queue: str | None = None) -> tuple["ClientPrinter", "ClientCups"]:
    """A client-side printer and the CUPS in front of it, both closed at
    ``case``'s cleanup (a trial TestCase)."""
    printer = ClientPrinter(workdir, **({"name": name} if name else {}))
    case.addCleanup(printer.close)
    cups = ClientCups(printer, workdir, **({"queue": queue} if queue else {}))
    case.addCleanup(cups.close)
    return printer, cups


def _gate(cookie: str, server: str) -> None:
    from twisted.internet import reactor

    from nxgate.clients.nx.printing import LocalPrinting

    port = LocalPrinting(reactor, server).open(cookie)
    print(f"gate {port}", flush=True)
    reactor.run()


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "gate":
        _gate(sys.argv[2], sys.argv[3])
    else:
        sys.exit("usage: python -m tests.harness.cups gate COOKIE SERVER")
