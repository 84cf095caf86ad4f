"""A key-exchange worker process: ``python -m nxgate.gateway.doors.conch.kexworker``.

Reads one job per line on stdin and answers each with one line on stdout,
both JSON objects; big numbers and bytes travel as hex strings:

* ``{"id": 7, "op": "dh", "g": "2", "p": "ffff...", "e": "1234..."}``
  -> ``{"id": 7, "f": "...", "k": "..."}``
* ``{"id": 8, "op": "mlkem768x25519", "init": "..."}``
  -> ``{"id": 8, "k": "...", "reply": "..."}``
* a job the client's value makes impossible -> ``{"id": 9, "error": "why"}``

Why a process and not a thread: the exponentiations hold the GIL for their
whole length (Python's ``pow`` and Cryptography alike), so a thread would
stop the reactor just the same.  The worker runs as ``nobody`` and lowers
its own priority so that the gateway's reactor gets the CPU first: a flood of key exchanges slows
other key exchanges, not logins, the portal or running sessions.
"""

from __future__ import annotations

import json
import os
import pwd
import sys
from typing import Any, BinaryIO

from nxgate.gateway.doors.conch import kexmath

#: How much nicer than the gateway the workers run.
NICENESS = 10


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """The answer to one job (pure apart from the randomness of the exchange)."""
    answer: dict[str, Any] = {"id": job.get("id")}
    try:
        if job.get("op") == "dh":
            f, k = kexmath.dh_server(int(job["g"], 16), int(job["p"], 16), int(job["e"], 16))
            answer.update(f=format(f, "x"), k=format(k, "x"))
        elif job.get("op") == "mlkem768x25519":
            k_encoded, reply = kexmath.mlkem768x25519_server(bytes.fromhex(job["init"]))
            answer.update(k=k_encoded.hex(), reply=reply.hex())
        else:
            answer["error"] = f"unknown operation {job.get('op')!r}"
    except (KeyError, ValueError, TypeError) as error:  # KexMathError is a ValueError
        answer["error"] = str(error) or type(error).__name__
    return answer


def serve(source: BinaryIO, sink: BinaryIO) -> None:
    for line in source:
        try:
            job = json.loads(line)
        except ValueError:
            job = {"id": None, "op": None}
        sink.write(json.dumps(run_job(job if isinstance(job, dict) else {})).encode() + b"\n")
        sink.flush()


def drop_root() -> None:
    """A worker needs no privilege: as root (the gateway runs as root for
    PAM and sessions) it becomes ``nobody``, so that a flaw in the parsing
    of a client's value could not act as root."""
    if os.geteuid() != 0:
        return
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        return
    try:
        os.setgroups([])
        os.setgid(nobody.pw_gid)
        os.setuid(nobody.pw_uid)
    except OSError as error:  # a sandbox without CAP_SETUID: computing as root beats not computing
        print(f"cannot become nobody ({error}); computing as root", file=sys.stderr, flush=True)


def main() -> None:
    try:
        os.nice(NICENESS)
    except OSError:
        pass  # runs at the gateway's priority then; still off the reactor
    drop_root()
    serve(sys.stdin.buffer, sys.stdout.buffer)


if __name__ == "__main__":
    main()
