"""An attacker for tests: ``python -m tests.harness.flood SOURCE PORT COUNT``
holds COUNT TCP connections from SOURCE to 127.0.0.1:PORT that never send
a byte, and opens new ones in place of those the server closes, until it
is terminated.  It prints "holding ..." once the first COUNT are open, and
a last line with its totals when it ends.  SOURCE may be several addresses
separated by commas: COUNT from each."""

from __future__ import annotations

import contextlib
import errno
import resource
import signal
import socket
import sys
import time


def raise_own_file_limit(needed: int) -> None:
    """The test process holds the flood's sockets itself."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            raise SystemExit(f"the flood needs {needed} open files; the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


class Flood:
    """``count`` TCP connections from ``source`` that never send a byte.
    The gateway may close them; :meth:`refill` opens new ones in their place,
    as an attacker would."""

    def __init__(self, source: str, port: int, count: int) -> None:
        self.source, self.port = source, port
        self.sockets: list[socket.socket] = []
        self.opened = 0
        self.refill(count)

    def _one(self) -> socket.socket:
        """One connection, connected (the kernel completes the handshake
        before the server accepts), then left silent."""
        sock = socket.socket()
        sock.bind((self.source, 0))
        sock.settimeout(2)
        with contextlib.suppress(OSError):  # a full backlog: it stays connecting, as an attacker's would
            sock.connect(("127.0.0.1", self.port))
        sock.setblocking(False)
        self.opened += 1
        return sock

    def refill(self, count: int) -> None:
        """Close the ones the gateway closed and open new ones up to ``count``."""
        alive = []
        for sock in self.sockets:
            if self._closed_by_peer(sock):
                sock.close()
            else:
                alive.append(sock)
        self.sockets = alive
        while len(self.sockets) < count:
            self.sockets.append(self._one())

    @staticmethod
    def _closed_by_peer(sock: socket.socket) -> bool:
        try:
            while sock.recv(65536):  # an SSH banner: read and go on
                pass
        except (BlockingIOError, InterruptedError):
            return False  # open, nothing more to read
        except OSError as error:
            return error.errno != errno.ENOTCONN  # reset or refused: closed; still connecting: open
        return True  # the end

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()
        self.sockets = []




def main() -> None:
    sources, port, count = sys.argv[1].split(","), int(sys.argv[2]), int(sys.argv[3])
    raise_own_file_limit(count * len(sources) + 256)
    floods = [Flood(source, port, count) for source in sources]
    print(f"holding {sum(len(flood.sockets) for flood in floods)} connections from {sys.argv[1]}", flush=True)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    while not stop:
        time.sleep(0.5)
        for flood in floods:
            flood.refill(count)
    print(f"opened {sum(flood.opened for flood in floods)} connections from {sys.argv[1]} in all,"
          f" {sum(len(flood.sockets) for flood in floods)} held at the end", flush=True)
    for flood in floods:
        flood.close()


if __name__ == "__main__":
    main()
