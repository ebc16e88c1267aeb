"""The Spark joiner after a lost or replaced checkpoint: a new processor that reads the whole input again, told
where the committed outputs end, emits exactly what the first one had not yet emitted, whatever the batching;
a checkpoint made with other bucket or state partition counts is set aside for a new one; the sink finds a
batch's input end in the offset log."""
from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest

from conftest import EVENTS_FILE
from kafka_joiner_support import rows_as_records
from pipeline_core.records import encode_record
from spark_joiner.checkpoint import LAYOUT_FILE, has_checkpoint, prepare_checkpoint
from spark_joiner.parse import RecordRouter, pack
from spark_joiner.bucket_join import DLQ, OUT, committed_rows, unpack_emitted
from spark_joiner.processor import BucketJoinProcessor
from spark_joiner.state_layout import STATE_LAYOUT
from spark_joiner.sink import batch_ends
from spark_support import kafka_batch

BUCKETS = 4


class _ValueState:
    """A bucket's value state as Spark's state server keeps it between calls."""

    def __init__(self) -> None:
        self.value: tuple | None = None

    def get(self) -> tuple | None:
        return self.value

    def update(self, value: tuple) -> None:
        self.value = value


class _MapState:
    """A bucket's map state (join key -> value) as Spark's state server keeps it between calls."""

    def __init__(self) -> None:
        self.values: dict[tuple, tuple] = {}

    def getValue(self, key: tuple) -> tuple | None:  # noqa: N802 (Spark's names)
        return self.values.get(tuple(key))

    def updateValue(self, key: tuple, value: tuple) -> None:  # noqa: N802
        self.values[tuple(key)] = value

    def removeKey(self, key: tuple) -> None:  # noqa: N802
        del self.values[tuple(key)]

    def iterator(self):
        return iter(list(self.values.items()))


class _TimerValues:
    """The processing time Spark hands each call: the micro-batch's."""

    def getCurrentProcessingTimeInMs(self) -> int:  # noqa: N802 (Spark's name)
        return 1_700_000_000_000


class _Handle:
    def __init__(self) -> None:
        self.states: dict[str, _ValueState | _MapState] = {}

    def getValueState(self, name: str, _schema: Any) -> _ValueState:  # noqa: N802 (Spark's name)
        return self.states.setdefault(name, _ValueState())

    def getMapState(self, name: str, _key_schema: Any, _value_schema: Any) -> _MapState:  # noqa: N802
        return self.states.setdefault(name, _MapState())


class Job:
    """The job's stateful step on one partition of input: one processor per bucket, as Spark groups them."""

    def __init__(self, committed: dict[int, int]) -> None:
        self.committed = committed
        self.processors: dict[int, BucketJoinProcessor] = {}
        self.outputs: Counter[bytes] = Counter()
        self.dead_letters: Counter[str] = Counter()

    def run(self, payloads: list[bytes], first_offset: int) -> None:
        packed = pack(RecordRouter(None, BUCKETS).route(kafka_batch(payloads, first_offset)))
        for bucket, blob in zip(packed.column("bucket").to_pylist(), packed.column("rows").to_pylist()):
            if bucket not in self.processors:
                self.processors[bucket] = BucketJoinProcessor(None, "machine.data", 10_000, self.committed)
                self.processors[bucket].init(_Handle())
            for frame in self.processors[bucket].handleInputRows(bucket, iter([pd.DataFrame({"rows": [blob]})]),
                                                                        _TimerValues()):
                emitted = unpack_emitted(frame["records"].tolist())
                for kind, value in zip(emitted.column("kind").to_pylist(), emitted.column("value").to_pylist()):
                    if kind == DLQ:
                        self.dead_letters[_without_time(value)] += 1
                    elif kind == OUT:
                        self.outputs[value] += 1

    def run_in_batches(self, payloads: list[bytes], first_offset: int, rng: random.Random, batches: int) -> None:
        bounds = sorted(rng.sample(range(1, len(payloads)), batches - 1))
        for start, end in zip([0, *bounds], [*bounds, len(payloads)]):
            self.run(payloads[start:end], first_offset + start)


def _without_time(letter: bytes) -> str:
    """A dead letter without the moment it was written."""
    fields = json.loads(letter)
    del fields["rejectedAt"]
    return json.dumps(fields, sort_keys=True)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_new_processor_after_the_committed_half_emits_exactly_the_rest(seed: int) -> None:
    rng = random.Random(seed)
    # File order: its out-of-order records become dead letters, which must not come twice either.
    payloads = [encode_record(record) for record in rows_as_records(EVENTS_FILE, time_order=False)[:4000]]
    payloads += [b"not json", b'{"thing": "R0815"}']
    whole = Job({})
    whole.run(payloads, 0)
    assert whole.outputs and whole.dead_letters

    half = len(payloads) // 2 + rng.randrange(100)
    before = Job({})
    before.run_in_batches(payloads[:half], 0, rng, 7)
    # The checkpoint is lost: a new job reads everything from the beginning, in other batches.
    after = Job({0: half})
    after.run_in_batches(payloads, 0, rng, 5)

    assert before.outputs + after.outputs == whole.outputs
    assert before.dead_letters + after.dead_letters == whole.dead_letters
    assert sum(after.outputs.values()) > 0 and not (set(after.outputs) & set(before.outputs))


def test_committed_rows_are_those_before_their_partitions_offset() -> None:
    table = pa.table({"partition": pa.array([0, 0, 1, 1, 2], pa.int32()), "offset": pa.array([4, 5, 0, 9, 3])})
    assert committed_rows(table, {0: 5, 1: 1}).tolist() == [True, False, True, False, False]
    assert committed_rows(table, {0: 4}) is None
    assert committed_rows(table, {}) is None


@pytest.mark.parametrize("changed", [(64, 8, STATE_LAYOUT), (32, 4, STATE_LAYOUT), (64, 4, "another layout")])
def test_a_checkpoint_made_with_another_layout_is_set_aside_and_a_new_one_begins(tmp_path, changed) -> None:
    checkpoint = tmp_path / "checkpoint"
    assert prepare_checkpoint(checkpoint, 64, 4, STATE_LAYOUT) is None  # nothing there yet
    (checkpoint / "offsets").mkdir()
    (checkpoint / "offsets" / "0").write_text("v1\n{}\n{}\n")
    assert prepare_checkpoint(checkpoint, 64, 4, STATE_LAYOUT) is None  # the same layout: resumed
    assert has_checkpoint(checkpoint)

    moved = prepare_checkpoint(checkpoint, *changed)
    assert moved is not None and has_checkpoint(moved) and not has_checkpoint(checkpoint)
    buckets, shuffle_partitions, state = changed
    assert json.loads((checkpoint / LAYOUT_FILE).read_text()) == {
        "buckets": buckets, "shuffle_partitions": shuffle_partitions, "state": state}


@pytest.mark.parametrize("recorded", [None, {"buckets": 64, "shuffle_partitions": 4}])
def test_a_checkpoint_from_before_the_state_layout_was_recorded_is_set_aside(tmp_path, recorded) -> None:
    """Checkpoints without a recorded layout, or without its state entry, hold one map entry per join key."""
    checkpoint = tmp_path / "checkpoint"
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "offsets" / "0").write_text("v1\n{}\n{}\n")
    if recorded is not None:
        (checkpoint / LAYOUT_FILE).write_text(json.dumps(recorded))
    moved = prepare_checkpoint(checkpoint, 64, 4, STATE_LAYOUT)
    assert moved is not None and has_checkpoint(moved) and not has_checkpoint(checkpoint)


@pytest.mark.parametrize("uri", ["hdfs:///checkpoints/spark-joiner", "s3a://bucket/spark-joiner"])
def test_a_checkpoint_uri_is_refused_with_the_way_to_shared_storage(uri: str) -> None:
    with pytest.raises(SystemExit, match="PersistentVolumeClaim"):
        prepare_checkpoint(Path(uri), 64, 4, STATE_LAYOUT)


def test_the_batch_ends_are_read_from_an_offset_log_entry() -> None:
    entry = ('v1\n{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{}}\n'
             '{"machine.data":{"1":7,"0":12}}\n')
    assert batch_ends(entry, "machine.data") == {0: 12, 1: 7}
    with pytest.raises(ValueError):
        batch_ends(entry, "other")
