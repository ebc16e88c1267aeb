"""The Spark joiner's stateful step restores each stream's Kafka offset order within a micro-batch.

After Spark's shuffle the rows of a bucket arrive in no particular order. These tests hand the
processor's join (the code Spark runs per bucket) rows in a shuffled order, split over several
micro-batches and packed per bucket as the router packs them (their output read back as the sink reads
it), and require exactly the engine's result: the keyed joiner fed in offset order.
"""
from __future__ import annotations

import json
import random

import numpy as np
import pyarrow as pa
import pytest

from clock_support import as_given_up, engine_join, given_up
from conftest import EVENTS_FILE
from kafka_joiner_support import as_multiset, offline_join, rows_as_records
from local_stream_buffer.batch import join_batch
from local_stream_buffer.keyed_batch import StateDict
from local_stream_buffer.order import order_verdicts
from local_stream_buffer.specs import SpecResolver
from spark_joiner.parse import pack, unpack
from spark_joiner.bucket_join import DLQ, OUT, join_bucket, unpack_emitted
from spark_support import routed_rows


def run_batches(records, raw=(), batches=3, seed=0):
    """Join the records' routed rows in `batches` micro-batches, each in shuffled row order, packed per
    bucket and unpacked as the stateful step does."""
    rows = routed_rows(records, raw=list(raw))
    rng = random.Random(seed)
    bounds = sorted(rng.sample(range(1, rows.num_rows), batches - 1))
    states = StateDict()
    outputs, dead_letters = [], []
    for start, end in zip([0, *bounds], [*bounds, rows.num_rows]):
        shuffled = list(range(start, end))
        rng.shuffle(shuffled)
        batch = rows.take(pa.array(shuffled))
        assert not batch.column("offset").to_pandas().is_monotonic_increasing  # really out of offset order
        for blob in pack(batch).column("rows").to_pylist():
            emitted = join_bucket(SpecResolver(), unpack([blob]), states, "machine.data", 10_000)
            if emitted:  # through the processor's packed output row, as the sink reads it
                records = unpack_emitted(emitted.frame()["records"]).to_pydict()
                for kind, value in zip(records["kind"], records["value"]):
                    if kind in (OUT, DLQ):  # not the clock rule's counts
                        (outputs if kind == OUT else dead_letters).append(value)
    return outputs, [json.loads(letter) for letter in dead_letters]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_shuffled_rows_in_time_ordered_input_give_the_engine_result(seed) -> None:
    records = rows_as_records(EVENTS_FILE, time_order=True)[:3000]
    expected, rejected = offline_join(records)
    outputs, dead_letters = run_batches(records, seed=seed)
    assert expected and not rejected and not dead_letters
    assert as_multiset(outputs) == as_multiset(expected)


def test_file_order_rejects_what_the_engine_rejects_and_joins_the_rest() -> None:
    records = rows_as_records(EVENTS_FILE, time_order=False)[:3000]
    malformed = [b'{"thing": "R0815", "quantity": "actSpeed_C11"', b'{"thing":"R0815","quantity":"x","result":1}']
    expected, rejected, dropped = engine_join(records)
    outputs, dead_letters = run_batches(records, raw=malformed)
    assert rejected, "the file-order slice must contain out-of-order records"
    assert as_multiset(outputs) == as_multiset(expected)
    # Records the clock rule gave up after holding them (the file jumps days back and forth): as the engine gave up.
    assert given_up(dead_letters) == as_given_up(dropped)
    dead_letters = [letter for letter in dead_letters if "offset" in letter]
    out_of_order = [letter for letter in dead_letters if letter["reason"].startswith(("out_of_order", "conflict"))]
    assert as_multiset([letter["payload"].encode() for letter in out_of_order]) == as_multiset(rejected)
    invalid = [letter for letter in dead_letters if letter not in out_of_order]
    assert sorted(letter["payload"].encode() for letter in invalid) == sorted(malformed)
    assert all(letter["reason"] and letter["stage"] == "spark_joiner" and "offset" in letter
               for letter in dead_letters)


def test_order_verdicts_match_the_engine_counters() -> None:
    rng = np.random.default_rng(7)
    times = np.round(rng.uniform(0, 50, 400)).astype(float)
    values = rng.integers(0, 3, 400).astype(float)
    state, _ = join_batch(None, times[:100], values[:100], np.empty(0), np.empty(0))
    verdicts = order_verdicts(times[100:], values[100:], state.last_time[0], state.last_value[0])
    after, _ = join_batch(state, times[100:], values[100:], np.empty(0), np.empty(0))
    assert verdicts.rejected.sum() == after.rejected - state.rejected
    assert verdicts.duplicate.sum() == after.duplicates - state.duplicates
