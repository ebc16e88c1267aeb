"""Kafka rows -> routed input rows, packed per bucket: validate each record, route it to the join keys
it feeds, and hand the stateful step a few large blobs instead of many rows. Column by column, with no
Python per record.

Runs inside Spark (``mapInArrow``) on the executors, applying the admission rule both joiners share
(``pipeline_core.admission``): a record whose key names a series no join needs is skipped unread; a valid
record under its own key becomes one routed row per (thing, spec binding) it feeds, tagged with its thing's
bucket; any other record becomes one row in the reject bucket with the reason, so the stateful step can
dead-letter it in the same exactly-once transaction as the join results. The job groups records by thing
itself, so it takes any partitioning of the input (the rule's partition step does not apply). Each routed row
carries the partition count its record was placed by (the writer's `PLACEMENT_HEADER`; 0 when it names none):
after the input grew, a thing's records placed by the new count follow those placed by the old one, in another
partition, and the join puts a stream in the order (placement, partition, offset).

The routed rows of one bucket leave the router as one Spark row: the bucket and its rows as an Arrow IPC
record batch. ``transformWithStateInPandas`` turns every input row into a Python tuple and back into a
pandas frame; handing it one row per bucket and Arrow batch, instead of one per record, removes that
per-record cost, and the processor unpacks the columns straight into numpy (:func:`unpack`).
"""
from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import BinaryType, IntegerType, StructField, StructType

from local_stream_buffer.specs import SpecResolver, load_join_specs
from pipeline_core.admission import skips, wrong_key
from pipeline_core.partitioning import PLACEMENT_HEADER, placement_history, thing_partition
from pipeline_core.record_columns import RecordColumns, decode_record_columns, key_column

# Columns the job selects from Spark's Kafka source (`headers` with its option includeHeaders).
KAFKA_COLUMNS = ("key", "value", "partition", "offset", "headers")

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
    pa.field("placement", pa.int32(), nullable=False),  # the partition count it was placed by (0: not named)
    pa.field("payload", pa.binary()),  # the original record, for a dead letter
    pa.field("reason", pa.string()),  # set for records rejected here
    pa.field("key", pa.binary()),  # the record's Kafka key, set for records rejected here (the others' is their own)
])

# What the router hands Spark: one row per bucket and input Arrow batch.
PACKED_SCHEMA = StructType([
    StructField("bucket", IntegerType(), False),
    StructField("rows", BinaryType(), False),  # the bucket's routed rows, an Arrow IPC record batch
])
PACKED_ARROW_SCHEMA = pa.schema([pa.field("bucket", pa.int32(), nullable=False),
                                 pa.field("rows", pa.binary(), nullable=False)])


# Spark hands every task a new router, and a Python worker runs many tasks: what the router looks up per
# distinct spec file, key and thing is kept per worker, so a plant's 100,000 machines are judged once, not
# once per batch.
@functools.lru_cache(maxsize=8)
def worker_resolver(join_specs: Path | None) -> SpecResolver:
    """The spec file's resolver, one per Python worker (and the processor's, read once per worker too)."""
    return SpecResolver(load_join_specs(join_specs))


@functools.lru_cache(maxsize=1 << 18)  # 100,000 machines of two quantities fit
def worker_skips(join_specs: Path | None, key: bytes | None) -> bool:
    """The admission rule's step 1 for a record key under the spec file (`pipeline_core.admission.skips`)."""
    return skips(key, worker_resolver(join_specs).joinable_thing)


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
    """The ``mapInArrow`` function: Kafka (key, value, partition, offset) batches -> packed routed rows.

    Picklable (holds only the spec path and bucket count). Column by column: payloads are decoded by
    ``pipeline_core.record_columns`` (Arrow's JSON reader, ``decode_record`` for what it cannot vouch for),
    and routes and buckets are looked up once per distinct quantity and thing of the batch, not per record.
    """

    def __init__(self, join_specs: Path | None, buckets: int) -> None:
        self.join_specs = join_specs
        self.buckets = buckets
        self.reject_bucket = buckets  # one extra bucket, never holding join state

    def __getstate__(self) -> dict:
        return {"join_specs": self.join_specs, "buckets": self.buckets}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["join_specs"], state["buckets"])

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            if batch.num_rows:
                yield pack(self.route(batch))

    @property
    def resolver(self) -> SpecResolver:
        return worker_resolver(self.join_specs)

    def _read(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The rows of `batch` a join needs to read: those whose key the admission rule skips go (step 1), judged
        once per distinct key."""
        keys = batch.column("key").dictionary_encode()
        skipped = np.array([worker_skips(self.join_specs, key) for key in keys.dictionary.to_pylist()] + [False],
                           dtype=bool)
        codes = keys.indices.fill_null(len(keys.dictionary)).to_numpy(zero_copy_only=False)
        read = ~skipped[codes]
        return batch if read.all() else batch.filter(pa.array(read))

    def route(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """One routed row per (record, join key it feeds), then one per rejected record."""
        batch = self._read(batch)
        records = _under_own_key(decode_record_columns(batch.column("value")), batch.column("key"))
        quantity_codes, quantities = _codes(records.quantity)
        thing_codes, things = _codes(records.thing)
        # Per distinct quantity: how many join keys it feeds, and on which side of each.
        routes = [self.resolver.routes(quantity) for quantity in quantities]
        route_counts = np.array([len(quantity_routes) for quantity_routes in routes], dtype=np.int64)
        width = max(1, int(route_counts.max(initial=0)))
        sides = np.zeros((len(routes), width), dtype=np.int32)
        for code, quantity_routes in enumerate(routes):
            sides[code, :len(quantity_routes)] = [side for _, side in quantity_routes]
        # A thing's keys share its bucket: its partition among `buckets` by the pipeline's one partitioning
        # rule, which is also how the input is partitioned.
        bucket_of_thing = np.array([thing_partition(thing, self.buckets) for thing in things], dtype=np.int32)
        # One routed row per (record, key it feeds): records feeding no key are dropped, as the keyed joiner
        # drops them (unrouted).
        counts = route_counts[quantity_codes] if len(quantity_codes) else np.zeros(0, dtype=np.int64)
        source = np.repeat(np.arange(len(counts)), counts)
        route = (np.arange(len(source)) - np.repeat(np.cumsum(counts) - counts, counts)).astype(np.int32)
        side = sides[quantity_codes[source], route]
        taken = pa.array(source, pa.int64())
        return routed_rows(batch, self.reject_bucket, bucket_of_thing[thing_codes[source]], records.thing.take(taken),
                           records.quantity.take(taken), route, side, records.time[source], records.result[source],
                           records.rows[source], records.rejected, records.reasons)


def routed_rows(batch: pa.RecordBatch, reject_bucket: int, bucket: np.ndarray, thing: pa.Array, quantity: pa.Array,
                route: np.ndarray, side: np.ndarray, time: np.ndarray, result: np.ndarray, rows: np.ndarray,
                rejected: np.ndarray, reasons: list[str]) -> pa.RecordBatch:
    """The routed rows of `batch`: one per (record, join key it feeds), given column by column with each one's
    row in the batch (`rows`), then one per rejected row (`rejected`) in the reject bucket with its reason."""
    invalid = len(rejected)
    nan = np.full(invalid, np.nan)
    taken = pa.array(np.concatenate([rows, np.asarray(rejected, np.int64)]), pa.int64())
    columns = [
        pa.array(np.concatenate([bucket, np.full(invalid, reject_bucket, np.int32)]), pa.int32()),
        pa.concat_arrays([thing, pa.nulls(invalid, pa.string())]),
        pa.concat_arrays([quantity, pa.nulls(invalid, pa.string())]),
        pa.array(np.concatenate([route, np.full(invalid, -1, np.int32)]), pa.int32()),
        pa.array(np.concatenate([side, np.full(invalid, -1, np.int32)]), pa.int32()),
        pa.array(np.concatenate([time, nan])),
        pa.array(np.concatenate([result, nan])),
        batch.column("partition").take(taken).cast(pa.int32()),
        batch.column("offset").take(taken).cast(pa.int64()),
        placements(batch).take(taken),
        batch.column("value").take(taken).cast(pa.binary()),
        pa.concat_arrays([pa.nulls(len(rows), pa.string()), pa.array(reasons, pa.string())]),
        pa.concat_arrays([pa.nulls(len(rows), pa.binary()),
                          batch.column("key").take(pa.array(np.asarray(rejected, np.int64))).cast(pa.binary())]),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ROUTED_ARROW_SCHEMA)


def placements(batch: pa.RecordBatch) -> pa.Array:
    """Per row of a Kafka batch, the partition count its record was placed by (the last count its writer's
    `PLACEMENT_HEADER` names); 0 where it names none (or the batch has no headers). Column by column: the few
    distinct header values are parsed once each."""
    if "headers" not in batch.schema.names:
        return pa.array(np.zeros(batch.num_rows, np.int32))
    headers = batch.column("headers")
    if isinstance(headers, pa.ChunkedArray):
        headers = headers.combine_chunks()
    rows = pc.list_parent_indices(headers).to_numpy(zero_copy_only=False) if len(headers) else np.empty(0, np.int64)
    entries = pc.list_flatten(headers)
    placed = np.zeros(batch.num_rows, np.int32)
    if len(entries):
        named = pc.fill_null(pc.equal(entries.field("key"), PLACEMENT_HEADER), False).to_numpy(zero_copy_only=False)
        values = entries.field("value").filter(pa.array(named)).dictionary_encode()
        counts = np.array([(placement_history([(PLACEMENT_HEADER, value)]) or (0,))[-1]
                           for value in values.dictionary.to_pylist()] + [0], np.int32)
        codes = values.indices.fill_null(len(values.dictionary)).to_numpy(zero_copy_only=False)
        placed[rows[named]] = counts[codes]
    return pa.array(placed)


def _codes(column: pa.Array) -> tuple[np.ndarray, list[str]]:
    """Dictionary codes of a string column and the distinct values they index."""
    encoded = column.dictionary_encode()
    return encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64), encoded.dictionary.to_pylist()


def _under_own_key(records: RecordColumns, keys: pa.Array) -> RecordColumns:
    """`records` with those under a key other than their own moved to the rejected rows, with the admission
    rule's reason (step 3). The keys are compared as one column; reasons are made for the few that differ."""
    if not len(records.rows):
        return records
    own = key_column(records.thing, records.quantity)
    matches = pc.fill_null(pc.equal(own, keys.take(pa.array(records.rows)).cast(pa.binary())), False)
    matches = matches.to_numpy(zero_copy_only=False)
    if matches.all():
        return records
    wrong = np.flatnonzero(~matches)
    reasons = [wrong_key(keys[int(records.rows[row])].as_py(),
                         {"thing": records.thing[int(row)].as_py(), "quantity": records.quantity[int(row)].as_py()})
               for row in wrong]
    keep = pa.array(matches)
    rejected = np.concatenate([records.rejected, records.rows[wrong]])
    return RecordColumns(records.rows[matches], records.thing.filter(keep), records.quantity.filter(keep),
                         records.time[matches], records.result[matches], rejected,
                         [*records.reasons, *reasons])
