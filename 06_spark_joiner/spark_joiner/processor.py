"""The join inside Spark's keyed state: one group per bucket, the engine's keyed batch join within it.

Spark calls the processor once per bucket that has input in a micro-batch (``transformWithStateInPandas``
keyed by bucket). The bucket's state holds each join key's engine state as bytes (and when it last had a
record), in chunks of keys by thing: a micro-batch reads and writes only the chunks it has rows for.
Grouping many machines into one bucket, and many keys into one chunk, is what keeps 100,000 machines fast:
Spark's per-group cost is paid per bucket, and its per-call state cost per chunk, not per machine. A bucket
holds at most ``max_join_keys`` keys; beyond, the least recently used are evicted and what they held is
dead-lettered (``local_stream_buffer.eviction``, the standalone joiner's rule).

The join itself is the engine's (``local_stream_buffer.keyed_batch``): it puts each stream back into Kafka
offset order (the rows went through a shuffle), rejects what breaks a stream's order, and joins. Its
result depends only on each stream's order, so it equals the standalone joiner's, pair for pair. This
module only turns Spark's rows into the engine's arrays, and the engine's pairs and verdicts into Kafka
records.

A join spec's idle release (``idle_release_s``) runs on Spark's processing-time timers: a bucket whose keys took
rows gets a timer (one at a time) at the batch's processing time plus the release; when it fires, every key of
the bucket whose stream had no rows for its release gives up what its reorder buffer holds
(``local_stream_buffer.reorder.release_idle_side``), and the next timer is set for the earliest stream still
buffering. The processing time is the micro-batch's, which Spark keeps in its offset log: a batch run again
after a crash releases the same streams.

Input before the sink's committed position (`sink`) has its outputs in Kafka already: a batch replayed
after a crash, or the input a new checkpoint reads from the beginning. Its rows are joined first, in a
call of their own whose outputs are dropped, to rebuild the state; the rest is joined on from there. A
key's records all lie in one partition, and the pairs the join has made certain after a prefix of its
streams do not depend on how the prefix was batched (without forcing), so the outputs kept are exactly
those the committed ones lacked.

This module holds only what Spark unpickles and asks before any row arrives: the processor and its state
schemas. The work is in ``bucket_join``, imported with the first rows a processor is handed. Spark also
unpickles the processor on the driver, in a Python process of its own, only to learn its state schemas
while it plans a query's first micro-batch; there the work's imports (pandas, pyarrow, the engine: 0.7 s of
a cold start on this machine) held up every start and restart of the job. The worker daemon imports
``bucket_join`` before it forks the workers (``worker_daemon``), so a task finds it loaded.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import BinaryType, IntegerType, LongType, StructField, StructType

from .settings import DEFAULT_MAX_JOIN_KEYS_PER_BUCKET

if TYPE_CHECKING:
    import pandas as pd

    from .bucket_join import BucketJoin

# What the processor emits: per bucket and micro-batch one row, its encoded Kafka records for machine.out
# and machine.dlq as an Arrow IPC record batch (``bucket_join.EMITTED_ARROW_SCHEMA``). One row per record
# would cost the JVM a conversion per record twice (into Spark rows, and into Arrow again for the sink).
OUTPUT_SCHEMA = StructType([StructField("records", BinaryType(), False)])
# The bucket's state (``state_layout``): its join keys in chunks, and how many keys it holds, so the bound is
# checked without reading them all.
CHUNK_KEY_SCHEMA = StructType([StructField("chunk", IntegerType(), False)])
CHUNK_SCHEMA = StructType([StructField("keys", BinaryType(), False)])  # bucket_join.CHUNK_ARROW_SCHEMA's IPC bytes
KEY_COUNT_SCHEMA = StructType([StructField("keys", LongType(), False)])


class BucketJoinProcessor(StatefulProcessor):
    """Joins every key of one bucket with the engine's keyed batch join (``bucket_join.BucketJoin``)."""

    def __init__(self, join_specs: Path | None, input_topic: str, max_pending_per_side: int,
                 committed: Mapping[int, int] | None = None,
                 max_join_keys: int | None = DEFAULT_MAX_JOIN_KEYS_PER_BUCKET,
                 spec_starts: Mapping[int, Mapping[str, int]] | None = None) -> None:
        self.join_specs = join_specs
        self.input_topic = input_topic
        self.max_pending_per_side = max_pending_per_side
        # Per input partition, the offset below which the outputs are committed (the sink's, at query start).
        self.committed = dict(committed or {})
        self.max_join_keys = max_join_keys
        # Per input partition, where each join spec started (by fingerprint): a spec added on a running stack joins
        # the records from there on only (pipeline_core.spec_starts).
        self.spec_starts = {partition: dict(starts) for partition, starts in (spec_starts or {}).items()}

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.chunks = handle.getMapState("join_chunks", CHUNK_KEY_SCHEMA, CHUNK_SCHEMA)
        self.key_count = handle.getValueState("key_count", KEY_COUNT_SCHEMA)
        self._bucket: BucketJoin | None = None

    @property
    def bucket(self) -> BucketJoin:
        """The bucket's join, set up with the first rows or timer (see the module doc)."""
        if self._bucket is None:
            from .bucket_join import BucketJoin  # not at module level: see the module doc
            self._bucket = BucketJoin(self.handle, self.chunks, self.key_count, self.join_specs, self.input_topic,
                                      self.max_pending_per_side, self.committed, self.max_join_keys, self.spec_starts)
        return self._bucket

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        return self.bucket.input_rows(rows, int(timerValues.getCurrentProcessingTimeInMs()))

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:
        return self.bucket.expired_timer(int(timerValues.getCurrentProcessingTimeInMs()))

    def close(self) -> None:
        pass
