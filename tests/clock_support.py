"""Machines whose clocks lie, for the clock rule's tests: streams of speed and torque readings with outliers,
steps back and ahead, faults on one quantity only, gaps, and disorder, as generated input; and the join of such
input by the engine's per-record and batch paths, beside the reference's (tests/join_reference.py)."""
from __future__ import annotations

import dataclasses
import json
import random
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from connector_support import run_simulator, topic_size
from join_reference import POWER, Spec, reference_join, reference_outliers
from local_stream_buffer.keyed import KeyedJoiner
from local_stream_buffer.status import IngestStatus
from support import read_topic, wait_for

SPEED, TORQUE = "actSpeed_C11", "vaTorque_C11"
HOUR_MS = 3_600_000
YEAR_MS = 365 * 24 * HOUR_MS
START_MS = 1_700_000_000_000

# What may happen at a reading of a machine: (kind, how far in ms, which quantities).
FAULT_KINDS = ("outlier", "step", "gap")
OFFSETS_MS = (-10 * YEAR_MS, -2 * HOUR_MS, -HOUR_MS, -10 * 60_000, -61_000, 90 * 60_000, 2 * HOUR_MS, 10 * YEAR_MS)
QUANTITY_SETS = ((SPEED, TORQUE), (SPEED,), (TORQUE,))


@dataclasses.dataclass(frozen=True)
class Fault:
    at_tick: int
    kind: str  # outlier: this tick's readings off by offset_ms; step: every later one; gap: a pause of offset_ms
    offset_ms: int
    quantities: tuple[str, ...]


def machine_readings(thing: str, ticks: int, faults: Iterable[Fault], tick_ms: int = 1000) -> list[dict[str, Any]]:
    """A machine sending speed every tick and torque half a tick later, in the order it sends them, with its
    clock's faults applied to the stamps (the readings' order stays the order sent)."""
    faults = sorted(faults, key=lambda fault: fault.at_tick)
    records = []
    shift = {SPEED: 0, TORQUE: 0}
    pause = 0
    for tick in range(ticks):
        outlier = {}
        for fault in faults:
            if fault.at_tick != tick:
                continue
            for quantity in fault.quantities:
                if fault.kind == "step":
                    shift[quantity] += fault.offset_ms
                elif fault.kind == "outlier":
                    outlier[quantity] = fault.offset_ms
            if fault.kind == "gap":
                pause += abs(fault.offset_ms)
        for quantity, half, value in ((SPEED, 0, 1000.0 + tick % 97), (TORQUE, tick_ms // 2, 2.5 + tick % 13)):
            stamp = START_MS + tick * tick_ms + half + pause + shift[quantity] + outlier.get(quantity, 0)
            records.append({"thing": thing, "quantity": quantity, "phenomenonTime": stamp, "result": value,
                            "id": f"{thing}-{tick}"})
    return records


@st.composite
def faults(draw: st.DrawFn, ticks: int) -> list[Fault]:
    return draw(st.lists(st.builds(Fault, st.integers(0, ticks - 1), st.sampled_from(FAULT_KINDS),
                                   st.sampled_from(OFFSETS_MS), st.sampled_from(QUANTITY_SETS)), max_size=4))


def interleaved(streams: list[list[dict[str, Any]]], seed: int) -> list[dict[str, Any]]:
    """The streams merged in a random order that keeps each one's own order (as Kafka keeps a key's)."""
    rng = random.Random(seed)
    positions = [0] * len(streams)
    merged = []
    while True:
        open_streams = [index for index, stream in enumerate(streams) if positions[index] < len(stream)]
        if not open_streams:
            return merged
        index = rng.choice(open_streams)
        merged.append(streams[index][positions[index]])
        positions[index] += 1


def by_stream(records: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Each stream (thing, quantity) of `records`, in their order."""
    streams: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for record in records:
        streams.setdefault((record["thing"], record["quantity"]), []).append(record)
    return list(streams.values())


def reference_spec(bound_ms: float = 0.0, confirm: int = 2) -> Spec:
    return dataclasses.replace(POWER, bound_ms=bound_ms, clock_confirm=confirm)


def reading(record: dict[str, Any]) -> tuple[str, str, float, float]:
    """A record as a dead letter gives it back: its stream, time and result."""
    return record["thing"], record["quantity"], float(record["phenomenonTime"]), float(record["result"])


def engine_join(records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                                        list[tuple[dict[str, Any], str]]]:
    """The standalone joiner's engine on the records in this order (the shipped join specs): its outputs, the
    records it rejected as they came, and the records it gave up after holding them (the clock rule's), each as
    its dead letter's payload gives it back, with the reason."""
    dropped: list[tuple[dict[str, Any], str]] = []
    joiner = KeyedJoiner(on_dead_letter=lambda record, _source, reason: dropped.append((record, reason)))
    outputs: list[dict[str, Any]] = []
    rejected: list[dict[str, Any]] = []
    for record in records:
        outcome = joiner.ingest(record, object())
        outputs.extend(outcome.outputs)
        if outcome.status is IngestStatus.REJECTED:
            rejected.append(record)
    return outputs, rejected, dropped


def given_up(letters: list[dict[str, Any]]) -> Counter:
    """Dead letters of records a joiner gave up after holding them (they name no offset: no frame of this
    batch), as (payload record, reason)."""
    return Counter((json.dumps(json.loads(letter["payload"]), sort_keys=True), letter["reason"]) for letter in letters
                   if "offset" not in letter)


def as_given_up(dropped: list[tuple[dict[str, Any], str]]) -> Counter:
    return Counter((json.dumps(record, sort_keys=True), reason) for record, reason in dropped)


# The plant of the end-to-end tests: machines with one clock fault each, through the stack.
TICKS = 120  # readings per machine, one a second


def machine_rows(thing: str, *, outlier_at: int | None = None, outlier_ms: int = 0, only: str | None = None,
                 step_at: int | None = None, step_ms: int = 0, gap_at: int | None = None) -> list[dict]:
    """A machine's rows, speed and torque each second (torque half a second later), with one fault: the readings
    of one tick stamped `outlier_ms` off (of `only` that quantity), a clock moved by `step_ms` from `step_at` on,
    or an hour's pause at `gap_at`."""
    rows = []
    for tick in range(TICKS):
        shift = (step_ms if step_at is not None and tick >= step_at else 0) + \
                (HOUR_MS if gap_at is not None and tick >= gap_at else 0)
        for quantity, half, value in ((SPEED, 0, 1000.0 + tick), (TORQUE, 500, 2.0 + tick % 7)):
            stamp = START_MS + tick * 1000 + half + shift
            if tick == outlier_at and only in (None, quantity):
                stamp += outlier_ms
            rows.append({"Thing": thing, "Timestamp": stamp, quantity: value, "id": f"{thing}-{tick}-{quantity}"})
    return rows


def plant_rows() -> list[dict]:
    """The machines' rows, machine after machine as each sends them (one topic per machine keeps its order)."""
    machines = [
        machine_rows("ahead-one-reading", outlier_at=60, outlier_ms=10 * YEAR_MS, only=SPEED),
        machine_rows("ahead-both-readings", outlier_at=60, outlier_ms=10 * YEAR_MS),
        machine_rows("behind-one-reading", outlier_at=40, outlier_ms=-2 * HOUR_MS, only=TORQUE),
        machine_rows("set-back", step_at=60, step_ms=-HOUR_MS),
        machine_rows("set-ahead", step_at=60, step_ms=2 * HOUR_MS),
        machine_rows("off-for-an-hour", gap_at=60),
        machine_rows("well-behaved"),
    ]
    return [row for rows in machines for row in rows]


def records_of(bootstrap: str, topic: str) -> list[dict]:
    """machine.data as the joiners read it: each stream in partition order."""
    return [json.loads(m.value) for m in sorted(read_topic(bootstrap, topic), key=lambda m: (m.partition, m.offset))]


def dead_lettered_readings(bootstrap: str, dlq: str) -> list[tuple]:
    letters = [json.loads(m.value) for m in read_topic(bootstrap, dlq)]
    assert all(letter["reason"].startswith("clock_outlier: ") for letter in letters), letters
    return sorted((json.loads(letter["payload"])["thing"], json.loads(letter["payload"])["quantity"],
                   json.loads(letter["payload"])["phenomenonTime"]) for letter in letters)


def replay_plant(bridge, tmp_path: Path) -> list[dict]:
    """The plant's rows through the simulator and `bridge` (a stream connector) into its machine.data, read back."""
    rows = plant_rows()
    events = tmp_path / "clock_faults.json"
    events.write_text("".join(json.dumps(row) + "\n" for row in rows))
    simulated = run_simulator(bridge.mqtt_topic, "--events-file", str(events), "--order", "file")
    assert simulated.returncode == 0 and f"published {len(rows)} rows" in simulated.stdout, simulated.stdout
    wait_for(lambda: topic_size(bridge.bootstrap, bridge.data_topic) >= len(rows), 90, f"{len(rows)} records")
    return records_of(bridge.bootstrap, bridge.data_topic)


def check_the_reference(records: list[dict]) -> tuple[list[dict], list[tuple]]:
    """The reference's join and outliers of machine.data, and what they say of each machine."""
    expected = reference_join(records, POWER)
    outliers = sorted((r["thing"], r["quantity"], r["phenomenonTime"]) for r in reference_outliers(records, POWER))
    joins = {}
    for output in expected:
        joins[output["thing"]] = joins.get(output["thing"], 0) + 1
    clean = 2 * TICKS - 1  # each reading with the other quantity's before and after it, but the last torque
    assert joins["well-behaved"] == clean
    # An outlier's two pairs are gone, and nothing takes their place (its neighbours are 1.5 s apart, beyond 1 s).
    assert joins["ahead-one-reading"] == joins["behind-one-reading"] == clean - 2
    assert joins["ahead-both-readings"] == clean - 3
    # A pair across the jump is none (over a second apart); the set-back clock's old timeline ends with its last
    # pair and the new one joins every reading.
    assert joins["set-ahead"] == joins["off-for-an-hour"] == joins["set-back"] == clean - 1
    assert [thing for thing, _, _ in outliers] == ["ahead-both-readings", "ahead-both-readings", "ahead-one-reading",
                                                   "behind-one-reading"]
    return expected, outliers


