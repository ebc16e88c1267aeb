"""Machines whose clocks lie, for the clock rule's tests: streams of speed and torque readings with outliers,
steps back and ahead, faults on one quantity only, gaps, and disorder, as generated input; and the join of such
input by the engine's per-record and batch paths, beside the reference's (tests/join_reference.py)."""
from __future__ import annotations

import dataclasses
import json
import random
from collections import Counter
from collections.abc import Iterable
from typing import Any

from hypothesis import strategies as st

from join_reference import POWER, Spec
from local_stream_buffer.keyed import KeyedJoiner
from local_stream_buffer.status import IngestStatus

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
