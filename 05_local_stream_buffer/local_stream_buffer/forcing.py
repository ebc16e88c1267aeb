"""Forcing: the oldest pending records of one key's join resolved as they stand, so that a stalled stream
holds no more than a bound.

A pending record waits for its predecessor pair until the other stream reaches its time. When that takes
longer than ``max_latency_s`` (processing time), or a side holds more than ``max_pending_per_side`` pending
records, the oldest are *forced*: each gets the lagging stream's last record as predecessor, the lagging
stream's gap up to the newest forced record is closed (a record arriving inside it is *late* and not
joined), and the forced records are released except the newest, which stays as the anchor. Forced records
give up their successor pair (the stalled stream's next record), which keeps memory bounded.

`Forcing` is a base of :class:`local_stream_buffer.two_stream_join.TwoStreamJoin` and works on its state
(``_buffers``, ``_frontier``, ``_emit``, ``_release``, ``_delta``, ``_max_pending``, ``_watermark``,
``_max_latency``, ``_clock``, ``forced``, ``peak_buffer``): a base class rather than an object of its own,
so that the join's per-record path reaches it without a hop.
"""

from __future__ import annotations

from itertools import islice

from .cases import PREDECESSOR_CASE


class Forcing:
    """What forces pending records of a :class:`TwoStreamJoin`: its pending limit, ``max_latency_s`` and ``poll``."""

    __slots__ = ()

    def _grown(self, side: int, held: int) -> None:
        """A side holds more records than its peak so far or the pending limit: record the peak, enforce the limit."""
        if held > self.peak_buffer:
            self.peak_buffer = held
        max_pending = self._max_pending
        if held > max_pending:  # pending <= held: only then can the limit be exceeded
            pending = held - 1 if self._buffers[side][0][0] <= self._frontier[side ^ 1] else held
            if pending > max_pending:
                self._force_oldest(side, pending - max_pending)
        self._watermark = min(self.peak_buffer, max_pending)

    def poll(self) -> None:
        """Force pairs that waited longer than ``max_latency_s``, without a new record (call it when idle)."""
        if self._max_latency is not None:
            self._force_overdue(self._clock())

    def _leading_side(self) -> int | None:
        """The side holding pending records, if any."""
        for side in (0, 1):
            buffer = self._buffers[side]
            if buffer and buffer[-1][0] > self._frontier[side ^ 1]:
                return side
        return None

    def _force_overdue(self, now: float) -> None:
        lead = self._leading_side()
        if lead is None:
            return
        buffer = self._buffers[lead]
        deadline = now - self._max_latency
        first = 1 if buffer[0][0] <= self._frontier[lead ^ 1] else 0
        overdue = 0
        for entry in islice(buffer, first, None):
            if entry[3] >= deadline:
                break
            overdue += 1
        if overdue:
            self._force_oldest(lead, overdue)

    def _force_oldest(self, lead: int, count: int) -> None:
        """Resolve the ``count`` oldest pending records of the leading side as they stand (see module doc)."""
        lag = lead ^ 1
        pending = self._buffers[lead]
        lag_buffer = self._buffers[lag]
        lag_frontier = self._frontier[lag]
        last = lag_buffer[-1] if lag_buffer else None
        release = self._release
        skip_first = last is not None and last[0] == lag_frontier
        first = 0
        if pending[0][0] <= lag_frontier:
            anchor = pending[0]
            first = 1
            skip_first = skip_first and anchor[0] != lag_frontier
            if release is not None:
                release(anchor[2])
        case = PREDECESSOR_CASE[lead]
        delta = self._delta
        emit = self._emit
        newest = first + count - 1
        for index in range(first, newest + 1):
            record = pending[index]
            if last is not None:
                if skip_first:
                    skip_first = False
                elif record[0] - last[0] <= delta:
                    if lead:
                        emit(case, last, record)
                    else:
                        emit(case, record, last)
            if index < newest and release is not None:
                release(record[2])
        # The newest forced record stays: it is the predecessor of the stalled stream's next record.
        for _ in range(newest):
            pending.popleft()
        self._frontier[lag] = record[0]
        self.forced += count
