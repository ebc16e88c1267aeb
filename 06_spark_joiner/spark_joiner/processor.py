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
        batch = pd.concat(list(rows), ignore_index=True)
        emitted = _Emitted()
        invalid = batch["reason"].notna().to_numpy()
        for payload, reason, partition, offset in batch.loc[invalid, ["payload", "reason", "partition", "offset"]
                                                            ].itertuples(index=False):
            emitted.dead_letter(reason, payload, self.input_topic, partition, offset)
        data = batch.loc[~invalid]
        if len(data):
            states = self._load_states()
            self._join(data, states, emitted)
            self.joins.update((pickle.dumps(states, protocol=pickle.HIGHEST_PROTOCOL),))
        if emitted.kinds:
            yield emitted.frame()

    def close(self) -> None:
        pass

    def _load_states(self) -> dict[JoinKey, bytes]:
        return pickle.loads(self.joins.get()[0]) if self.joins.exists() else {}

    def _join(self, data: pd.DataFrame, states: dict[JoinKey, bytes], emitted: _Emitted) -> None:
        routes = {pair: self.resolver.routes(pair[0])[pair[1]].binding
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
            for side, side_rows in zip((LEFT, RIGHT), sides):
                self._reject_out_of_order(thing, binding, side, side_rows, arrays[side], state, emitted)
            state, pairs = join_batch(state, *arrays[LEFT], *arrays[RIGHT], delta_time=binding.delta_time_ms,
                                      max_pending_per_side=self.max_pending_per_side)
            states[key] = state.to_bytes()
            emitted.joins(thing, binding, pairs)

    def _reject_out_of_order(self, thing: str, binding: SpecBinding, side: int, rows: pd.DataFrame,
                             arrays: tuple[np.ndarray, np.ndarray], state: BatchJoinState,
                             emitted: _Emitted) -> None:
        times, values = arrays
        verdicts = order_verdicts(times, values, state.last_time[side], state.last_value[side])
        rejected = np.flatnonzero(verdicts.rejected)
        if not len(rejected):
            return
        stream = record_key(thing, binding.quantity(side))
        for index in rejected.tolist():
            row = rows.iloc[index]
            reason = rejection_reason(stream, times[index], verdicts.latest_before[index])
            emitted.dead_letter(reason, row["payload"], self.input_topic, row["partition"], row["offset"])


class _Emitted:
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
