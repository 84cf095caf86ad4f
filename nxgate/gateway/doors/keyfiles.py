"""The doors' own private files (SSH host keys, the portal's TLS key): a
0700 directory and 0600 files created new, never overwritten, shared by
the doors that generate a key at first start."""

from __future__ import annotations

import os
import stat

from twisted.logger import Logger

log = Logger()


def ensure_private_dir(path: str) -> None:
    """Create ``path`` with mode 0700, or tighten an existing one."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & 0o077:
        log.warn("tightening permissions of {path} from {mode:o} to 700", path=path, mode=mode)
        os.chmod(path, 0o700)


def write_private_file(path: str, data: bytes) -> None:
    """Create a new file readable by its owner only; never overwrite one."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
