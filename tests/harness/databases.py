"""Private PostgreSQL and MariaDB servers for tests.

Each server is the distribution's own program run as the unprivileged
user ``nobody`` in a temporary directory, listening on a free loopback
port (and a Unix socket in that directory), with a user ``nxgate`` whose
random password is in a root-only file -- never on a command line.  The
system-wide instances, if any, are not touched.

API (the same for both)::

    server = PostgresServer()      # or MariaDBServer()
    url = server.start()           # "postgresql://nxgate@127.0.0.1:PORT/nxgate"
    server.password_file           # for [store] password_file
    url = server.new_database()    # a fresh, empty database on the same server
    server.stop(); server.start()  # same data, same port (the database "goes away and comes back")
    server.restart()
    server.pause(); server.resume()  # SIGSTOP/SIGCONT: a server that hangs
    server.cleanup()               # stop and remove the directory

``shared(PostgresServer)`` gives one instance per test process, started on
first use and cleaned up at exit, for test classes that only need a
database (trial runs no ``setUpClass``).  ``available(PostgresServer)``
says whether the programs are installed (tests skip otherwise).
"""

from __future__ import annotations

import atexit
import glob
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Any

from tests.harness.net import free_port
from tests.harness.process import wait_for

RUN_AS = "nobody"


def _find(name: str, patterns: list[str]) -> str | None:
    for pattern in patterns:
        found = sorted(glob.glob(pattern), reverse=True)
        if found:
            return found[0]
    return shutil.which(name)


class DatabaseServer:
    """What the two servers share: the directory, the user, the process."""

    scheme = ""
    start_timeout = 60.0

    def __init__(self) -> None:
        self.root: str | None = None
        self.port = 0
        self.process: subprocess.Popen | None = None
        self.password = secrets.token_urlsafe(18)
        self.password_file = ""
        self.databases = 0
        account = pwd.getpwnam(RUN_AS)
        self.uid, self.gid = account.pw_uid, account.pw_gid

    # ----------------------------------------------------------- public
    @property
    def url(self) -> str:
        return f"{self.scheme}://nxgate@127.0.0.1:{self.port}/nxgate"

    def start(self) -> str:
        """Start the server (made on first start); returns the URL of the ``nxgate`` database."""
        if self.root is None:
            self.root = tempfile.mkdtemp(prefix=f"nxgate-{self.scheme}-")
            os.chown(self.root, self.uid, self.gid)
            secret_dir = tempfile.mkdtemp(prefix="nxgate-dbpass-", dir=self.root)  # root-owned, 0700
            self.password_file = os.path.join(secret_dir, "password")
            with open(os.open(self.password_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as out:
                out.write(self.password + "\n")
            self.port = free_port()
            self._initialise()
            self._launch()
            self._create_database("nxgate")
        elif self.process is None:
            self._launch()
        return self.url

    def stop(self) -> None:
        """Stop the server, keeping its data (``start`` brings it back on the same port)."""
        if self.process is not None:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGINT if self.scheme == "postgresql" else signal.SIGTERM)
                try:
                    self.process.wait(30)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait(10)
            self.process = None

    def restart(self) -> str:
        self.stop()
        return self.start()

    def pause(self) -> None:
        """SIGSTOP the server and its children (PostgreSQL's backends leave
        its process group): it hangs, connections stay open, nothing answers."""
        for pid in self._pids():
            os.kill(pid, signal.SIGSTOP)

    def resume(self) -> None:
        for pid in self._pids():
            os.kill(pid, signal.SIGCONT)

    def _pids(self) -> list[int]:
        if self.process is None:
            return []
        pids = [self.process.pid]
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as stat:
                        ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
                except (OSError, ValueError, IndexError):
                    continue
                if ppid == self.process.pid:
                    pids.append(int(entry))
        return pids

    def cleanup(self) -> None:
        self.stop()
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def new_database(self) -> str:
        """A fresh empty database on this server that ``nxgate`` owns; its URL."""
        self.start()
        self.databases += 1
        name = f"nxgate_{os.getpid()}_{self.databases}"
        self._create_database(name)
        return f"{self.scheme}://nxgate@127.0.0.1:{self.port}/{name}"

    # ---------------------------------------------------------- helpers
    def _as_nobody(self, argv: list[str], **options: Any) -> subprocess.CompletedProcess:
        return subprocess.run(argv, user=self.uid, group=self.gid, extra_groups=[], cwd=self.root,
                              capture_output=True, text=True, timeout=120, check=False, **options)

    def _checked(self, result: subprocess.CompletedProcess, what: str) -> None:
        if result.returncode != 0:
            raise RuntimeError(f"{what} failed ({result.returncode}): {result.stderr.strip() or result.stdout.strip()}")

    def _spawn(self, argv: list[str]) -> None:
        assert self.root is not None
        log = open(os.path.join(self.root, "server.log"), "ab")
        try:
            self.process = subprocess.Popen(argv, user=self.uid, group=self.gid, extra_groups=[], cwd=self.root,
                                            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        finally:
            log.close()
        try:
            wait_for(self._ready, self.start_timeout, f"{self.scheme} on port {self.port}", interval=0.05)
        except BaseException:
            self.stop()
            raise RuntimeError(f"{self.scheme} did not start; its log: {self.log_tail()}") from None

    def _ready(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"{self.scheme} exited with {self.process.returncode}: {self.log_tail()}")
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                pass
        except OSError:
            return False
        return self._accepts_queries()

    def log_tail(self, lines: int = 15) -> str:
        try:
            with open(os.path.join(self.root or "/nonexistent", "server.log"), errors="replace") as log:
                return " | ".join(log.read().splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # for subclasses
    def _initialise(self) -> None: ...
    def _launch(self) -> None: ...
    def _create_database(self, name: str) -> None: ...
    def _accepts_queries(self) -> bool: ...


class PostgresServer(DatabaseServer):
    scheme = "postgresql"
    programs = ["/usr/lib/postgresql/*/bin/{}"]

    @classmethod
    def program(cls, name: str) -> str | None:
        return _find(name, [pattern.format(name) for pattern in cls.programs])

    @classmethod
    def available(cls) -> str | None:
        """None if it can run here, else why not."""
        for name in ("initdb", "postgres"):
            if cls.program(name) is None:
                return f"PostgreSQL's {name} is not installed (apt-get install postgresql)"
        try:
            import psycopg2  # noqa: F401
        except ImportError:
            return "psycopg2 is not installed (pip install psycopg2-binary)"
        return None

    @property
    def data(self) -> str:
        return os.path.join(self.root or "", "data")

    def _initialise(self) -> None:
        superuser_password = os.path.join(self.root or "", "initdb.pw")
        with open(superuser_password, "w") as out:
            out.write(secrets.token_urlsafe(18) + "\n")
        os.chown(superuser_password, self.uid, self.gid)
        os.chmod(superuser_password, 0o600)
        result = self._as_nobody([self.program("initdb"), "-D", self.data, "-U", "postgres", "-E", "UTF8",
                                  "--locale=C", "--pwfile", superuser_password, "--auth-local=trust",
                                  "--auth-host=scram-sha-256", "--no-sync"])
        os.unlink(superuser_password)
        self._checked(result, "initdb")

    def _launch(self) -> None:
        self._spawn([self.program("postgres"), "-D", self.data, "-p", str(self.port), "-k", self.root,
                     "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "synchronous_commit=off",
                     "-c", "full_page_writes=off", "-c", "max_connections=200", "-c", "shared_buffers=16MB"])

    def _superuser(self, database: str = "postgres") -> Any:
        import psycopg2

        connection = psycopg2.connect(host=self.root, port=self.port, user="postgres", dbname=database,
                                      connect_timeout=3)
        connection.autocommit = True
        return connection

    def _accepts_queries(self) -> bool:
        try:
            self._superuser().close()
        except Exception:
            return False
        return True

    def _create_database(self, name: str) -> None:
        connection = self._superuser()
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1 FROM pg_roles WHERE rolname='nxgate'")
                if cursor.fetchone() is None:
                    cursor.execute("CREATE ROLE nxgate LOGIN PASSWORD %s", (self.password,))
                cursor.execute(f'CREATE DATABASE "{name}" OWNER nxgate')
        finally:
            connection.close()


class MariaDBServer(DatabaseServer):
    scheme = "mysql"

    @staticmethod
    def program(name: str) -> str | None:
        return _find(name, [f"/usr/sbin/{name}", f"/usr/bin/{name}"])

    @classmethod
    def available(cls) -> str | None:
        for name in ("mariadb-install-db", "mariadbd", "mariadb"):
            if cls.program(name) is None:
                return f"MariaDB's {name} is not installed (apt-get install mariadb-server)"
        try:
            import pymysql  # noqa: F401
        except ImportError:
            return "PyMySQL is not installed (pip install PyMySQL)"
        return None

    @property
    def data(self) -> str:
        return os.path.join(self.root or "", "data")

    @property
    def socket_path(self) -> str:
        return os.path.join(self.root or "", "mysqld.sock")

    def _initialise(self) -> None:
        self._checked(self._as_nobody([self.program("mariadb-install-db"), "--no-defaults", f"--datadir={self.data}",
                                       "--skip-test-db", "--auth-root-authentication-method=socket",
                                       f"--user={RUN_AS}"]), "mariadb-install-db")

    def _launch(self) -> None:
        self._spawn([self.program("mariadbd"), "--no-defaults", f"--datadir={self.data}", f"--port={self.port}",
                     "--bind-address=127.0.0.1", f"--socket={self.socket_path}",
                     f"--pid-file={os.path.join(self.root or '', 'mysqld.pid')}", "--skip-name-resolve",
                     "--skip-log-bin", "--innodb-buffer-pool-size=32M", "--innodb-log-file-size=16M",
                     "--innodb-flush-log-at-trx-commit=2", "--innodb-doublewrite=0", "--max-connections=200",
                     "--character-set-server=utf8mb4", "--collation-server=utf8mb4_bin"])

    def _client(self, sql: str) -> subprocess.CompletedProcess:
        """SQL through the command-line client as the server's own OS user
        (unix_socket authentication); the statements go on stdin, so the
        password never reaches a command line."""
        return self._as_nobody([self.program("mariadb"), "--no-defaults", f"--socket={self.socket_path}",
                                "-u", RUN_AS, "--batch"], input=sql)

    def _accepts_queries(self) -> bool:
        return os.path.exists(self.socket_path) and self._client("SELECT 1;").returncode == 0

    def _create_database(self, name: str) -> None:
        quoted = self.password.replace("\\", "\\\\").replace("'", "\\'")
        self._checked(self._client(
            f"CREATE USER IF NOT EXISTS 'nxgate'@'127.0.0.1' IDENTIFIED BY '{quoted}';\n"
            f"CREATE USER IF NOT EXISTS 'nxgate'@'localhost' IDENTIFIED BY '{quoted}';\n"
            f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;\n"
            f"GRANT ALL ON `{name}`.* TO 'nxgate'@'127.0.0.1';\n"
            f"GRANT ALL ON `{name}`.* TO 'nxgate'@'localhost';\n"), f"creating database {name}")


_shared: dict[type, DatabaseServer] = {}


def shared(kind: type[DatabaseServer]) -> DatabaseServer:
    """One running server of ``kind`` for this test process (stopped at exit)."""
    server = _shared.get(kind)
    if server is None:
        server = _shared[kind] = kind()
        atexit.register(server.cleanup)
    server.start()
    return server


def available(kind: Any) -> str | None:
    return kind.available()


def wait_until_down(server: DatabaseServer, timeout: float = 10.0) -> None:
    wait_for(lambda: not _port_open(server.port), timeout, f"{server.scheme} to stop")


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


if __name__ == "__main__":  # a quick manual check: python -m tests.harness.databases
    for kind in (PostgresServer, MariaDBServer):
        began = time.monotonic()
        server = kind()
        try:
            print(kind.__name__, server.start(), server.new_database(), f"{time.monotonic() - began:.1f}s")
            began = time.monotonic()
            server.restart()
            print("  restart", f"{time.monotonic() - began:.1f}s")
        finally:
            server.cleanup()
