"""Bounded disorder: a reorder buffer per stream in front of the join, so the join still sees in-order streams.

A join spec's ``max_out_of_orderness_s`` (seconds, like ``delta_time_s``) lets each stream of a key arrive up to
that much event time behind its newest record. Per stream the buffer keeps the records not yet certain to be
in their place, and hands them to the join in time order as soon as they are at or before the stream's
*watermark*, its newest time minus the bound: nothing that may still arrive can come before them (a record
at exactly the watermark is within the bound but could only tie). So the join sees every stream in time
order, whatever the arrival order within the bound, and emits exactly the in-order pairs with the same ids;
the bound is the only latency added. With a bound of 0 no buffer is put in front and the join behaves as it
always did (a record older than its stream's newest is rejected ``out_of_order``).

Every verdict is given when a record arrives, judged against the newest time of its stream and the records
the buffer holds (so an adapter can dead-letter the record it is handling, never one ingested earlier):

* older than the watermark: *late*, not joined; the reason says how far behind the newest it was;
* at the time of a record the buffer holds (or of the join's last record, at the watermark): an exact repeat
  is a duplicate and dropped, another result a conflict and rejected; the first to arrive stays, as in the
  in-order join (only such conflicts make the result depend on the arrival order);
* anything else is accepted: held in the buffer, or handed to the join at once if it is at the watermark.

Idle release. A spec's ``idle_release_s`` lets a stream that went quiet give up what its buffer holds: once
that much processing time passed without a record of the stream, everything buffered is handed to the join
(its watermark jumps to its newest time), so a machine's last pairs go out without waiting for its next
records. From then on a record at or before the released time is late (``Rejection.RELEASED``). The output
then depends on when records arrived, not only on their order: the trade this option makes. Which streams
are due is decided by the adapter (:mod:`local_stream_buffer.idle_release`); this module only releases.

State and recovery. The newest record of a stream is always in its buffer (it is after the watermark), so
a stream's newest time, its watermark, and what the buffer holds are all given by the records held. The
standalone joiner's changelog keeps every held record, buffered ones included, and re-ingesting them in
their arrival order rebuilds the same buffers and the same join (:class:`ReorderedJoin`); a release is kept as
a marker (the stream and the time released up to) and applied again after them. The batch path (Spark) keeps
the buffers, released times and last arrivals in the key's state bytes, ahead of the join's own state
(:class:`ReorderState`).
"""

from __future__ import annotations

import math
import struct
from bisect import bisect_left, bisect_right
from typing import Any, Callable, Iterator, NamedTuple

import numpy as np

from .batch import BatchJoinState, PairArrays, join_batch
from .output import canonical_time
from .rejections import Rejection, order_rejection
from .status import IngestStatus
from .two_stream_join import DEFAULT_MAX_PENDING_PER_SIDE, LEFT, RIGHT, TwoStreamJoin

_ACCEPTED = IngestStatus.ACCEPTED
_DUPLICATE = IngestStatus.DUPLICATE
_REJECTED = IngestStatus.REJECTED
_LATE = IngestStatus.LATE
_NEVER = -math.inf
_FLOAT = np.float64
_EMPTY = np.empty(0, dtype=_FLOAT)


def released_rejection(thing: str, quantity: str, t: float, released: float, idle_release_ms: float | None) -> str:
    """The reason for a record at or before the time up to which its stream was released when idle."""
    idle_s = "?" if idle_release_ms is None else canonical_time(round(idle_release_ms / 1000, 6))
    return Rejection.RELEASED.reason(t=canonical_time(t), stream=f"{thing}.{quantity}",
                                     released=canonical_time(released), idle_s=idle_s)


def late_rejection(thing: str, quantity: str, t: float, newest: float, bound: float) -> str:
    """The reason for a record more than ``bound`` (ms) behind the newest time of its stream."""
    behind = newest - t
    return Rejection.BEYOND_BOUND.reason(
        t=canonical_time(t), stream=f"{thing}.{quantity}", newest=canonical_time(newest),
        behind_ms=canonical_time(behind), late_ms=canonical_time(behind - bound), bound_ms=canonical_time(bound))


class ReorderedJoin:
    """A :class:`TwoStreamJoin` behind a reorder buffer per side: the per-record path with bounded disorder.

    Same interface as the join it wraps (``ingest``, ``poll``, ``last_time``, ``buffer``, ``held_items``, ``len``,
    ``forced``), so the keyed joiner uses either. Accepted records are held (the caller's items stay with the
    key) until the join lets go of them; a record the join turns away when the buffer hands it over (only
    possible inside a gap that forcing closed) is let go through ``release`` at once.

    :param join: the join the buffers feed; times in its unit.
    :param max_out_of_orderness_ms: how far a record may be behind its stream's newest; above 0.
    :param release: the join's release hook, for records the join turns away on hand-over.
    :param arrived: called with the side of every record that arrives (the idle release's clock), if given.
    :param idle_release_ms: the spec's idle release, for the reason of a record late after one.
    """

    __slots__ = ("_join", "_bound", "_release", "_newest", "_times", "_entries", "_released", "_arrived",
                 "_idle_release_ms", "late_on_release")

    def __init__(self, join: TwoStreamJoin, max_out_of_orderness_ms: float,
                 release: Callable[[Any], None] | None = None, arrived: Callable[[int], None] | None = None,
                 idle_release_ms: float | None = None) -> None:
        if not max_out_of_orderness_ms > 0:
            raise ValueError("max_out_of_orderness_ms must be above 0 for a reorder buffer")
        self._join = join
        self._bound = max_out_of_orderness_ms
        self._release = release
        self._newest = [_NEVER, _NEVER]  # newest time accepted per side
        # Per side the buffered records in time order: their times (for bisect) and (time, value, item).
        self._times: tuple[list[float], list[float]] = ([], [])
        self._entries: tuple[list[tuple[float, Any, Any]], list[tuple[float, Any, Any]]] = ([], [])
        self._released = [_NEVER, _NEVER]  # per side the time up to which an idle release handed everything over
        self._arrived = arrived
        self._idle_release_ms = idle_release_ms
        self.late_on_release = 0  # buffered records the join turned away on hand-over (forcing)

    def ingest(self, side: int, t: float, value: Any, item: Any) -> IngestStatus:
        """Judge the next arriving record of a side; hand the join whatever became certain in its place."""
        if self._arrived is not None:
            self._arrived(side)
        newest = self._newest[side]
        if t > newest:
            self._newest[side] = t
            times = self._times[side]
            entries = self._entries[side]
            times.append(t)
            entries.append((t, value, item))
            watermark = t - self._bound
            if times[0] <= watermark:
                self._hand_over(side, watermark)
            return _ACCEPTED
        watermark = newest - self._bound
        if t < watermark:
            return _LATE
        if t != t:
            return _REJECTED  # a NaN time has no place in the stream
        if t <= self._released[side]:
            return _LATE  # its place was given up when the quiet stream was released
        times = self._times[side]
        index = bisect_left(times, t)
        if index < len(times) and times[index] == t:
            return _DUPLICATE if value == self._entries[side][index][1] else _REJECTED
        if t == watermark:
            # Nothing buffered is at or before it: it is next in the stream (or ties the join's last record).
            return self._join.ingest(side, t, value, item)
        times.insert(index, t)
        self._entries[side].insert(index, (t, value, item))
        return _ACCEPTED

    def _hand_over(self, side: int, watermark: float) -> None:
        times = self._times[side]
        entries = self._entries[side]
        count = bisect_right(times, watermark)
        ingest = self._join.ingest
        for t, value, item in entries[:count]:
            if ingest(side, t, value, item) is not _ACCEPTED:
                self.late_on_release += 1
                if self._release is not None:
                    self._release(item)
        del times[:count]
        del entries[:count]

    def release(self, side: int, up_to: float | None = None) -> float | None:
        """Hand the join what a side's buffer holds up to ``up_to`` (None: all of it, up to its newest time), and
        from then on judge records at or before that time late. Returns the time released up to, or None when
        nothing was buffered there (an idle stream whose buffer the watermark had emptied already)."""
        newest = self._newest[side]
        if up_to is None:
            if not self._times[side]:
                return None
            up_to = newest
        self._hand_over(side, up_to)
        self._released[side] = max(self._released[side], up_to)
        self._newest[side] = max(newest, up_to)
        return up_to

    def close(self, side: int, item: Any) -> None:
        """End a side's stream: everything its buffer holds goes to the join, then the join's side ends
        (:meth:`TwoStreamJoin.close`)."""
        self._hand_over(side, math.inf)
        self._newest[side] = math.inf
        self._join.close(side, item)

    def late_reason(self, thing: str, quantity: str, side: int, t: float) -> str | None:
        """Why a record judged late was: beyond the bound (with how far), at or before what an idle release
        gave up, or None inside a gap forcing closed."""
        newest = self._newest[side]
        if t < newest - self._bound:
            return late_rejection(thing, quantity, t, newest, self._bound)
        if t <= self._released[side]:
            return released_rejection(thing, quantity, t, self._released[side], self._idle_release_ms)
        return None

    def rejection(self, thing: str, quantity: str, side: int, t: float) -> str:
        """Why a record was rejected: it has the time of a record held before it, with another result."""
        return order_rejection(thing, quantity, t, t)

    def last_time(self, side: int) -> float:
        """The newest time of a side (-inf before the first)."""
        return self._newest[side]

    def poll(self) -> None:
        self._join.poll()

    @property
    def forced(self) -> int:
        return self._join.forced

    def buffer(self, side: int) -> list[tuple[float, Any, Any]]:
        """The entries a side holds: the join's, then the reorder buffer's (what an evicted key gives up)."""
        return [*self._join.buffer(side), *self._entries[side]]

    def held_items(self) -> Iterator[Any]:
        yield from self._join.held_items()
        for entries in self._entries:
            for entry in entries:
                yield entry[2]

    def __len__(self) -> int:
        return len(self._join) + len(self._times[LEFT]) + len(self._times[RIGHT])


def late_reason(join: TwoStreamJoin | ReorderedJoin, thing: str, quantity: str, side: int, t: float) -> str | None:
    """The reason a key's join gave for a late record, if it has one (the plain join's forcing gap has none)."""
    return join.late_reason(thing, quantity, side, t) if type(join) is ReorderedJoin else None


def order_reason(join: TwoStreamJoin | ReorderedJoin, thing: str, quantity: str, side: int, t: float) -> str:
    """The reason a key's join rejected a record (out of order, or a conflict)."""
    if type(join) is ReorderedJoin:
        return join.rejection(thing, quantity, side, t)
    return order_rejection(thing, quantity, t, join.last_time(side))


# --- The batch path -----------------------------------------------------------------------------------------

# Serialised: a marker byte no BatchJoinState starts with, the newest time and buffer size per side, the time
# released up to and the processing time (ms) of the last arrival per side, then the buffers (left times, left
# values, right times, right values), then the join's own state bytes. The earlier format ("R") had neither
# released times nor arrivals; it is still read.
_EARLIER_FORMAT = 0x52  # "R"
_EARLIER_HEADER = struct.Struct("<B2d2Q")
_REORDERED_FORMAT = 0x53  # "S"
_HEADER = struct.Struct("<B2d2Q2d2q")


class ReorderState:
    """The reorder buffers of one key on the batch path: per side its newest time, buffered records, the time
    an idle release gave up everything up to, and the processing time (ms) its last record arrived."""

    __slots__ = ("newest", "times", "values", "released", "arrived_ms")

    def __init__(self) -> None:
        self.newest = [_NEVER, _NEVER]
        self.times = [_EMPTY, _EMPTY]  # buffered records per side, in time order
        self.values = [_EMPTY, _EMPTY]
        self.released = [_NEVER, _NEVER]
        self.arrived_ms = [0, 0]

    def held(self) -> int:
        return len(self.times[LEFT]) + len(self.times[RIGHT])


def is_reordered(data: bytes | None) -> bool:
    """Whether stored key state carries reorder buffers (written by :func:`dump_key_state` with a bound)."""
    return bool(data) and data[0] in (_REORDERED_FORMAT, _EARLIER_FORMAT)


def load_key_state(data: bytes | None) -> tuple[ReorderState, BatchJoinState]:
    """A key's reorder buffers and join state from its stored bytes (None: a fresh key).

    State written without a bound (a plain :class:`BatchJoinState`) gets empty buffers whose newest times are
    the join's last times, so nothing older than what the join has seen is accepted.
    """
    reorder = ReorderState()
    if data is None:
        return reorder, BatchJoinState()
    if not is_reordered(data):
        state = BatchJoinState.from_bytes(data)
        reorder.newest = list(state.last_time)
        return reorder, state
    if data[0] == _EARLIER_FORMAT:
        _, newest_left, newest_right, n_left, n_right = _EARLIER_HEADER.unpack_from(data)
        header = _EARLIER_HEADER.size
    else:
        (_, newest_left, newest_right, n_left, n_right, released_left, released_right, arrived_left,
         arrived_right) = _HEADER.unpack_from(data)
        header = _HEADER.size
        reorder.released = [released_left, released_right]
        reorder.arrived_ms = [arrived_left, arrived_right]
    reorder.newest = [newest_left, newest_right]
    end = header + 16 * (n_left + n_right)
    arrays = np.frombuffer(data, dtype="<f8", count=2 * (n_left + n_right), offset=header).astype(_FLOAT)
    right_start = 2 * n_left
    reorder.times = [arrays[:n_left], arrays[right_start:right_start + n_right]]
    reorder.values = [arrays[n_left:right_start], arrays[right_start + n_right:]]
    return reorder, BatchJoinState.from_bytes(data[end:])


def dump_key_state(reorder: ReorderState, state: BatchJoinState) -> bytes:
    """A key's reorder buffers and join state as the bytes a state store keeps."""
    header = _HEADER.pack(_REORDERED_FORMAT, *reorder.newest, len(reorder.times[LEFT]), len(reorder.times[RIGHT]),
                          *reorder.released, *reorder.arrived_ms)
    arrays = (reorder.times[LEFT], reorder.values[LEFT], reorder.times[RIGHT], reorder.values[RIGHT])
    return header + b"".join(np.ascontiguousarray(a, dtype="<f8").tobytes() for a in arrays) + state.to_bytes()


class ReorderVerdicts(NamedTuple):
    """Per arriving record of one stream (in arrival order): what the reorder buffer made of it."""

    late: np.ndarray  # bool: older than the watermark when it arrived
    rejected: np.ndarray  # bool: a NaN time, or the time of an earlier record with another result
    newest_before: np.ndarray  # the stream's newest time when each record arrived


def reorder_side(reorder: ReorderState, join: BatchJoinState, side: int, times: np.ndarray, values: np.ndarray,
                 bound: float) -> tuple[ReorderVerdicts, np.ndarray, np.ndarray, int]:
    """Pass the next arriving records of one stream (arrival order) through its buffer in ``reorder``.

    Returns the verdicts, the records handed to the join now (times and values, in time order) and how many
    duplicates were dropped. The same verdicts as :class:`ReorderedJoin` gives one record at a time.
    """
    n = len(times)
    newest_before = np.empty(n, dtype=_FLOAT)
    newest = reorder.newest[side]
    if n:
        newest_before[0] = newest
        np.fmax.accumulate(times[:-1], out=newest_before[1:])  # fmax: a NaN time moves nothing
        np.fmax(newest_before, newest, out=newest_before)
        newest = float(np.fmax(newest_before[-1], times[-1]))
    nan = np.isnan(times)
    # Older than the join's last record can only be a record of state written before the bound was set.
    last_time = join.last_time[side]
    late = (times < newest_before - bound) | (times < last_time) | (times <= reorder.released[side])
    candidate = ~late & ~nan
    # Candidates compete for their time with the records before them: the join's last record (at the watermark
    # at most), then the buffered ones, then the batch's in arrival order. The first at a time stays.
    prior = [] if last_time == _NEVER else [last_time]
    pool_times = np.concatenate((prior, reorder.times[side], times[candidate]))
    pool_values = np.concatenate(([join.last_value[side]] if prior else [], reorder.values[side], values[candidate]))
    n_prior, n_buffered = len(prior), len(reorder.times[side])
    order = np.argsort(pool_times, kind="stable")
    sorted_times = pool_times[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = sorted_times[1:] != sorted_times[:-1]
    winner = np.maximum.accumulate(np.where(first, np.arange(len(order)), 0))
    sorted_values = pool_values[order]
    duplicate = ~first & (sorted_values == sorted_values[winner])
    conflict = ~first & ~duplicate
    rejected = nan.copy()
    batch_rows = np.flatnonzero(candidate)
    in_batch = order >= n_prior + n_buffered
    rejected[batch_rows[order[conflict & in_batch] - n_prior - n_buffered]] = True
    keep = first & (order >= n_prior)
    kept_times, kept_values = sorted_times[keep], sorted_values[keep]
    due = int(kept_times.searchsorted(newest - bound, side="right"))
    reorder.newest[side] = newest
    reorder.times[side], reorder.values[side] = kept_times[due:], kept_values[due:]
    verdicts = ReorderVerdicts(late, rejected, newest_before)
    return verdicts, kept_times[:due], kept_values[:due], int(np.count_nonzero(duplicate & in_batch))


def join_reordered(data: bytes | None, left_times: np.ndarray, left_values: np.ndarray, right_times: np.ndarray,
                   right_values: np.ndarray, max_out_of_orderness_ms: float, delta_time_ms: float | None = None,
                   max_pending_per_side: int = DEFAULT_MAX_PENDING_PER_SIDE, arrived_ms: int = 0,
                   ) -> tuple[bytes, PairArrays, tuple[ReorderVerdicts, ReorderVerdicts]]:
    """:func:`join_batch` with bounded disorder: the next arriving records of both sides (each in arrival
    order) through the key's reorder buffers into its join. Takes and returns the key's stored bytes;
    ``arrived_ms`` (processing time) is kept as the last arrival of each side with records.

    With ``max_out_of_orderness_ms`` 0 (the spec's bound set back to 0) the buffers hand everything over and the
    state is stored as a plain join state again.
    """
    reorder, state = load_key_state(data)
    for side, times in ((LEFT, left_times), (RIGHT, right_times)):
        if len(times):
            reorder.arrived_ms[side] = arrived_ms
    arriving = ((left_times, left_values), (right_times, right_values))
    verdicts = []
    released = []
    late = rejected = duplicates = 0
    for side, (times, values) in zip((LEFT, RIGHT), arriving):
        times = np.asarray(times, dtype=_FLOAT)
        values = np.asarray(values, dtype=_FLOAT)
        verdict, out_times, out_values, dropped = reorder_side(reorder, state, side, times, values,
                                                                max_out_of_orderness_ms)
        verdicts.append(verdict)
        released.append((out_times, out_values))
        late += int(np.count_nonzero(verdict.late))
        rejected += int(np.count_nonzero(verdict.rejected))
        duplicates += dropped
    state, pairs = join_batch(state, *released[LEFT], *released[RIGHT], delta_time_ms=delta_time_ms,
                              max_pending_per_side=max_pending_per_side)
    state.late += late
    state.rejected += rejected
    state.duplicates += duplicates
    stored = dump_key_state(reorder, state) if max_out_of_orderness_ms > 0 else state.to_bytes()
    return stored, pairs, (verdicts[LEFT], verdicts[RIGHT])


def release_idle_side(data: bytes, side: int, delta_time_ms: float | None = None,
                      max_pending_per_side: int = DEFAULT_MAX_PENDING_PER_SIDE) -> tuple[bytes, PairArrays] | None:
    """Release what a key's reorder buffer holds of one side (an idle stream, see the module doc): all of it goes
    to the join and records at or before its newest time are late from then on. Returns the key's new stored
    bytes and the pairs that became certain, or None when the side buffers nothing."""
    reorder, state = load_key_state(data)
    times, values = reorder.times[side], reorder.values[side]
    if not len(times):
        return None
    reorder.times[side], reorder.values[side] = _EMPTY, _EMPTY
    reorder.released[side] = max(reorder.released[side], reorder.newest[side])
    arriving = [(_EMPTY, _EMPTY), (_EMPTY, _EMPTY)]
    arriving[side] = (times, values)
    state, pairs = join_batch(state, *arriving[LEFT], *arriving[RIGHT], delta_time_ms=delta_time_ms,
                              max_pending_per_side=max_pending_per_side)
    return dump_key_state(reorder, state), pairs


def rejected_rows(verdicts: ReorderVerdicts, thing: str, quantity: str, times: np.ndarray, bound: float,
                  released: float = _NEVER, idle_release_ms: float | None = None) -> tuple[np.ndarray, list[str]]:
    """The rows (indices into the stream's arriving records) the reorder buffer turned away, and why
    (``released``: the time up to which an idle release gave the stream up, before these records)."""
    turned_away = np.flatnonzero(verdicts.late | verdicts.rejected)
    reasons = []
    for row, t, newest, late in zip(turned_away.tolist(), times[turned_away].tolist(),
                                    verdicts.newest_before[turned_away].tolist(), verdicts.late[turned_away].tolist()):
        if late and t < newest - bound:
            reasons.append(late_rejection(thing, quantity, t, newest, bound))
        elif late and t <= released:
            reasons.append(released_rejection(thing, quantity, t, released, idle_release_ms))
        elif late or t != t:  # older than the join's last record (state from before the bound), or a NaN time
            reasons.append(order_rejection(thing, quantity, t, newest))
        else:  # the time of an earlier record, with another result
            reasons.append(order_rejection(thing, quantity, t, t))
    return turned_away, reasons


__all__ = ["ReorderedJoin", "ReorderState", "ReorderVerdicts", "dump_key_state", "is_reordered", "join_reordered",
           "late_reason", "late_rejection", "load_key_state", "order_reason", "rejected_rows", "release_idle_side",
           "released_rejection", "reorder_side"]
