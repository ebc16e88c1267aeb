"""The keyed batch join: many join keys' records at once, in any row order, into their batch states.

Built for the Spark job, whose stateful step hands over the rows of many keys (things and spec bindings)
per call, after a shuffle that kept no order. :func:`join_keyed_batch` puts each stream back into its
source order, names the records the order verdict rejects (with their reasons), and runs
:func:`local_stream_buffer.batch.join_batch` once per key. States are kept as bytes per key, as a state
store holds them. The pairs equal the keyed joiner's on the same streams, pair for pair.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import NamedTuple, Protocol

import numpy as np

from .batch import BatchJoinState, PairArrays, join_batch
from .columnar_batch import StateColumns, continues_streams, join_columns
from .order import order_verdicts
from .rejections import order_rejection
from .reorder import is_reordered, join_reordered, load_key_state, rejected_rows
from .specs import SpecBinding
from .two_stream_join import DEFAULT_MAX_PENDING_PER_SIDE, LEFT, RIGHT

JoinKey = tuple[str, SpecBinding]  # a thing and the spec binding it joins under
StateKey = tuple[str, str, str]  # (thing, spec name, axis): how a key's state is stored

_NO_ROWS = np.empty(0, dtype=np.int64)


class KeyStates(Protocol):
    """Where the keyed batch join keeps its keys' states as bytes, read and written a call's keys at a time (a
    state store pays per call, not per key)."""

    def read_many(self, keys: Sequence[StateKey]) -> list[bytes | None]:
        """Each key's state, None for a key without one."""

    def write_many(self, states: Mapping[StateKey, bytes]) -> None:
        """Keep these keys' states (others unchanged)."""


class StateDict(dict):
    """Key states in memory: a dict of state key to bytes, as :class:`KeyStates`."""

    def read_many(self, keys: Sequence[StateKey]) -> list[bytes | None]:
        return [self.get(stored) for stored in keys]

    def write_many(self, states: Mapping[StateKey, bytes]) -> None:
        self.update(states)


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


def join_keyed_batch(states: KeyStates, rows: KeyedRows,
                     max_pending_per_side: int = DEFAULT_MAX_PENDING_PER_SIDE, arrived_ms: int = 0) -> KeyedPairs:
    """Join ``rows`` into ``states`` (one read, then one write of the keys of ``rows``); returns the pairs that
    became certain. ``arrived_ms`` is the processing time the rows arrived at, kept by keys with a reorder
    buffer for the idle release (:mod:`local_stream_buffer.idle_release`).

    Vectorised over the rows: one sort by (key, side, partition, offset), then one columnar join of every key
    whose streams simply continue (:mod:`local_stream_buffer.columnar_batch`), and one engine call per other
    key. Exact repeats of a stream's latest record are dropped as the engine drops them; records breaking the
    order are rejected, and their rows and reasons returned.
    """
    if not len(rows.key):
        return _no_pairs()
    order = np.lexsort((rows.offset, rows.partition, rows.side, rows.key))
    key, side = rows.key[order], rows.side[order]
    times = np.asarray(rows.time, dtype=np.float64)[order]
    results = np.asarray(rows.result, dtype=np.float64)[order]
    starts = np.flatnonzero(np.diff(key, prepend=-1))
    ends = np.append(starts[1:], len(key))
    # Where each key's right side begins (sides are sorted within a key).
    splits = np.searchsorted(key * 2 + side, key[starts] * 2 + RIGHT)
    # Rows before each row that do not follow their predecessor in time: a stream is strictly increasing
    # within the batch when none of its rows after the first is counted here.
    not_rising = np.concatenate(([0], np.cumsum(np.diff(times) <= 0)))
    rejected: list[np.ndarray] = []
    reasons: list[str] = []
    found: list[tuple[np.ndarray, PairArrays]] = []
    codes = key[starts].tolist()
    stored_keys = [state_key(*rows.keys[code]) for code in codes]
    blobs = states.read_many(stored_keys)
    written: dict[StateKey, bytes] = {}
    # Keys without a bound or reorder buffers whose records continue their streams go through the columnar
    # join together; the others (out of order, late, bounded disorder) one by one.
    plain = np.flatnonzero([not rows.keys[code][1].max_out_of_orderness_ms and not is_reordered(blob)
                            for code, blob in zip(codes, blobs)])
    side_bounds = np.stack([starts, splits, ends], axis=1)
    arriving = np.diff(side_bounds, axis=1)  # (keys, 2): rows per side
    has_rows = arriving > 0
    side_starts = np.minimum(side_bounds[:, :2], len(times) - 1)  # clipped: a side without rows has none
    first = np.where(has_rows, times[side_starts], math.inf)
    rising = np.all(~has_rows | (not_rising[side_bounds[:, 1:] - 1] == not_rising[side_starts]), axis=1)
    columns = StateColumns.from_bytes([blobs[index] for index in plain.tolist()])
    fits = rising[plain] & continues_streams(columns, first[plain], has_rows[plain])
    together = plain[fits]
    if len(together):
        if not fits.all():
            columns = StateColumns.from_bytes([blobs[index] for index in together.tolist()])
        in_group = np.zeros(len(codes), dtype=bool)
        in_group[together] = True
        row_in_group = np.repeat(in_group, ends - starts)
        picked = [row_in_group & (side == stream_side) for stream_side in (LEFT, RIGHT)]
        deltas = np.array([_delta(rows.keys[codes[index]][1]) for index in together.tolist()], dtype=np.float64)
        stored, joined = join_columns(columns, arriving[together], [times[mask] for mask in picked],
                                      [results[mask] for mask in picked], deltas, max_pending_per_side)
        for index, state in zip(together.tolist(), stored):
            written[stored_keys[index]] = state
        found.append((key[starts[together]][joined.key], joined.pairs))
    alone = np.ones(len(codes), dtype=bool)
    alone[together] = False
    for index in np.flatnonzero(alone).tolist():
        start, split, end = side_bounds[index].tolist()
        thing, binding = rows.keys[codes[index]]
        stored = stored_keys[index]
        sides = (slice(start, split), slice(split, end))
        bound = binding.max_out_of_orderness_ms
        if bound or is_reordered(blobs[index]):
            # Bounded disorder: each stream through the key's reorder buffer (kept in its state) first.
            written[stored], pairs, verdicts = join_reordered(
                blobs[index], times[sides[LEFT]], results[sides[LEFT]], times[sides[RIGHT]],
                results[sides[RIGHT]], bound, delta_time=binding.delta_time_ms, max_pending_per_side=max_pending_per_side,
                arrived_ms=arrived_ms)
            released = None
            for stream_side, stream, verdict in zip((LEFT, RIGHT), sides, verdicts):
                if not (verdict.late.any() or verdict.rejected.any()):
                    continue
                if released is None:  # an idle release is the reason of some late records; it moves between calls
                    released = load_key_state(written[stored])[0].released
                broken, why = rejected_rows(verdict, thing, binding.quantity(stream_side), times[stream], bound,
                                            released[stream_side], binding.idle_release_ms)
                if len(broken):
                    rejected.append(order[stream.start + broken])
                    reasons.extend(why)
            if pairs.count:
                found.append((np.full(pairs.count, codes[index], dtype=np.int64), pairs))
            continue
        state = BatchJoinState.from_bytes(blobs[index]) if blobs[index] is not None else BatchJoinState()
        for stream_side, stream in zip((LEFT, RIGHT), sides):
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
        written[stored] = state.to_bytes()
        if pairs.count:
            found.append((np.full(pairs.count, codes[index], dtype=np.int64), pairs))
    states.write_many(written)
    return KeyedPairs(*_in_key_and_time_order(found), np.concatenate(rejected) if rejected else _NO_ROWS, reasons)


def _delta(binding: SpecBinding) -> float:
    return math.inf if binding.delta_time_ms is None else float(binding.delta_time_ms)


def _in_key_and_time_order(found: list[tuple[np.ndarray, PairArrays]]) -> tuple[np.ndarray, PairArrays]:
    """All keys' pairs in one set of arrays, by key, then left time, then right time: one sort, not one per key."""
    if not found:
        return _NO_ROWS, _no_pairs().pairs
    pairs = PairArrays(*(np.concatenate(column) for column in zip(*(pairs for _, pairs in found))))
    key = np.concatenate([codes for codes, _ in found])
    order = np.lexsort((pairs.right_time, pairs.left_time, key))
    return key[order], PairArrays(*(column[order] for column in pairs))


def _no_pairs() -> KeyedPairs:
    empty = np.empty(0, dtype=np.float64)
    return KeyedPairs(_NO_ROWS, PairArrays(empty, empty, empty, empty, np.empty(0, dtype=np.int8)), _NO_ROWS, [])
