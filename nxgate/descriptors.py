"""This process's open file descriptors: how many, the limit, and whether it ran out.

Every part that must tell "out of files" from other failures asks here:
the doors' guard and what logged-in users hold keep a reserve below the
limit, the admin status shows the count, and a login that PAM or NSS could
not check for want of descriptors is a temporary failure, not a wrong
password (glibc's NSS says "not found" and PAM "Module is unknown" or
"Authentication failure" then; only the count tells the truth).
"""

from __future__ import annotations

import errno
import os
import resource

#: Descriptors PAM needs free to run one transaction (its configuration,
#: its modules, /etc/passwd and /etc/shadow, unix_chkpwd's pipes): with
#: fewer spare, its verdict says nothing about the password.
PAM_HEADROOM = 16
#: Descriptors one NSS look-up needs (/etc/passwd, or a socket to sssd or systemd).
NSS_HEADROOM = 4
OUT_OF_FILES = frozenset({errno.EMFILE, errno.ENFILE})


def file_limit() -> int:
    """The soft RLIMIT_NOFILE."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def count_open_files() -> int:
    """This process's open descriptors (Linux /proc; 0 elsewhere: not checked).

    Listing ``/proc/self/fd`` takes a descriptor itself: with none left the
    process holds every one it may, so the answer is the limit (it used to
    be 0, which hid an exhausted gateway from ``nxgate-admin status``)."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # less listdir's own
    except OSError as error:
        if error.errno in OUT_OF_FILES:
            return file_limit()
        return 0


def spare_files() -> int:
    """Descriptors this process may still open (0 when it ran out)."""
    return max(0, file_limit() - count_open_files())


def short_of_files(headroom: int = PAM_HEADROOM) -> bool:
    """Whether fewer than ``headroom`` descriptors are left: a failure just
    seen may have come from that rather than from what was asked."""
    return spare_files() < headroom
