"""The thumbnail's xwd dump is read with a bound (issue 22, item 2).

The X server decides how big ``xwd``'s dump is (a user's own agent can
claim a 16384x16384 screen: a 1 GiB dump, 4 GiB is possible), and the
gateway runs as root: it must stop reading at the limit, not read the whole
dump and then look at its size.
"""

from __future__ import annotations

import os
import resource
import stat
import threading
import time

from twisted.trial.unittest import SynchronousTestCase

from nxgate.node import thumbnails

MB = 1 << 20


class ReadLimitedTests(SynchronousTestCase):
    def pipe_with(self, total: int) -> int:
        """The read end of a pipe that a thread fills with ``total`` bytes."""
        read_end, write_end = os.pipe()

        def write() -> None:
            try:
                left = total
                while left:
                    left -= os.write(write_end, b"\0" * min(left, MB))
            except BrokenPipeError:
                pass
            finally:
                os.close(write_end)

        writer = threading.Thread(target=write)
        writer.start()
        self.addCleanup(writer.join)
        self.addCleanup(os.close, read_end)
        return read_end

    def test_a_stream_past_the_limit_is_stopped_while_reading(self) -> None:
        fd = self.pipe_with(64 * MB)
        error = self.assertRaises(thumbnails.DumpTooLarge, thumbnails.read_limited, fd, MB, time.monotonic() + 60)
        self.assertEqual(error.read, MB + 1)  # never more than the limit and one byte

    def test_a_stream_within_the_limit_is_read_whole(self) -> None:
        fd = self.pipe_with(MB)
        self.assertEqual(len(thumbnails.read_limited(fd, MB, time.monotonic() + 60)), MB)


class GrabTests(SynchronousTestCase):
    def test_a_huge_xwd_dump_is_refused_with_bounded_memory(self) -> None:
        """An "xwd" that writes 300 MB: grab stops at the (here 4 MB) limit,
        and this process's peak memory does not grow by the dump."""
        directory = os.path.abspath(self.mktemp())
        os.makedirs(directory)
        os.chmod(directory, 0o755)
        fake = os.path.join(directory, "xwd")
        with open(fake, "w") as handle:
            handle.write("#!/bin/sh\nexec head -c 300000000 /dev/zero\n")
        os.chmod(fake, stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
        self.patch(thumbnails, "XWD", fake)
        self.patch(thumbnails, "MAX_DUMP_BYTES", 4 * MB)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        self.assertRaises(thumbnails.DumpTooLarge, thumbnails.grab, 4321, "/nonexistent", os.getuid(), os.getgid())
        grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        self.assertLess(grown_kib, 64 * 1024)
