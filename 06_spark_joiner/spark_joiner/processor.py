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

import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import BinaryType, StringType, StructField, StructType

from local_stream_buffer import LEFT, RIGHT
from local_stream_buffer.batch import BatchJoinState, PairArrays, join_batch
from local_stream_buffer.output import output_records
from local_stream_buffer.specs import SpecBinding, SpecResolver
from stack.records import dead_letter, encode_record, record_key

from .order import order_verdicts, rejection_reason
from .parse import binding_id, resolver_for

STAGE = "spark_joiner"
OUT = "out"
DLQ = "dlq"

# What the processor emits: encoded Kafka records, each for machine.out or machine.dlq.
OUTPUT_SCHEMA = StructType([
    StructField("kind", StringType(), False),
    StructField("key", StringType(), True),
    StructField("value", BinaryType(), False),
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
        data = pd.concat(list(rows), ignore_index=True)
        has_data = data["reason"].isna().any()
        states = self._load_states() if has_data else {}
        emitted = join_rows(self.resolver, data, states, self.input_topic, self.max_pending_per_side)
        if has_data:
            self.joins.update((pickle.dumps(states, protocol=pickle.HIGHEST_PROTOCOL),))
        if emitted.kinds:
            yield emitted.frame()

    def close(self) -> None:
        pass

    def _load_states(self) -> dict[JoinKey, bytes]:
        return pickle.loads(self.joins.get()[0]) if self.joins.exists() else {}


def join_rows(resolver: SpecResolver, data: pd.DataFrame, states: dict[JoinKey, bytes], input_topic: str,
              max_pending_per_side: int) -> Emitted:
    """Join routed rows (in any row order) into ``states``; returns the records to emit.

    ``states`` maps each join key to its engine state as bytes and is updated in place. Vectorised over
    the bucket's rows: one sort by (join key, side, partition, offset), then one engine call per key.
    """
    emitted = Emitted()
    invalid = data["reason"].notna().to_numpy()
    for payload, reason, partition, offset in data.loc[invalid, ["payload", "reason", "partition", "offset"]
                                                       ].itertuples(index=False):
        emitted.dead_letter(reason, payload, input_topic, partition, offset)
    data = data.loc[~invalid]
    if not len(data):
        return emitted
    # Join key per row: (thing, binding), the binding found from (quantity, route index).
    route_codes, routes = pd.factorize(pd.MultiIndex.from_arrays([data["quantity"], data["route"]]))
    route_bindings = [resolver.routes(quantity)[route].binding for quantity, route in routes]
    binding_ids = sorted({binding_id(binding) for binding in route_bindings})
    bindings = {binding_id(binding): binding for binding in route_bindings}
    binding_of_route = np.array([binding_ids.index(binding_id(binding)) for binding in route_bindings])
    thing_codes, things = pd.factorize(data["thing"])
    key_codes = thing_codes.astype(np.int64) * len(binding_ids) + binding_of_route[route_codes]
    side = data["side"].to_numpy()
    partition = data["partition"].to_numpy()
    offset = data["offset"].to_numpy()
    # Stream order is Kafka offset order: sort by key, then side, then position in Kafka.
    order = np.lexsort((offset, partition, side, key_codes))
    key_codes, side, partition, offset = key_codes[order], side[order], partition[order], offset[order]
    times = data["time"].to_numpy(np.float64)[order]
    results = data["result"].to_numpy(np.float64)[order]
    payloads = data["payload"].to_numpy()[order]
    starts = np.flatnonzero(np.diff(key_codes, prepend=-1))
    for start, end in zip(starts.tolist(), [*starts[1:].tolist(), len(key_codes)]):
        code = int(key_codes[start])
        thing = things[code // len(binding_ids)]
        spec, axis = binding_ids[code % len(binding_ids)]
        binding = bindings[(spec, axis)]
        key = (thing, spec, axis)
        state = BatchJoinState.from_bytes(states[key]) if key in states else BatchJoinState()
        split = start + int(np.searchsorted(side[start:end], RIGHT))
        sides = (slice(start, split), slice(split, end))
        for stream_side, rows in zip((LEFT, RIGHT), sides):
            verdicts = order_verdicts(times[rows], results[rows], state.last_time[stream_side],
                                      state.last_value[stream_side])
            stream = record_key(thing, binding.quantity(stream_side))
            for index in np.flatnonzero(verdicts.rejected).tolist():
                row = rows.start + index
                reason = rejection_reason(stream, times[row], verdicts.latest_before[index])
                emitted.dead_letter(reason, payloads[row], input_topic, partition[row], offset[row])
        state, pairs = join_batch(state, times[sides[LEFT]], results[sides[LEFT]], times[sides[RIGHT]],
                                  results[sides[RIGHT]], delta_time=binding.delta_time_ms,
                                  max_pending_per_side=max_pending_per_side)
        states[key] = state.to_bytes()
        emitted.joins(thing, binding, pairs)
    return emitted


class Emitted:
    """Output rows of one bucket, built column by column."""

    def __init__(self) -> None:
        self.kinds: list[str] = []
        self.keys: list[str | None] = []
        self.values: list[bytes] = []

    def dead_letter(self, reason: str, payload: bytes, topic: str, partition: int, offset: int) -> None:
        self.kinds.append(DLQ)
        self.keys.append(None)
        self.values.append(dead_letter(reason, bytes(payload), STAGE, topic=topic, partition=int(partition),
                                       offset=int(offset)))

    def joins(self, thing: str, binding: SpecBinding, pairs: PairArrays) -> None:
        if not pairs.count:
            return
        # machine.out in time order per key, whatever order the engine found the pairs in.
        order = np.lexsort((pairs.right_time, pairs.left_time))
        pairs = PairArrays(*(column[order] for column in pairs))
        key = record_key(thing, binding.output_quantity)
        for record in output_records(thing, binding, pairs):
            self.kinds.append(OUT)
            self.keys.append(key)
            self.values.append(encode_record(record))

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame({"kind": self.kinds, "key": self.keys, "value": self.values})
