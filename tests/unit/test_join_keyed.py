"""The keyed joiner and the Spark helpers on the real data file (5,000 rows of three machines)."""

from __future__ import annotations

import json
import re
import uuid
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest

from local_stream_buffer import LEFT, RIGHT, IngestStatus, Record
from local_stream_buffer.batch import join_batch
from local_stream_buffer.keyed import KeyedJoiner
from local_stream_buffer.output import OUTPUT_ID_NAMESPACE, output_records
from local_stream_buffer.specs import JoinSpec, SpecResolver, load_join_specs

EVENTS_FILE = Path(__file__).resolve().parents[2] / "01_simulator" / "data" / "test_events.json"
ROW_FIELDS = {"Thing", "Timestamp", "id"}
# Specs that together route every quantity of the file exactly once; the file's order is judged by the order
# rule alone (the clock rule would take its jumps of days for clock faults: tests/unit/test_join_clock.py).
EVERY_QUANTITY = [
    JoinSpec("power", "actSpeed_C{axis}", "vaTorque_C{axis}", "vaPower_C{axis}", "power", 1.0, clock_confirm_readings=0),
    JoinSpec("load", "vaLoad_C{axis}", "vaCurr_C{axis}", "loadPerCurr_C{axis}", "ratio", clock_confirm_readings=0),
    JoinSpec("speed", "cmdSpeed_C{axis}", "vaPower_C{axis}", "cmdSpeedPower_C{axis}", "product",
             clock_confirm_readings=0),
    JoinSpec("state", "turnState_C{axis}", "aaAcc_C{axis}", "turnAcc_C{axis}", "difference", clock_confirm_readings=0),
]


def _records(rows: list[dict]) -> list[dict]:
    """The rows as the Kafka records of the pipeline: one per quantity."""
    return [
        {"thing": row["Thing"], "quantity": quantity, "phenomenonTime": row["Timestamp"], "result": value}
        for row in rows for quantity, value in row.items() if quantity not in ROW_FIELDS
    ]


@pytest.fixture(scope="module")
def file_order() -> list[dict]:
    return _records([json.loads(line) for line in EVENTS_FILE.read_text().splitlines()])


@pytest.fixture(scope="module")
def time_order(file_order: list[dict]) -> list[dict]:
    return sorted(file_order, key=lambda record: record["phenomenonTime"])  # stable: file order within a time


def _ingest_all(joiner: KeyedJoiner, records: list[dict]) -> tuple[list[dict], Counter]:
    outputs: list[dict] = []
    statuses: Counter = Counter()
    for offset, record in enumerate(records):
        outcome = joiner.ingest(record, source=offset)
        outputs += outcome.outputs
        statuses[outcome.status] += 1
    return outputs, statuses


def test_power_join_over_the_real_data_in_time_order(time_order: list[dict]) -> None:
    released: list[int] = []
    joiner = KeyedJoiner(on_release=released.append)
    outputs, statuses = _ingest_all(joiner, time_order)
    assert len(outputs) == 2_748
    assert len({output["id"] for output in outputs}) == 2_748
    assert {output["quantity"] for output in outputs} == {"vaPower_C11"}
    assert statuses[IngestStatus.REJECTED] == statuses[IngestStatus.DUPLICATE] == 0
    counters = joiner.counters
    assert (counters.records_in, counters.joins_out, counters.forced) == (len(time_order), 2_748, 0)
    # Every accepted record is released exactly once or still held; the held ones are few (O(pending)).
    held = list(joiner.held_sources())
    assert len(released) == len(set(released))
    assert sorted(released + held) == sorted(
        offset for offset, record in enumerate(time_order) if joiner.resolver.routes(record["quantity"])
    )
    assert len(held) == joiner.held_count() <= 3 * joiner.key_count()  # per key: last, anchor, pending


def test_without_delta_time_the_power_join_has_7548_pairs(time_order: list[dict]) -> None:
    unlimited = JoinSpec("power", "actSpeed_C{axis}", "vaTorque_C{axis}", "vaPower_C{axis}", "power")
    outputs, _ = _ingest_all(KeyedJoiner([unlimited]), time_order)
    assert len(outputs) == 7_548


def test_file_order_rejects_exactly_the_records_older_than_their_stream(file_order: list[dict]) -> None:
    joiner = KeyedJoiner(EVERY_QUANTITY)
    rejected = [outcome.reason for outcome in map(joiner.ingest, file_order)
                if outcome.status is IngestStatus.REJECTED]
    assert len(rejected) == joiner.counters.rejected == 14_150
    assert joiner.counters.unrouted == 0
    assert re.fullmatch(r"out_of_order: t=\d+ older than last t=\d+ of R0815\.\w+_C11", rejected[0])


def test_file_order_outputs_are_the_pairs_of_the_accepted_records(file_order: list[dict]) -> None:
    joiner = KeyedJoiner(EVERY_QUANTITY[:1])
    accepted: dict[tuple[str, str], tuple[list, list]] = defaultdict(lambda: ([], []))
    outputs = []
    for record in file_order:
        outcome = joiner.ingest(record)
        outputs += outcome.outputs
        if outcome.status is IngestStatus.ACCEPTED:
            (binding, side), = joiner.resolver.routes(record["quantity"])
            accepted[(record["thing"], binding.output_quantity)][side].append(record)
    assert _spark_style_outputs(joiner.resolver, accepted) == sorted(outputs, key=lambda o: o["id"])


def _spark_style_outputs(resolver: SpecResolver, groups: dict, batches: int = 3) -> list[dict]:
    """What the Spark job does per (thing, output quantity) group: batches of arrays, then output records."""
    outputs = []
    for (thing, output_quantity), sides in groups.items():
        binding = resolver.binding_for_output(output_quantity)
        arrays = [(np.array([r["phenomenonTime"] for r in side], dtype=float),
                   np.array([r["result"] for r in side], dtype=float)) for side in sides]
        state = None
        for part in range(batches):
            (lt, lv), (rt, rv) = ((np.array_split(t, batches)[part], np.array_split(v, batches)[part]) for t, v in arrays)
            state, pairs = join_batch(state, lt, lv, rt, rv, delta_time_ms=binding.delta_time_ms)
            outputs += output_records(thing, binding, pairs)
    return sorted(outputs, key=lambda output: output["id"])


def test_spark_helpers_give_the_keyed_outputs_record_for_record(time_order: list[dict]) -> None:
    joiner = KeyedJoiner()
    outputs, _ = _ingest_all(joiner, time_order)
    groups: dict[tuple[str, str], tuple[list, list]] = defaultdict(lambda: ([], []))
    for record in time_order:
        for binding, side in joiner.resolver.routes(record["quantity"]):
            groups[(record["thing"], binding.output_quantity)][side].append(record)
    assert _spark_style_outputs(joiner.resolver, groups) == sorted(outputs, key=lambda output: output["id"])


def test_exact_duplicates_are_dropped_and_change_nothing(time_order: list[dict]) -> None:
    once, _ = _ingest_all(KeyedJoiner(), time_order)
    joiner = KeyedJoiner()
    twice, statuses = _ingest_all(joiner, [record for record in time_order for _ in range(2)])
    assert twice == once
    assert statuses[IngestStatus.DUPLICATE] == joiner.counters.duplicates == 2_681 + 4_705


def test_output_record_and_its_deterministic_id() -> None:
    joiner = KeyedJoiner()
    joiner.ingest({"thing": "R0815", "quantity": "actSpeed_C12", "phenomenonTime": 1554096460000, "result": 300.0})
    outcome = joiner.ingest({"thing": "R0815", "quantity": "vaTorque_C12", "phenomenonTime": 1554096460501,
                             "result": 2.0})
    assert outcome.status is IngestStatus.ACCEPTED
    name = "R0815/vaPower_C12/1554096460000/1554096460501"
    assert outcome.outputs == [{
        "thing": "R0815",
        "quantity": "vaPower_C12",
        "phenomenonTime": 1554096460250.5,
        "result": pytest.approx(2 * np.pi / 60 * 300.0 * 2.0),
        "left": {"quantity": "actSpeed_C12", "phenomenonTime": 1554096460000, "result": 300.0},
        "right": {"quantity": "vaTorque_C12", "phenomenonTime": 1554096460501, "result": 2.0},
        "case": "left_successor",
        "id": str(uuid.uuid5(OUTPUT_ID_NAMESPACE, name)),
    }]


def test_a_quantity_used_by_two_specs_feeds_both_and_is_released_once() -> None:
    specs = [
        JoinSpec("power", "actSpeed_C{axis}", "vaTorque_C{axis}", "vaPower_C{axis}", "power"),
        JoinSpec("speed_current", "actSpeed_C{axis}", "vaCurr_C{axis}", "speedCurr_C{axis}", "product"),
    ]
    released: list[str] = []
    joiner = KeyedJoiner(specs, on_release=released.append)
    speed = {"thing": "R1", "quantity": "actSpeed_C11", "phenomenonTime": 1000, "result": 1.0}
    assert joiner.ingest(speed, "speed@1000").status is IngestStatus.ACCEPTED
    assert joiner.state_size() == 2 and list(joiner.held_sources()) == ["speed@1000"]
    for t, source in ((2000, "speed@2000"), (3000, "speed@3000")):
        joiner.ingest({**speed, "phenomenonTime": t}, source)
    torque = joiner.ingest({"thing": "R1", "quantity": "vaTorque_C11", "phenomenonTime": 3000, "result": 2.0}, "torque")
    assert [o["quantity"] for o in torque.outputs] == ["vaPower_C11"] * 3  # successor of 1000, 2000; same time 3000
    assert released == []  # the current join still holds all speed records
    current = joiner.ingest({"thing": "R1", "quantity": "vaCurr_C11", "phenomenonTime": 3000, "result": 3.0}, "curr")
    assert [o["quantity"] for o in current.outputs] == ["speedCurr_C11"] * 3
    assert released == ["speed@1000", "speed@2000"]  # superseded in both joins now
    assert set(joiner.held_sources()) == {"speed@3000", "torque", "curr"}


def test_records_objects_and_invalid_records() -> None:
    joiner = KeyedJoiner()
    assert joiner.ingest(Record("actSpeed_C11", timestamp=1554096460415, result=1.5, thing="R1")).status \
        is IngestStatus.ACCEPTED
    outcome = joiner.ingest({"thing": "R1", "quantity": "vaTorque_C11", "phenomenonTime": 1554096460415, "result": 2})
    assert outcome.outputs[0]["left"]["phenomenonTime"] == 1554096460415
    assert outcome.outputs[0]["case"] == "same_time"
    invalid = joiner.ingest({"quantity": "vaTorque_C11", "phenomenonTime": 1, "result": 2})
    assert invalid.status is IngestStatus.REJECTED and invalid.reason.startswith("invalid: ")
    assert joiner.ingest({"thing": "R1", "quantity": "vaLoad_C11", "phenomenonTime": 1, "result": 2}).status \
        is IngestStatus.UNROUTED
    conflict = joiner.ingest({"thing": "R1", "quantity": "vaTorque_C11", "phenomenonTime": 1554096460415, "result": 3})
    assert conflict.status is IngestStatus.REJECTED and conflict.reason.startswith("conflict: ")


def test_spec_resolution_over_axes() -> None:
    resolver = SpecResolver()
    assert resolver.specs == load_join_specs()
    (binding, side), = resolver.routes("actSpeed_C12")
    assert (binding.output_quantity, binding.right_quantity, side) == ("vaPower_C12", "vaTorque_C12", LEFT)
    (binding, side), = resolver.routes("vaTorque_C3")
    assert (binding.left_quantity, side, binding.delta_time_ms) == ("actSpeed_C3", RIGHT, 1000.0)
    assert resolver.routes("vaLoad_C11") == () and resolver.routes("actSpeed_Cx") == ()
    assert resolver.binding_for_output("vaPower_C11") == resolver.routes("actSpeed_C11")[0].binding
    assert resolver.binding_for_output("vaLoad_C11") is None


def test_invalid_spec_files_are_refused(tmp_path: Path) -> None:
    spec_file = tmp_path / "specs.toml"
    spec_file.write_text('[[join]]\nname = "x"\nleft = "a{axis}"\nright = "b{axis}"\noutput = "c{axis}"\n'
                         'formula = "__import__"\n')
    with pytest.raises(ValueError, match="unknown formula"):
        load_join_specs(spec_file)
    spec_file.write_text('[[join]]\nname = "x"\nleft = "a{axis}"\nright = "b"\noutput = "c{axis}"\nformula = "product"\n')
    with pytest.raises(ValueError, match="axis"):
        load_join_specs(spec_file)


@pytest.mark.parametrize("crash_at", [1, 777, 5_000, 12_345, 19_000])
def test_reingesting_from_the_oldest_held_record_reproduces_every_later_output(time_order, crash_at) -> None:
    """The Kafka joiner's recovery: after a crash, replay from the oldest held offset, drop the outputs of
    records it had already processed; what follows must be exactly what the uninterrupted run emitted."""
    uninterrupted = KeyedJoiner()
    outputs_by_offset = [uninterrupted.ingest(record, offset).outputs for offset, record in enumerate(time_order)]

    before_crash = KeyedJoiner()
    for offset, record in enumerate(time_order[:crash_at]):
        before_crash.ingest(record, offset)
    oldest_held = next(before_crash.held_sources(), crash_at)

    recovered = KeyedJoiner()
    replayed = [recovered.ingest(record, offset).outputs
                for offset, record in enumerate(time_order[oldest_held:], start=oldest_held)]
    assert replayed[crash_at - oldest_held:] == outputs_by_offset[crash_at:]
