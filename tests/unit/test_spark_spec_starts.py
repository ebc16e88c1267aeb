"""The Spark joiner with a spec added on a running stack: the routed rows of the new spec from before its start in
their partition are dropped (`bucket_join.started_rows`), in a rebuild's batch too, so the spec joins from its start
on and the others as before. Checked against the oracle (tests/join_reference.py, no code of either joiner)."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow as pa

from growth_support import machine_rows
from join_reference import POWER, Spec, reference_join
from local_stream_buffer.keyed_batch import StateDict
from local_stream_buffer.spec_changes import fingerprint
from local_stream_buffer.specs import load_join_specs
from pipeline_core.records import encode_record, record_key
from spark_joiner.bucket_join import OUT, join_bucket, started_rows, unpack_emitted
from spark_joiner.parse import RecordRouter, unpack, worker_resolver

SPECS = """
[[join]]
name = "power"
left = "actSpeed_C{axis}"
right = "vaTorque_C{axis}"
output = "vaPower_C{axis}"
formula = "power"
delta_time_s = 1.0

[[join]]
name = "torque_speed"
left = "vaTorque_C{axis}"
right = "actSpeed_C{axis}"
output = "vaTorqueSpeed_C{axis}"
formula = "product"
delta_time_s = 1.0
"""
TORQUE_SPEED_REFERENCE = Spec("vaTorque_C", "actSpeed_C", "vaTorqueSpeed_C", lambda l, r: l * r, 1000.0)


def test_rows_of_a_spec_before_its_start_do_not_reach_it(tmp_path: Path) -> None:
    spec_file = tmp_path / "specs.toml"
    spec_file.write_text(SPECS)
    records = machine_rows(["m1", "m2", "m3"], 0, 60)
    start = len(records) // 2
    batch = pa.RecordBatch.from_pydict({
        "key": pa.array([record_key(r["thing"], r["quantity"]).encode() for r in records], pa.binary()),
        "value": pa.array([encode_record(r) for r in records], pa.binary()),
        "partition": pa.array([0] * len(records), pa.int32()),
        "offset": pa.array(range(len(records)), pa.int64())})
    rows = unpack([blob for packed in RecordRouter(spec_file, 4)(iter([batch]))
                   for blob in packed.column("rows").to_pylist()])
    specs = {spec.name: fingerprint(spec) for spec in load_join_specs(spec_file)}
    starts = {0: {specs["power"]: 0, specs["torque_speed"]: start}}
    kept = started_rows(worker_resolver(spec_file), rows, starts)
    assert 0 < kept.num_rows < rows.num_rows
    emitted = unpack_emitted(join_bucket(worker_resolver(spec_file), kept, StateDict(), "machine.data",
                                         1000).frame()["records"])
    joined = Counter(json.dumps(json.loads(value), sort_keys=True)
                     for kind, value in zip(emitted.column("kind").to_pylist(), emitted.column("value").to_pylist())
                     if kind == OUT)
    expected = Counter(json.dumps(output, sort_keys=True) for output in
                       reference_join(records, POWER) + reference_join(records[start:], TORQUE_SPEED_REFERENCE))
    assert joined == expected
    assert started_rows(worker_resolver(spec_file), rows, {0: {specs["power"]: 0, specs["torque_speed"]: 0}}) is rows
