"""The join of two in-order streams of one key: the state machine behind every API of this package.

Each stream (side 0 = left, side 1 = right) arrives in its own time order; how the two interleave is
arbitrary. Every record pairs with its predecessor (latest record of the other stream at or before its
time) and its successor (earliest record of the other stream at or after its time). A successor pair is
emitted as soon as both records are there; a predecessor pair once the other stream has reached the
record's time (before that a record could still arrive in between). The emitted set therefore depends
only on the two streams, not on their interleaving. See the package README for the full contract.

State invariant after every step, with the *lagging* stream being the one with the smaller frontier
(its last time, or the time up to which forcing closed it):

* the lagging stream holds only its last record (the predecessor of the other stream's next records);
* the leading stream holds its latest record at or before the lagging frontier (the *anchor*: the
  predecessor of the lagging stream's next record) and every record after that frontier (*pending*:
  their predecessor pair is not certain yet).

So the state is O(pending records), never O(history). Records leaving the state are handed to the
release hook exactly once.

Forcing (``max_latency_s`` overdue or more than ``max_pending_per_side`` pending) resolves the oldest
pending records as they stand, closing the lagging stream's gap up to them (`forcing`).
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Any, Callable, Iterator

from .cases import PREDECESSOR_CASE, SUCCESSOR_CASE, JoinCase
from .forcing import Forcing
from .status import IngestStatus

LEFT = 0
RIGHT = 1

# Pending records per side and key before the oldest are forced. Far above what any in-order pair of
# streams needs (the seed's test cases stay below a few hundred), low enough to bound a stalled stream.
DEFAULT_MAX_PENDING_PER_SIDE = 10_000

# A buffered record: (time, result, the caller's item, arrival time on the injected clock).
Entry = tuple[float, Any, Any, float]
# Called with (case code, left entry, right entry) for every emitted pair; the code is a JoinCase value.
PairSink = Callable[[int, Entry, Entry], None]

_SAME_TIME = int(JoinCase.SAME_TIME)
_ACCEPTED = IngestStatus.ACCEPTED
_DUPLICATE = IngestStatus.DUPLICATE
_REJECTED = IngestStatus.REJECTED
_LATE = IngestStatus.LATE
_NEVER = -math.inf
_UNBOUNDED = math.inf


class TwoStreamJoin(Forcing):
    """Join state of one key: two buffers, their frontiers and counters.

    :param emit: called with (case, left entry, right entry) for each pair, in a deterministic order.
    :param release: called with the caller's item when a record leaves the state (the seed's commit hook).
    :param delta_time_ms: pairs farther apart than this are not emitted (times are in milliseconds: the keyed
        adapters' epoch ms; the seed-compatible ``StreamBuffer`` converts its seconds).
    :param max_pending_per_side: pending records per side beyond which the oldest are forced.
    :param max_latency_s: processing-time seconds a pending predecessor pair may wait before it is forced.
    :param clock: processing-time clock in seconds for ``max_latency_s`` (injectable for tests).
    """

    __slots__ = (
        "_buffers", "_sides", "_frontier", "_last_time", "_last_value", "_emit", "_release", "_delta",
        "_max_pending", "_watermark", "_max_latency", "_clock",
        "duplicates", "rejected", "late", "forced", "peak_buffer",
    )

    def __init__(
        self,
        emit: PairSink,
        release: Callable[[Any], None] | None = None,
        delta_time_ms: float | None = None,
        max_pending_per_side: int = DEFAULT_MAX_PENDING_PER_SIDE,
        max_latency_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_pending_per_side < 1:
            raise ValueError("max_pending_per_side must be at least 1")
        self._buffers: tuple[deque[Entry], deque[Entry]] = (deque(), deque())
        # Per side: its buffer, the other side's buffer and the other side.
        self._sides = ((self._buffers[LEFT], self._buffers[RIGHT], RIGHT), (self._buffers[RIGHT], self._buffers[LEFT], LEFT))
        self._frontier = [_NEVER, _NEVER]
        # Last time and result seen per stream, for the order check (late records count as seen).
        self._last_time = [_NEVER, _NEVER]
        self._last_value: list[Any] = [None, None]
        self._emit = emit
        self._release = release
        self._delta = math.inf if delta_time_ms is None else delta_time_ms
        self._max_pending = max_pending_per_side
        self._watermark = 0  # min(peak_buffer, max_pending): a side growing beyond it needs a look
        self._max_latency = max_latency_s
        self._clock = clock
        self.duplicates = 0
        self.rejected = 0
        self.late = 0
        self.forced = 0  # pending records resolved early by max_latency or the pending limit
        self.peak_buffer = 0  # largest number of records held by one side

    def last_time(self, side: int) -> float:
        """Time of the last record seen on a side (-inf before the first)."""
        return self._last_time[side]

    def buffer(self, side: int) -> deque[Entry]:
        """The entries a side holds (read-only view for inspection)."""
        return self._buffers[side]

    def held_items(self) -> Iterator[Any]:
        """The caller's items of all held records."""
        for buffer in self._buffers:
            for entry in buffer:
                yield entry[2]

    def __len__(self) -> int:
        return len(self._buffers[0]) + len(self._buffers[1])

    def ingest(self, side: int, t: float, value: Any, item: Any) -> IngestStatus:
        """Add the next record of a side and emit every pair it makes certain.

        The hot path of the package, hence written out in one function with local names, and with the
        bookkeeping that the defaults make unnecessary (delta_time_ms, release hook, max_latency_s) skipped.
        """
        last_time = self._last_time
        if t <= last_time[side]:
            return self._out_of_order(side, t, value)
        last_time[side] = t
        self._last_value[side] = value
        frontier = self._frontier
        own_frontier = frontier[side]
        if t <= own_frontier:
            self.late += 1
            return _LATE
        frontier[side] = t
        max_latency = self._max_latency
        entry = (t, value, item, 0.0 if max_latency is None else self._clock())
        own, theirs, other = self._sides[side]
        # A stream that already leads cannot pair yet: the other holds nothing after its frontier.
        if theirs and frontier[other] >= own_frontier:
            emit = self._emit
            delta = self._delta
            unbounded = delta == _UNBOUNDED
            if own:
                prev = own[-1]
                prev_time = prev[0]
            else:
                prev = None
                prev_time = _NEVER
            anchor = theirs[0]
            anchor_time = anchor[0]
            if anchor_time > own_frontier:
                anchor = None
            # The first record after the frontier is prev's successor unless the anchor ties with prev;
            # that pair came when the later of the two arrived, so it must not come again as a predecessor pair.
            skip_first = prev is not None and prev_time == own_frontier and (anchor is None or anchor_time != own_frontier)
            successor_of_theirs = SUCCESSOR_CASE[other]
            successor = None
            at_or_before = 0  # records of theirs at or before t
            in_range = False
            tie = False
            for record in theirs:
                record_time = record[0]
                if record_time > t:
                    successor = record
                    break
                at_or_before += 1
                if record_time <= own_frontier:
                    continue  # the anchor
                in_range = True
                if record_time == t:
                    tie = True
                    if side:
                        emit(_SAME_TIME, record, entry)
                    else:
                        emit(_SAME_TIME, entry, record)
                    continue
                # The new record is this record's successor ...
                if unbounded or t - record_time <= delta:
                    if side:
                        emit(successor_of_theirs, record, entry)
                    else:
                        emit(successor_of_theirs, entry, record)
                # ... and prev (the previous record of the new record's stream) is now certainly its predecessor.
                if skip_first:
                    skip_first = False
                elif prev is not None and (unbounded or record_time - prev_time <= delta):
                    if side:
                        emit(PREDECESSOR_CASE[other], record, prev)
                    else:
                        emit(PREDECESSOR_CASE[other], prev, record)
            if successor is not None and not tie and (unbounded or successor[0] - t <= delta):
                if side:
                    emit(SUCCESSOR_CASE[side], successor, entry)
                else:
                    emit(SUCCESSOR_CASE[side], entry, successor)
            if anchor is not None and (unbounded or t - anchor_time <= delta):
                if prev is None or anchor_time > prev_time:
                    # Forcing closed this stream's gap up to the anchor, so the new record is its successor.
                    if side:
                        emit(successor_of_theirs, anchor, entry)
                    else:
                        emit(successor_of_theirs, entry, anchor)
                elif not in_range and successor is not None:
                    # Nothing between the frontier and t, and the other stream is past t: the anchor is certainly
                    # the new record's predecessor (the pair the seed lost under shuffled arrival).
                    if side:
                        emit(PREDECESSOR_CASE[side], anchor, entry)
                    else:
                        emit(PREDECESSOR_CASE[side], entry, anchor)
            release = self._release
            if successor is not None or theirs[-1][0] == t:
                # This stream is now behind (or level): it keeps only the new record, the other one its
                # latest record at or before t plus everything after t.
                if release is not None:
                    for dropped in own:
                        release(dropped[2])
                own.clear()
                own.append(entry)
                if at_or_before > 1:
                    popleft = theirs.popleft
                    for _ in range(at_or_before - 1):
                        dropped = popleft()
                        if release is not None:
                            release(dropped[2])
                if max_latency is not None:
                    self._force_overdue(entry[3])
                return _ACCEPTED
            # This stream now leads: the other keeps only its last record.
            if len(theirs) > 1:
                last = theirs.pop()
                if release is not None:
                    for dropped in theirs:
                        release(dropped[2])
                theirs.clear()
                theirs.append(last)
        own.append(entry)
        held = len(own)
        if held > self._watermark:
            self._grown(side, held)
        if max_latency is not None:
            self._force_overdue(entry[3])
        return _ACCEPTED

    def close(self, side: int, item: Any) -> None:
        """End a side's stream: a last record at +inf (``item`` its caller's item), after which the side takes no
        record. Every pair the other stream still waits for that needs no later record of this side comes out;
        the pairs with the +inf record itself are the caller's to drop (they are never within a finite
        ``delta_time_ms``). It never becomes overdue for ``max_latency_s``: forcing it would close the other stream."""
        max_latency_s, self._max_latency = self._max_latency, None
        try:
            self.ingest(side, _UNBOUNDED, 0.0, item)
        finally:
            self._max_latency = max_latency_s
        own = self._buffers[side]
        if own and own[-1][0] == _UNBOUNDED:
            own[-1] = (_UNBOUNDED, 0.0, item, _UNBOUNDED)

    def _out_of_order(self, side: int, t: float, value: Any) -> IngestStatus:
        if t == self._last_time[side] and value == self._last_value[side]:
            self.duplicates += 1
            return _DUPLICATE
        self.rejected += 1
        return _REJECTED
