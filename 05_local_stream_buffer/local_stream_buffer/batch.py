"""The vectorised batch path: the same join as :class:`TwoStreamJoin`, on numpy arrays, for Spark and bulk loads.

``join_batch(state, left_times, left_values, right_times, right_values, delta_time_ms=...)`` takes the next
records of each side (each in its stream's time order, as many as there are, possibly none) and returns
the new state and the pairs that became certain. Because the emitted set does not depend on how the two
streams interleave, a batch needs no arrival order between its sides: the pairs emitted over any split of
the input into batches are exactly the pairs the per-record API emits for any interleaving (as long as no
forcing happens; forcing depends on arrival by nature). The state has the same shape as the per-record
state (the lagging side's last record, the leading side's anchor and pending records) and serialises to
bytes for Spark's state store.

Times are float64 milliseconds (the keyed adapters' epoch ms), as ``delta_time_ms``.
"""

from __future__ import annotations

import math
import struct
from typing import NamedTuple

import numpy as np

from .cases import JoinCase
from .order import order_verdicts
from .two_stream_join import DEFAULT_MAX_PENDING_PER_SIDE, LEFT, RIGHT

_FLOAT = np.float64
_EMPTY = np.empty(0, dtype=_FLOAT)
_NEVER = -math.inf
_SAME_TIME_CODE = int(JoinCase.SAME_TIME)
_SUCCESSOR_CODE = (int(JoinCase.LEFT_SUCCESSOR), int(JoinCase.RIGHT_SUCCESSOR))
_PREDECESSOR_CODE = (int(JoinCase.LEFT_PREDECESSOR), int(JoinCase.RIGHT_PREDECESSOR))

# Serialised state: format version, sizes of both sides, then per side frontier, last time, last value,
# then the counters, then the four arrays (left times, left values, right times, right values).
_HEADER = struct.Struct("<B2Q6d6Q")
_FORMAT_VERSION = 1


class PairArrays(NamedTuple):
    """Emitted pairs as parallel arrays; ``case`` holds :class:`JoinCase` codes. In no particular order."""

    left_time: np.ndarray
    left_value: np.ndarray
    right_time: np.ndarray
    right_value: np.ndarray
    case: np.ndarray

    @property
    def count(self) -> int:
        return len(self.case)


class BatchJoinState:
    """Join state of one key for the batch path: numpy arrays plus frontiers, order-check marks and counters."""

    __slots__ = ("times", "values", "frontier", "last_time", "last_value",
                 "records", "pairs", "duplicates", "rejected", "late", "forced")

    def __init__(self) -> None:
        self.times = [_EMPTY, _EMPTY]  # held records per side, in time order
        self.values = [_EMPTY, _EMPTY]
        self.frontier = [_NEVER, _NEVER]  # last time per side, or the time up to which forcing closed it
        self.last_time = [_NEVER, _NEVER]  # last time seen per side (late records included), for the order check
        self.last_value = [math.nan, math.nan]
        self.records = 0  # accepted records
        self.pairs = 0
        self.duplicates = 0
        self.rejected = 0
        self.late = 0
        self.forced = 0

    def held(self) -> int:
        """Number of records held by both sides."""
        return len(self.times[LEFT]) + len(self.times[RIGHT])

    def to_bytes(self) -> bytes:
        header = _HEADER.pack(
            _FORMAT_VERSION, len(self.times[LEFT]), len(self.times[RIGHT]),
            *self.frontier, *self.last_time, *self.last_value,
            self.records, self.pairs, self.duplicates, self.rejected, self.late, self.forced,
        )
        arrays = (self.times[LEFT], self.values[LEFT], self.times[RIGHT], self.values[RIGHT])
        return header + b"".join(np.ascontiguousarray(array, dtype="<f8").tobytes() for array in arrays)

    @classmethod
    def from_bytes(cls, data: bytes) -> BatchJoinState:
        fields = _HEADER.unpack_from(data)
        if fields[0] != _FORMAT_VERSION:
            raise ValueError(f"unknown join state format {fields[0]}")
        n_left, n_right = fields[1], fields[2]
        state = cls()
        state.frontier = list(fields[3:5])
        state.last_time = list(fields[5:7])
        state.last_value = list(fields[7:9])
        (state.records, state.pairs, state.duplicates, state.rejected, state.late, state.forced) = fields[9:15]
        arrays = np.frombuffer(data, dtype="<f8", offset=_HEADER.size).astype(_FLOAT)
        # Plain ints for the bounds: a numpy call here cost as much as the rest of the method.
        right_start = 2 * n_left
        state.times[LEFT] = arrays[:n_left]
        state.values[LEFT] = arrays[n_left:right_start]
        state.times[RIGHT] = arrays[right_start:right_start + n_right]
        state.values[RIGHT] = arrays[right_start + n_right:]
        return state

    def copy(self) -> BatchJoinState:
        """A copy sharing the (never modified in place) arrays."""
        state = BatchJoinState()
        state.times = list(self.times)
        state.values = list(self.values)
        state.frontier = list(self.frontier)
        state.last_time = list(self.last_time)
        state.last_value = list(self.last_value)
        state.records, state.pairs, state.duplicates = self.records, self.pairs, self.duplicates
        state.rejected, state.late, state.forced = self.rejected, self.late, self.forced
        return state


def join_batch(
    state: BatchJoinState | None,
    left_times: np.ndarray,
    left_values: np.ndarray,
    right_times: np.ndarray,
    right_values: np.ndarray,
    delta_time_ms: float | None = None,
    max_pending_per_side: int = DEFAULT_MAX_PENDING_PER_SIDE,
) -> tuple[BatchJoinState, PairArrays]:
    """Join the next records of both sides into ``state`` (None: a fresh key); returns (new state, pairs).

    Per side, records are checked against the stream order as in the per-record API: an exact duplicate of
    the previous record is dropped, an older one (or one at the same time with another value) rejected, one
    inside a gap closed by forcing counted late; the state's counters say how many. The input state is not
    modified.
    """
    if max_pending_per_side < 1:
        raise ValueError("max_pending_per_side must be at least 1")
    old = state if state is not None else BatchJoinState()
    new = old.copy()
    delta = math.inf if delta_time_ms is None else delta_time_ms
    accepted = [
        _accept_in_order(new, LEFT, left_times, left_values),
        _accept_in_order(new, RIGHT, right_times, right_values),
    ]
    times = [_append(old.times[side], accepted[side][0]) for side in (LEFT, RIGHT)]
    values = [_append(old.values[side], accepted[side][1]) for side in (LEFT, RIGHT)]
    for side in (LEFT, RIGHT):
        if len(accepted[side][0]):
            new.frontier[side] = float(accepted[side][0][-1])
    n_old = (len(old.times[LEFT]), len(old.times[RIGHT]))
    pairs = _gather(_certain_new_pairs(times, n_old, old.frontier, delta), times, values)
    _trim(new, times, values)
    forced = _force_over_limit(new, max_pending_per_side, delta)
    if forced is not None:
        pairs = PairArrays(*(np.concatenate(columns) for columns in zip(pairs, forced)))
    new.records += len(accepted[LEFT][0]) + len(accepted[RIGHT][0])
    new.pairs += pairs.count
    return new, pairs


def _append(held: np.ndarray, arriving: np.ndarray) -> np.ndarray:
    return np.concatenate((held, arriving)) if len(held) else arriving


def _accept_in_order(state: BatchJoinState, side: int, times: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The records of one side that continue its stream; updates the order marks and counters of ``state``."""
    times = np.asarray(times, dtype=_FLOAT)
    values = np.asarray(values, dtype=_FLOAT)
    if times.shape != values.shape or times.ndim != 1:
        raise ValueError("times and values must be 1-d arrays of the same length")
    if not len(times):
        return times, values
    last_time = state.last_time[side]
    # np.count_nonzero rather than .all()/.any(): those go through Python-level wrappers, which cost more
    # than the whole comparison on the small batches that Spark's buckets hand over per key.
    if times[0] <= last_time or np.count_nonzero(times[1:] > times[:-1]) != len(times) - 1:
        times, values = _drop_out_of_order(state, side, times, values)
        if not len(times):
            return times, values
    state.last_time[side] = float(times[-1])
    state.last_value[side] = float(values[-1])
    if times[0] > state.frontier[side]:
        return times, values
    # Records inside a gap closed by forcing are late (a prefix, the times being ordered now).
    n_late = int(times.searchsorted(state.frontier[side], side="right"))
    state.late += n_late
    return times[n_late:], values[n_late:]


def _drop_out_of_order(state: BatchJoinState, side: int, times: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Keep the records that continue the stream; count the others as duplicates or rejected (see order.py)."""
    verdicts = order_verdicts(times, values, state.last_time[side], state.last_value[side])
    n_duplicates = int(np.count_nonzero(verdicts.duplicate))
    state.duplicates += n_duplicates
    state.rejected += len(times) - int(np.count_nonzero(verdicts.in_order)) - n_duplicates
    return times[verdicts.in_order], values[verdicts.in_order]


IndexPieces = list[tuple[np.ndarray, np.ndarray, int]]  # (left indices, right indices, their case code)


def _certain_new_pairs(times: list[np.ndarray], n_old: tuple[int, int], old_frontier: list[float], delta: float) -> IndexPieces:
    """The pairs that are certain now and were not before, as indices into ``times``.

    Each pair is found once, by its case: same-time and left-successor pairs from the left records'
    successors, right-successor pairs from the right records' successors, and predecessor pairs from each
    record's predecessor when the other side has reached it and the pair is not also a successor pair.
    A pair is new if one of its records is, or if it is the predecessor pair of an old record that the
    other side had not reached (nor forcing closed) before. The first ``n_old`` records per side are old.
    """
    pieces: IndexPieces = []
    if not len(times[LEFT]) or not len(times[RIGHT]):
        return pieces
    limited = math.isfinite(delta)
    for side in (LEFT, RIGHT):
        other = side ^ 1
        own, theirs = times[side], times[other]
        # Only the records up to the other side's last time have a successor and a certain predecessor.
        count = int(own.searchsorted(theirs[-1], side="right"))
        if not count:
            continue
        own_time = own[:count]
        partner = theirs.searchsorted(own_time, side="left")
        partner_time = theirs[partner]
        tie = partner_time == own_time
        has_old = n_old[side] or n_old[other]

        # Successor pairs (same-time pairs once, from the left): new if one of the two records is.
        any_tie = np.count_nonzero(tie) > 0
        if not (limited or has_old or any_tie):
            # Every record up to the other side's last time, with its successor: nothing to select.
            pieces.append(_oriented(side, np.arange(count), partner, _SUCCESSOR_CODE[side]))
        else:
            # Masks are combined as they come: np.ones, like .any(), is a Python-level function.
            keep = partner_time - own_time <= delta if limited else None
            if has_old:
                new = partner >= n_old[other]
                new[n_old[side]:] = True
                keep = new if keep is None else keep & new
            if keep is None:
                keep = np.ones(count, dtype=bool)
            if any_tie:
                if side == LEFT:
                    index = (keep & tie).nonzero()[0]
                    pieces.append(_oriented(side, index, partner[index], _SAME_TIME_CODE))
                keep &= ~tie
            index = keep.nonzero()[0]
            pieces.append(_oriented(side, index, partner[index], _SUCCESSOR_CODE[side]))

        # Predecessor pairs, left out where the times tie (that is the same-time pair) or where the record
        # is its predecessor's successor (then it is that successor pair).
        # Where before is -1, theirs[before] wraps to the other side's last time; the own_previous test then
        # fails as it should, because every own time here is at most that last time.
        before = partner - 1
        before_time = theirs[before]
        own_previous = np.empty(count)
        own_previous[0] = -math.inf
        own_previous[1:] = own_time[:-1]
        keep = own_previous >= before_time
        if any_tie:
            keep &= ~tie
        if limited:
            keep &= own_time - before_time <= delta
        if has_old:
            new = (before >= n_old[other]) | (own_time > old_frontier[other])
            new[n_old[side]:] = True
            keep &= new
        index = keep.nonzero()[0]
        pieces.append(_oriented(side, index, before[index], _PREDECESSOR_CODE[side]))
    return pieces


def _oriented(side: int, own: np.ndarray, theirs: np.ndarray, code: int) -> tuple[np.ndarray, np.ndarray, int]:
    return (theirs, own, code) if side else (own, theirs, code)


def _gather(pieces: IndexPieces, times: list[np.ndarray], values: list[np.ndarray]) -> PairArrays:
    if not pieces:
        return PairArrays(_EMPTY, _EMPTY, _EMPTY, _EMPTY, np.empty(0, dtype=np.int8))
    lefts, rights, codes = zip(*pieces)
    left, right = np.concatenate(lefts), np.concatenate(rights)
    case = np.empty(len(left), dtype=np.int8)
    start = 0
    for piece, code in zip(lefts, codes):
        case[start:start + len(piece)] = code
        start += len(piece)
    return PairArrays(times[LEFT][left], values[LEFT][left], times[RIGHT][right], values[RIGHT][right], case)


def _trim(state: BatchJoinState, times: list[np.ndarray], values: list[np.ndarray]) -> None:
    """Keep what can still pair: the lagging side's last record, the leading side's anchor and pending records."""
    frontier = state.frontier
    for side in (LEFT, RIGHT):
        other_frontier = frontier[side ^ 1]
        if frontier[side] <= other_frontier:
            start = max(len(times[side]) - 1, 0)  # lagging or level: the last record only
        else:
            anchor = int(times[side].searchsorted(other_frontier, side="right")) - 1
            start = max(anchor, 0)
        state.times[side] = times[side][start:]
        state.values[side] = values[side][start:]


def _force_over_limit(state: BatchJoinState, limit: int, delta: float) -> PairArrays | None:
    """Resolve the oldest pending records beyond ``limit`` as they stand (see two_stream_join's doc)."""
    lead = LEFT if state.frontier[LEFT] > state.frontier[RIGHT] else RIGHT
    lag = lead ^ 1
    lead_times = state.times[lead]
    lag_frontier = state.frontier[lag]
    if not len(lead_times) or state.frontier[lead] <= lag_frontier:
        return None  # level: nothing pending
    anchored = bool(lead_times[0] <= lag_frontier)
    start = 1 if anchored else 0
    count = len(lead_times) - start - limit
    if count <= 0:
        return None
    forced = np.arange(start, start + count)
    lag_times = state.times[lag]
    pairs = None
    if len(lag_times):
        last = lag_times[-1]
        # The first pending record is the last lagging record's successor (already paired) unless the
        # anchor ties with that record or forcing already moved the frontier past it.
        if last == lag_frontier and not (anchored and lead_times[0] == lag_frontier):
            forced = forced[1:]
        forced = forced[lead_times[forced] - last <= delta]
        last_index = np.full(len(forced), len(lag_times) - 1)
        pairs = _gather([_oriented(lead, forced, last_index, _PREDECESSOR_CODE[lead])], state.times, state.values)
    newest = start + count - 1  # stays as the anchor: the predecessor of the stalled side's next record
    state.frontier[lag] = float(lead_times[newest])
    state.times[lead] = lead_times[newest:]
    state.values[lead] = state.values[lead][newest:]
    state.forced += int(count)
    return pairs
