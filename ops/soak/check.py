"""The soak's check of what the pipeline made of the plant's rows, from what Kafka holds after the run.

machine.data, partition by partition (every record of a machine lies in one): each record of this run's machines
must be a reading of a published row, at its time, with the value the plant gives it (`plant.Plant`), once; every
row the broker acknowledged must be there whole, unless a SIGKILL of Mosquitto may have lost it (acknowledged after
its last save: counted, and shown). The join of what machine.data holds, computed by the reference
(`join_reference`, which shares no code with either joiner), gives the records machine.out must hold, each once:
compared as canonical JSON (every field, the id included) by a 128-bit digest. The partitions are read in worker
processes, two at a time, the soak's machine being otherwise idle by then.

Beside the verdicts, each partition gives what InfluxDB must hold: points per hour of event time, and a random
sample of whole hour-long windows of single series (`SampleWindow`) to compare point by point.
"""
from __future__ import annotations

import hashlib
import logging
import math
import multiprocessing
import random
from array import array
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from join_reference import POWER, reference_join, reference_outliers, reference_turned_away

from .plant import JOIN_LEFT, JOIN_RIGHT, KINDS, Plant, values_agree
from .points import joined_point_of, level_of
from .readback import PartitionRange, read_values

log = logging.getLogger("soak.check")

HOUR_MS = 3_600_000
WINDOW_MS = HOUR_MS  # a sample window: an hour of one series
EXAMPLES = 5  # of each kind of problem, kept for the report
DIGEST_BYTES = 16


@dataclass(frozen=True)
class CheckContext:
    """What a worker needs to check a partition (picklable)."""

    bootstrap: str
    security: dict[str, str]
    machines: int
    axes: int
    seed: int
    probes: int
    names: tuple[str, ...]
    phase_ms: tuple[int, ...]  # each machine's offset within a round
    round_times_ms: np.ndarray  # the event time of each round published
    at_risk: np.ndarray  # rounds with a row the broker acknowledged after its last save before a SIGKILL
    sample_points: int  # points each data partition samples (raw and joined each)
    level_bounds: tuple[float, float, float]
    sample_seed: int
    clock_offsets: dict[int, np.ndarray] = field(default_factory=dict)  # machine -> its clock's offset per round


@dataclass
class SampleWindow:
    """All points one series must have in InfluxDB within [start_ms, end_ms): raw ones as {time_ns: value},
    joined ones as {time_ns: (result, active, case, level)}."""

    measurement: str  # "raw" or "joined"
    thing: str
    quantity: str
    start_ms: int
    end_ms: int
    points: dict[int, Any] = field(default_factory=dict)


@dataclass
class PartitionResult:
    """What one partition of machine.data (or machine.out) gave."""

    span: PartitionRange
    records: int = 0  # of this run's machines
    foreign: int = 0  # of other machines (another run, `make data`): not this run's to check
    problems: Counter = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)
    machines: list[int] = field(default_factory=list)
    rows: int = 0  # rows found whole
    lost_at_risk: list[tuple[int, int]] = field(default_factory=list)  # (machine, round) lost to a Mosquitto kill
    raw_per_hour: Counter = field(default_factory=Counter)  # distinct points by hour of event time
    joined_per_hour: Counter = field(default_factory=Counter)
    digests: bytes = b""  # machine.out: what it holds; machine.data: what the reference join gives
    outputs_per_thing: Counter = field(default_factory=Counter)
    windows: list[SampleWindow] = field(default_factory=list)
    # The records the reference's clock rule drops as outliers: (thing, quantity, time, result) each.
    outliers: list[tuple[str, str, float, float]] = field(default_factory=list)
    # The records it turns away otherwise (late in their timeline, or a conflict), which a joiner dead-letters too.
    turned_away: list[tuple[str, str, float, float]] = field(default_factory=list)

    def problem(self, kind: str, count: int, example: str) -> None:
        if count:
            self.problems[kind] += count
            found = self.examples.setdefault(kind, [])
            if len(found) < EXAMPLES:
                found.append(example)


def digest(record: Mapping[str, Any]) -> bytes:
    """A record's identity for the comparison: every field, as canonical JSON."""
    return hashlib.blake2b(orjson.dumps(record, option=orjson.OPT_SORT_KEYS), digest_size=DIGEST_BYTES).digest()


class Stream:
    """One series' records in their order: the row (round) each came of, its time, its value."""

    __slots__ = ("rounds", "times", "values")

    def __init__(self) -> None:
        self.rounds, self.times, self.values = array("q"), array("q"), array("d")


def check_data_partition(context: CheckContext, span: PartitionRange) -> PartitionResult:
    """machine.data's records of one partition, checked; their reference join's digests and InfluxDB's due."""
    result = PartitionResult(span)
    plant = Plant(context.machines, context.axes, context.seed, context.probes)
    machine_of = {name: index for index, name in enumerate(context.names)}
    quantity_of = {quantity: index for index, quantity in enumerate(plant.quantities)}
    streams: dict[tuple[int, int], Stream] = {}
    loads = orjson.loads
    for batch in read_values(context.bootstrap, context.security, span):
        for value in batch:
            try:
                record = loads(value)
                machine = machine_of.get(record["thing"])
                if machine is None:
                    result.foreign += 1
                    continue
                quantity = quantity_of.get(record["quantity"])
                if quantity is None:
                    result.problem("unknown quantity", 1, value.decode(errors="replace")[:200])
                    continue
                stream = streams.get((machine, quantity))
                if stream is None:
                    stream = streams[(machine, quantity)] = Stream()
                stream.rounds.append(int(record["id"]))
                stream.times.append(record["phenomenonTime"])
                stream.values.append(record["result"])
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, OverflowError):
                result.problem("unreadable record", 1, value[:200].decode(errors="replace"))
    return check_streams(context, plant, streams, result)


def check_streams(context: CheckContext, plant: Plant, streams: dict[tuple[int, int], Stream],
                  result: PartitionResult) -> PartitionResult:
    """The checks of one partition's records, as read into their streams (machine, quantity -> records in order)."""
    result.records = sum(len(stream.rounds) for stream in streams.values())
    result.machines = sorted({machine for machine, _quantity in streams})
    rng = random.Random(f"{context.sample_seed}/{result.span.topic}/{result.span.partition}")
    _draw_raw_windows(context, plant, streams, result, rng)
    joined_windows = _draw_joined_windows(context, plant, streams, result, rng)
    for machine in result.machines:
        _check_machine(context, plant, machine, streams, result, joined_windows)
        for quantity in range(len(plant.quantities)):
            streams.pop((machine, quantity), None)  # free as we go
    return result


def _check_machine(context: CheckContext, plant: Plant, machine: int, streams: dict[tuple[int, int], Stream],
                   result: PartitionResult, joined_windows: dict[tuple[int, int], dict[int, SampleWindow]]) -> None:
    name = context.names[machine]
    rounds_published = len(context.round_times_ms)
    present = plant.presence(machine, np.arange(rounds_published))  # (rounds, quantities)
    missing_by_round: Counter = Counter()
    found_rows: set[int] = set()
    for quantity, quantity_name in enumerate(plant.quantities):
        stream = streams.get((machine, quantity))
        rounds = np.frombuffer(stream.rounds, dtype=np.int64) if stream else np.empty(0, dtype=np.int64)
        times = np.frombuffer(stream.times, dtype=np.int64) if stream else np.empty(0, dtype=np.int64)
        values = np.frombuffer(stream.values, dtype=np.float64) if stream else np.empty(0)
        where = f"{name} {quantity_name}"
        valid = (rounds >= 0) & (rounds < rounds_published)
        result.problem("record of no published row", int((~valid).sum()),
                       f"{where}: id {rounds[~valid][:3].tolist()}")
        rounds, times, values = rounds[valid], times[valid], values[valid]
        unique, counts = np.unique(rounds, return_counts=True)
        result.problem("record twice", int((counts > 1).sum()), f"{where}: rows {unique[counts > 1][:3].tolist()}")
        expected = np.flatnonzero(present[:, quantity])
        unexpected = np.setdiff1d(unique, expected, assume_unique=True)
        result.problem("quantity the row did not carry", len(unexpected), f"{where}: rows {unexpected[:3].tolist()}")
        for missing in np.setdiff1d(expected, unique, assume_unique=True).tolist():
            missing_by_round[missing] += 1
        found_rows.update(unique.tolist())
        steps_back = int((np.diff(rounds) <= 0).sum()) if len(rounds) > 1 else 0
        result.problem("records out of order", steps_back, f"{where}: {steps_back} steps back")
        round_times = context.round_times_ms[rounds]
        clock = context.clock_offsets.get(machine)
        stamps = round_times + context.phase_ms[machine] + (clock[rounds] if clock is not None else 0)
        wrong_time = times != stamps
        result.problem("record at the wrong time", int(wrong_time.sum()),
                       f"{where}: rows {rounds[wrong_time][:3].tolist()}, times {times[wrong_time][:3].tolist()}")
        wrong = ~values_agree(values, plant.value(machine, quantity, round_times))
        result.problem("record of the wrong value", int(wrong.sum()),
                       f"{where}: rows {rounds[wrong][:3].tolist()}, values {values[wrong][:3].tolist()}")
        kept = np.unique(times)
        for hour, count in zip(*np.unique(kept // HOUR_MS, return_counts=True)):
            result.raw_per_hour[int(hour) * HOUR_MS] += int(count)
    _rows(context, present, machine, name, missing_by_round, found_rows, result)
    _join(context, plant, machine, streams, result, joined_windows)


def _rows(context: CheckContext, present: np.ndarray, machine: int, name: str, missing_by_round: Counter,
          found_rows: set[int], result: PartitionResult) -> None:
    """Rows missing whole (lost: a SIGKILL of Mosquitto may explain it) or in part (never explained)."""
    for round_, missing in sorted(missing_by_round.items()):
        carried = int(present[round_].sum())
        if missing < carried:
            result.problem("row in part", 1, f"{name} row {round_}: {missing} of {carried} quantities missing")
        elif context.at_risk[round_]:
            result.lost_at_risk.append((machine, round_))
        else:
            result.problem("row lost", 1, f"{name} row {round_} (acknowledged by the broker, no SIGKILL of "
                                          f"Mosquitto after it before its save)")
    result.rows += len(found_rows)


def _join(context: CheckContext, plant: Plant, machine: int, streams: dict[tuple[int, int], Stream],
          result: PartitionResult, joined_windows: dict[tuple[int, int], dict[int, SampleWindow]]) -> None:
    """The reference join of the machine's records as they lie in machine.data (each stream in its order)."""
    name = context.names[machine]
    digests = bytearray()
    for axis in range(context.axes):
        records = []
        for kind in (JOIN_LEFT, JOIN_RIGHT):
            quantity_name = f"{kind}_C1{axis + 1}"
            stream = streams.get((machine, plant.quantities.index(quantity_name)))
            if stream is None:
                continue
            records += [{"thing": name, "quantity": quantity_name, "phenomenonTime": time_ms, "result": value}
                        for time_ms, value in zip(stream.times, stream.values)]
        outputs = reference_join(records, POWER)
        result.outliers += [(name, r["quantity"], r["phenomenonTime"], r["result"])
                            for r in reference_outliers(records, POWER)]
        result.turned_away += [(name, r["quantity"], r["phenomenonTime"], r["result"])
                               for r in reference_turned_away(records, POWER)]
        if not outputs:
            continue
        windows = joined_windows.get((machine, axis), {})
        points = set()  # InfluxDB keeps one point per series and time: a result written again overwrites itself
        for output in outputs:
            digests += digest(output)
            point_time_ns, fields = joined_point_of(output, context.level_bounds)
            point = (point_time_ns, fields[2], fields[3])
            if point not in points:
                points.add(point)
                result.joined_per_hour[(point_time_ns // 1_000_000) // HOUR_MS * HOUR_MS] += 1
            window = windows.get(point_time_ns // 1_000_000 // WINDOW_MS)
            if window is not None:
                window.points[point_time_ns] = fields
        result.outputs_per_thing[name] += len(outputs)
    result.digests += bytes(digests)


def _draws(keys: list[tuple[int, int]], weights: np.ndarray, streams: dict[tuple[int, int], Stream], wanted: int,
           rng: random.Random):
    """(stream, hour-long slot) of records drawn at random; every one of them, in order, when the streams hold no
    more records than are wanted."""
    if weights[-1] <= wanted:
        for key in keys:
            yield from ((key, slot) for slot in sorted({time_ms // WINDOW_MS for time_ms in streams[key].times}))
        return
    for _ in range(100_000):
        key = keys[int(np.searchsorted(weights, rng.randrange(int(weights[-1])), side="right"))]
        stream = streams[key]
        yield key, stream.times[rng.randrange(len(stream.times))] // WINDOW_MS


def _draw_raw_windows(context: CheckContext, plant: Plant, streams: dict[tuple[int, int], Stream],
                      result: PartitionResult, rng: random.Random) -> None:
    """hour-long windows of single series, each at a record drawn at random (so windows fall where the records
    are), until they hold `sample_points` points."""
    keys = [key for key, stream in streams.items() if len(stream.times)]
    if not keys:
        return
    weights = np.cumsum([len(streams[key].times) for key in keys])
    drawn: set[tuple[int, int, int]] = set()
    points = 0
    for key, slot in _draws(keys, weights, streams, context.sample_points, rng):
        if points >= context.sample_points:
            break
        if (*key, slot) in drawn:
            continue
        drawn.add((*key, slot))
        stream = streams[key]
        machine, quantity = key
        window = SampleWindow("raw", context.names[machine], plant.quantities[quantity], slot * WINDOW_MS,
                              (slot + 1) * WINDOW_MS)
        times = np.frombuffer(stream.times, dtype=np.int64)
        inside = np.flatnonzero((times >= window.start_ms) & (times < window.end_ms))
        window.points = {int(times[i]) * 1_000_000: stream.values[i] for i in inside}
        points += len(window.points)
        result.windows.append(window)


def _draw_joined_windows(context: CheckContext, plant: Plant, streams: dict[tuple[int, int], Stream],
                         result: PartitionResult, rng: random.Random) -> dict[tuple[int, int], dict[int, SampleWindow]]:
    """Windows of join results (machine, axis -> slot -> window), each at a speed record drawn at random, until
    their speed records (each of which joins at least once when a torque lies within the join's reach) reach
    `sample_points`; the join fills them."""
    keys = [key for key, stream in streams.items() if len(stream.times)
            and plant.quantities[key[1]].startswith(JOIN_LEFT + "_")]
    windows: dict[tuple[int, int], dict[int, SampleWindow]] = {}
    if not keys:
        return windows
    weights = np.cumsum([len(streams[key].times) for key in keys])
    records = 0
    for (machine, quantity), slot in _draws(keys, weights, streams, context.sample_points, rng):
        if records >= context.sample_points:
            break
        stream = streams[(machine, quantity)]
        axis = quantity // len(KINDS)
        slots = windows.setdefault((machine, axis), {})
        if slot in slots:
            continue
        output_quantity = f"{POWER.output}1{axis + 1}"  # the output of the axis's speed and torque, C1<axis>
        slots[slot] = window = SampleWindow("joined", context.names[machine], output_quantity, slot * WINDOW_MS,
                                            (slot + 1) * WINDOW_MS)
        result.windows.append(window)
        times = np.frombuffer(stream.times, dtype=np.int64)
        records += int(((times >= window.start_ms) & (times < window.end_ms)).sum())
    return windows


def check_out_partition(context: CheckContext, span: PartitionRange) -> PartitionResult:
    """machine.out's records of one partition: their digests, by thing."""
    result = PartitionResult(span)
    names = set(context.names)
    digests = bytearray()
    loads = orjson.loads
    for batch in read_values(context.bootstrap, context.security, span):
        for value in batch:
            try:
                record = loads(value)
                thing = record["thing"]
            except (orjson.JSONDecodeError, KeyError, TypeError):
                result.problem("unreadable record", 1, value[:200].decode(errors="replace"))
                continue
            if thing not in names:
                result.foreign += 1
                continue
            digests += digest(record)
            result.outputs_per_thing[thing] += 1
            result.records += 1
    result.digests = bytes(digests)
    return result


def _task(arguments: tuple[str, CheckContext, PartitionRange]) -> PartitionResult:
    kind, context, span = arguments
    return check_data_partition(context, span) if kind == "data" else check_out_partition(context, span)


def check_partitions(context: CheckContext, data: Sequence[PartitionRange], out: Sequence[PartitionRange],
                     processes: int = 2) -> tuple[list[PartitionResult], list[PartitionResult]]:
    """Every partition checked, `processes` at a time (spawned: nothing of the soak's clients is inherited)."""
    tasks = [("data", context, span) for span in data] + [("out", context, span) for span in out]
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        results = pool.map(_task, tasks, chunksize=1)
    return results[:len(data)], results[len(data):]


@dataclass(frozen=True)
class JoinVerdict:
    expected: int
    found: int
    missing: int  # the reference gives them, machine.out lacks them
    extra: int  # machine.out holds them, the reference does not give them
    twice: int  # held more than once
    things_differing: list[str]  # a few things whose counts differ: "name: expected n, found m"

    @property
    def holds(self) -> bool:
        return self.missing == 0 and self.extra == 0 and self.twice == 0


def compare_outputs(data: Sequence[PartitionResult], out: Sequence[PartitionResult]) -> JoinVerdict:
    """machine.out against the reference join, as multisets of digests."""
    expected = _digest_array(b"".join(result.digests for result in data))
    found = _digest_array(b"".join(result.digests for result in out))
    unique_expected, expected_counts = np.unique(expected, return_counts=True)
    unique_found, found_counts = np.unique(found, return_counts=True)
    missing = len(np.setdiff1d(unique_expected, unique_found, assume_unique=True))
    extra = len(np.setdiff1d(unique_found, unique_expected, assume_unique=True))
    twice = int((found_counts - 1).sum())
    expected_by_thing = sum((result.outputs_per_thing for result in data), Counter())
    found_by_thing = sum((result.outputs_per_thing for result in out), Counter())
    differing = [f"{thing}: expected {expected_by_thing[thing]}, found {found_by_thing[thing]}"
                 for thing in sorted(set(expected_by_thing) | set(found_by_thing))
                 if expected_by_thing[thing] != found_by_thing[thing]]
    return JoinVerdict(int(expected_counts.sum()), len(found), missing, extra, twice, differing[:EXAMPLES])


def _digest_array(digests: bytes) -> np.ndarray:
    return np.frombuffer(digests, dtype=np.dtype((np.void, DIGEST_BYTES)))
