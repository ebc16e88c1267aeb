"""The join inside Spark's keyed state: one group per hash bucket, one engine state per join key.

Spark calls the processor once per bucket that has input in a micro-batch (``transformWithStateInPandas``
keyed by bucket). The bucket's state is a single value: every join key's
``local_stream_buffer.batch.BatchJoinState`` as bytes. Grouping many machines into one bucket is what
keeps 10,000 machines fast: Spark's per-group cost is paid per bucket, not per machine.

Within a micro-batch the rows of a stream arrive in no particular order (they went through a shuffle);
they are put back into Kafka offset order before the engine sees them. The engine's result depends only
on each stream's order, so it equals the standalone joiner's, pair for pair.
"""
from __future__ import annotations

import json
import pickle
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import BinaryType, StructField, StructType

from local_stream_buffer import LEFT, RIGHT
from local_stream_buffer.batch import BatchJoinState, PairArrays, join_batch
from local_stream_buffer.output import output_records
from local_stream_buffer.specs import SpecBinding, SpecResolver
from pipeline_core.records import dead_letter, encode_record, record_key

from .order import order_verdicts, rejection_reason
from .parse import binding_id, resolver_for, unpack

STAGE = "spark_joiner"
NOT_FINITE = "join result is not a finite number"  # the standalone joiner's reason
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

JoinKey = tuple[str, str, str]


class BucketJoinProcessor(StatefulProcessor):
    """Joins every key of one hash bucket with the engine's vectorised batch path."""

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
        emitted = join_rows(self.resolver, data, states, self.input_topic, self.max_pending_per_side)
        if has_data:
            self.joins.update((pickle.dumps(states, protocol=pickle.HIGHEST_PROTOCOL),))
        if emitted:
            yield emitted.frame()

    def close(self) -> None:
        pass

    def _load_states(self) -> dict[JoinKey, bytes]:
        stored = self.joins.get()  # None for a bucket without state: one call to the state server, not two
        return pickle.loads(stored[0]) if stored is not None else {}


def _codes(column: pa.ChunkedArray) -> tuple[np.ndarray, list]:
    """Dictionary codes of a string column and the distinct values they index."""
    encoded = column.combine_chunks().dictionary_encode()
    return encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64), encoded.dictionary.to_pylist()


def join_rows(resolver: SpecResolver, data: pa.Table, states: dict[JoinKey, bytes], input_topic: str,
              max_pending_per_side: int) -> Emitted:
    """Join routed rows (in any row order) into ``states``; returns the records to emit.

    ``states`` maps each join key to its engine state as bytes and is updated in place. Vectorised over
    the bucket's rows: one sort by (join key, side, partition, offset), then one engine call per key.
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
    # Join key per row: (thing, binding), the binding found from (quantity, route index).
    quantity_codes, quantities = _codes(data.column("quantity"))
    route = data.column("route").to_numpy().astype(np.int64)
    width = int(route.max()) + 1
    routes, route_codes = np.unique(quantity_codes * width + route, return_inverse=True)
    route_bindings = [resolver.routes(quantities[code // width])[code % width].binding for code in routes.tolist()]
    binding_ids = sorted({binding_id(binding) for binding in route_bindings})
    bindings = {binding_id(binding): binding for binding in route_bindings}
    binding_of_route = np.array([binding_ids.index(binding_id(binding)) for binding in route_bindings])
    thing_codes, things = _codes(data.column("thing"))
    key_codes = thing_codes * len(binding_ids) + binding_of_route[route_codes]
    side = data.column("side").to_numpy()
    partition = data.column("partition").to_numpy()
    offset = data.column("offset").to_numpy()
    # Stream order is Kafka offset order: sort by key, then side, then position in Kafka.
    order = np.lexsort((offset, partition, side, key_codes))
    key_codes, side, partition, offset = key_codes[order], side[order], partition[order], offset[order]
    times = data.column("time").to_numpy()[order]
    results = data.column("result").to_numpy()[order]
    payloads = data.column("payload")
    starts = np.flatnonzero(np.diff(key_codes, prepend=-1))
    ends = [*starts[1:].tolist(), len(key_codes)]
    # Where each key's right side begins (sides are sorted within a key).
    splits = np.searchsorted(key_codes * 2 + side, key_codes[starts] * 2 + RIGHT).tolist()
    # Rows before each row that do not follow their predecessor in time: a stream is strictly increasing
    # within the batch when none of its rows after the first is counted here.
    not_rising = np.concatenate(([0], np.cumsum(np.diff(times) <= 0))).tolist()
    time_list = times.tolist()
    for start, split, end, code in zip(starts.tolist(), splits, ends, key_codes[starts].tolist()):
        thing = things[code // len(binding_ids)]
        spec, axis = binding_ids[code % len(binding_ids)]
        binding = bindings[(spec, axis)]
        key = (thing, spec, axis)
        state = BatchJoinState.from_bytes(states[key]) if key in states else BatchJoinState()
        sides = (slice(start, split), slice(split, end))
        for stream_side, rows in zip((LEFT, RIGHT), sides):
            if rows.start == rows.stop or (time_list[rows.start] > state.last_time[stream_side]
                                           and not_rising[rows.stop - 1] == not_rising[rows.start]):
                continue  # in order: the common case, without the per-record verdicts
            verdicts = order_verdicts(times[rows], results[rows], state.last_time[stream_side],
                                      state.last_value[stream_side])
            if not verdicts.rejected.any():
                continue
            stream = record_key(thing, binding.quantity(stream_side))
            for index in np.flatnonzero(verdicts.rejected).tolist():
                row = rows.start + index
                reason = rejection_reason(stream, times[row], verdicts.latest_before[index])
                emitted.dead_letter(reason, payloads[int(order[row])].as_py(), input_topic, partition[row],
                                    offset[row])
        state, pairs = join_batch(state, times[sides[LEFT]], results[sides[LEFT]], times[sides[RIGHT]],
                                  results[sides[RIGHT]], delta_time=binding.delta_time_ms,
                                  max_pending_per_side=max_pending_per_side)
        states[key] = state.to_bytes()
        emitted.joins(thing, binding, pairs)
    emitted.build_joins(input_topic)
    return emitted


class Emitted:
    """Output rows of one bucket, built column by column."""

    def __init__(self) -> None:
        self.dead_letter_rows: list[int] = []  # rows of kind DLQ; every other row is OUT
        self.keys: list[str | None] = []
        self.values: list[bytes] = []
        self._held: list[tuple[str, SpecBinding, PairArrays]] = []

    def __len__(self) -> int:
        return len(self.values)

    def dead_letter(self, reason: str, payload: bytes, topic: str, partition: int, offset: int) -> None:
        self.dead_letter_rows.append(len(self.values))
        self.keys.append(None)
        self.values.append(dead_letter(reason, bytes(payload), STAGE, topic=topic, partition=int(partition),
                                       offset=int(offset)))

    def joins(self, thing: str, binding: SpecBinding, pairs: PairArrays) -> None:
        """Hold one key's pairs; :meth:`build_joins` turns every held pair into a record."""
        if pairs.count:
            self._held.append((thing, binding, pairs))

    def build_joins(self, input_topic: str) -> None:
        """The output records of the held pairs: machine.out in time order per key, whatever order the
        engine found the pairs in. One sort over all keys, not one per key. A record whose result is not a
        finite number (a formula overflowing, say) is dead-lettered, as the standalone joiner does."""
        if not self._held:
            return
        counts = [pairs.count for _, _, pairs in self._held]
        held = PairArrays(*(np.concatenate(column) for column in zip(*(pairs for _, _, pairs in self._held))))
        held_index = np.repeat(np.arange(len(counts)), counts)
        order = np.lexsort((held.right_time, held.left_time, held_index))
        held = PairArrays(*(column[order] for column in held))
        start = 0
        for (thing, binding, _), count in zip(self._held, counts):
            records = output_records(thing, binding, PairArrays(*(column[start:start + count] for column in held)))
            start += count
            key = record_key(thing, binding.output_quantity)
            try:
                values = list(map(encode_record, records))
            except ValueError:  # some result is not finite (rare): dead-letter those, record by record
                values = None
            if values is not None:
                self.keys.extend([key] * count)
                self.values.extend(values)
                continue
            for record in records:
                try:
                    value = encode_record(record)
                except ValueError:
                    self.dead_letter_rows.append(len(self.values))
                    self.keys.append(None)
                    self.values.append(dead_letter(NOT_FINITE, None, STAGE, topic=input_topic,
                                                   output=json.dumps(record, default=repr)))
                    continue
                self.keys.append(key)
                self.values.append(value)
        self._held = []

    def frame(self) -> pd.DataFrame:
        """The records as the processor's one output row."""
        kinds = np.full(len(self.values), OUT, np.int8)
        kinds[self.dead_letter_rows] = DLQ
        records = pa.RecordBatch.from_arrays([pa.array(kinds), pa.array(self.keys, pa.string()),
                                              pa.array(self.values, pa.binary())], schema=EMITTED_ARROW_SCHEMA)
        return pd.DataFrame({"records": [records.serialize().to_pybytes()]})



def unpack_emitted(blobs: Iterable[bytes]) -> pa.Table:
    """The records of the processor's output rows, as one table of kind, key and value."""
    return pa.Table.from_batches([pa.ipc.read_record_batch(pa.py_buffer(blob), EMITTED_ARROW_SCHEMA)
                                  for blob in blobs], schema=EMITTED_ARROW_SCHEMA)
