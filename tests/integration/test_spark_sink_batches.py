"""The Spark joiner's sink knows its batches: a batch whose records are not tied to input offsets (an idle release
made by a processing-time timer) commits once, however often Spark runs it. Each transaction names its batch and
the checkpoint's query in the committed offsets' metadata; a sink resumed on the same checkpoint skips a batch at
or below the last one named, and one on a new checkpoint (another query) does not."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from confluent_kafka import Producer

from pipeline_core.kafka_clients import producer_config
from spark_joiner.bucket_join import OUT
from spark_joiner.sink import TransactionalBatchSink
from support import read_topic, unique
from test_spark_sink_outage import emitted

pytestmark = pytest.mark.integration


def checkpoint_of(query_id: str, tmp_path: Path) -> str:
    """A checkpoint folder whose query has started (Spark writes its id in `metadata` then)."""
    directory = tmp_path / query_id
    directory.mkdir()
    (directory / "metadata").write_text(json.dumps({"id": query_id}))
    return str(directory)


def test_a_batch_without_new_input_commits_once_per_checkpoint(bootstrap: str, new_topics, tmp_path: Path) -> None:
    topics = new_topics()
    producer = Producer(producer_config(bootstrap))
    for offset in range(10):
        producer.produce(topics.data, f"input {offset}".encode(), partition=0)
    assert producer.flush(30) == 0
    transactional_id = unique("spark-joiner.batches")
    checkpoint = checkpoint_of("query-1", tmp_path)

    def sink_on(checkpoint_dir: str) -> TransactionalBatchSink:
        sink = TransactionalBatchSink(bootstrap, topics.out, topics.dlq, transactional_id)
        sink.resume(topics.data, checkpoint_dir)
        return sink

    first = sink_on(checkpoint)
    try:
        first.write(0, emitted((OUT, "m1.power", b"join of input")), {0: 10})
        first.write(1, emitted((OUT, "m1.power", b"released")), {0: 10})  # no new input: a timer's records
    finally:
        first.close()
    resumed = sink_on(checkpoint)  # the driver restarted; Spark runs batch 1 again (its checkpoint commit was lost)
    try:
        assert resumed.last_batch_committed == 1
        resumed.write(1, emitted((OUT, "m1.power", b"released")), {0: 10})
        resumed.write(2, emitted((OUT, "m1.power", b"released later")), {0: 10})
        assert resumed.counters.skipped_batches == 1 and resumed.counters.batches == 1
    finally:
        resumed.close()
    fresh = sink_on(checkpoint_of("query-2", tmp_path))  # a new checkpoint: its batch ids start again
    try:
        assert fresh.last_batch_committed == -1 and fresh.committed == {0: 10}
    finally:
        fresh.close()
    values = [message.value for message in read_topic(bootstrap, topics.out, expected=3, idle_s=1.0)]
    assert values == [b"join of input", b"released", b"released later"]
