"""The Spark job as it was before its router and output records went column by column, kept for the bench.

`benchmarks.spark_joiner` runs this job beside the current one on the same input in the same run and
prints the ratio. It differs from the job in exactly the two per-record Python paths it replaced:

- the router decoded every payload with `decode_record` and looked up its routes through a per-worker
  cache, one record at a time;
- the processor built every output record as a dict (`output_records`, a UUID5 and canonical times per
  record) and encoded it with `encode_record`.

Everything else (Kafka source, shuffle, the engine's keyed batch join, state, sink) is the job's own code.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from local_stream_buffer.batch import PairArrays
from local_stream_buffer.keyed_batch import JoinKey, KeyedPairs
from local_stream_buffer.output import is_finite_result, output_records
from local_stream_buffer.rejections import Rejection
from pipeline_core.partitioning import thing_partition
from pipeline_core.records import InvalidRecord, dead_letter, decode_record, encode_record, record_key
from spark_joiner.encode import STAGE, EncodedOutputs
from spark_joiner.job import CHECKPOINT_FILE_MANAGER, FILE_SYSTEM_CHECKPOINTS, QUERY_NAME, is_local_path, kafka_source
from spark_joiner.parse import PACKED_SCHEMA, RecordRouter, routed_rows, unpack
from spark_joiner.bucket_join import ChunkedStates, join_bucket
from spark_joiner.processor import OUTPUT_SCHEMA, BucketJoinProcessor
from spark_joiner.settings import SparkJoinerSettings
from spark_joiner.sink import TransactionalBatchSink

# Distinct (thing, quantity) pairs whose routes the router remembers before it starts afresh.
_TARGET_CACHE_SIZE = 200_000
# The routes of this process's routers, per (spec file, bucket count): see PerRecordRouter.
_WORKER_TARGETS: dict[tuple[Path | None, int], "_TargetCache"] = {}


class PerRecordRouter(RecordRouter):
    """The previous ``mapInArrow`` router: per record, decode, validate and look up its join keys."""

    def __init__(self, join_specs: Path | None, buckets: int) -> None:
        super().__init__(join_specs, buckets)
        if (join_specs, buckets) not in _WORKER_TARGETS:
            _WORKER_TARGETS[(join_specs, buckets)] = _TargetCache(self.targets)
        self._targets = _WORKER_TARGETS[(join_specs, buckets)]

    def targets(self, thing: str, quantity: str) -> tuple[tuple[int, int, int], ...]:
        """(bucket, route index, side) of every join key a record of ``thing`` and ``quantity`` feeds."""
        bucket = thing_partition(thing, self.buckets)
        return tuple((bucket, index, side) for index, (_, side) in enumerate(self.resolver.routes(quantity)))

    def route(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """One routed row per (record, join key it feeds), then one per rejected record."""
        cache = self._targets
        if len(cache) > _TARGET_CACHE_SIZE:
            cache.clear()
        records: list[dict] = []
        rejected: list[int] = []
        reasons: list[str] = []
        keep = records.append
        for row, payload in enumerate(batch.column("value").to_pylist()):
            try:
                keep(decode_record(payload))
            except InvalidRecord as error:
                rejected.append(row)
                reasons.append(str(error))
        things = [record["thing"] for record in records]
        quantities = [record["quantity"] for record in records]
        targets = [cache[key] for key in zip(things, quantities)]
        flat = [target for record_targets in targets for target in record_targets]
        valid_rows = np.delete(np.arange(batch.num_rows), rejected) if rejected else np.arange(batch.num_rows)
        times = np.array([record["phenomenonTime"] for record in records], np.float64)
        results = np.array([record["result"] for record in records], np.float64)
        thing_column, quantity_column = pa.array(things, pa.string()), pa.array(quantities, pa.string())
        if len(flat) != len(records) or () in targets:  # else every record feeds exactly one key
            source = np.repeat(np.arange(len(records)), np.fromiter(map(len, targets), np.int64, len(targets)))
            valid_rows, times, results = valid_rows[source], times[source], results[source]
            taken = pa.array(source, pa.int64())
            thing_column, quantity_column = thing_column.take(taken), quantity_column.take(taken)
        bucket, route, side = np.array(flat, np.int32).reshape(-1, 3).T
        return routed_rows(batch, self.reject_bucket, bucket, thing_column, quantity_column, route, side, times,
                           results, valid_rows, np.array(rejected, np.int64), reasons)


class _TargetCache(dict):
    """(thing, quantity) -> its routing targets, computed on first use (one dict lookup per record)."""

    def __init__(self, targets: Callable[[str, str], tuple[tuple[int, int, int], ...]]) -> None:
        super().__init__()
        self._compute = targets

    def __missing__(self, key: tuple[str, str]) -> tuple[tuple[int, int, int], ...]:
        value = self[key] = self._compute(*key)
        return value


def encode_per_record(keys: Sequence[JoinKey], joined: KeyedPairs, input_topic: str) -> EncodedOutputs:
    """The previous output step: a dict per record (output_records), then encode_record per record."""
    output_keys: list[str] = []
    values: list[bytes] = []
    dead_letters: list[bytes] = []
    bounds = np.flatnonzero(np.diff(joined.key, prepend=-1, append=len(keys))).tolist()
    for start, end in zip(bounds, bounds[1:]):
        thing, binding = keys[int(joined.key[start])]
        records = output_records(thing, binding, PairArrays(*(column[start:end] for column in joined.pairs)))
        key = record_key(thing, binding.output_quantity)
        if all(map(is_finite_result, records)):
            output_keys.extend([key] * len(records))
            values.extend(map(encode_record, records))
            continue
        for record in records:
            if is_finite_result(record):
                output_keys.append(key)
                values.append(encode_record(record))
            else:
                dead_letters.append(dead_letter(Rejection.NOT_FINITE.reason(), None, STAGE, topic=input_topic,
                                                output=json.dumps(record, default=repr)))
    return EncodedOutputs(pa.array(output_keys, pa.string()), pa.array(values, pa.binary()), dead_letters)


class PerRecordProcessor(BucketJoinProcessor):
    """The job's processor with the previous output step."""

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        data = unpack(blob for frame in rows for blob in frame["rows"])
        states = ChunkedStates(self.chunks)
        emitted = join_bucket(self.bucket.resolver, data, states, self.input_topic, self.max_pending_per_side,
                              encode=encode_per_record)
        self.bucket.store_states(states, emitted)
        if emitted:
            yield emitted.frame()


def start_baseline_query(spark: SparkSession, settings: SparkJoinerSettings,
                         sink: TransactionalBatchSink) -> StreamingQuery:
    """``spark_joiner.job.start_query`` with the previous router and output step."""
    sink.resume(settings.input_topic, str(settings.checkpoint_dir))  # fresh topics: nothing committed to skip
    if is_local_path(str(settings.checkpoint_dir)):
        spark.conf.set(CHECKPOINT_FILE_MANAGER, FILE_SYSTEM_CHECKPOINTS)
    routed = kafka_source(spark, settings).mapInArrow(PerRecordRouter(settings.join_specs, settings.buckets),
                                                      PACKED_SCHEMA)
    joined = routed.groupBy("bucket").transformWithStateInPandas(
        statefulProcessor=PerRecordProcessor(settings.join_specs, settings.input_topic, settings.max_pending_per_side),
        outputStructType=OUTPUT_SCHEMA,
        outputMode="Append",
        timeMode="None",
    )
    return (
        joined.writeStream.queryName(f"{QUERY_NAME}_baseline")
        .foreachBatch(sink)
        .option("checkpointLocation", str(settings.checkpoint_dir))
        .trigger(processingTime=f"{int(settings.trigger_s * 1000)} milliseconds")
        .start()
    )
