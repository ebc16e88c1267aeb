"""Clocks that lie: each stream of a join key keeps to its machine's timeline, whatever one bad stamp says.

A machine's clock can be wrong: a reading stamped years ahead by a PLC whose battery died, a clock set back an
hour by an NTP step or a daylight-saving bug, a gateway stamping a stale buffer. Joined as they come, one
reading far ahead makes every later reading of its stream "older than the last" and silences the series for
as long as the clock lies. The clock rule judges every arriving record of a stream against the newest record
its *timeline* took, before the join (or the reorder buffer) sees it:

* within ``clock_step_ahead_s`` ahead of that newest record, or within the disorder bound plus
  ``clock_step_back_s`` behind it, the record *fits*: the timeline takes it, and the join judges it as always;
* farther off, it is *set aside*, held but not joined, and the records after it decide what it was (a record
  at the time of one set aside is a repeat, dropped, or a conflict, rejected, as in the join, and counts for
  nothing):

  - ``clock_confirm_readings`` records that fit the timeline come first: the records set aside were
    **outliers**, dead-lettered ``clock_outlier``; the join never saw them, so it gives exactly the pairs it
    would have given without them;
  - ``clock_confirm_readings`` records in all lie together off the timeline first (each fitting the newest of
    them by the same limits, or, behind the timeline, lying beyond them but still behind it: time went on there):
    the clock **moved**. Ahead, the timeline goes on with them, as after any gap.
    Behind, the timeline **ends** (what its join still waits for is settled as at the end of the stream: each
    record gets the pairs it can still have) and a new timeline begins with them;
  - a record ahead of records set aside ahead of the timeline shows that time went on: they were readings
    after a gap, and the timeline takes them; the new record is judged against them in turn (set aside);
  - any other record that fits neither drops what was set aside (outliers) and is set aside itself.

A stream's timelines are numbered from 0, and the n-th timeline of one stream joins the n-th of the other: no
pair ever joins readings of two timelines. Both streams of a machine step back together when its clock does;
a stream that steps back alone joins nothing until its partner steps back too (the clock counters show it).
The first record of a stream starts its first timeline.

Every verdict depends on its stream's own order only, never on how the streams interleave or are cut into
batches, so both joiners give the same outputs and dead letters. The per-record path is :class:`ClockedJoin`
(the standalone joiner); the batch path (Spark) keeps the same :class:`StreamClock` per side in the key's state
(``local_stream_buffer.clocked_batch``).
"""
from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple, Protocol

from .output import canonical_time
from .rejections import Rejection
from .specs import ClockRule
from .status import IngestStatus
from .two_stream_join import LEFT, RIGHT

log = logging.getLogger(__name__)

_ACCEPTED = IngestStatus.ACCEPTED
_DUPLICATE = IngestStatus.DUPLICATE
_REJECTED = IngestStatus.REJECTED
_NEVER = -math.inf
END = math.inf  # the time of the record that ends a stream's timeline in its join: never paired, never output

# What became of the records set aside (`StreamClock.arrive`).
OUTLIERS = 1  # dead-lettered: the timeline went on without them
AHEAD = 2  # the timeline takes them: the clock went on ahead (or readings after a gap)
BEHIND = 3  # the timeline ends; a new one begins with them

# A record as the clock holds it: (time in epoch ms, result, the caller's item).
Held = tuple[float, float, Any]


class Settled(NamedTuple):
    """Records set aside, settled: what became of them (OUTLIERS, AHEAD or BEHIND) and the records, in arrival
    order."""

    kind: int
    records: list[Held]


class StreamClock:
    """The clock rule's state of one stream: the records set aside and how many records fit the timeline since.
    The timeline's newest time is its join's, passed in by the caller."""

    __slots__ = ("aside", "aside_newest", "votes")

    def __init__(self, aside: list[Held] | None = None, votes: int = 0) -> None:
        self.aside: list[Held] = aside or []
        self.aside_newest = max((held[0] for held in self.aside), default=_NEVER)
        self.votes = votes

    def repeats(self, t: float, value: float) -> bool | None:
        """Whether a record at ``t`` repeats one set aside: True for an exact repeat (dropped as a duplicate), False
        for another result at its time (rejected as a conflict; the first stays), None when none is at ``t``."""
        for held in self.aside:
            if held[0] == t:
                return held[1] == value
        return None

    def arrive(self, t: float, value: float, item: Any, newest: float, rule: ClockRule) -> tuple[Settled | None, bool]:
        """Judge an arriving record against the timeline's ``newest`` time (one that repeats a record set aside is
        the caller's to turn away first: :meth:`repeats`). Returns what became of the records set aside (None:
        nothing) and whether the timeline takes the record now; apply the settled records first. A record
        neither taken nor settled is set aside."""
        aside = self.aside
        if not aside:
            if newest == _NEVER or newest - rule.behind_ms <= t <= newest + rule.ahead_ms:
                return None, True
            self._set_aside((t, value, item))
            return None, False
        if newest - rule.behind_ms <= t <= newest + rule.ahead_ms:
            self.votes += 1
            if self.votes < rule.confirm:
                return None, True
            self._clear()
            return Settled(OUTLIERS, aside), True
        run_newest = self.aside_newest
        behind = aside[0][0] < newest
        # A record fits the records set aside, or lies beyond them still behind the timeline (time went on there).
        if run_newest - rule.behind_ms <= t <= run_newest + rule.ahead_ms or \
                behind and run_newest < t < newest - rule.behind_ms:
            aside.append((t, value, item))
            if t > run_newest:
                self.aside_newest = t
            if len(aside) < rule.confirm:
                return None, False
            self._clear()
            return Settled(AHEAD if aside[0][0] > newest else BEHIND, aside), False
        if not behind and t > run_newest:
            self._set_aside((t, value, item))
            return Settled(AHEAD, aside), False
        self._set_aside((t, value, item))
        return Settled(OUTLIERS, aside), False

    def _set_aside(self, held: Held) -> None:
        self.aside = [held]
        self.aside_newest = held[0]
        self.votes = 0

    def _clear(self) -> None:
        self.aside = []
        self.aside_newest = _NEVER
        self.votes = 0


def outlier_reason(stream: str, t: float, newest: float, confirm: int) -> str:
    """Why a record set aside was dropped as an outlier (``newest``: its timeline's newest time then)."""
    off = t - newest
    return Rejection.CLOCK_OUTLIER.reason(
        t=canonical_time(t), stream=stream, off_ms=canonical_time(abs(off)), direction="ahead of" if off > 0 else
        "behind", newest=canonical_time(newest), confirm=confirm)


class ClockCounters:
    """What the clock rule did to streams (of a machine, or of many)."""

    __slots__ = ("outliers", "steps_back", "jumps_ahead")
    NAMES = ("outliers", "steps_back", "jumps_ahead")

    def __init__(self, outliers: int = 0, steps_back: int = 0, jumps_ahead: int = 0) -> None:
        self.outliers = outliers  # records dropped as outliers
        self.steps_back = steps_back  # timelines ended by a step back (a new one began)
        self.jumps_ahead = jumps_ahead  # runs of records set aside ahead that the timeline then took (a gap, or a
        # clock set ahead)

    def add(self, other: ClockCounters) -> None:
        self.outliers += other.outliers
        self.steps_back += other.steps_back
        self.jumps_ahead += other.jumps_ahead

    def as_tuple(self) -> tuple[int, int, int]:
        return self.outliers, self.steps_back, self.jumps_ahead

    def __bool__(self) -> bool:
        return bool(self.outliers or self.steps_back or self.jumps_ahead)


def clock_fault_points(faults: Mapping[str, ClockCounters]) -> dict[str, dict[str, int]]:
    """Per machine whose clock the rule caught at something, its counters as a stage reports them."""
    return {thing: {f"clock_{name}": count for name, count in zip(ClockCounters.NAMES, counters.as_tuple())}
            for thing, counters in faults.items() if counters}


def clock_fault_totals(faults: Mapping[str, ClockCounters]) -> dict[str, int]:
    """What the clock rule did to every machine's streams, added up, as a stage reports it."""
    totals = ClockCounters()
    for counters in faults.values():
        totals.add(counters)
    return {f"clock_{name}": count for name, count in zip(ClockCounters.NAMES, totals.as_tuple())}


class ClockOwner(Protocol):
    """What a :class:`ClockedJoin` asks of the key it joins (the keyed joiner's key)."""

    def new_line(self) -> Any:
        """A new, empty join for a timeline; its hooks let ``END`` pass (no item, no pair with its time)."""

    def release(self, item: Any) -> None:
        """Let go of a record the clock held (the joins release the rest through their own hook)."""

    def drop(self, side: int, held: Held, reason: str, outlier: bool) -> None:
        """A record held until now is not joined after all: an outlier, or a record set aside that its timeline's
        join turned away (not as a duplicate, which goes without a word) when it took it. Released after."""

    def stream(self, side: int) -> str:
        """A side's stream, ``thing.quantity``, for reasons and logs."""

    def reject_reason(self, join: Any, side: int, t: float, status: IngestStatus) -> str:
        """The reason a timeline's join gave for turning a record away."""

    def clock_counters(self) -> ClockCounters:
        """Where the rule counts what it did (the machine's)."""

    def clock_changed(self) -> None:
        """What :meth:`ClockedJoin.snapshot` gives may have changed (a record set aside or settled, a vote, a
        timeline begun or gone)."""


class ClockedJoin:
    """A key's join behind the clock rule of each of its two streams: the per-record path.

    Holds one join per live timeline (:class:`TwoStreamJoin`, or :class:`ReorderedJoin` with a bound), made by its
    owner. A timeline's join lives until both streams have left it; a stream leaving it is ended there by a record
    at +inf (``END``), so its last pairs come out. Same interface as the joins it holds (``ingest``, ``buffer``,
    ``held_items``, ``poll``, ``release``, ``forced``, ``len``).
    """

    __slots__ = ("_owner", "_rule", "_lines", "_line", "_clocks", "_plan", "recorded", "_apart_said")

    def __init__(self, owner: ClockOwner, rule: ClockRule) -> None:
        self._owner = owner
        self._rule = rule
        self._lines: dict[int, Any] = {0: owner.new_line()}  # live timelines' joins, by number
        self._line = [0, 0]  # per side, the timeline its stream is on
        self._clocks = (StreamClock(), StreamClock())
        self._plan: dict | None = None  # while restoring: where each held record goes (see :meth:`restore`)
        self.recorded = False  # whether its owner's adapter keeps a snapshot of it (to delete when the key goes)
        self._apart_said = -1  # the timeline a side was last said to be left behind on (logged once each)

    def ingest(self, side: int, t: float, value: Any, item: Any) -> IngestStatus:
        """Judge the next arriving record of a side by its clock, then the join of its timeline."""
        line = self._line[side]
        join = self._lines[line]
        clock = self._clocks[side]
        if not clock.aside:  # the common case: no record waits to be judged
            newest = join.last_time(side)
            rule = self._rule
            if newest - rule.behind_ms <= t <= newest + rule.ahead_ms or newest == _NEVER:
                if line < self._line[side ^ 1] and line != self._apart_said:
                    self._say_apart(side)
                return join.ingest(side, t, value, item)
        repeat = clock.repeats(t, value)
        if repeat is not None:
            return _DUPLICATE if repeat else _REJECTED
        settled, take = clock.arrive(t, value, item, join.last_time(side), self._rule)
        self._owner.clock_changed()
        status = _ACCEPTED  # set aside: held
        if settled is not None:
            status = self._settle(side, settled, item)
        if take:
            line = self._line[side]
            if line < self._line[side ^ 1] and line != self._apart_said:
                self._say_apart(side)
            return self._lines[line].ingest(side, t, value, item)
        return status

    def _settle(self, side: int, settled: Settled, arriving: Any) -> IngestStatus:
        """Apply what became of the records set aside; returns the status of the arriving record (its caller's
        ``arriving`` item) where it is among them (the join's verdict as it took it), else ACCEPTED."""
        owner = self._owner
        counters = owner.clock_counters()
        join = self._lines[self._line[side]]
        if settled.kind == OUTLIERS:  # the arriving record is never among them
            newest = join.last_time(side)
            counters.outliers += len(settled.records)
            for held in settled.records:
                owner.drop(side, held, outlier_reason(owner.stream(side), held[0], newest, self._rule.confirm), True)
                owner.release(held[2])
            return _ACCEPTED
        if settled.kind == AHEAD:
            counters.jumps_ahead += 1
            log.debug("%s went on %s ms ahead of its timeline at t=%s (after a gap, or its clock was set ahead): "
                     "joined on", owner.stream(side), canonical_time(settled.records[0][0] - join.last_time(side)),
                     canonical_time(join.last_time(side)))
        else:
            counters.steps_back += 1
            log.warning("%s stepped back: its clock went from t=%s to t=%s; the timeline ended there and a new one "
                        "begins", owner.stream(side), canonical_time(join.last_time(side)),
                        canonical_time(settled.records[0][0]))
            join = self._next_line(side)
        arriving_status = _ACCEPTED
        for held in settled.records:
            status = join.ingest(side, held[0], held[1], held[2])
            if held[2] is arriving:
                arriving_status = status
            elif status is not _ACCEPTED:
                if status is not _DUPLICATE:
                    owner.drop(side, held, owner.reject_reason(join, side, held[0], status), False)
                owner.release(held[2])
        return arriving_status

    def _say_apart(self, side: int) -> None:
        """A side's timeline takes a record after its partner left it: said once per timeline, as its records join
        nothing now (a record set aside says nothing yet: it may be the side stepping back too)."""
        self._apart_said = self._line[side]
        log.warning("%s keeps to a timeline %s stepped back from: they join nothing until it steps back too (a "
                    "clock fault on one quantity, or readings too sparse to show the step: docs/join.md)",
                    self._owner.stream(side), self._owner.stream(side ^ 1))

    def _next_line(self, side: int) -> Any:
        """End the side's timeline in its join and move the side to the next one; a timeline both sides left goes,
        and with it every record its join held (none can pair any more)."""
        line = self._line[side]
        ended = self._lines[line]
        ended.close(side, None)
        self._line[side] = line + 1
        if self._line[side ^ 1] > line:
            del self._lines[line]
            for item in list(ended.held_items()):
                if item is not None:
                    self._owner.release(item)
        following = self._lines.get(line + 1)
        if following is None:
            following = self._lines[line + 1] = self._owner.new_line()
        return following

    def snapshot(self, source_of: Callable[[Any], object]) -> dict | None:
        """What a restore needs beyond the held records themselves, as JSON-ready data with each record named by
        ``source_of(item)``: per side its timeline (counted from the lower side's), the records it sets aside and
        its votes, and the records it holds in timelines it left. None while both sides share one timeline and
        nothing is set aside: the held records alone then restore the key."""
        clocks = self._clocks
        if self._line[LEFT] == self._line[RIGHT] and not clocks[LEFT].aside and not clocks[RIGHT].aside:
            return None
        base = min(self._line)
        return {
            "line": [line - base for line in self._line],
            "votes": [clock.votes for clock in clocks],
            "aside": [[source_of(held[2]) for held in clock.aside] for clock in clocks],
            "left_lines": [{str(line - base): [source_of(entry[2]) for entry in join.buffer(side) if entry[0] != END]
                            for line, join in self._lines.items() if line < self._line[side]} for side in (LEFT, RIGHT)],
        }

    def restore(self, snapshot: dict) -> None:
        """Take a :meth:`snapshot` back, before the key's held records are placed again (:meth:`place`)."""
        self.recorded = True
        self._line = list(snapshot["line"])
        for line in range(min(self._line), max(self._line) + 1):
            if line not in self._lines:
                self._lines[line] = self._owner.new_line()
        for clock, votes in zip(self._clocks, snapshot["votes"]):
            clock.votes = votes
        self._plan = {
            "aside": [set(sources) for sources in snapshot["aside"]],
            "left_lines": [{source: int(line) for line, sources in lines.items() for source in sources}
                           for lines in snapshot["left_lines"]],
        }

    def place(self, side: int, t: float, value: Any, item: Any, source: object) -> IngestStatus:
        """Put a held record back where it was when its state was saved (a restore: its records in their order,
        never judged again); a timeline a side left is ended again once its records are back."""
        plan = self._plan
        if plan is not None and source in plan["aside"][side]:
            clock = self._clocks[side]
            votes = clock.votes
            clock.aside.append((t, value, item))
            clock.aside_newest = max(clock.aside_newest, t)
            clock.votes = votes
            return _ACCEPTED
        line = plan["left_lines"][side].get(source, self._line[side]) if plan is not None else self._line[side]
        return self._lines[line].ingest(side, t, value, item)

    def restored(self) -> None:
        """The held records are back: end each timeline a side has left, as it was ended before."""
        if self._plan is None:
            return
        self._plan = None
        for side in (LEFT, RIGHT):
            for line, join in self._lines.items():
                if line < self._line[side]:
                    join.close(side, None)

    def sets_aside(self, side: int, t: float) -> bool:
        """Whether a record at ``t`` is set aside on a side (a record at its time with another result conflicts)."""
        return self._clocks[side].repeats(t, math.nan) is not None

    def taking(self, side: int) -> Any:
        """The join of the timeline a side's stream is on (whose reasons a record it turned away gets)."""
        return self._lines[self._line[side]]

    def last_time(self, side: int) -> float:
        return self._lines[self._line[side]].last_time(side)

    def release(self, side: int, up_to: float | None = None) -> float | None:
        """An idle release of a side's stream, in the join of its timeline (see ``reorder``)."""
        return self._lines[self._line[side]].release(side, up_to)

    def poll(self) -> None:
        for join in self._lines.values():
            join.poll()

    @property
    def forced(self) -> int:
        return sum(join.forced for join in self._lines.values())

    def buffer(self, side: int) -> list[tuple]:
        """The records a side holds, in every live timeline and set aside (what an evicted key gives up)."""
        held = [entry for join in self._lines.values() for entry in join.buffer(side) if entry[0] != END]
        return held + self._clocks[side].aside

    def held_items(self) -> Iterator[Any]:
        for join in self._lines.values():
            for item in join.held_items():
                if item is not None:
                    yield item
        for clock in self._clocks:
            for held in clock.aside:
                yield held[2]

    def __len__(self) -> int:
        return sum(len(join) for join in self._lines.values()) + len(self._clocks[LEFT].aside) + \
            len(self._clocks[RIGHT].aside)
