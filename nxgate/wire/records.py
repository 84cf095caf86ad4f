"""TLS records in bulk, for the member streams' throughput.

pyOpenSSL moves application data one TLS record (16 KiB) per call: its
connections are made with ``SSL_MODE_ENABLE_PARTIAL_WRITE``, so ``send``
stops after one record, and ``recv`` allocates a buffer and copies out one
record at a time.  A gateway relaying a session's screen updates from a
member paid that per-call overhead 65 000 times per GB each way
(bench/cluster_relay.py, issue 25).  Here:

* :func:`whole_writes` clears that mode on a connection (ours only, both
  ends of every member connection, :mod:`nxgate.wire.tls`): one ``send``
  encrypts a whole write into the memory BIO, which never refuses bytes;
* :func:`read_all` decrypts every complete record waiting in the receive
  BIO into one buffer and returns it as one ``bytes``;
* :func:`keep_freed_memory` keeps those buffers' memory in the process
  between reads instead of faulting fresh pages in for each.

Both use pyOpenSSL's private ``_lib``/``_ffi``/``_ssl`` names (checked by
tests/test_twisted_canaries.py); when they are missing, :data:`AVAILABLE`
is False and the callers keep pyOpenSSL's public one-record calls.
"""

from __future__ import annotations

import ctypes
from typing import Any

from OpenSSL import SSL

try:
    from OpenSSL._util import ffi as _ffi
    from OpenSSL._util import lib as _lib

    AVAILABLE = all(hasattr(_lib, name) for name in ("SSL_clear_mode", "SSL_read", "SSL_MODE_ENABLE_PARTIAL_WRITE")) \
        and hasattr(SSL.Connection, "_raise_ssl_error")
except ImportError:  # pragma: no cover - a pyOpenSSL without the private module
    AVAILABLE = False

#: The most one :func:`read_all` returns (the rest stays in the BIO for the next call).
READ_LIMIT = 1024 * 1024


def whole_writes(connection: SSL.Connection) -> None:
    """Let one ``send`` on ``connection`` write all its records."""
    if AVAILABLE:
        _lib.SSL_clear_mode(connection._ssl, _lib.SSL_MODE_ENABLE_PARTIAL_WRITE)


_buffer: Any = None  # one receive buffer for the process: the reactor's thread only, copied out at once


def read_all(connection: SSL.Connection) -> bytes:
    """Every record's plaintext that is complete in ``connection``'s receive
    BIO (up to :data:`READ_LIMIT`), as one ``bytes``.  Raises as ``recv``
    does (``WantReadError`` when there is nothing, ``ZeroReturnError`` at
    the peer's close, ``SSL.Error``) only when nothing was read before it;
    the condition shows again at the next call."""
    global _buffer
    if _buffer is None:
        _buffer = _ffi.new("char[]", READ_LIMIT)
    ssl, buffer = connection._ssl, _buffer
    total = 0
    while total < READ_LIMIT:
        result = _lib.SSL_read(ssl, buffer + total, READ_LIMIT - total)
        if result <= 0:
            if total:
                break
            connection._raise_ssl_error(ssl, result)
        total += result
    return _ffi.buffer(buffer, total)[:]


#: glibc's mallopt parameters (malloc.h) and what a relaying process sets them to.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: Buffers below this come from the heap, not from a new mmap each (the stream's reads, records and
#: decrypted pieces are up to ~1-2 MiB).
MMAP_THRESHOLD = 4 * 1024 * 1024
#: Freed heap kept for the next buffers instead of given back to the kernel at once.
TRIM_THRESHOLD = 16 * 1024 * 1024
_kept: list[bool] = []


def keep_freed_memory() -> bool:
    """Make this process's ``malloc`` keep the memory of freed stream
    buffers for the next ones (once per process; glibc only, else False).

    A member stream allocates and frees a buffer of up to a MiB or two for
    every TCP read, TLS write and decrypted piece.  glibc's default
    thresholds served most of them with fresh pages: the heap's top was
    given back to the kernel (``brk``) and faulted in and zeroed again
    for the next buffer.  Measured with perf on the TLS round trip alone
    (encrypt, records out, records in, decrypt; 2 GiB in 1 MiB writes):
    memmove 29 %, page faults, page clearing and ``brk`` ~20 %, AES-GCM
    13 %; with these two thresholds the same work took 0.65-0.69 CPU s/GB
    instead of 1.21-1.25.  In bench/cluster_relay.py the node's CPU per GB
    of the up direction went from 2.9-3.8 to 1.5-1.7.  What it costs: up
    to :data:`TRIM_THRESHOLD` of freed heap stays in the process after a
    bulk transfer."""
    if _kept:
        return _kept[0]
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        _kept.append(False)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    done = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    _kept.append(done)
    return done
