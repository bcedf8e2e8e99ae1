"""Fixed length buckets: every batch is padded to one of a few lengths, so each shape compiles once."""

from __future__ import annotations

import bisect


def bucket_for(length: int, buckets: list[int]) -> int:
    """The smallest bucket that holds `length` (longer sequences are truncated to the largest)."""
    index = bisect.bisect_left(buckets, length)
    return buckets[min(index, len(buckets) - 1)]
