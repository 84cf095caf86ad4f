"""SSH compression that a client cannot turn into a memory bomb.

zlib packs up to about 1,000 bytes of zeros into one, so a client that may
compress can send one packet within the 1 MiB packet limit that inflates to a
gigabyte.  Conch inflates every packet whole, as soon as it arrives, and
offers plain ``zlib``, which starts at the first NEWKEYS, before the client
has authenticated: anyone who reaches the port could make the gateway
allocate gigabytes.  Two rules close that:

* only OpenSSH's *delayed* compression, ``zlib@openssh.com``, is offered: it
  starts once user authentication has succeeded (OpenSSH's own server has
  offered nothing else by default since 2008);
* every inflate is bounded by the packet limit: :class:`BoundedInflater`
  asks zlib for at most that many bytes and refuses the packet if there is
  more, so a compressed packet never costs more than the limit.

Pure: zlib and nothing else.
"""

from __future__ import annotations

import zlib

#: OpenSSH's delayed compression: zlib from the first packet after
#: SSH_MSG_USERAUTH_SUCCESS (and at every key exchange after it).
DELAYED_ZLIB = b"zlib@openssh.com"
#: What the server offers, in its order.
SERVER_COMPRESSIONS = (b"none", DELAYED_ZLIB)


class CompressionError(ValueError):
    """A packet that does not inflate within the limit, or is no zlib data;
    the message says which."""


class BoundedInflater:
    """The incoming half of an SSH zlib stream, one packet at a time (the
    ``decompress`` Conch's transport calls), none larger than ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._stream = zlib.decompressobj()

    def decompress(self, data: bytes) -> bytes:
        try:
            # One byte more than allowed tells "exactly the limit" from "more".
            inflated = self._stream.decompress(data, self.limit + 1)
        except zlib.error as error:
            raise CompressionError(f"the compressed data is corrupt ({error})") from None
        if len(inflated) > self.limit or self._stream.unconsumed_tail:
            raise CompressionError(f"a compressed packet of {len(data)} bytes inflates to more than "
                                   f"{self.limit} bytes, the packet limit")
        return inflated
