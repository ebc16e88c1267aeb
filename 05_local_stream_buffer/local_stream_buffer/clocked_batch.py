"""The clock rule on the batch path (the Spark job): a key's stored state with its timelines, and the join of a
key's next records through each stream's clock (:mod:`local_stream_buffer.clock` says what the rule is).

A key whose streams keep to one timeline stores its join state as it always did (a plain or a reordered state).
While its clock rule holds records set aside, or its two streams are on different timelines, the key stores a
*clocked* state: per side its timeline's number, the records set aside and the records since that fit the
timeline (``votes``), and one inner state per live timeline. Timelines are numbered from the lower side's, so a
key whose streams agree again goes back to its plain state.
"""
from __future__ import annotations

import logging
import math
import struct
from typing import NamedTuple

import numpy as np

from .batch import BatchJoinState, PairArrays, join_batch
from .clock import BEHIND, END, OUTLIERS, ClockCounters, StreamClock, outlier_reason
from .output import canonical_time
from .idle_release import due_sides as reordered_due_sides
from .idle_release import next_due_ms as reordered_next_due_ms
from .order import order_verdicts
from .rejections import order_rejection
from .reorder import is_reordered, join_reordered, load_key_state, rejected_rows
from .reorder import release_idle_side as release_reordered_side
from .specs import ClockRule, SpecBinding
from .two_stream_join import DEFAULT_MAX_PENDING_PER_SIDE, LEFT, RIGHT

log = logging.getLogger(__name__)

_FLOAT = np.float64
_EMPTY = np.empty(0, dtype=_FLOAT)
_CLOCKED_FORMAT = 0x43  # "C": no plain ("\x01") or reordered ("R", "S") state starts with it
# Marker, per side the timeline's number, its votes and how many records it sets aside; the set-aside records
# (left times, left values, right times, right values); the number of live timelines; per timeline its number
# and the length of its inner state (0: none yet), then the inner state.
_HEADER = struct.Struct("<B2i2I2I")
_LINE = struct.Struct("<iI")
_COUNT = struct.Struct("<I")
# A record handed to a timeline from where it waited (set aside): no row of the batch, dropped by its reading.
_SET_ASIDE = -1
_NO_ROWS = np.empty(0, dtype=np.int64)


class ClockedState:
    """A key's state on the batch path under the clock rule: each side's timeline and clock, and the inner
    state of every live timeline (None: a timeline with nothing stored yet)."""

    __slots__ = ("line", "clocks", "lines")

    def __init__(self) -> None:
        self.line = [0, 0]
        self.clocks = (StreamClock(), StreamClock())
        self.lines: dict[int, bytes | None] = {0: None}

    def is_plain(self) -> bool:
        """One timeline for both streams and nothing set aside: stored as the inner state alone."""
        return self.line[LEFT] == self.line[RIGHT] and not self.clocks[LEFT].aside and not self.clocks[RIGHT].aside


def is_clocked(data: bytes | None) -> bool:
    """Whether stored key state is a clocked one (timelines apart, or records set aside)."""
    return bool(data) and data[0] == _CLOCKED_FORMAT


def load_clocked(data: bytes | None) -> ClockedState:
    """A key's clocked state from its stored bytes (a plain or reordered state: its one timeline)."""
    state = ClockedState()
    if not is_clocked(data):
        state.lines = {0: data}
        return state
    _, left_line, right_line, left_votes, right_votes, n_left, n_right = _HEADER.unpack_from(data)
    state.line = [left_line, right_line]
    offset = _HEADER.size
    arrays = np.frombuffer(data, dtype="<f8", count=2 * (n_left + n_right), offset=offset)
    offset += arrays.nbytes
    aside = []
    start = 0
    for count in (n_left, n_right):
        times, values = arrays[start:start + count].tolist(), arrays[start + count:start + 2 * count].tolist()
        aside.append([(t, value, _SET_ASIDE) for t, value in zip(times, values)])
        start += 2 * count
    state.clocks = (StreamClock(aside[LEFT], left_votes), StreamClock(aside[RIGHT], right_votes))
    (count,) = _COUNT.unpack_from(data, offset)
    offset += _COUNT.size
    state.lines = {}
    for _ in range(count):
        number, length = _LINE.unpack_from(data, offset)
        offset += _LINE.size
        state.lines[number] = bytes(data[offset:offset + length]) if length else None
        offset += length
    return state


def dump_clocked(state: ClockedState) -> bytes | None:
    """The bytes a key's clocked state is stored as: the inner state alone when it is plain (None: nothing yet)."""
    base = min(state.line)
    if state.is_plain():
        return state.lines[state.line[LEFT]]
    asides = [clock.aside for clock in state.clocks]
    header = _HEADER.pack(_CLOCKED_FORMAT, state.line[LEFT] - base, state.line[RIGHT] - base,
                          state.clocks[LEFT].votes, state.clocks[RIGHT].votes, len(asides[LEFT]), len(asides[RIGHT]))
    arrays = b"".join(np.asarray([held[column] for held in aside], dtype="<f8").tobytes()
                      for aside in asides for column in (0, 1))
    lines = b"".join(_LINE.pack(number - base, len(inner or b"")) + (inner or b"")
                     for number, inner in sorted(state.lines.items()))
    return header + arrays + _COUNT.pack(len(state.lines)) + lines


class ClockedKeyJoin(NamedTuple):
    """What the join of one key's records under its clock rule gave."""

    stored: bytes | None
    pairs: PairArrays
    rejected: tuple[np.ndarray, np.ndarray]  # per side, the arriving records (indices) turned away on arrival
    reasons: tuple[list[str], list[str]]
    dropped: list[tuple[int, float, float, str]]  # (side, time, result, reason): records held before, given up
    counters: ClockCounters


class _Handed:
    """The records each timeline takes in one call, per side, in the order it takes them: (time, result, row of
    the batch or _SET_ASIDE); a timeline a side leaves gets a last record at END."""

    def __init__(self) -> None:
        self.records: dict[int, tuple[list[tuple[float, float, int]], list[tuple[float, float, int]]]] = {}

    def add(self, line: int, side: int, t: float, value: float, row: int) -> None:
        if line not in self.records:
            self.records[line] = ([], [])
        self.records[line][side].append((t, value, row))


def _newest(inner: bytes | None, side: int) -> float:
    """The newest time a timeline's join took on a side (-inf: none)."""
    return load_key_state(inner)[0].newest[side] if inner is not None else -math.inf


def _all_fit(times: np.ndarray, newest: float, rule: ClockRule) -> bool:
    """Whether every arriving record of a side fits its timeline, the records before it included."""
    if not len(times):
        return True
    newest_before = np.empty(len(times), dtype=_FLOAT)
    newest_before[0] = newest
    np.maximum.accumulate(times[:-1], out=newest_before[1:])
    np.fmax(newest_before, newest, out=newest_before)
    judged = newest_before > -math.inf  # the first record of a stream fits whatever it is
    return bool(np.all(~judged | ((times >= newest_before - rule.behind_ms) & (times <= newest_before + rule.ahead_ms))))


def needs_clock(data: bytes | None, rule: ClockRule | None, sides: tuple[np.ndarray, np.ndarray]) -> bool:
    """Whether a key's arriving records (per side, times in arrival order) need its clock rule: its state is a
    clocked one, or a record does not fit its timeline. Otherwise the key joins as if there were no rule."""
    if rule is None:
        return False
    if is_clocked(data):
        return True
    return not all(_all_fit(times, _newest(data, side), rule) for side, times in zip((LEFT, RIGHT), sides))


def join_clocked(data: bytes | None, binding: SpecBinding, thing: str, times: tuple[np.ndarray, np.ndarray],
                 values: tuple[np.ndarray, np.ndarray], max_pending_per_side: int = DEFAULT_MAX_PENDING_PER_SIDE,
                 arrived_ms: int = 0) -> ClockedKeyJoin:
    """The next arriving records of a key (per side in arrival order) through each side's clock into the joins of
    their timelines, as :class:`local_stream_buffer.clock.ClockedJoin` takes them one at a time."""
    rule = binding.clock_rule
    state = load_clocked(data)
    handed = _Handed()
    dropped: list[tuple[int, float, float, str]] = []
    counters = ClockCounters()
    rejected: tuple[list[int], list[int]] = ([], [])
    reasons: tuple[list[str], list[str]] = ([], [])
    for side in (LEFT, RIGHT):
        clock = state.clocks[side]
        quantity = binding.quantity(side)
        stream = f"{thing}.{quantity}"
        line = state.line[side]
        newest = max(_newest(state.lines.get(line), side),
                     max((t for t, _, _ in handed.records.get(line, ([], []))[side]), default=-math.inf))
        for row, (t, value) in enumerate(zip(times[side].tolist(), values[side].tolist())):
            repeat = clock.repeats(t, value)
            if repeat is not None:
                if not repeat:
                    rejected[side].append(row)
                    reasons[side].append(order_rejection(thing, quantity, t, t))
                continue
            settled, take = clock.arrive(t, value, row, newest, rule)
            if settled is not None:
                if settled.kind == OUTLIERS:
                    counters.outliers += len(settled.records)
                    dropped.extend((side, held[0], held[1], outlier_reason(stream, held[0], newest, rule.confirm))
                                   for held in settled.records)
                else:
                    if settled.kind == BEHIND:
                        counters.steps_back += 1
                        log.warning("%s stepped back: its clock went from t=%s to t=%s; the timeline ended there and "
                                    "a new one begins", stream, canonical_time(newest),
                                    canonical_time(settled.records[0][0]))
                        handed.add(line, side, END, 0.0, _SET_ASIDE)
                        line += 1
                        state.line[side] = line
                        state.lines.setdefault(line, None)
                        newest = -math.inf
                    else:
                        counters.jumps_ahead += 1
                        log.debug("%s went on %s ms ahead of its timeline at t=%s (after a gap, or its clock was set "
                                 "ahead): joined on", stream, canonical_time(settled.records[0][0] - newest),
                                 canonical_time(newest))
                    for held in settled.records:
                        # The arriving record keeps its row: turned away, it is dead-lettered as it came.
                        handed.add(line, side, held[0], held[1], row if held[2] == row else _SET_ASIDE)
                        newest = max(newest, held[0])
            if take:
                handed.add(line, side, t, value, row)
                newest = max(newest, t)
    pairs: list[PairArrays] = []
    for line, sides in sorted(handed.records.items()):
        inner, line_pairs, turned_away = _join_line(state.lines.get(line), binding, thing, sides,
                                                    max_pending_per_side, arrived_ms)
        state.lines[line] = inner
        pairs.append(line_pairs)
        for side, position, reason in turned_away:
            t, value, row = sides[side][position]
            if row == _SET_ASIDE:
                dropped.append((side, t, value, reason))
            else:
                rejected[side].append(row)
                reasons[side].append(reason)
    for line in [line for line in state.lines if line < min(state.line)]:
        del state.lines[line]  # both streams left it: nothing it holds can pair any more
    return ClockedKeyJoin(dump_clocked(state), _concatenated(pairs), tuple(np.asarray(rows, dtype=np.int64)
                                                                             for rows in rejected),
                          reasons, dropped, counters)


def _join_line(inner: bytes | None, binding: SpecBinding, thing: str,
               sides: tuple[list[tuple[float, float, int]], list[tuple[float, float, int]]],
               max_pending_per_side: int, arrived_ms: int) -> tuple[bytes, PairArrays, list[tuple[int, int, str]]]:
    """One timeline's join of the records it takes in this call: its new inner state, its pairs (none with END),
    and the records it turned away (side, position in ``sides``, reason)."""
    times = tuple(np.asarray([record[0] for record in side], dtype=_FLOAT) for side in sides)
    values = tuple(np.asarray([record[1] for record in side], dtype=_FLOAT) for side in sides)
    with np.errstate(invalid="ignore"):  # END less END, where both streams end a timeline: no pair, as it should be
        stored, pairs, turned_away = join_key_records(inner, binding, thing, times, values, max_pending_per_side,
                                                      arrived_ms)
    real = (pairs.left_time != END) & (pairs.right_time != END)
    if not real.all():
        pairs = PairArrays(*(column[real] for column in pairs))
    return stored, pairs, [(side, int(position), reason) for side, (positions, why) in enumerate(turned_away)
                           for position, reason in zip(positions.tolist(), why)]


def join_key_records(inner: bytes | None, binding: SpecBinding, thing: str, times: tuple[np.ndarray, np.ndarray],
                     values: tuple[np.ndarray, np.ndarray], max_pending_per_side: int = DEFAULT_MAX_PENDING_PER_SIDE,
                     arrived_ms: int = 0) -> tuple[bytes, PairArrays, tuple[tuple[np.ndarray, list[str]], ...]]:
    """One key's join of its next records (per side, in the order its join takes them), without a clock: its new
    stored state, its pairs, and per side the records turned away (positions) and why. Exact repeats go without a
    word; with a bound, each stream passes its reorder buffer first."""
    bound = binding.max_out_of_orderness_ms
    turned_away: list[tuple[np.ndarray, list[str]]] = []
    if bound or is_reordered(inner):
        stored, pairs, verdicts = join_reordered(inner, times[LEFT], values[LEFT], times[RIGHT], values[RIGHT], bound,
                                                 delta_time_ms=binding.delta_time_ms,
                                                 max_pending_per_side=max_pending_per_side, arrived_ms=arrived_ms)
        released = None
        for side, verdict in zip((LEFT, RIGHT), verdicts):
            if not (verdict.late.any() or verdict.rejected.any()):
                turned_away.append((_NO_ROWS, []))
                continue
            if released is None:  # an idle release is the reason of some late records; it moves between calls
                released = load_key_state(stored)[0].released
            turned_away.append(rejected_rows(verdict, thing, binding.quantity(side), times[side], bound,
                                             released[side], binding.idle_release_ms))
        return stored, pairs, tuple(turned_away)
    state = BatchJoinState.from_bytes(inner) if inner is not None else BatchJoinState()
    for side in (LEFT, RIGHT):
        verdicts = order_verdicts(times[side], values[side], state.last_time[side], state.last_value[side])
        broken = np.flatnonzero(verdicts.rejected)
        quantity = binding.quantity(side)
        turned_away.append((broken, [order_rejection(thing, quantity, t, last) for t, last in
                                     zip(times[side][broken].tolist(), verdicts.latest_before[broken].tolist())]))
    state, pairs = join_batch(state, times[LEFT], values[LEFT], times[RIGHT], values[RIGHT],
                              delta_time_ms=binding.delta_time_ms, max_pending_per_side=max_pending_per_side)
    return state.to_bytes(), pairs, tuple(turned_away)


def _concatenated(pairs: list[PairArrays]) -> PairArrays:
    if not pairs:
        return PairArrays(_EMPTY, _EMPTY, _EMPTY, _EMPTY, np.empty(0, dtype=np.int8))
    return PairArrays(*(np.concatenate(column) for column in zip(*pairs)))


def held_records(data: bytes | None) -> list[tuple[int, float, float]]:
    """Every record a key's stored state holds, ``(side, time, result)``: its timelines' joins and reorder
    buffers, and what its clocks set aside (what an evicted key gives up)."""
    state = load_clocked(data)
    held = []
    for inner in state.lines.values():
        if inner is None:
            continue
        reorder, joined = load_key_state(inner)
        held += [(side, t, value) for side in (LEFT, RIGHT)
                 for times, values in ((joined.times[side], joined.values[side]),
                                       (reorder.times[side], reorder.values[side]))
                 for t, value in zip(times.tolist(), values.tolist()) if t != END]
    return held + [(side, held[0], held[1]) for side in (LEFT, RIGHT) for held in state.clocks[side].aside]


def _current(data: bytes | None, side: int) -> tuple[ClockedState, bytes | None]:
    state = load_clocked(data)
    return state, state.lines.get(state.line[side])


def due_sides(data: bytes | None, now_ms: int, idle_release_ms: float) -> list[int]:
    """The sides of a key's stored state whose timeline's reorder buffer is due for its idle release
    (:func:`local_stream_buffer.idle_release.due_sides`)."""
    return [side for side in (LEFT, RIGHT)
            if side in reordered_due_sides(_current(data, side)[1], now_ms, idle_release_ms)]


def next_due_ms(data: bytes | None, idle_release_ms: float) -> int | None:
    """When the earliest side's timeline of a key's stored state is due for its idle release."""
    due = [reordered_next_due_ms(_current(data, side)[1], idle_release_ms) for side in (LEFT, RIGHT)]
    due = [when for when in due if when is not None]
    return min(due) if due else None


def release_idle_side(data: bytes, side: int, delta_time_ms: float | None = None,
                      max_pending_per_side: int = DEFAULT_MAX_PENDING_PER_SIDE) -> tuple[bytes, PairArrays] | None:
    """The idle release of one side of a key's stored state, in its timeline's join
    (:func:`local_stream_buffer.reorder.release_idle_side`)."""
    state, inner = _current(data, side)
    if inner is None or not is_reordered(inner):
        return None
    released = release_reordered_side(inner, side, delta_time_ms, max_pending_per_side)
    if released is None:
        return None
    state.lines[state.line[side]], pairs = released
    real = (pairs.left_time != END) & (pairs.right_time != END)
    return dump_clocked(state), PairArrays(*(column[real] for column in pairs))


__all__ = ["ClockedKeyJoin", "ClockedState", "due_sides", "dump_clocked", "held_records", "is_clocked",
           "join_clocked", "join_key_records", "load_clocked", "needs_clock", "next_due_ms", "release_idle_side"]
