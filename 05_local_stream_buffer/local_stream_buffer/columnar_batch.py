"""The batch join of many keys at once: :func:`local_stream_buffer.batch.join_batch` over columns of keys.

``join_batch`` costs a few dozen numpy calls per key, whatever the key's size: about 130 µs. With many
machines each sending a few records per micro-batch, that per-key cost is the whole cost. Here the same
join runs for every key of a batch together, each step one numpy call over all keys' records, with the
keys told apart by segment (a key's records lie together, in time order per side). Its states are read
from and written to the bytes :class:`BatchJoinState` stores, many at a time.

It takes the common case only: per key and side, the records continue the stream (each later than the
one before and than the state's last and frontier times), so no record is dropped, rejected or late, and no
reorder buffer stands in front. :mod:`local_stream_buffer.keyed_batch` hands every other key to
``join_batch`` one by one. The pairs and the states are exactly ``join_batch``'s, forcing included: the few
keys left with more pending records than the bound are forced with its own code.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from .batch import (_FORMAT_VERSION, _HEADER, _PREDECESSOR_CODE, _SAME_TIME_CODE, _SUCCESSOR_CODE, BatchJoinState,
                    PairArrays, _force_over_limit, _oriented)
from .two_stream_join import LEFT, RIGHT

_FLOAT = np.float64
_NO_INDEX = np.empty(0, dtype=np.int64)

# BatchJoinState's serialised header (batch._HEADER, "<B2Q6d6Q") as a packed numpy record.
_HEADER_DTYPE = np.dtype([("version", "u1"), ("held", "<u8", (2,)), ("frontier", "<f8", (2,)),
                          ("last_time", "<f8", (2,)), ("last_value", "<f8", (2,)), ("counters", "<u8", (6,))])
assert _HEADER_DTYPE.itemsize == _HEADER.size
_RECORDS, _PAIRS = 0, 1  # indices of the counters (records, pairs, duplicates, rejected, late, forced)


def segment_positions(counts: np.ndarray) -> np.ndarray:
    """For segments of the given lengths laid end to end: each element's position within its segment."""
    total = int(counts.sum())
    starts = np.cumsum(counts) - counts
    return np.arange(total, dtype=np.int64) - np.repeat(starts, counts)


class StateColumns(NamedTuple):
    """The join states of K keys as columns: per side, the held records of all keys laid key after key."""

    held: np.ndarray  # int64 (K, 2): held records per key and side
    times: tuple[np.ndarray, np.ndarray]  # per side: float64, the held times of key 0, then key 1, ...
    values: tuple[np.ndarray, np.ndarray]
    frontier: np.ndarray  # float64 (K, 2)
    last_time: np.ndarray  # float64 (K, 2)
    last_value: np.ndarray  # float64 (K, 2)
    counters: np.ndarray  # int64 (K, 6): records, pairs, duplicates, rejected, late, forced

    @classmethod
    def from_bytes(cls, blobs: Sequence[bytes | None]) -> StateColumns:
        """The states of :meth:`BatchJoinState.to_bytes` blobs (None: a fresh key)."""
        keys = len(blobs)
        stored = np.fromiter((blob is not None for blob in blobs), dtype=bool, count=keys)
        headers = np.zeros(keys, dtype=_HEADER_DTYPE)
        headers["version"] = _FORMAT_VERSION
        headers["frontier"] = headers["last_time"] = -math.inf
        headers["last_value"] = math.nan
        present = [blob for blob in blobs if blob is not None]
        if not present:
            empty = np.empty(0, dtype=_FLOAT)
            return cls._of(headers, (empty, empty), (empty, empty))
        lengths = np.fromiter(map(len, present), dtype=np.int64, count=len(present))
        starts = np.cumsum(lengths) - lengths
        buffer = np.frombuffer(b"".join(present), dtype=np.uint8)
        read = buffer[starts[:, None] + np.arange(_HEADER.size)].view(_HEADER_DTYPE).ravel()
        if np.count_nonzero(read["version"] != _FORMAT_VERSION):
            raise ValueError(f"unknown join state format {sorted(set(read['version'].tolist()))}")
        headers[stored] = read
        held = read["held"].astype(np.int64)
        floats = 2 * held.sum(axis=1)
        if np.any(lengths != _HEADER.size + 8 * floats):
            raise ValueError("join state bytes of the wrong length")
        # Every stored float, blob after blob: (left times, left values, right times, right values) per key.
        first_byte = np.repeat(starts + _HEADER.size, floats) + 8 * segment_positions(floats)
        numbers = buffer[first_byte[:, None] + np.arange(8)].view("<f8").ravel().astype(_FLOAT)
        position = segment_positions(floats)
        n_left, n_right = np.repeat(held[:, LEFT], floats), np.repeat(held[:, RIGHT], floats)
        part = ((position >= n_left).astype(np.int8) + (position >= 2 * n_left) + (position >= 2 * n_left + n_right))
        return cls._of(headers, (numbers[part == 0], numbers[part == 2]), (numbers[part == 1], numbers[part == 3]))

    @classmethod
    def _of(cls, headers: np.ndarray, times: tuple, values: tuple) -> StateColumns:
        return cls(headers["held"].astype(np.int64), times, values, headers["frontier"].astype(_FLOAT),
                   headers["last_time"].astype(_FLOAT), headers["last_value"].astype(_FLOAT),
                   headers["counters"].astype(np.int64))

    def to_bytes(self) -> list[bytes]:
        """Per key, the bytes :meth:`BatchJoinState.to_bytes` writes for its state."""
        keys = len(self.held)
        if not keys:
            return []
        headers = np.zeros(keys, dtype=_HEADER_DTYPE)
        headers["version"] = _FORMAT_VERSION
        headers["held"] = self.held
        headers["frontier"], headers["last_time"], headers["last_value"] = self.frontier, self.last_time, self.last_value
        headers["counters"] = self.counters
        floats = 2 * self.held.sum(axis=1)
        lengths = _HEADER.size + 8 * floats
        ends = np.cumsum(lengths)
        starts = ends - lengths
        out = np.empty(int(ends[-1]), dtype=np.uint8)
        out[starts[:, None] + np.arange(_HEADER.size)] = headers.view(np.uint8).reshape(keys, _HEADER.size)
        # Each held number's place among its key's floats: left times, left values, right times, right values.
        float_starts = np.cumsum(floats) - floats
        numbers = np.empty(int(floats.sum()), dtype="<f8")
        n_left = self.held[:, LEFT]
        for side, offsets in ((LEFT, (np.zeros_like(n_left), n_left)), (RIGHT, (2 * n_left, 2 * n_left + self.held[:, RIGHT]))):
            key = np.repeat(np.arange(keys), self.held[:, side])
            base = float_starts[key] + segment_positions(self.held[:, side])
            numbers[base + offsets[0][key]] = self.times[side]
            numbers[base + offsets[1][key]] = self.values[side]
        first_byte = np.repeat(starts + _HEADER.size, floats) + 8 * segment_positions(floats)
        out[first_byte[:, None] + np.arange(8)] = numbers.view(np.uint8).reshape(-1, 8)
        data = out.tobytes()
        return [data[start:end] for start, end in zip(starts.tolist(), ends.tolist())]


class ColumnarPairs(NamedTuple):
    key: np.ndarray  # int per pair: index into the call's keys
    pairs: PairArrays


def continues_streams(state: StateColumns, first_time: np.ndarray, has_rows: np.ndarray) -> np.ndarray:
    """Per key: its arriving records (``first_time`` of each side's, ``has_rows`` per side) start after the
    state's last and frontier times on both sides; rising within the batch is the caller's check."""
    later = (first_time > state.last_time) & (first_time > state.frontier)
    return np.all(later | ~has_rows, axis=1)


def join_columns(state: StateColumns, arriving: np.ndarray, times: Sequence[np.ndarray], values: Sequence[np.ndarray],
                 delta_time_ms: np.ndarray, max_pending_per_side: int) -> tuple[list[bytes], ColumnarPairs]:
    """Join the next records of K keys into their states: the new states as bytes, and the pairs, by key.

    ``arriving`` (int64, (K, 2)) counts each key's next records per side; ``times``/``values`` hold them per
    side, key after key, each key's in time order, all later than its state's last and frontier times
    (:func:`continues_streams`). ``delta_time_ms`` is per key (inf: unlimited).
    """
    keys = len(arriving)
    total = state.held + arriving
    starts = np.cumsum(total, axis=0) - total
    key_of = [np.repeat(np.arange(keys), total[:, side]) for side in (LEFT, RIGHT)]
    local = [segment_positions(total[:, side]) for side in (LEFT, RIGHT)]
    all_times, all_values = [], []
    for side in (LEFT, RIGHT):
        # The held records, then the arriving ones, per key.
        is_new = local[side] >= state.held[key_of[side], side]
        side_times = np.empty(len(is_new), dtype=_FLOAT)
        side_values = np.empty(len(is_new), dtype=_FLOAT)
        side_times[~is_new], side_values[~is_new] = state.times[side], state.values[side]
        side_times[is_new], side_values[is_new] = times[side], values[side]
        all_times.append(side_times)
        all_values.append(side_values)
    # A key-major sort key per record: search one key's records by time with one call for all keys.
    distinct, rank = np.unique(np.concatenate(all_times), return_inverse=True)
    split = len(all_times[LEFT])
    ordered = [key_of[LEFT] * len(distinct) + rank[:split], key_of[RIGHT] * len(distinct) + rank[split:]]

    frontier = state.frontier.copy()
    last_time, last_value = state.last_time.copy(), state.last_value.copy()
    for side in (LEFT, RIGHT):
        has_new = arriving[:, side] > 0
        last = (starts[:, side] + total[:, side] - 1)[has_new]
        frontier[has_new, side] = last_time[has_new, side] = all_times[side][last]
        last_value[has_new, side] = all_values[side][last]

    pieces = [piece for side in (LEFT, RIGHT) for piece in
              _certain_new_pairs(side, all_times, ordered, key_of, local, starts, total, state, delta_time_ms)]
    lefts, rights, codes = zip(*pieces) if pieces else ((_NO_INDEX,), (_NO_INDEX,), (_SAME_TIME_CODE,))
    left, right = np.concatenate(lefts), np.concatenate(rights)
    case = np.repeat(np.array(codes, dtype=np.int8), [len(piece) for piece in lefts])
    pair_key = key_of[LEFT][left]
    pairs = PairArrays(all_times[LEFT][left], all_values[LEFT][left], all_times[RIGHT][right],
                       all_values[RIGHT][right], case)
    counters = state.counters.copy()
    counters[:, _RECORDS] += arriving.sum(axis=1)
    counters[:, _PAIRS] += np.bincount(pair_key, minlength=keys)

    held_times, held_values, held = [], [], np.empty_like(total)
    for side in (LEFT, RIGHT):
        # Keep what can still pair: the lagging side's last record, the leading side's anchor and pending ones.
        other_frontier = frontier[:, side ^ 1]
        lagging = frontier[:, side] <= other_frontier
        at_or_before = np.bincount(key_of[side], weights=(all_times[side] <= other_frontier[key_of[side]]).astype(_FLOAT),
                                   minlength=keys).astype(np.int64)
        first_kept = np.maximum(np.where(lagging, total[:, side] - 1, at_or_before - 1), 0)
        kept = local[side] >= first_kept[key_of[side]]
        held_times.append(all_times[side][kept])
        held_values.append(all_values[side][kept])
        held[:, side] = total[:, side] - np.minimum(first_kept, total[:, side])
    joined = StateColumns(held, tuple(held_times), tuple(held_values), frontier, last_time, last_value, counters)
    stored = joined.to_bytes()

    # Forcing: rare (a side far ahead of the other), so the few keys that may need it go through join_batch's own.
    lead = np.where(frontier[:, LEFT] > frontier[:, RIGHT], LEFT, RIGHT)
    may_force = np.flatnonzero(held[np.arange(keys), lead] > max_pending_per_side)
    key_parts, pair_parts = [pair_key], [pairs]
    for key in may_force.tolist():
        forced_state = BatchJoinState.from_bytes(stored[key])
        forced = _force_over_limit(forced_state, max_pending_per_side, float(delta_time_ms[key]))
        if forced is not None:  # None: nothing to force, or nothing on the other side to pair with
            forced_state.pairs += forced.count
            key_parts.append(np.full(forced.count, key, dtype=np.int64))
            pair_parts.append(forced)
        stored[key] = forced_state.to_bytes()
    if len(pair_parts) > 1:
        pairs = PairArrays(*(np.concatenate(column) for column in zip(*pair_parts)))
    return stored, ColumnarPairs(np.concatenate(key_parts), pairs)


def _certain_new_pairs(side: int, times: list[np.ndarray], ordered: list[np.ndarray], key_of: list[np.ndarray],
                       local: list[np.ndarray], starts: np.ndarray, total: np.ndarray, state: StateColumns,
                       delta_time_ms: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """``batch._certain_new_pairs`` for one side's records of every key: (left, right, case) index pieces.

    The rule, per record with the other side reaching it: its successor pair (or same-time pair, from the
    left) when one of the two records is new; its predecessor pair when it is not also a successor pair and
    is new (one record new, or the other side had not reached the record before).
    """
    other = side ^ 1
    own, theirs = times[side], times[other]
    if not len(own) or not len(theirs):
        return []
    keys = len(total)
    has_theirs = total[:, other] > 0
    their_last = np.full(keys, -math.inf)
    their_last[has_theirs] = theirs[(starts[:, other] + total[:, other] - 1)[has_theirs]]
    reached = np.flatnonzero(own <= their_last[key_of[side]])
    key = key_of[side][reached]
    own_time = own[reached]
    partner = np.searchsorted(ordered[other], ordered[side][reached], side="left")
    partner_local = partner - starts[key, other]
    partner_time = theirs[partner]
    tie = partner_time == own_time
    delta = delta_time_ms[key]
    own_new = local[side][reached] >= state.held[key, side]
    old_other = state.held[key, other]

    keep = (partner_time - own_time <= delta) & ((partner_local >= old_other) | own_new)
    pieces = []
    if side == LEFT:
        same = np.flatnonzero(keep & tie)
        pieces.append((reached[same], partner[same], _SAME_TIME_CODE))
    successor = np.flatnonzero(keep & ~tie)
    pieces.append(_oriented(side, reached[successor], partner[successor], _SUCCESSOR_CODE[side]))

    before = partner - 1
    has_before = partner_local >= 1
    before_time = np.where(has_before, theirs[np.maximum(before, 0)], math.inf)
    own_previous = np.where(local[side][reached] >= 1, own[np.maximum(reached - 1, 0)], -math.inf)
    keep = (has_before & (own_previous >= before_time) & ~tie & (own_time - before_time <= delta)
            & ((partner_local - 1 >= old_other) | (own_time > state.frontier[key, other]) | own_new))
    predecessor = np.flatnonzero(keep)
    pieces.append(_oriented(side, reached[predecessor], before[predecessor], _PREDECESSOR_CODE[side]))
    return pieces

