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
  BIO into one buffer and returns it as one ``bytes`` (the process keeps
  those buffers' memory between reads: :mod:`nxgate.wire.heap`).

Both use pyOpenSSL's private ``_lib``/``_ffi``/``_ssl`` names (checked by
tests/test_twisted_canaries.py); when they are missing, :data:`AVAILABLE`
is False and the callers keep pyOpenSSL's public one-record calls.
"""

from __future__ import annotations

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
