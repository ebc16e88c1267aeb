"""The join inside Spark's keyed state: one group per bucket, the engine's keyed batch join within it.

Spark calls the processor once per bucket that has input in a micro-batch (``transformWithStateInPandas``
keyed by bucket). The bucket's state is a single value: every join key's engine state as bytes. Grouping
many machines into one bucket is what keeps 10,000 machines fast: Spark's per-group cost is paid per
bucket, not per machine.

The join itself is the engine's (``local_stream_buffer.keyed_batch``): it puts each stream back into Kafka
offset order (the rows went through a shuffle), rejects what breaks a stream's order, and joins. Its
result depends only on each stream's order, so it equals the standalone joiner's, pair for pair. This
module only turns Spark's rows into the engine's arrays, and the engine's pairs and verdicts into Kafka
records.
"""
from __future__ import annotations

import pickle
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import BinaryType, StructField, StructType

from local_stream_buffer.keyed_batch import JoinKey, KeyedPairs, KeyedRows, StateKey, join_keyed_batch
from local_stream_buffer.specs import SpecResolver
from pipeline_core.records import dead_letter

from .encode import STAGE, EncodedOutputs, encode_outputs
from .parse import resolver_for, unpack

# The topic of an emitted record: a small int column, which Arrow builds from numpy without a Python
# object per record.
OUT = 0  # machine.out
DLQ = 1  # machine.dlq

# What the processor emits: per bucket and micro-batch one row, its encoded Kafka records for machine.out
# and machine.dlq as an Arrow IPC record batch (EMITTED_ARROW_SCHEMA). One row per record would cost the
# JVM a conversion per record twice (into Spark rows, and into Arrow again for the sink).
OUTPUT_SCHEMA = StructType([StructField("records", BinaryType(), False)])
EMITTED_ARROW_SCHEMA = pa.schema([
    pa.field("kind", pa.int8(), nullable=False),  # OUT or DLQ
    pa.field("key", pa.string()),
    pa.field("value", pa.binary(), nullable=False),
])
STATE_SCHEMA = StructType([StructField("joins", BinaryType(), False)])


class BucketJoinProcessor(StatefulProcessor):
    """Joins every key of one bucket with the engine's keyed batch join."""

    def __init__(self, join_specs: Path | None, input_topic: str, max_pending_per_side: int) -> None:
        self.join_specs = join_specs
        self.input_topic = input_topic
        self.max_pending_per_side = max_pending_per_side

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.joins = handle.getValueState("joins", STATE_SCHEMA)
        self.resolver: SpecResolver = resolver_for(self.join_specs)

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        data = unpack(blob for frame in rows for blob in frame["rows"])
        has_data = data.column("reason").null_count > 0
        states = self._load_states() if has_data else {}
        emitted = join_bucket(self.resolver, data, states, self.input_topic, self.max_pending_per_side)
        if has_data:
            self._store_states(states)
        if emitted:
            yield emitted.frame()

    def close(self) -> None:
        pass

    def _load_states(self) -> dict[StateKey, bytes]:
        stored = self.joins.get()  # None for a bucket without state: one call to the state server, not two
        return pickle.loads(stored[0]) if stored is not None else {}

    def _store_states(self, states: dict[StateKey, bytes]) -> None:
        self.joins.update((pickle.dumps(states, protocol=pickle.HIGHEST_PROTOCOL),))


def _codes(column: pa.ChunkedArray) -> tuple[np.ndarray, list]:
    """Dictionary codes of a string column and the distinct values they index."""
    encoded = column.combine_chunks().dictionary_encode()
    return encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64), encoded.dictionary.to_pylist()


def keyed_rows(resolver: SpecResolver, data: pa.Table) -> KeyedRows:
    """The engine's view of routed rows: each row's join key (thing and the binding its route names)."""
    quantity_codes, quantities = _codes(data.column("quantity"))
    thing_codes, things = _codes(data.column("thing"))
    route = data.column("route").to_numpy().astype(np.int64)
    width = int(route.max()) + 1
    # A row's binding from (quantity, route index); its key from (thing, binding).
    routes, route_codes = np.unique(quantity_codes * width + route, return_inverse=True)
    route_bindings = [resolver.routes(quantities[code // width])[code % width].binding for code in routes.tolist()]
    bindings = list(dict.fromkeys(route_bindings))
    binding_of_route = np.array([bindings.index(binding) for binding in route_bindings], dtype=np.int64)
    codes, key = np.unique(thing_codes * len(bindings) + binding_of_route[route_codes], return_inverse=True)
    keys = [(things[code // len(bindings)], bindings[code % len(bindings)]) for code in codes.tolist()]
    return KeyedRows(keys, key.astype(np.int64), data.column("side").to_numpy(), data.column("partition").to_numpy(),
                     data.column("offset").to_numpy(), data.column("time").to_numpy(),
                     data.column("result").to_numpy())


Encoder = Callable[[Sequence[JoinKey], KeyedPairs, str], EncodedOutputs]


def join_bucket(resolver: SpecResolver, data: pa.Table, states: dict[StateKey, bytes], input_topic: str,
                max_pending_per_side: int, encode: Encoder = encode_outputs) -> Emitted:
    """Join a bucket's routed rows (in any row order) into ``states`` with the engine; the records to emit.

    ``states`` maps each join key to its engine state as bytes and is updated in place. Rows the router
    rejected, and rows the engine finds out of order, become dead letters with their reasons; ``encode``
    turns the pairs into records.
    """
    emitted = Emitted()
    invalid = pc.is_valid(data.column("reason"))
    if data.column("reason").null_count < data.num_rows:
        rejected = data.filter(invalid)
        for payload, reason, partition, offset in zip(*(rejected.column(name).to_pylist() for name in
                                                        ("payload", "reason", "partition", "offset"))):
            emitted.dead_letter(reason, payload, input_topic, partition, offset)
        data = data.filter(pc.invert(invalid))
    if not data.num_rows:
        return emitted
    rows = keyed_rows(resolver, data)
    joined = join_keyed_batch(states, rows, max_pending_per_side)
    payloads = data.column("payload")
    for row, reason in zip(joined.rejected.tolist(), joined.reasons):
        emitted.dead_letter(reason, payloads[row].as_py(), input_topic, rows.partition[row], rows.offset[row])
    if joined.count:
        emitted.outputs(encode(rows.keys, joined, input_topic))
    return emitted


class Emitted:
    """The records of one bucket and micro-batch: dead letters (few) and output records (as arrays)."""

    def __init__(self) -> None:
        self.dead_letters: list[bytes] = []
        self.keys: list[pa.Array] = []
        self.values: list[pa.Array] = []

    def __len__(self) -> int:
        return len(self.dead_letters) + sum(map(len, self.values))

    def dead_letter(self, reason: str, payload: bytes | None, topic: str, partition: int, offset: int) -> None:
        # payload None: a record without a value (a tombstone).
        self.dead_letters.append(dead_letter(reason, payload, STAGE, topic=topic, partition=int(partition),
                                             offset=int(offset)))

    def outputs(self, encoded: EncodedOutputs) -> None:
        self.keys.append(encoded.keys)
        self.values.append(encoded.values)
        self.dead_letters.extend(encoded.dead_letters)

    def frame(self) -> pd.DataFrame:
        """The records as the processor's one output row: machine.dlq's, then machine.out's."""
        outputs = sum(map(len, self.values))
        kinds = np.full(len(self.dead_letters) + outputs, OUT, np.int8)
        kinds[:len(self.dead_letters)] = DLQ
        keys = pa.concat_arrays([pa.nulls(len(self.dead_letters), pa.string()), *self.keys])
        values = pa.concat_arrays([pa.array(self.dead_letters, pa.binary()), *self.values])
        records = pa.RecordBatch.from_arrays([pa.array(kinds), keys, values], schema=EMITTED_ARROW_SCHEMA)
        return pd.DataFrame({"records": [records.serialize().to_pybytes()]})


def unpack_emitted(blobs: Iterable[bytes]) -> pa.Table:
    """The records of the processor's output rows, as one table of kind, key and value."""
    return pa.Table.from_batches([pa.ipc.read_record_batch(pa.py_buffer(blob), EMITTED_ARROW_SCHEMA)
                                  for blob in blobs], schema=EMITTED_ARROW_SCHEMA)
