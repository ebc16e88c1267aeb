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

    ``states`` maps each join key to its engine state as bytes and is updated in place.
    """
    emitted = Emitted()
    invalid = data["reason"].notna().to_numpy()
    for payload, reason, partition, offset in data.loc[invalid, ["payload", "reason", "partition", "offset"]
                                                       ].itertuples(index=False):
        emitted.dead_letter(reason, payload, input_topic, partition, offset)
    data = data.loc[~invalid]
    if not len(data):
        return emitted
    routes = {pair: resolver.routes(pair[0])[pair[1]].binding
              for pair in data[["quantity", "route"]].drop_duplicates().itertuples(index=False, name=None)}
    bindings = {binding_id(binding): binding for binding in routes.values()}
    ids = [binding_id(routes[pair]) for pair in zip(data["quantity"], data["route"])]
    data = data.assign(spec=[spec for spec, _ in ids], axis=[axis for _, axis in ids])
    # Stream order is Kafka offset order; sorted once, every (key, side) slice below keeps it.
    data = data.sort_values(["partition", "offset"], kind="stable")
    for (thing, spec, axis), rows in data.groupby(["thing", "spec", "axis"], sort=True):
        binding = bindings[(spec, axis)]
        key = (thing, spec, axis)
        state = BatchJoinState.from_bytes(states[key]) if key in states else BatchJoinState()
        sides = [rows[rows["side"].to_numpy() == side] for side in (LEFT, RIGHT)]
        arrays = [(side_rows["time"].to_numpy(np.float64), side_rows["result"].to_numpy(np.float64))
                  for side_rows in sides]
        for side in (LEFT, RIGHT):
            _dead_letter_out_of_order(thing, binding, side, sides[side], arrays[side], state, input_topic, emitted)
        state, pairs = join_batch(state, *arrays[LEFT], *arrays[RIGHT], delta_time=binding.delta_time_ms,
                                  max_pending_per_side=max_pending_per_side)
        states[key] = state.to_bytes()
        emitted.joins(thing, binding, pairs)
    return emitted


def _dead_letter_out_of_order(thing: str, binding: SpecBinding, side: int, rows: pd.DataFrame,
                              arrays: tuple[np.ndarray, np.ndarray], state: BatchJoinState, input_topic: str,
                              emitted: Emitted) -> None:
    times, values = arrays
    verdicts = order_verdicts(times, values, state.last_time[side], state.last_value[side])
    rejected = np.flatnonzero(verdicts.rejected)
    if not len(rejected):
        return
    stream = record_key(thing, binding.quantity(side))
    payloads, partitions, offsets = (rows[column].to_numpy() for column in ("payload", "partition", "offset"))
    for index in rejected.tolist():
        reason = rejection_reason(stream, times[index], verdicts.latest_before[index])
        emitted.dead_letter(reason, payloads[index], input_topic, partitions[index], offsets[index])


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
