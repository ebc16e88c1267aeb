"""The keyed batch join (the Spark job's engine) on the real data file: rows of many keys in shuffled order,
split into batches, give the keyed joiner's outputs and reject what it rejects, with the same reasons."""

from __future__ import annotations

import random

import numpy as np
import pytest

from kafka_joiner_support import as_multiset, rows_as_records
from conftest import EVENTS_FILE
from local_stream_buffer.keyed import KeyedJoiner
from local_stream_buffer.keyed_batch import KeyedRows, StateDict, join_keyed_batch
from local_stream_buffer.output import output_records
from local_stream_buffer.status import IngestStatus
from local_stream_buffer.specs import SpecResolver


def routed(records: list[dict], resolver: SpecResolver) -> tuple[list, list[tuple[int, int, int]]]:
    """The join keys of the records, and per routed row: (key index, side, record number)."""
    keys: dict = {}
    rows = []
    for number, record in enumerate(records):
        for binding, side in resolver.routes(record["quantity"]):
            key = keys.setdefault((record["thing"], binding), len(keys))
            rows.append((key, side, number))
    return list(keys), rows


def join_in_batches(records: list[dict], batches: int, seed: int) -> tuple[list[dict], list[tuple[int, str]]]:
    resolver = SpecResolver()
    keys, rows = routed(records, resolver)
    rng = random.Random(seed)
    bounds = sorted(rng.sample(range(1, len(rows)), batches - 1))
    states = StateDict()
    outputs, rejected = [], []
    for start, end in zip([0, *bounds], [*bounds, len(rows)]):
        batch = rows[start:end]
        rng.shuffle(batch)  # after a shuffle, rows keep no order; each stream's order is its offsets
        key, side, number = (np.array(column, dtype=np.int64) for column in zip(*batch))
        arrays = KeyedRows(keys, key, side, np.zeros(len(batch), dtype=np.int64), number,
                           np.array([records[n]["phenomenonTime"] for n in number.tolist()], dtype=float),
                           np.array([records[n]["result"] for n in number.tolist()], dtype=float))
        joined = join_keyed_batch(states, arrays)
        assert np.all(np.diff(joined.key) >= 0), "pairs come per key"
        rejected += [(int(number[row]), reason) for row, reason in zip(joined.rejected.tolist(), joined.reasons)]
        for code in np.unique(joined.key).tolist():
            thing, binding = keys[code]
            mine = joined.key == code
            outputs += output_records(thing, binding, type(joined.pairs)(*(column[mine] for column in joined.pairs)))
    return outputs, rejected


@pytest.mark.parametrize("seed", [0, 1])
def test_shuffled_batches_of_the_file_order_give_the_keyed_joiner_result(seed) -> None:
    records = rows_as_records(EVENTS_FILE, time_order=False)[:6000]
    joiner = KeyedJoiner()
    expected, expected_rejected = [], []
    for number, record in enumerate(records):
        outcome = joiner.ingest(record)
        expected += outcome.outputs
        if outcome.status is IngestStatus.REJECTED:
            expected_rejected.append((number, outcome.reason))
    outputs, rejected = join_in_batches(records, batches=4, seed=seed)
    assert expected and expected_rejected
    assert as_multiset(outputs) == as_multiset(expected)
    assert sorted(rejected) == sorted(expected_rejected)


def test_no_rows_no_pairs() -> None:
    empty = np.empty(0, dtype=np.int64)
    joined = join_keyed_batch(StateDict(), KeyedRows([], empty, empty, empty, empty, empty.astype(float), empty.astype(float)))
    assert joined.count == 0 and not len(joined.rejected) and joined.reasons == []
