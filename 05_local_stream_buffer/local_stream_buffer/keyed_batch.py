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

from .batch import PairArrays
from .clock import ClockCounters
from .clocked_batch import is_clocked, join_clocked, join_key_records, needs_clock
from .columnar_batch import StateColumns, continues_streams, join_columns
from .reorder import is_reordered
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


class Dropped(NamedTuple):
    """A record a key held from an earlier call and gave up in this one (the clock rule's: an outlier, or a record
    it set aside that its timeline's join turned away), as its dead letter gives it back."""

    key: int  # index into the rows' keys
    side: int
    time: float
    result: float
    reason: str


class KeyedPairs(NamedTuple):
    """The pairs of one call: per key (in the order of ``keys``), by left time, then right time."""

    key: np.ndarray  # int per pair: index into the rows' keys
    pairs: PairArrays
    rejected: np.ndarray  # row numbers (into the input rows) that break their stream's order
    reasons: list[str]  # why, per rejected row (a Rejection's text)
    dropped: list[Dropped] = []  # records held before and given up now (local_stream_buffer.clock)
    clock: dict[int, ClockCounters] = {}  # per key (index into the rows' keys), what the clock rule did in this call

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
                            and not is_clocked(blob) for code, blob in zip(codes, blobs)])
    side_bounds = np.stack([starts, splits, ends], axis=1)
    arriving = np.diff(side_bounds, axis=1)  # (keys, 2): rows per side
    has_rows = arriving > 0
    side_starts = np.minimum(side_bounds[:, :2], len(times) - 1)  # clipped: a side without rows has none
    first = np.where(has_rows, times[side_starts], math.inf)
    rising = np.all(~has_rows | (not_rising[side_bounds[:, 1:] - 1] == not_rising[side_starts]), axis=1)
    columns = StateColumns.from_bytes([blobs[index] for index in plain.tolist()])
    fits = rising[plain] & continues_streams(columns, first[plain], has_rows[plain])
    # Under the clock rule a record far ahead of the one before it is set aside: its key goes one by one.
    ahead = _ahead_ms([rows.keys[code][1] for code in codes])
    gap = np.diff(times, prepend=-math.inf)
    gap[side_bounds[:, :2][has_rows]] = -math.inf  # a side's first row is measured from the state's last time
    key_gap = np.maximum.reduceat(gap, starts)
    last = columns.last_time
    first_gap = np.where(has_rows[plain] & (last > -math.inf), first[plain] - last, -math.inf).max(axis=1)
    fits &= np.maximum(key_gap[plain], first_gap) <= ahead[plain]
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
    dropped: list[Dropped] = []
    clock: dict[int, ClockCounters] = {}
    for index in np.flatnonzero(alone).tolist():
        start, split, end = side_bounds[index].tolist()
        thing, binding = rows.keys[codes[index]]
        sides = (slice(start, split), slice(split, end))
        side_times = (times[sides[LEFT]], times[sides[RIGHT]])
        side_values = (results[sides[LEFT]], results[sides[RIGHT]])
        if needs_clock(blobs[index], binding.clock_rule, side_times):
            # The clock rule sets records aside, or holds some from earlier calls (local_stream_buffer.clock).
            clocked = join_clocked(blobs[index], binding, thing, side_times, side_values, max_pending_per_side,
                                   arrived_ms)
            stored, pairs = clocked.stored, clocked.pairs
            turned_away = tuple(zip(clocked.rejected, clocked.reasons))
            dropped.extend(Dropped(codes[index], *given_up) for given_up in clocked.dropped)
            if clocked.counters:
                clock[codes[index]] = clocked.counters
        else:
            stored, pairs, turned_away = join_key_records(blobs[index], binding, thing, side_times, side_values,
                                                          max_pending_per_side, arrived_ms)
        if stored is not None:
            written[stored_keys[index]] = stored
        for stream, (broken, why) in zip(sides, turned_away):
            if len(broken):
                rejected.append(order[stream.start + broken])
                reasons.extend(why)
        if pairs.count:
            found.append((np.full(pairs.count, codes[index], dtype=np.int64), pairs))
    states.write_many(written)
    return KeyedPairs(*_in_key_and_time_order(found), np.concatenate(rejected) if rejected else _NO_ROWS, reasons,
                      dropped, clock)


def _ahead_ms(bindings: Sequence[SpecBinding]) -> np.ndarray:
    """Per key, how far ahead of its stream's timeline a record may lie before the clock rule sets it aside."""
    limits: dict[SpecBinding, float] = {}
    for binding in bindings:
        if binding not in limits:
            rule = binding.clock_rule
            limits[binding] = math.inf if rule is None else rule.ahead_ms
    return np.array([limits[binding] for binding in bindings], dtype=np.float64)


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
