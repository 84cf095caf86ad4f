"""A machine whose accounts are numbered differently: a process (a cluster
member under test) in a private mount namespace, with its own copy of /etc
(in which a user has another uid) bind-mounted over the real one.

The whole directory, not the two files: the kernel detaches a file's bind
mount in every namespace when the file is replaced on the host, which
``useradd`` and ``userdel`` of any other test do.

``private_etc(directory, user, number)`` makes the copy; ``wrapper(etc)`` is
the argv to put before the member's command; run as ``python -m
tests.harness.accounts ETC -- COMMAND...`` it mounts ETC over /etc (in the
namespace ``unshare`` made) and execs COMMAND.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time


def wrapper(etc: str) -> list[str]:
    return ["unshare", "--mount", "--propagation", "private", "--", sys.executable, "-m", "tests.harness.accounts",
            etc, "--"]


def private_etc(directory: str, user: str, group: str, number: int) -> str:
    """A copy of /etc in ``directory`` where ``user`` (and its ``group``) are ``number``."""
    etc = os.path.join(directory, "etc")
    for attempt in range(5):
        # Other tests of a parallel run add and remove users meanwhile: a file cp listed (shadow's
        # lock, passwd+) may be gone when it copies it.  A later attempt copies a settled /etc.
        copied = subprocess.run(["cp", "-a", "/etc", etc], capture_output=True, text=True)
        if copied.returncode == 0:
            break
        shutil.rmtree(etc, ignore_errors=True)
        time.sleep(0.5)
    else:
        raise AssertionError(f"cannot copy /etc: {copied.stderr.strip()}")
    renumbered("/etc/passwd", user, number, os.path.join(etc, "passwd"))
    renumbered("/etc/group", group, number, os.path.join(etc, "group"))
    return etc


def renumbered(path: str, name: str, number: int, out: str) -> None:
    """A copy of passwd (or group) ``path`` with ``name``'s line(s) given ``number`` as uid and gid (or gid)."""
    lines = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            fields = line.rstrip("\n").split(":")
            if fields[0] == name:
                fields[2] = str(number)
                if len(fields) == 7:  # passwd: the primary group too
                    fields[3] = str(number)
            lines.append(":".join(fields) + "\n")
    with open(out, "w", encoding="utf-8") as handle:
        handle.writelines(lines)
    os.chmod(out, 0o644)


def main(argv: list[str]) -> None:
    etc, separator, *command = argv
    assert separator == "--" and command, "usage: accounts ETC -- COMMAND..."
    subprocess.run(["mount", "--bind", etc, "/etc"], check=True)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
