"""The stream-order verdict: which records of a batch continue their stream, which repeat it, which break it.

One rule for every path of the engine: a record must be later than every record of its stream seen before
it. An exact repeat of the latest one (same time, same result) is a duplicate and dropped; anything else at
or before that time is rejected. A NaN time is never later than anything, so it is rejected, and it does
not count as seen: the records after it are judged against the latest real time.

The batch path (:func:`local_stream_buffer.batch.join_batch`) counts these verdicts; the keyed batch join
(:mod:`local_stream_buffer.keyed_batch`) names the rejected records, so an adapter can dead-letter them.
The per-record path (:class:`TwoStreamJoin`) applies the same rule to one record at a time.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class OrderVerdicts(NamedTuple):
    """Per record of a batch: does it continue its stream, or is it a duplicate; and what came before it."""

    in_order: np.ndarray  # bool: later than every record of the stream before it
    duplicate: np.ndarray  # bool: exact repeat (same time, same result) of the latest record before it
    latest_before: np.ndarray  # the latest time of the stream before each record

    @property
    def rejected(self) -> np.ndarray:
        """bool: neither in order nor a duplicate."""
        return ~self.in_order & ~self.duplicate


def order_verdicts(times: np.ndarray, values: np.ndarray, last_time: float, last_value: float) -> OrderVerdicts:
    """Verdicts for the next records of one stream (float64 arrays), after a latest record (time and result)."""
    n = len(times)
    latest_before = np.empty(n, dtype=np.float64)
    if n == 0:
        return OrderVerdicts(np.ones(0, bool), np.zeros(0, bool), latest_before)
    latest_before[0] = last_time
    np.fmax.accumulate(times[:-1], out=latest_before[1:])  # fmax: a NaN time is rejected, not carried on
    np.fmax(latest_before, last_time, out=latest_before)
    in_order = times > latest_before
    # np.count_nonzero rather than .all(): the Python-level wrapper costs more than the comparison on the
    # small batches that Spark's buckets hand over per key.
    if np.count_nonzero(in_order) == n:
        return OrderVerdicts(in_order, np.zeros(n, bool), latest_before)
    # A tie is a duplicate if it also has the value of the latest record kept before it (the stream's last
    # one for the first records).
    positions = np.where(in_order, np.arange(n), -1)
    np.maximum.accumulate(positions, out=positions)
    previous = np.empty_like(positions)
    previous[0] = -1
    previous[1:] = positions[:-1]
    previous_value = np.where(previous >= 0, values[np.maximum(previous, 0)], last_value)
    duplicate = ~in_order & (times == latest_before) & (values == previous_value)
    return OrderVerdicts(in_order, duplicate, latest_before)
