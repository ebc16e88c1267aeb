"""After machine.data grew, the Spark joiner joins a thing's records placed by the old partition count before those
placed by the new one, wherever each lies.

A micro-batch that reads both (a new checkpoint rebuilding from the input, a batch replayed after a crash, a
backlog) holds a thing's old records in one partition and its newer ones in another, maybe of a lower number:
ordered by (partition, offset) alone, the newer came first and the older were rejected as out of order. The
placement header each record carries (the counts its writer placed by) orders them. Checked against the oracle
(tests/join_reference.py), which shares no code with the joiner, over the records in the order they were written."""
from __future__ import annotations

import json
import random
from collections import Counter

import pyarrow as pa

from growth_support import PLACEMENT_HEADER, machine_rows
from join_reference import reference_join
from local_stream_buffer.keyed_batch import StateDict
from local_stream_buffer.specs import SpecResolver
from pipeline_core.partitioning import thing_partition
from pipeline_core.records import encode_record, record_key
from spark_joiner.bucket_join import OUT, join_bucket, unpack_emitted
from spark_joiner.parse import RecordRouter, unpack

HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def kafka_rows(records: list[dict], history: tuple[int, ...], offsets: dict[int, int]) -> dict[str, list]:
    """The records as Spark's Kafka source hands them, placed by the last count of `history`."""
    columns: dict[str, list] = {"key": [], "value": [], "partition": [], "offset": [], "headers": []}
    for record in records:
        partition = thing_partition(record["thing"], history[-1])
        columns["key"].append(record_key(record["thing"], record["quantity"]).encode())
        columns["value"].append(encode_record(record))
        columns["partition"].append(partition)
        columns["offset"].append(offsets.get(partition, 0))
        offsets[partition] = offsets.get(partition, 0) + 1
        columns["headers"].append([{"key": PLACEMENT_HEADER, "value": ",".join(map(str, history)).encode()}])
    return columns


def test_a_thing_moved_to_a_lower_partition_is_joined_in_the_order_written() -> None:
    things = [thing for thing in (f"m{index}" for index in range(1000))
              if thing_partition(thing, 8) < thing_partition(thing, 5)][:4]
    before, after = machine_rows(things, 0, 20), machine_rows(things, 20, 20)
    offsets: dict[int, int] = {}
    old, new = kafka_rows(before, (5,), offsets), kafka_rows(after, (5, 8), offsets)
    columns = {name: old[name] + new[name] for name in old}
    order = list(range(len(columns["key"])))
    random.Random(3).shuffle(order)  # a shuffle keeps no order: the join restores it
    batch = pa.RecordBatch.from_pydict({
        "key": pa.array([columns["key"][i] for i in order], pa.binary()),
        "value": pa.array([columns["value"][i] for i in order], pa.binary()),
        "partition": pa.array([columns["partition"][i] for i in order], pa.int32()),
        "offset": pa.array([columns["offset"][i] for i in order], pa.int64()),
        "headers": pa.array([columns["headers"][i] for i in order], HEADERS)})
    rows = unpack([blob for packed in RecordRouter(None, 4)(iter([batch])) for blob in packed.column("rows").to_pylist()])
    emitted = join_bucket(SpecResolver(), rows, StateDict(), "machine.data", 1000)
    records = unpack_emitted(emitted.frame()["records"])
    kinds, values = records.column("kind").to_pylist(), records.column("value").to_pylist()
    assert [value for kind, value in zip(kinds, values) if kind != OUT] == []  # nothing out of order
    joined = Counter(json.dumps(json.loads(value), sort_keys=True) for kind, value in zip(kinds, values) if kind == OUT)
    expected = Counter(json.dumps(output, sort_keys=True) for output in reference_join(before + after))
    assert joined == expected and sum(expected.values()) > 100
