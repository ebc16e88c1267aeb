"""Kafka rows -> routed input rows: validate each record and route it to the join keys it feeds.

Runs inside Spark (``mapInArrow``) on the executors. A valid record becomes one row per
(thing, spec binding) it feeds, tagged with its hash bucket; a record that fails validation becomes
one row in the reject bucket with the reason, so the stateful step can dead-letter it in the same
exactly-once transaction as the join results. Records that feed no join spec are dropped here, as the
keyed joiner drops them (unrouted).
"""
from __future__ import annotations

import math
import zlib
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
from pyspark.sql.types import (BinaryType, DoubleType, IntegerType, LongType, StringType, StructField,
                               StructType)

from local_stream_buffer.specs import SpecBinding, SpecResolver, load_join_specs
from local_stream_buffer.timestamps import to_epoch_ms
from stack.records import InvalidRecord, decode_record

# Columns the job selects from Spark's Kafka source.
KAFKA_COLUMNS = ("value", "partition", "offset")

ROUTED_SCHEMA = StructType([
    StructField("bucket", IntegerType(), False),
    StructField("thing", StringType(), True),
    StructField("quantity", StringType(), True),
    StructField("route", IntegerType(), False),  # index into SpecResolver.routes(quantity); -1 if rejected
    StructField("side", IntegerType(), False),  # -1 if rejected
    StructField("time", DoubleType(), False),  # epoch ms; NaN if rejected
    StructField("result", DoubleType(), False),
    StructField("partition", IntegerType(), False),
    StructField("offset", LongType(), False),
    StructField("payload", BinaryType(), True),  # the original record, for a dead letter
    StructField("reason", StringType(), True),  # set for records rejected here
])
ROUTED_ARROW_SCHEMA = pa.schema([
    pa.field(field.name, arrow_type, nullable=field.nullable)
    for field, arrow_type in zip(ROUTED_SCHEMA.fields, (
        pa.int32(), pa.string(), pa.string(), pa.int32(), pa.int32(), pa.float64(), pa.float64(), pa.int32(),
        pa.int64(), pa.binary(), pa.string()))
])


def binding_id(binding: SpecBinding) -> tuple[str, str]:
    """The identity of a spec binding: spec name and axis."""
    return binding.spec.name, binding.axis


def bucket_of(thing: str, binding: SpecBinding, buckets: int) -> int:
    """A stable hash bucket of a join key (the same in every process and run, unlike ``hash``)."""
    spec, axis = binding_id(binding)
    return zlib.crc32(f"{thing}\x00{spec}\x00{axis}".encode()) % buckets


def resolver_for(join_specs: Path | None) -> SpecResolver:
    return SpecResolver(load_join_specs(join_specs))


class RecordRouter:
    """The ``mapInArrow`` function: Kafka (value, partition, offset) batches -> routed rows.

    Picklable (holds only the spec path and bucket count); the resolver is built once per worker.
    """

    def __init__(self, join_specs: Path | None, buckets: int) -> None:
        self.join_specs = join_specs
        self.buckets = buckets
        self.reject_bucket = buckets  # one extra bucket, never holding join state
        self._resolver: SpecResolver | None = None

    def __getstate__(self) -> dict:
        return {"join_specs": self.join_specs, "buckets": self.buckets, "reject_bucket": self.reject_bucket,
                "_resolver": None}

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            yield self.route(batch)

    def route(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        if self._resolver is None:
            self._resolver = resolver_for(self.join_specs)
        routes_of = self._resolver.routes
        buckets = self.buckets
        bucket_cache: dict[tuple[str, SpecBinding], int] = {}
        columns: dict[str, list] = {field.name: [] for field in ROUTED_SCHEMA.fields}
        (bucket_column, thing_column, quantity_column, route_column, side_column, time_column, result_column,
         partition_column, offset_column, payload_column, reason_column) = columns.values()
        for payload, partition, offset in zip(batch.column("value").to_pylist(),
                                              batch.column("partition").to_pylist(),
                                              batch.column("offset").to_pylist()):
            try:
                record = decode_record(payload)
                time = float(to_epoch_ms(record["phenomenonTime"]))
                thing, quantity, result = record["thing"], record["quantity"], float(record["result"])
                routes = routes_of(quantity)
            except InvalidRecord as error:
                thing, quantity, result, time = None, None, math.nan, math.nan
                routes = ((None, -1),)
                reason = str(error)
            else:
                reason = None
            for index, (binding, side) in enumerate(routes):
                if binding is None:
                    bucket, index = self.reject_bucket, -1
                else:
                    bucket = bucket_cache.get((thing, binding))
                    if bucket is None:
                        bucket = bucket_cache[(thing, binding)] = bucket_of(thing, binding, buckets)
                bucket_column.append(bucket)
                thing_column.append(thing)
                quantity_column.append(quantity)
                route_column.append(index)
                side_column.append(side)
                time_column.append(time)
                result_column.append(result)
                partition_column.append(partition)
                offset_column.append(offset)
                payload_column.append(payload)
                reason_column.append(reason)
        return pa.RecordBatch.from_arrays([pa.array(values, type=ROUTED_ARROW_SCHEMA.field(name).type)
                                           for name, values in columns.items()], schema=ROUTED_ARROW_SCHEMA)
