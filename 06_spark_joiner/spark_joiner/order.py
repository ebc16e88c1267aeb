"""Per-record stream-order verdicts for a batch, so rejected records can be dead-lettered one by one.

``local_stream_buffer.batch.join_batch`` applies the same check but only counts its verdicts; this
module names the records. The rules are the engine's: a record must be newer than every record of its
stream seen before it; an exact repeat of the latest one (same time, same result) is a duplicate and
dropped; anything else older or at the same time is rejected.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from local_stream_buffer.output import canonical_time


class OrderVerdicts(NamedTuple):
    in_order: np.ndarray  # bool per record: continues the stream
    duplicate: np.ndarray  # bool per record: exact repeat of the stream's latest record, dropped
    latest_before: np.ndarray  # the latest time of the stream before each record

    @property
    def rejected(self) -> np.ndarray:
        return ~self.in_order & ~self.duplicate


def order_verdicts(times: np.ndarray, values: np.ndarray, last_time: float, last_value: float) -> OrderVerdicts:
    """Verdicts for the next records of one stream, given the time and result of its latest record."""
    n = len(times)
    latest_before = np.empty(n, dtype=np.float64)
    if n == 0:
        return OrderVerdicts(np.ones(0, bool), np.zeros(0, bool), latest_before)
    latest_before[0] = last_time
    np.maximum.accumulate(times[:-1], out=latest_before[1:])
    np.maximum(latest_before, last_time, out=latest_before)
    in_order = times > latest_before
    if in_order.all():
        return OrderVerdicts(in_order, np.zeros(n, bool), latest_before)
    # The value to compare a tie with: the latest record accepted before it.
    positions = np.where(in_order, np.arange(n), -1)
    np.maximum.accumulate(positions, out=positions)
    previous = np.concatenate(([-1], positions[:-1]))
    previous_value = np.where(previous >= 0, values[np.maximum(previous, 0)], last_value)
    duplicate = ~in_order & (times == latest_before) & (values == previous_value)
    return OrderVerdicts(in_order, duplicate, latest_before)


def rejection_reason(stream: str, time: float, latest_before: float) -> str:
    """The reason text, worded as the keyed joiner words it."""
    if time < latest_before:
        return (f"out_of_order: t={canonical_time(time)} older than last t={canonical_time(latest_before)} "
                f"of {stream}")
    return f"conflict: t={canonical_time(time)} equals last t of {stream} with a different result"
