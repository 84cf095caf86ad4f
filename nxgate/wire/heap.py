"""How a process that relays bulk streams asks ``malloc`` to keep its memory.

Every read of a bulk stream allocates a buffer as large as the read may be
(Python's ``recv(n)`` allocates ``n`` bytes, then shrinks the object), and
every sealed or opened SSH packet, TLS write and decrypted piece of records
is a fresh object of up to a MiB or two.  With glibc's default thresholds
most of them were served with fresh pages: ``mmap`` or the heap's top given
back (``brk``), page faults that clear each page, ``munmap`` (and ``mremap``
to shrink), for each read and each packet.  Measured on a folder copy
through ``nxgate-client``'s own channel (bench/sharing_copy.py, load
15-17): 2.4-3.2 CPU seconds per GB in the gateway and in nxgate-client
with the defaults, 1.1-1.8 with the thresholds below.  On a member's TLS
round trip alone (perf, 2 GiB in 1 MiB writes: memmove 29 %, page faults,
clearing and ``brk`` ~20 %, AES-GCM 13 %) the same work took 0.65-0.69 CPU
s/GB instead of 1.21-1.25, and in bench/cluster_relay.py the node's CPU
per GB of the up direction went from 2.9-3.8 to 1.5-1.7.

Used by the processes that relay SSH channels
(:mod:`nxgate.streams.reverse_channel`) and member streams
(:mod:`nxgate.wire.connection`).
"""

from __future__ import annotations

import ctypes

#: glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: Blocks below this come from the heap, not from a new mapping each (reads of up to 1 MiB, packets).
MMAP_THRESHOLD = 4 * 1024 * 1024
#: Freed heap kept for the next blocks instead of given back to the kernel at once.
TRIM_THRESHOLD = 16 * 1024 * 1024
_applied: list[bool] = []


def keep_freed_memory() -> bool:
    """Set this process's ``malloc`` thresholds for bulk streams, once
    (glibc only; elsewhere nothing, and False).  What it costs: up to
    :data:`TRIM_THRESHOLD` of freed heap stays in the process after a bulk
    transfer, and only in a process that carried one."""
    if _applied:
        return _applied[0]
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        _applied.append(False)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    done = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    _applied.append(done)
    return done
