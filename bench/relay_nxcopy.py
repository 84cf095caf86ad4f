#!/usr/bin/env python3
"""Loopback throughput / latency benchmark for helpers/nxcopy and friends.

For every relay it starts a fresh relay process whose stdin/stdout are the
"client side" (by default one end of a loopback TCP connection, like a
socket handed over by sshd) and which connects to a consumer listening on
127.0.0.1, then measures:

  * throughput: SIZE bytes (default 2 GiB; median of --repeat runs) from
    the producer through the relay to the consumer; GB/s (1 GB = 1e9 bytes)
    and the relay's CPU seconds (user+sys, from wait4) per GB;
  * latency: p50/p99 of 1000 one-byte round trips (client -> relay ->
    echo server -> relay -> client), in a separate run of the relay.

Relays: nxcopy (splice), nxcopy --no-splice, socat (default), socat -b 262144,
a minimal Python os.splice loop (blocking, one thread per direction, with
nxcopy's default pipe size unless --python-pipe-size says otherwise), plus a
"direct" row without any relay that shows what the producer/consumer harness
itself can do.  The producer uses sendfile() and the consumer splice() into
/dev/null so that the harness costs as little CPU as possible.  On a small
or shared machine the figures are noisy: compare rows from the same run.

stdlib only:  python3 bench/relay_nxcopy.py [--size 2G] [--json out.json]
"""

import argparse
import fcntl
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
HELPERS = os.path.join(os.path.dirname(HERE), "helpers")
CHUNK = 1 << 20
RUN_TIMEOUT = 300.0


def parse_size(text):
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    text = text.strip().lower().rstrip("ib")
    if text and text[-1] in mult:
        return int(float(text[:-1]) * mult[text[-1]])
    return int(text)


# -- the reference relay: a plain blocking splice loop, one thread per direction


def python_splice_relay(target, pipe_size):
    host, port = target.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def pump(src, dst, dst_is_sock):
        r, w = os.pipe()
        try:
            fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, pipe_size)
        except OSError:
            pass
        while True:
            n = os.splice(src, w, pipe_size)
            if n == 0:
                break
            while n:
                n -= os.splice(r, dst, n)
        if dst_is_sock:
            sock.shutdown(socket.SHUT_WR)
        else:
            os.close(dst)

    threads = [threading.Thread(target=pump, args=(0, sock.fileno(), True)),
               threading.Thread(target=pump, args=(sock.fileno(), 1, False))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


# -- client side: what the relay gets as stdin/stdout ---------------------------


class ClientSide:
    """Our write end ``w`` feeds the relay's stdin, ``r`` reads its stdout."""

    def __init__(self, kind):
        self.kind = kind
        self.closers = []
        if kind == "pipes":
            self.relay_in, self.w = os.pipe()
            self.r, self.relay_out = os.pipe()
            self.relay_fds = [self.relay_in, self.relay_out]
            self.mine = [self.w, self.r]
        else:
            if kind == "tcp":
                lst = socket.socket()
                lst.bind(("127.0.0.1", 0))
                lst.listen(1)
                a = socket.create_connection(lst.getsockname())
                b, _ = lst.accept()
                lst.close()
                for s in (a, b):
                    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            else:
                a, b = socket.socketpair()
            self.sock = a
            self.w = self.r = a.fileno()
            self.relay_in = self.relay_out = b.detach()
            self.relay_fds = [self.relay_in]
            self.mine = []

    def spawned(self):
        for fd in self.relay_fds:
            os.close(fd)

    def close_write(self):
        if self.kind == "pipes":
            os.close(self.w)
            self.mine.remove(self.w)
        else:
            self.sock.shutdown(socket.SHUT_WR)

    def close(self):
        for fd in self.mine:
            os.close(fd)
        self.mine = []
        if self.kind != "pipes":
            self.sock.close()


class Relay:
    def __init__(self, argv, client, port):
        self.argv = [a.replace("{port}", str(port)) for a in argv]
        self.proc = subprocess.Popen(self.argv, stdin=client.relay_in, stdout=client.relay_out)
        client.spawned()
        self.rusage = None

    def wait(self, timeout=RUN_TIMEOUT):
        deadline = time.monotonic() + timeout
        while True:
            pid, status, rusage = os.wait4(self.proc.pid, os.WNOHANG)
            if pid:
                self.proc.returncode = os.waitstatus_to_exitcode(status)
                self.rusage = rusage
                return self.proc.returncode
            if time.monotonic() > deadline:
                self.proc.kill()
                raise RuntimeError("%s did not exit" % self.argv[0])
            time.sleep(0.01)

    def cpu(self):
        return self.rusage.ru_utime + self.rusage.ru_stime


def listener():
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(1)
    lst.settimeout(30)
    return lst


class Source:
    """A page-cached file of CHUNK*16 bytes; sendfile() from it costs the
    producer almost nothing, so the relay, not Python, is what gets measured."""

    def __init__(self):
        import tempfile
        self.f = tempfile.TemporaryFile()
        self.f.write(os.urandom(CHUNK) * 16)
        self.f.flush()
        self.size = CHUNK * 16


def producer(fd, size, source):
    left = size
    while left:
        off = (size - left) % source.size
        left -= os.sendfile(fd, source.f.fileno(), off, min(left, source.size - off))


def consumer(sock, size):
    """splice() into a pipe and on to /dev/null: zero-copy, GIL released."""
    r, w = os.pipe()
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, CHUNK)
    except OSError:
        pass
    got = 0
    try:
        while True:
            n = os.splice(sock.fileno(), w, CHUNK)
            if not n:
                return got
            got += n
            while n:
                n -= os.splice(r, null, n)
    finally:
        for fd in (r, w, null):
            os.close(fd)


def close_all(lst, client, relay) -> None:
    """The measurement's sockets closed, and its relay killed if still running."""
    client.close()
    lst.close()
    if relay and relay.proc.returncode is None:
        relay.proc.kill()
        relay.proc.wait()


def throughput(argv, size, client_kind, source):
    """Returns (seconds, relay cpu seconds or None, relay exit code or None)."""
    lst = listener()
    client = ClientSide(client_kind)
    relay = None
    try:
        if argv is None:  # no relay: producer talks to the consumer directly
            conn = socket.create_connection(lst.getsockname())
            peer, _ = lst.accept()
            wfd, done_writing = conn.fileno(), lambda: conn.shutdown(socket.SHUT_WR)
        else:
            relay = Relay(argv, client, lst.getsockname()[1])
            peer, _ = lst.accept()
            wfd, done_writing = client.w, client.close_write
        result = {}

        def produce():
            producer(wfd, size, source)
            done_writing()

        t = threading.Thread(target=produce)
        start = time.perf_counter()
        t.start()
        result["got"] = consumer(peer, size)
        elapsed = time.perf_counter() - start
        t.join()
        if result["got"] != size:
            raise RuntimeError("consumer got %d of %d bytes" % (result["got"], size))
        peer.close()  # ends the relay's other direction
        if argv is None:
            conn.close()
            return elapsed, None, None
        rc = relay.wait()
        return elapsed, relay.cpu(), rc
    finally:
        close_all(lst, client, relay)


def latency(argv, rounds, client_kind):
    """1-byte round trips through the relay to an echo server; returns sorted seconds."""
    lst = listener()
    client = ClientSide(client_kind)
    relay = None
    try:
        if argv is None:
            conn = socket.create_connection(lst.getsockname())
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            peer, _ = lst.accept()
            wfd = rfd = conn.fileno()
        else:
            relay = Relay(argv, client, lst.getsockname()[1])
            peer, _ = lst.accept()
            wfd, rfd = client.w, client.r
        peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def echo():
            while True:
                b = peer.recv(1)
                if not b:
                    peer.shutdown(socket.SHUT_WR)
                    return
                peer.sendall(b)

        t = threading.Thread(target=echo)
        t.start()
        samples = []
        for i in range(rounds + 50):  # the first 50 are warm-up
            start = time.perf_counter()
            os.write(wfd, b"x")
            if os.read(rfd, 1) != b"x":
                raise RuntimeError("echo mismatch")
            if i >= 50:
                samples.append(time.perf_counter() - start)
        if argv is None:
            conn.shutdown(socket.SHUT_WR)
        else:
            client.close_write()
        t.join(30)
        if argv is None:
            conn.close()
        else:
            relay.wait()
        peer.close()
        return sorted(samples)
    finally:
        close_all(lst, client, relay)


def pct(samples, p):
    return samples[min(len(samples) - 1, int(round(p / 100.0 * (len(samples) - 1))))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="2G", help="bytes per throughput run (default 2G; k/m/g suffixes)")
    ap.add_argument("--rounds", type=int, default=1000, help="latency round trips (default 1000)")
    ap.add_argument("--repeat", type=int, default=3,
                    help="throughput runs per relay; the median is reported (default 3)")
    ap.add_argument("--client", choices=("tcp", "socketpair", "pipes"), default="tcp",
                    help="what the relay gets as stdin/stdout (default: a loopback TCP socket)")
    ap.add_argument("--nxcopy", default=os.path.join(HELPERS, "nxcopy"))
    ap.add_argument("--nxcopy-buffers", default="", metavar="N,N",
                    help="extra rows: nxcopy --buffer N for each size (e.g. 64k,1m)")
    ap.add_argument("--json", help="write the results here as JSON")
    ap.add_argument("--python-pipe-size", default="128k",
                    help="pipe size of the Python splice loop (default 128k = nxcopy's default buffer)")
    ap.add_argument("--python-relay", metavar="HOST:PORT", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.python_relay:
        python_splice_relay(args.python_relay, parse_size(args.python_pipe_size))
        return 0
    size = parse_size(args.size)

    if not os.access(args.nxcopy, os.X_OK):
        subprocess.run(["make", "-C", HELPERS, "all"], check=True)
    target = "127.0.0.1:{port}"
    rows = [
        ("direct (no relay)", None),
        ("nxcopy (splice)", [args.nxcopy, "--connect", target]),
        ("nxcopy --no-splice", [args.nxcopy, "--no-splice", "--connect", target]),
        ("socat (default)", ["socat", "-", "TCP:" + target]),
        ("socat -b 262144", ["socat", "-b", "262144", "-", "TCP:" + target]),
        ("python os.splice loop", [sys.executable, os.path.abspath(__file__), "--python-relay", target,
                                   "--python-pipe-size", str(parse_size(args.python_pipe_size))]),
    ]
    for b in filter(None, args.nxcopy_buffers.split(",")):
        rows.insert(2, ("nxcopy --buffer %s" % b, [args.nxcopy, "--buffer", str(parse_size(b)), "--connect", target]))
    notes = []
    socat = shutil.which("socat")
    if not socat:
        notes.append("socat not found: socat rows skipped")
        rows = [r for r in rows if not r[0].startswith("socat")]
    else:
        rows = [(n, [socat] + a[1:] if a and a[0] == "socat" else a) for n, a in rows]

    print("relay benchmark: %d bytes per run (median of %d), client side = %s, %d round trips,"
          " %d CPUs, kernel %s" % (size, args.repeat, args.client, args.rounds, os.cpu_count(),
                                   os.uname().release))
    header = "%-24s %9s %12s %10s %10s %4s" % ("relay", "GB/s", "CPU s/GB", "p50 us", "p99 us", "rc")
    print(header)
    print("-" * len(header))
    results = []
    source = Source()
    for name, argv in rows:
        runs = sorted((throughput(argv, size, args.client, source) for _ in range(max(1, args.repeat))),
                      key=lambda run: run[0])
        secs, cpu, rc = runs[len(runs) // 2]  # the median run by elapsed time
        rc = max((r[2] for r in runs), key=lambda c: c or 0)  # any failure shows
        lat = latency(argv, args.rounds, args.client)
        gb = size / 1e9
        row = {
            "relay": name,
            "argv": argv,
            "bytes": size,
            "seconds": secs,
            "all_seconds": [r[0] for r in runs],
            "gb_per_s": gb / secs,
            "cpu_s_per_gb": None if cpu is None else cpu / gb,
            "latency_p50_us": pct(lat, 50) * 1e6,
            "latency_p99_us": pct(lat, 99) * 1e6,
            "exit_code": rc,
        }
        results.append(row)
        print("%-24s %9.2f %12s %10.1f %10.1f %4s" % (
            name, row["gb_per_s"],
            "-" if cpu is None else "%.3f" % row["cpu_s_per_gb"],
            row["latency_p50_us"], row["latency_p99_us"], "-" if rc is None else rc), flush=True)
    for n in notes:
        print("note: " + n)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"size": size, "client": args.client, "rounds": args.rounds,
                       "repeat": args.repeat, "cpus": os.cpu_count(), "kernel": os.uname().release,
                       "notes": notes, "results": results}, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
