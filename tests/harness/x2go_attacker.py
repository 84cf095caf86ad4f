"""A logged-in user attacking the X2Go door's file surfaces, with paramiko (what python-x2go uses).

Run by Debian's python3 (python3-paramiko; the venv has no paramiko):
``python3 tests/harness/x2go_attacker.py ATTACK PORT USER`` with the
password in ``NXGATE_TEST_PASSWORD`` (never in argv).  It prints one JSON
line with what it got; ``handles`` then holds what it opened until its
stdin closes.  Attacks:

* ``handles COUNT CONNECTIONS``: on each of CONNECTIONS logins, one SFTP
  channel opening ``~/.x2go/held`` for writing COUNT times, never closing;
* ``bigpacket MEGABYTES``: an SFTP packet header announcing 2 GB, then up
  to MEGABYTES of data, until the server closes the channel;
* ``malformed COUNT``: COUNT SFTP OPEN packets too short to read;
* ``forwards COUNT``: COUNT ``tcpip-forward`` requests;
* ``scp COUNT SIZE DIRECTORY``: one ``scp -t`` of COUNT files of SIZE bytes
  into ``~/.x2go/DIRECTORY``, as x2goclient's libssh sends it;

and what python-x2go does, for comparison: ``put SIZE`` writes a cookie of
SIZE bytes to ``~/.x2go/C-put/.pulse-cookie`` with paramiko's ``putfo``
(open, write, close, stat).
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys
import time

import paramiko


def login(port: int, user: str) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    client.connect("127.0.0.1", port=port, username=user, password=os.environ["NXGATE_TEST_PASSWORD"],
                   allow_agent=False, look_for_keys=False, timeout=30, banner_timeout=30, auth_timeout=30)
    _, stdout, _ = client.exec_command("echo $HOME", timeout=30)  # python-x2go's first command
    stdout.read()
    return client


def sftp_channel(client: paramiko.SSHClient) -> paramiko.Channel:
    channel = client.get_transport().open_session(timeout=30)
    channel.invoke_subsystem("sftp")
    channel.settimeout(30)
    return channel


def send_all(channel: paramiko.Channel, data: bytes) -> bool:
    """False when the server closed the channel first."""
    try:
        channel.sendall(data)
        return True
    except (OSError, EOFError, paramiko.SSHException):
        return False


def closed_by_server(channel: paramiko.Channel, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    channel.settimeout(1)
    while time.monotonic() < deadline:
        if channel.closed or channel.eof_received:
            return True
        try:
            if channel.recv(65536) == b"":
                return True
        except socket.timeout:
            continue
        except (OSError, EOFError):
            return True
    return False


def handles(port: int, user: str, count: int, connections: int) -> None:
    clients = [login(port, user) for _ in range(connections)]  # all logged in before the first handle
    held, refused, errors = [], 0, set()
    for client in clients:
        sftp = client.open_sftp()
        home = sftp.normalize(".")
        for _ in range(count):
            try:
                held.append(sftp.open(f"{home}/.x2go/held", "w"))
            except (OSError, paramiko.SSHException) as error:
                refused += 1
                errors.add(str(error)[:200])
    print(json.dumps({"held": len(held), "refused": refused, "errors": sorted(errors)}), flush=True)
    sys.stdin.read()  # hold everything until the test is done
    for client in clients:
        client.close()


def bigpacket(port: int, user: str, megabytes: int) -> None:
    client = login(port, user)
    channel = sftp_channel(client)
    sent = 0
    closed = not send_all(channel, struct.pack(">LB", 0x7FFFFFFF, 3) + b"\0\0\0\1")
    chunk = b"\0" * 65536
    while not closed and sent < megabytes * 1024 * 1024:
        if channel.closed or channel.eof_received:
            closed = True
            break
        closed = not send_all(channel, chunk)
        sent += len(chunk)
    closed = closed or closed_by_server(channel, 20)
    print(json.dumps({"sent": sent, "closed": closed}), flush=True)
    client.close()


def malformed(port: int, user: str, count: int) -> None:
    client = login(port, user)
    channel = sftp_channel(client)
    send_all(channel, struct.pack(">LBL", 5, 1, 3))  # INIT, version 3
    answers, sent = 0, 0
    for number in range(count):
        # OPEN with a request id and a name length that runs past the packet.
        if not send_all(channel, struct.pack(">LBLL", 9, 3, number, 1000)):
            break
        sent += 1
    closed = closed_by_server(channel, 10)
    print(json.dumps({"sent": sent, "closed": closed, "answers": answers}), flush=True)
    client.close()


def forwards(port: int, user: str, count: int) -> None:
    client = login(port, user)
    transport = client.get_transport()
    granted = 0
    for number in range(count):
        if transport.global_request("tcpip-forward", ("127.0.0.1", 20000 + number), wait=True) is not None:
            granted += 1
    print(json.dumps({"granted": granted, "refused": count - granted}), flush=True)
    client.close()


def scp(port: int, user: str, count: int, size: int, directory: str) -> None:
    client = login(port, user)
    channel = client.get_transport().open_session(timeout=30)
    channel.settimeout(30)
    channel.exec_command(f"scp -t -r '.x2go/{directory}'")
    written, reason = 0, ""

    def answer() -> bytes:
        first = channel.recv(1)
        if first == b"\0" or first == b"":
            return first
        return first + channel.recv(1024)

    if answer() == b"\0":
        for number in range(count):
            if not send_all(channel, f"C0600 {size} file{number}\n".encode()):
                break
            reply = answer()
            if reply != b"\0":
                reason = reply.decode(errors="replace").strip()
                break
            if not send_all(channel, os.urandom(size) + b"\0"):
                break
            reply = answer()
            if reply != b"\0":
                reason = reply.decode(errors="replace").strip()
                break
            written += 1
    print(json.dumps({"written": written, "refused": reason}), flush=True)
    client.close()


def put(port: int, user: str, size: int) -> None:
    import io

    client = login(port, user)
    sftp = client.open_sftp()
    home = sftp.normalize(".")
    attributes = sftp.putfo(io.BytesIO(b"c" * size), f"{home}/.x2go/C-put/.pulse-cookie")  # checks the size
    print(json.dumps({"size": attributes.st_size}), flush=True)
    client.close()


def main() -> None:
    attack, port, user, *rest = sys.argv[1:]
    numbers = [int(value) for value in rest if value.isdigit()]
    if attack == "handles":
        handles(int(port), user, *numbers)
    elif attack == "bigpacket":
        bigpacket(int(port), user, *numbers)
    elif attack == "malformed":
        malformed(int(port), user, *numbers)
    elif attack == "forwards":
        forwards(int(port), user, *numbers)
    elif attack == "put":
        put(int(port), user, *numbers)
    elif attack == "scp":
        scp(int(port), user, numbers[0], numbers[1], rest[2])
    else:
        raise SystemExit(f"no attack {attack!r}")


if __name__ == "__main__":
    main()
