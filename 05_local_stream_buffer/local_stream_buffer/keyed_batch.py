"""The keyed batch join: many join keys' records at once, in any row order, into their batch states.

Built for the Spark job, whose stateful step hands over the rows of many keys (things and spec bindings)
per call, after a shuffle that kept no order. :func:`join_keyed_batch` puts each stream back into its
source order, names the records the order verdict rejects (with their reasons), and runs
:func:`local_stream_buffer.batch.join_batch` once per key. States are kept as bytes per key, as a state
store holds them. The pairs equal the keyed joiner's on the same streams, pair for pair.
"""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence
from typing import NamedTuple

import numpy as np

from .batch import BatchJoinState, PairArrays, join_batch
from .order import order_verdicts
from .rejections import order_rejection
from .reorder import is_reordered, join_reordered, rejected_rows
from .specs import SpecBinding
from .two_stream_join import DEFAULT_MAX_PENDING_PER_SIDE, LEFT, RIGHT

JoinKey = tuple[str, SpecBinding]  # a thing and the spec binding it joins under
StateKey = tuple[str, str, str]  # (thing, spec name, axis): how a key's state is stored

_NO_ROWS = np.empty(0, dtype=np.int64)


def state_key(thing: str, binding: SpecBinding) -> StateKey:
    """The key a join key's state is stored under: plain strings, stable across runs and spec file edits."""
    return thing, binding.spec.name, binding.axis


class KeyedRows(NamedTuple):
    """Records routed to join keys, in any row order; one row per (record, key it feeds)."""

    keys: Sequence[JoinKey]  # the join keys of these rows
    key: np.ndarray  # int per row: index into keys
    side: np.ndarray  # int per row: LEFT or RIGHT
    partition: np.ndarray  # int per row: where the record came from; a stream's order is (partition, offset)
    offset: np.ndarray
    time: np.ndarray  # float64 epoch ms
    result: np.ndarray  # float64


class KeyedPairs(NamedTuple):
    """The pairs of one call: per key (in the order of ``keys``), by left time, then right time."""

    key: np.ndarray  # int per pair: index into the rows' keys
    pairs: PairArrays
    rejected: np.ndarray  # row numbers (into the input rows) that break their stream's order
    reasons: list[str]  # why, per rejected row (a Rejection's text)

    @property
    def count(self) -> int:
        return self.pairs.count


def join_keyed_batch(states: MutableMapping[StateKey, bytes], rows: KeyedRows,
                     max_pending_per_side: int = DEFAULT_MAX_PENDING_PER_SIDE) -> KeyedPairs:
    """Join ``rows`` into ``states`` (updated in place); returns the pairs that became certain.

    Vectorised over the rows: one sort by (key, side, partition, offset), then one engine call per key.
    Exact repeats of a stream's latest record are dropped as the engine drops them; records breaking the
    order are rejected, and their rows and reasons returned.
    """
    if not len(rows.key):
        return _no_pairs()
    order = np.lexsort((rows.offset, rows.partition, rows.side, rows.key))
    key, side = rows.key[order], rows.side[order]
    times = np.asarray(rows.time, dtype=np.float64)[order]
    results = np.asarray(rows.result, dtype=np.float64)[order]
    starts = np.flatnonzero(np.diff(key, prepend=-1))
    ends = [*starts[1:].tolist(), len(key)]
    # Where each key's right side begins (sides are sorted within a key).
    splits = np.searchsorted(key * 2 + side, key[starts] * 2 + RIGHT).tolist()
    # Rows before each row that do not follow their predecessor in time: a stream is strictly increasing
    # within the batch when none of its rows after the first is counted here.
    not_rising = np.concatenate(([0], np.cumsum(np.diff(times) <= 0))).tolist()
    time_list = times.tolist()
    rejected: list[np.ndarray] = []
    reasons: list[str] = []
    found: list[tuple[int, PairArrays]] = []
    for start, split, end, code in zip(starts.tolist(), splits, ends, key[starts].tolist()):
        thing, binding = rows.keys[code]
        stored = state_key(thing, binding)
        sides = (slice(start, split), slice(split, end))
        bound = binding.max_out_of_orderness_ms
        if bound or is_reordered(states.get(stored)):
            # Bounded disorder: each stream through the key's reorder buffer (kept in its state) first.
            states[stored], pairs, verdicts = join_reordered(
                states.get(stored), times[sides[LEFT]], results[sides[LEFT]], times[sides[RIGHT]],
                results[sides[RIGHT]], bound, delta_time=binding.delta_time_ms, max_pending_per_side=max_pending_per_side)
            for stream_side, stream, verdict in zip((LEFT, RIGHT), sides, verdicts):
                broken, why = rejected_rows(verdict, thing, binding.quantity(stream_side), times[stream], bound)
                if len(broken):
                    rejected.append(order[stream.start + broken])
                    reasons.extend(why)
            if pairs.count:
                found.append((code, pairs))
            continue
        state = BatchJoinState.from_bytes(states[stored]) if stored in states else BatchJoinState()
        for stream_side, stream in zip((LEFT, RIGHT), sides):
            if stream.start == stream.stop or (time_list[stream.start] > state.last_time[stream_side]
                                               and not_rising[stream.stop - 1] == not_rising[stream.start]):
                continue  # in order: the common case, without the per-record verdicts
            verdicts = order_verdicts(times[stream], results[stream], state.last_time[stream_side],
                                      state.last_value[stream_side])
            broken = np.flatnonzero(verdicts.rejected)
            if not len(broken):
                continue
            rejected.append(order[stream.start + broken])
            quantity = binding.quantity(stream_side)
            reasons.extend(order_rejection(thing, quantity, t, last) for t, last in
                           zip(times[stream][broken].tolist(), verdicts.latest_before[broken].tolist()))
        state, pairs = join_batch(state, times[sides[LEFT]], results[sides[LEFT]], times[sides[RIGHT]],
                                  results[sides[RIGHT]], delta_time=binding.delta_time_ms,
                                  max_pending_per_side=max_pending_per_side)
        states[stored] = state.to_bytes()
        if pairs.count:
            found.append((code, pairs))
    return KeyedPairs(*_in_key_and_time_order(found), np.concatenate(rejected) if rejected else _NO_ROWS, reasons)


def _in_key_and_time_order(found: list[tuple[int, PairArrays]]) -> tuple[np.ndarray, PairArrays]:
    """All keys' pairs in one set of arrays, by key, then left time, then right time: one sort, not one per key."""
    if not found:
        return _NO_ROWS, _no_pairs().pairs
    codes = [code for code, _ in found]
    counts = [pairs.count for _, pairs in found]
    pairs = PairArrays(*(np.concatenate(column) for column in zip(*(pairs for _, pairs in found))))
    key = np.repeat(np.array(codes, dtype=np.int64), counts)
    order = np.lexsort((pairs.right_time, pairs.left_time, key))
    return key[order], PairArrays(*(column[order] for column in pairs))


def _no_pairs() -> KeyedPairs:
    empty = np.empty(0, dtype=np.float64)
    return KeyedPairs(_NO_ROWS, PairArrays(empty, empty, empty, empty, np.empty(0, dtype=np.int8)), _NO_ROWS, [])
