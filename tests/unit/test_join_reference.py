"""join_reference, the offline join of the chaos, outage, cluster and disorder runs, against the join's
definition worked by hand, and against the standalone joiner's engine: two codes that share nothing agree."""
from __future__ import annotations

import ast
import dataclasses
import math
from pathlib import Path

import join_reference
from conftest import EVENTS_FILE
from connector_support import expected_records
from disorder_support import AT_BOUND_PER_MACHINE, DISORDER_MS, DISORDERED, PAIRS, displaced_rows, tail_rows
from join_reference import POWER, reference_join
from kafka_joiner_support import as_multiset, rows_as_records
from local_stream_buffer.keyed import KeyedJoiner
from local_stream_buffer.specs import JoinSpec


def engine_outputs(records: list[dict], max_out_of_orderness_s: float = 0.0) -> list[dict]:
    joiner = KeyedJoiner([JoinSpec("power", "actSpeed_C{axis}", "vaTorque_C{axis}", "vaPower_C{axis}", "power",
                                   delta_time_s=1.0, max_out_of_orderness_s=max_out_of_orderness_s)])
    return [output for record in records for output in joiner.ingest(record).outputs]


def record(quantity: str, time_ms: int, result: float, thing: str = "R1") -> dict:
    return {"thing": thing, "quantity": quantity, "phenomenonTime": time_ms, "result": result}


def test_the_reference_imports_nothing_of_either_joiner() -> None:
    tree = ast.parse(Path(join_reference.__file__).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= {"__future__", "math", "re", "uuid", "bisect", "collections.abc", "dataclasses", "typing"}


def test_a_small_join_worked_by_hand() -> None:
    # Speeds at 0, 10, 2000 ms; torques at 5 and 10 ms; another axis and a quantity of no spec besides.
    records = [record("actSpeed_C11", 1000, 100.0), record("vaTorque_C11", 1005, 2.0),
               record("actSpeed_C11", 1010, 120.0), record("vaTorque_C11", 1010, 3.0),
               record("actSpeed_C11", 3000, 90.0), record("actSpeed_C12", 1000, 1.0), record("other", 1000, 1.0)]
    outputs = {(o["left"]["phenomenonTime"], o["right"]["phenomenonTime"]): o for o in reference_join(records)}
    # 1000's successor is 1005; 1005's predecessor 1000 (a successor pair already) and successor 1010 (speed);
    # 1010 and 1010 the same time. 3000 has no torque at or after it: nothing; C12 has no torque at all.
    assert {pair: o["case"] for pair, o in outputs.items()} == {
        (1000, 1005): "left_successor", (1010, 1005): "right_successor", (1010, 1010): "same_time"}
    first = outputs[(1000, 1005)]
    assert first == {
        "thing": "R1", "quantity": "vaPower_C11", "phenomenonTime": 1002.5, "result": 2 * math.pi / 60 * 100.0 * 2.0,
        "left": {"quantity": "actSpeed_C11", "phenomenonTime": 1000, "result": 100.0},
        "right": {"quantity": "vaTorque_C11", "phenomenonTime": 1005, "result": 2.0},
        "case": "left_successor", "id": first["id"]}
    assert outputs[(1010, 1010)]["phenomenonTime"] == 1010 and type(outputs[(1010, 1010)]["phenomenonTime"]) is int
    # Farther apart than delta_time (1 s): dropped (0 and 1001). The speed at 1600 is the successor of the torques
    # at 1001 and 1500 before it; the torque at 1700 is its successor.
    apart = reference_join([record("actSpeed_C11", 0, 1.0), record("vaTorque_C11", 1001, 1.0),
                            record("vaTorque_C11", 1500, 1.0), record("actSpeed_C11", 1600, 1.0),
                            record("vaTorque_C11", 1700, 1.0)])
    assert {(o["left"]["phenomenonTime"], o["right"]["phenomenonTime"], o["case"]) for o in apart} == {
        (1600, 1001, "right_successor"), (1600, 1500, "right_successor"), (1600, 1700, "left_successor")}


def test_a_record_exactly_at_the_bound_joins_and_one_a_millisecond_beyond_does_not() -> None:
    spec = dataclasses.replace(POWER, bound_ms=2000)
    base = [record("actSpeed_C11", 10_000, 1.0), record("vaTorque_C11", 10_000, 1.0),
            record("vaTorque_C11", 12_500, 1.0), record("actSpeed_C11", 14_000, 1.0), record("vaTorque_C11", 14_000, 1.0)]
    # A speed 2,000 ms behind the newest speed (14,000) is within the bound and pairs the torque at 12,500; one
    # 2,001 ms behind is late.
    at_bound = base + [record("actSpeed_C11", 12_000, 5.0), record("vaTorque_C11", 20_000, 1.0),
                       record("actSpeed_C11", 20_000, 1.0)]
    beyond = base + [record("actSpeed_C11", 11_999, 5.0), record("vaTorque_C11", 20_000, 1.0),
                     record("actSpeed_C11", 20_000, 1.0)]
    assert 12_000 in {o["left"]["phenomenonTime"] for o in reference_join(at_bound, spec)}
    assert 11_999 not in {o["left"]["phenomenonTime"] for o in reference_join(beyond, spec)}
    assert as_multiset(reference_join(at_bound, spec)) == as_multiset(engine_outputs(at_bound, 2.0))
    assert as_multiset(reference_join(beyond, spec)) == as_multiset(engine_outputs(beyond, 2.0))


def test_the_shipped_events_in_time_order_give_the_engines_joins() -> None:
    records = rows_as_records(EVENTS_FILE, time_order=True)
    expected = reference_join(records)
    assert len(expected) == PAIRS
    assert as_multiset(expected) == as_multiset(engine_outputs(records))


def test_the_shipped_events_in_file_order_give_the_engines_joins_of_the_records_in_order() -> None:
    records = rows_as_records(EVENTS_FILE, time_order=False)  # thousands out of order: rejected by both
    expected = reference_join(records)
    assert 0 < len(expected) < PAIRS
    assert as_multiset(expected) == as_multiset(engine_outputs(records))


def test_the_disorder_replay_reaches_the_bound_and_joins_as_the_engine_and_the_in_order_join() -> None:
    rows = displaced_rows()
    arrivals = expected_records(rows) + expected_records(tail_rows(rows, DISORDER_MS + 1000))
    newest: dict[tuple[str, str], int] = {}
    behind = []
    for r in arrivals:
        key = (r["thing"], r["quantity"])
        behind.append(newest.get(key, r["phenomenonTime"]) - r["phenomenonTime"])
        newest[key] = max(newest.get(key, r["phenomenonTime"]), r["phenomenonTime"])
    assert max(behind) == DISORDER_MS and behind.count(DISORDER_MS) >= 3 * AT_BOUND_PER_MACHINE
    expected = reference_join(arrivals, DISORDERED)
    assert as_multiset(expected) == as_multiset(engine_outputs(arrivals, DISORDER_MS / 1000))
    in_time_order = sorted(expected_records(rows), key=lambda r: r["phenomenonTime"])
    assert as_multiset(expected) == as_multiset(reference_join(in_time_order))
