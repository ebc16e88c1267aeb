"""Kafka rows -> routed input rows, packed per bucket: validate each record, route it to the join keys
it feeds, and hand the stateful step a few large blobs instead of many rows.

Runs inside Spark (``mapInArrow``) on the executors. A valid record becomes one routed row per
(thing, spec binding) it feeds, tagged with its thing's bucket; a record that fails validation becomes
one row in the reject bucket with the reason, so the stateful step can dead-letter it in the same
exactly-once transaction as the join results. Records that feed no join spec are dropped here, as the
keyed joiner drops them (unrouted).

The routed rows of one bucket leave the router as one Spark row: the bucket and its rows as an Arrow IPC
record batch. ``transformWithStateInPandas`` turns every input row into a Python tuple and back into a
pandas frame; handing it one row per bucket and Arrow batch, instead of one per record, removes that
per-record cost, and the processor unpacks the columns straight into numpy (:func:`unpack`).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
from pyspark.sql.types import BinaryType, IntegerType, StructField, StructType

from local_stream_buffer.specs import SpecResolver, load_join_specs
from pipeline_core.partitioning import thing_partition
from pipeline_core.records import InvalidRecord, decode_record

# Columns the job selects from Spark's Kafka source.
KAFKA_COLUMNS = ("value", "partition", "offset")

# One routed row: a record (or a rejected payload) on its way to one join key.
ROUTED_ARROW_SCHEMA = pa.schema([
    pa.field("bucket", pa.int32(), nullable=False),
    pa.field("thing", pa.string()),
    pa.field("quantity", pa.string()),
    pa.field("route", pa.int32(), nullable=False),  # index into SpecResolver.routes(quantity); -1 if rejected
    pa.field("side", pa.int32(), nullable=False),  # -1 if rejected
    pa.field("time", pa.float64(), nullable=False),  # epoch ms; NaN if rejected
    pa.field("result", pa.float64(), nullable=False),
    pa.field("partition", pa.int32(), nullable=False),
    pa.field("offset", pa.int64(), nullable=False),
    pa.field("payload", pa.binary()),  # the original record, for a dead letter
    pa.field("reason", pa.string()),  # set for records rejected here
])

# What the router hands Spark: one row per bucket and input Arrow batch.
PACKED_SCHEMA = StructType([
    StructField("bucket", IntegerType(), False),
    StructField("rows", BinaryType(), False),  # the bucket's routed rows, an Arrow IPC record batch
])
PACKED_ARROW_SCHEMA = pa.schema([pa.field("bucket", pa.int32(), nullable=False),
                                 pa.field("rows", pa.binary(), nullable=False)])

# Distinct (thing, quantity) pairs whose routes the router remembers before it starts afresh.
_TARGET_CACHE_SIZE = 200_000
# The routes of this process's routers, per (spec file, bucket count): see RecordRouter.
_WORKER_TARGETS: dict[tuple[Path | None, int], "_TargetCache"] = {}


def resolver_for(join_specs: Path | None) -> SpecResolver:
    return SpecResolver(load_join_specs(join_specs))


def pack(routed: pa.RecordBatch) -> pa.RecordBatch:
    """Routed rows -> one (bucket, Arrow IPC bytes) row per bucket present."""
    buckets = routed.column("bucket").to_numpy()
    order = np.argsort(buckets, kind="stable")
    buckets = buckets[order]
    routed = routed.take(pa.array(order))
    starts = np.flatnonzero(np.diff(buckets, prepend=-1))
    ends = [*starts[1:].tolist(), len(buckets)]
    blobs = [routed.slice(start, end - start).serialize().to_pybytes() for start, end in zip(starts.tolist(), ends)]
    return pa.RecordBatch.from_arrays([pa.array(buckets[starts], pa.int32()), pa.array(blobs, pa.binary())],
                                      schema=PACKED_ARROW_SCHEMA)


def unpack(blobs: Iterable[bytes]) -> pa.Table:
    """The routed rows of packed blobs, as one table."""
    return pa.Table.from_batches([pa.ipc.read_record_batch(pa.py_buffer(blob), ROUTED_ARROW_SCHEMA)
                                  for blob in blobs], schema=ROUTED_ARROW_SCHEMA)


class RecordRouter:
    """The ``mapInArrow`` function: Kafka (value, partition, offset) batches -> packed routed rows.

    Picklable (holds only the spec path and bucket count). Spark unpickles it for every task; the routes it
    has looked up stay with the Python worker process, which Spark reuses across tasks and micro-batches
    (at 10,000 machines every task would otherwise look up 20,000 routes again).
    """

    def __init__(self, join_specs: Path | None, buckets: int) -> None:
        self.join_specs = join_specs
        self.buckets = buckets
        self.reject_bucket = buckets  # one extra bucket, never holding join state
        self._resolver: SpecResolver | None = None
        if (join_specs, buckets) not in _WORKER_TARGETS:
            _WORKER_TARGETS[(join_specs, buckets)] = _TargetCache(self.targets)
        self._targets = _WORKER_TARGETS[(join_specs, buckets)]

    def __getstate__(self) -> dict:
        return {"join_specs": self.join_specs, "buckets": self.buckets, "reject_bucket": self.reject_bucket}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["join_specs"], state["buckets"])

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            if batch.num_rows:
                yield pack(self.route(batch))

    def targets(self, thing: str, quantity: str) -> tuple[tuple[int, int, int], ...]:
        """(bucket, route index, side) of every join key a record of ``thing`` and ``quantity`` feeds."""
        if self._resolver is None:
            self._resolver = resolver_for(self.join_specs)
        # A thing's keys share its bucket: its partition among `buckets` by the pipeline's one partitioning
        # rule, which is also how the input is partitioned.
        bucket = thing_partition(thing, self.buckets)
        return tuple((bucket, index, side) for index, (_, side) in enumerate(self._resolver.routes(quantity)))

    def route(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """One routed row per (record, join key it feeds), then one per rejected record."""
        cache = self._targets
        if len(cache) > _TARGET_CACHE_SIZE:
            cache.clear()
        # Per record only what needs Python: parse and validate, then look up its join keys; one pass each,
        # as comprehensions. The rest is columnar.
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
        times = np.array([record["phenomenonTime"] for record in records], np.float64)  # epoch ms as they are
        results = np.array([record["result"] for record in records], np.float64)
        thing_column, quantity_column = pa.array(things, pa.string()), pa.array(quantities, pa.string())
        if len(flat) != len(records) or () in targets:  # else every record feeds exactly one key
            # Records feeding no join key, or several: one routed row per (record, join key).
            source = np.repeat(np.arange(len(records)), np.fromiter(map(len, targets), np.int64, len(targets)))
            valid_rows, times, results = valid_rows[source], times[source], results[source]
            taken = pa.array(source, pa.int64())
            thing_column, quantity_column = thing_column.take(taken), quantity_column.take(taken)
        bucket, route, side = np.array(flat, np.int32).reshape(-1, 3).T
        valid, invalid = len(flat), len(rejected)
        nan = np.full(invalid, np.nan)
        rows = pa.array(np.concatenate([valid_rows, np.array(rejected, np.int64)]), pa.int64())
        columns = [
            pa.array(np.concatenate([bucket, np.full(invalid, self.reject_bucket, np.int32)]), pa.int32()),
            pa.concat_arrays([thing_column, pa.nulls(invalid, pa.string())]),
            pa.concat_arrays([quantity_column, pa.nulls(invalid, pa.string())]),
            pa.array(np.concatenate([route, np.full(invalid, -1, np.int32)]), pa.int32()),
            pa.array(np.concatenate([side, np.full(invalid, -1, np.int32)]), pa.int32()),
            pa.array(np.concatenate([times, nan])),
            pa.array(np.concatenate([results, nan])),
            batch.column("partition").take(rows).cast(pa.int32()),
            batch.column("offset").take(rows).cast(pa.int64()),
            batch.column("value").take(rows).cast(pa.binary()),
            pa.array([None] * valid + reasons, pa.string()),
        ]
        return pa.RecordBatch.from_arrays(columns, schema=ROUTED_ARROW_SCHEMA)


class _TargetCache(dict):
    """(thing, quantity) -> its routing targets, computed on first use (one dict lookup per record)."""

    def __init__(self, targets: Callable[[str, str], tuple[tuple[int, int, int], ...]]) -> None:
        super().__init__()
        self._compute = targets

    def __missing__(self, key: tuple[str, str]) -> tuple[tuple[int, int, int], ...]:
        value = self[key] = self._compute(*key)
        return value
