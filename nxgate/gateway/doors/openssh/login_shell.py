"""``nxgate-shell``: the nx account's command when the system sshd serves NX.

sshd starts it for every NX client (``ForceCommand nxgate-shell``).  It
carries the NX conversation to the gateway's local socket — login and
session management happen there — and after ``bye`` it gets the gateway's
connection to the session's agent (it could not reach the agent's socket
itself) and ``exec``s ``nxcopy``, so the bulk stream goes
sshd <-> nxcopy <-> agent without Python.  It imports nothing heavy: it
runs once per connection.
"""

from __future__ import annotations

import base64
import json
import os
import selectors
import shutil
import socket
import sys
import termios
import tty

from nxgate.gateway.doors.openssh import framing

DEFAULT_SOCKET = "/run/nxgate/shell.sock"


def find_nxcopy() -> str | None:
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [
        os.environ.get("NXGATE_NXCOPY", ""),
        os.path.join(os.path.dirname(sys.executable), "nxcopy"),  # installed beside us
        os.path.join(here, "..", "..", "..", "helpers", "nxcopy"),  # a source checkout
        "/usr/lib/nxgate/nxcopy",
        shutil.which("nxcopy") or "",
    ]
    return next((path for path in candidates if path and os.access(path, os.X_OK)), None)


def fail(message: str) -> int:
    sys.stderr.write(f"nxgate-shell: {message}\n")
    return 1


def switch(message: dict[str, object], agent_fd: int | None, stdin: int, stdout: int) -> int:
    """Send what the client already sent to the agent, become nxcopy."""
    nxcopy = find_nxcopy()
    if nxcopy is None:
        return fail("nxcopy not found")
    if agent_fd is None:
        return fail("the gateway sent no connection to the agent")
    agent = socket.socket(fileno=agent_fd)
    agent.setblocking(True)
    leftover = base64.b64decode(str(message.get("leftover", "")))
    if leftover:
        agent.sendall(leftover)
    fd = agent.detach()
    os.set_inheritable(fd, True)
    os.execv(nxcopy, [nxcopy, "--in-fd", str(stdin), "--out-fd", str(stdout), "--fd", str(fd)])
    return 1  # not reached


def relay(conn: socket.socket, stdin: int, stdout: int) -> int:
    deframer = framing.Deframer()
    received: list[int] = []  # descriptors from the gateway: the agent connection
    selector = selectors.DefaultSelector()
    selector.register(stdin, selectors.EVENT_READ, "client")
    selector.register(conn, selectors.EVENT_READ, "gateway")
    while True:
        for key, _ in selector.select():
            if key.data == "client":
                data = os.read(stdin, 65536)
                if data:
                    conn.sendall(framing.frame(framing.DATA, data))
                else:
                    conn.sendall(framing.frame(framing.EOF))
                    selector.unregister(stdin)
                continue
            data, fds, _flags, _address = socket.recv_fds(conn, 65536, 4)
            received.extend(fds)
            if not data:
                return 0
            for kind, payload in deframer.feed(data):
                if kind == framing.DATA:
                    os.write(stdout, payload)
                elif kind == framing.SWITCH:
                    selector.close()
                    conn.close()
                    agent_fd = received.pop(0) if received else None
                    for extra in received:
                        os.close(extra)
                    return switch(json.loads(payload), agent_fd, stdin, stdout)
                elif kind == framing.EXIT:
                    return int(payload or b"0")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args:  # sshd passes "-c COMMAND" when the client asked for one
        return fail("this account only speaks NX; commands are refused")
    path = os.environ.get("NXGATE_SOCKET", DEFAULT_SOCKET)
    words = (os.environ.get("SSH_CONNECTION") or os.environ.get("SSH_CLIENT") or "").split()
    remote = words[0] if words else None
    stdin, stdout = 0, 1
    saved = None
    if os.isatty(stdin):
        saved = termios.tcgetattr(stdin)
        tty.setraw(stdin)  # a pty must pass the binary stream untouched
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError as error:
        os.write(stdout, b"NX> 500 ERROR: The NX service is not running on this server.\nNX> 999 Bye.\n")
        return fail(f"cannot reach the gateway at {path}: {error}")
    conn.sendall(framing.frame(framing.HELLO, framing.hello_payload(remote)))
    try:
        return relay(conn, stdin, stdout)
    finally:
        if saved is not None:
            termios.tcsetattr(stdin, termios.TCSADRAIN, saved)


if __name__ == "__main__":
    sys.exit(main())
