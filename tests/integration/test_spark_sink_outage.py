"""Kafka away under the Spark joiner's sink for longer than its transaction timeout and its start-up deadline.

Spark runs the sink on a thread of Py4J's callback server. A `SystemExit` raised there (the start-up deadline's
`KafkaStartupError`, once raised while the sink replaced its producer inside a batch) ended that thread alone,
and the query waited for its answer for ever: the Spark joiner stopped for good after a Kafka outage of minutes.
Here a batch that meets Kafka away fails with an ordinary exception, which Spark turns into a failed query, and
lets go of its producer; `resume()`, which the job's main thread calls to restart the query, waits for Kafka up
to the start-up deadline and then raises in that thread; once Kafka is back it fences the old producer and the
batch commits once.

The test stops and starts Kafka, so it runs a Kafka of its own (`private_kafka`), never the shared one.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from fault_support import stop_server
from pipeline_core.kafka_clients import (KafkaStartupError, admin_client, consumer_config, producer_config,
                                         raise_partition_errors, retry_transient, transactional_producer_config)
from pipeline_core.topics import MACHINE_DATA, MACHINE_DLQ, MACHINE_OUT, ensure_topics
from spark_joiner.bucket_join import DLQ, EMITTED_ARROW_SCHEMA, OUT
from spark_joiner.sink import TransactionalBatchSink
from stack import manager
from stack.processes import port_is_free
from stack.services import Kafka
from support import read_topic, unique, wait_for

pytestmark = pytest.mark.integration

TRANSACTION_TIMEOUT_S = 3.0
STARTUP_DEADLINE_S = 4.0


def emitted(*records: tuple[int, str, bytes]) -> pa.Table:
    """A batch's processor rows: (kind, key, value) each."""
    kinds, keys, values = zip(*records)
    return pa.table({"kind": pa.array(kinds, pa.int8()), "key": list(keys), "value": list(values)},
                    schema=EMITTED_ARROW_SCHEMA)


def coordinators_ready(bootstrap: str, transactional_id: str, topic: str) -> None:
    """Return once both coordinators of the sink answer: the transactional id's, whose producer the sink's init
    fences, and its group's, which holds its input offsets. A just started Kafka answers NOT_COORDINATOR while it
    creates or loads __transaction_state and __consumer_offsets, and CONCURRENT_TRANSACTIONS while it aborts the
    transaction a stop cut short; on a loaded machine for longer than the sink's short deadline here."""
    ready = Producer(transactional_producer_config(bootstrap, transactional_id))
    retry_transient(lambda: ready.init_transactions(10), deadline_s=180, what="the transaction coordinator")
    group = Consumer(consumer_config(bootstrap, transactional_id))
    try:
        retry_transient(lambda: raise_partition_errors(group.committed([TopicPartition(topic, 0)], timeout=10)),
                        deadline_s=180, what="the group coordinator")
    finally:
        group.close()


def test_a_batch_meeting_kafka_away_fails_plainly_and_the_restarted_query_commits_it_once(
        private_kafka: str, tmp_path: Path) -> None:
    bootstrap = private_kafka
    port = int(bootstrap.rsplit(":", 1)[1])
    data, out, dlq = (dataclasses.replace(spec, name=f"{spec.name}.sink-outage")
                      for spec in (MACHINE_DATA, MACHINE_OUT, MACHINE_DLQ))
    ensure_topics(admin_client(bootstrap), (data, out, dlq))
    # The input the batches cover: offsets 0-19 of its partition 0 (what they hold does not matter to the sink).
    producer = Producer(producer_config(bootstrap))
    for offset in range(20):
        producer.produce(data.name, f"input {offset}".encode(), partition=0)
    assert producer.flush(30) == 0
    transactional_id = unique("spark-joiner.outage")
    coordinators_ready(bootstrap, transactional_id, data.name)
    sink = TransactionalBatchSink(bootstrap, out.name, dlq.name, transactional_id,
                                  startup_deadline_s=STARTUP_DEADLINE_S, transaction_timeout_s=TRANSACTION_TIMEOUT_S)
    reports: list[str | None] = []
    sink.while_waiting = lambda: reports.append(sink.waiting_for)
    try:
        assert sink.resume(data.name, str(tmp_path / "checkpoint")) == {}
        sink.write(0, emitted((OUT, "m1.power", b"join 1"), (DLQ, None, b"letter 1")), {0: 10})

        stop_server(Kafka(), bootstrap, "Kafka")
        with pytest.raises(Exception) as failed:  # noqa: PT011 - any ordinary exception; a SystemExit fails here
            sink.write(1, emitted((OUT, "m1.power", b"join 2")), {0: 20})
        assert sink.producer is None, f"the producer of a failed transaction was kept ({failed.value!r})"
        assert sink.counters.batches == 1
        # Spark runs the batch again only in a restarted query; without resume() it fails plainly again.
        with pytest.raises(RuntimeError, match="resume"):
            sink.write(1, emitted((OUT, "m1.power", b"join 2")), {0: 20})

        # The restarted query's resume() on the job's main thread: it waits for Kafka, saying so, and past
        # the start-up deadline raises where the process may end.
        with pytest.raises(KafkaStartupError):
            sink.resume(data.name, str(tmp_path / "checkpoint"))
        assert "Kafka" in reports, "the heartbeat was not told that the sink waits for Kafka"

        manager.up([Kafka()])
        wait_for(lambda: not port_is_free(port), 60, "Kafka listening again")
        coordinators_ready(bootstrap, transactional_id, data.name)  # as a supervisor restarts the job until then
        assert sink.resume(data.name, str(tmp_path / "checkpoint")) == {0: 10}
        assert sink.producer is not None and sink.waiting_for is None
        sink.write(1, emitted((OUT, "m1.power", b"join 2")), {0: 20})
    finally:
        sink.close()

    assert [message.value for message in read_topic(bootstrap, out.name, expected=2, deadline_s=60)] == \
        [b"join 1", b"join 2"]
    assert [message.value for message in read_topic(bootstrap, dlq.name, expected=1, deadline_s=60)] == [b"letter 1"]
    # Kafka holds the input position with the outputs: a successor of the sink reads it there.
    successor = TransactionalBatchSink(bootstrap, out.name, dlq.name, transactional_id)
    try:
        assert successor.resume(data.name, str(tmp_path / "checkpoint")) == {0: 20}
    finally:
        successor.close()
