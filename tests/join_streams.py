"""Hypothesis strategies of what reaches a joiner: many machines' streams, interleaved at random, faults applied to
the arrival order, and processing times with quiet spells. For the property tests that check the engine against
the join's reference (tests/unit/test_join_against_reference.py).

A `Scenario` is a list of events in processing-time order: records arriving (`Arrival`) and the joiner looking for
quiet streams (`ReleaseCheck`, its idle release), as join_state_reference takes them. Each machine has one or two
axes; per axis a speed and a torque stream (the power join), with `extra_quantities` a load stream (a second spec
on the speed) and a temperature no spec joins. Times lie on a grid of STEP_MS, some streams half a millisecond off
it; each stream starts in time order, and the streams interleave at random.

Faults act on the arrival order, each a function of FAULTS (a name, and how it changes the arrivals, given the spec's
bound), drawn in any number and mix: a new kind of fault is one more entry, and every test drawing `scenarios()`
meets it. Processing
times advance PROCESSING_STEP_MS per arrival, with drawn pauses; in seconds every one is a multiple of 1/8, exact
in binary, so an engine's seconds clock and the reference's milliseconds agree on every comparison.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from join_state_reference import Arrival, Event, ReleaseCheck

BASE_MS = 1_700_000_000_000  # event times: a stream's grid starts here
STEP_MS = 100  # the grid of event times
MAX_STEPS = 24  # grid points per stream, at most
PROCESSING_STEP_MS = 125  # processing time between two arrivals
# Processing times begin after every event time: records arrive after they were measured.
PROCESSING_START_MS = BASE_MS + 100 * STEP_MS * MAX_STEPS
PAUSES_MS = (500, 1_000, 2_000, 5_000)  # quiet spells


def speed(axis: str) -> str:
    return f"actSpeed_C{axis}"


def torque(axis: str) -> str:
    return f"vaTorque_C{axis}"


def load(axis: str) -> str:
    return f"vaLoad_C{axis}"


def temperature(axis: str) -> str:
    return f"aaTemp_C{axis}"  # joined by no spec


def grid_time(step: int, off_grid: bool = False) -> int | float:
    """Epoch ms of a grid step (an int, as Kafka's JSON records carry whole times), or half a ms after it."""
    return BASE_MS + step * STEP_MS + 0.5 if off_grid else BASE_MS + step * STEP_MS


def result_of(thing: str, quantity: str, step: int) -> float:
    """A stream's result at a grid step: varied, finite, a function of where it is (a repeat carries it again)."""
    return float((step * 37 + len(quantity) * 11 + sum(map(ord, thing))) % 97) / 4 + 0.25


Records = list[dict[str, Any]]
Draw = Callable[[st.SearchStrategy], Any]
BOUNDS_MS = (0, 300, 1_000)  # max_out_of_orderness drawn: none, three grid steps, ten


def _displace(draw: Draw, records: Records, farthest: int) -> Records:
    """A record moved up to `farthest` arrivals later: it comes behind its stream's next records."""
    if not records:
        return records
    index = draw(st.integers(0, len(records) - 1))
    moved = records[:index] + records[index + 1:]
    moved.insert(min(len(moved), index + draw(st.integers(1, farthest))), records[index])
    return moved


def _at_the_bound(draw: Draw, records: Records, bound_ms: float) -> Records:
    """A record moved to arrive right after its stream's record `bound_ms` later: exactly the bound behind the
    newest of its stream (when no later one came before it), the last place it may arrive and still join."""
    where = {(record["thing"], record["quantity"], record["phenomenonTime"]): index
             for index, record in enumerate(records)}
    candidates = [(index, later) for index, record in enumerate(records)
                  if (later := where.get((record["thing"], record["quantity"], record["phenomenonTime"] + bound_ms),
                                         -1)) > index]
    if not bound_ms or not candidates:
        return records
    index, later = draw(st.sampled_from(candidates))
    moved = list(records)
    moved.insert(later + 1, moved[index])
    del moved[index]
    return moved


def _repeat(draw: Draw, records: Records, conflicting: bool) -> Records:
    """A record sent again a few arrivals later (a redelivery), or another result at its time (`conflicting`)."""
    if not records:
        return records
    index = draw(st.integers(0, len(records) - 1))
    copy = dict(records[index])
    if conflicting:
        copy["result"] += 1.0
    repeated = list(records)
    repeated.insert(min(len(repeated), index + draw(st.integers(1, 12))), copy)
    return repeated


# name -> how it changes the arrivals: (draw, the records in arrival order, the bound in ms) -> the records
FAULTS: dict[str, Callable[[Draw, Records, float], Records]] = {
    "displaced": lambda draw, records, bound_ms: _displace(draw, records, 6),  # mostly within a bound of 300-1,000 ms
    "displaced far": lambda draw, records, bound_ms: _displace(draw, records, 40),  # mostly beyond it
    "at the bound": _at_the_bound,
    "duplicate": lambda draw, records, bound_ms: _repeat(draw, records, conflicting=False),
    "conflict": lambda draw, records, bound_ms: _repeat(draw, records, conflicting=True),
}


@dataclass(frozen=True)
class Scenario:
    events: list[Event]
    bound_ms: float  # the specs' max_out_of_orderness the faults were drawn for
    faults: tuple[str, ...]  # the faults applied, in order: for a failing example's report

    @property
    def arrivals(self) -> list[Arrival]:
        return [event for event in self.events if isinstance(event, Arrival)]

    @property
    def records(self) -> Records:
        return [arrival.record for arrival in self.arrivals]


@st.composite
def machine_streams(draw: Draw, max_machines: int = 4, axes: Sequence[str] = ("1", "11"),
                    extra_quantities: bool = False) -> list[Records]:
    """Each machine's streams, each in time order: speed and torque per axis (and load and temperature)."""
    streams = []
    for machine in range(draw(st.integers(1, max_machines))):
        thing = f"m{machine}"
        for axis in draw(st.lists(st.sampled_from(axes), min_size=1, max_size=len(axes), unique=True)):
            quantities = [speed(axis), torque(axis)]
            if extra_quantities:
                quantities += [quantity for quantity in (load(axis), temperature(axis)) if draw(st.booleans())]
            for quantity in quantities:
                steps = sorted(draw(st.sets(st.integers(0, MAX_STEPS), max_size=MAX_STEPS)))
                off_grid = draw(st.integers(0, 3)) == 0  # half a millisecond off the grid: fractional times
                streams.append([{"thing": thing, "quantity": quantity, "phenomenonTime": grid_time(step, off_grid),
                                 "result": result_of(thing, quantity, step)} for step in steps])
    return streams


@st.composite
def scenarios(draw: Draw, max_machines: int = 4, axes: Sequence[str] = ("1", "11"), extra_quantities: bool = False,
              fault_kinds: Sequence[str] | None = None, max_faults: int = 8, quiet_spells: bool = False,
              bounds_ms: Sequence[float] = BOUNDS_MS) -> Scenario:
    """Streams of `machine_streams`, interleaved at random, a bound of `bounds_ms`, and up to `max_faults` faults of
    `fault_kinds` (every kind of FAULTS unless given); `quiet_spells`: drawn pauses in processing time, each followed
    by a look for quiet streams, and one at the end."""
    bound_ms = draw(st.sampled_from(bounds_ms))
    streams = draw(machine_streams(max_machines, axes, extra_quantities))
    rng = draw(st.randoms(use_true_random=False))
    labels = [index for index, stream in enumerate(streams) for _ in stream]
    rng.shuffle(labels)  # far cheaper to draw than a permutation
    positions = [0] * len(streams)
    records: Records = []
    for label in labels:
        records.append(streams[label][positions[label]])
        positions[label] += 1
    kinds = list(FAULTS) if fault_kinds is None else list(fault_kinds)
    applied = draw(st.lists(st.sampled_from(kinds), max_size=max_faults)) if kinds else []
    for kind in applied:
        records = FAULTS[kind](draw, records, bound_ms)
    events: list[Event] = []
    now_ms = PROCESSING_START_MS
    pauses = {}
    if quiet_spells:
        pauses = dict(draw(st.lists(st.tuples(st.integers(0, len(records)), st.sampled_from(PAUSES_MS)),
                                    max_size=6)))
    for index, record in enumerate(records):
        if index in pauses:
            now_ms += pauses[index]
            events.append(ReleaseCheck(now_ms))
        now_ms += PROCESSING_STEP_MS
        events.append(Arrival(now_ms, record))
    if quiet_spells:
        events.append(ReleaseCheck(now_ms + pauses.get(len(records), max(PAUSES_MS))))
    return Scenario(events, bound_ms, tuple(applied))
