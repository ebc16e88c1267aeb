"""The Spark joiner as a real `python -m spark_joiner` job against real Kafka: machine.out, read with
read_committed, equals the offline engine and the standalone joiner, under local-cluster (executors in
their own JVMs, as on a real cluster) and in local mode through kill -9 of the driver.

Each Spark job start costs a JVM, a session and a first stateful batch, so the tests are few and each
proves several things."""
from __future__ import annotations

import json
import random
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from confluent_kafka import Producer

from conftest import EVENTS_FILE
from kafka_joiner_support import (JoinerProcess, as_multiset, delete_internal_topics, key_of, new_group,
                                  offline_join, rows_as_records)
from spark_support import OUTPUT_DEADLINE_S, SparkJoinerProcess, spark_joiners, worker_daemons  # noqa: F401 (a fixture)
from pipeline_core.kafka_clients import producer_config
from support import produce_records, read_topic, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.spark]

MALFORMED = [b'{"thing": "R0815", "quantity": "actSpeed_C11"', b'{"thing":"R0815","quantity":"actSpeed_C11"}',
             b'{"thing":"R0815","quantity":"actSpeed_C11","phenomenonTime":1554096460415,"result":"fast"}']



def spark_joiner(started: list[SparkJoinerProcess], bootstrap: str, topics, tmp_path: Path,
                 *extra: str) -> SparkJoinerProcess:
    joiner = SparkJoinerProcess(bootstrap, topics, tmp_path / "checkpoint", tmp_path, *extra)
    started.append(joiner)
    return joiner


def produce_raw(bootstrap: str, topic: str, payloads: list[bytes]) -> None:
    producer = Producer(producer_config(bootstrap))
    for payload in payloads:
        producer.produce(topic, payload, key=b"R0815.actSpeed_C11")
    assert producer.flush(30) == 0


def committed_outputs(bootstrap: str, topic: str, expected: int, joiner: SparkJoinerProcess) -> list:
    """Wait for `expected` committed outputs (failing early if the job died), then read on for surplus."""
    wait_for(lambda: joiner.check_alive() or len(read_topic(bootstrap, topic, idle_s=0.3)) >= expected,
             OUTPUT_DEADLINE_S, f"{expected} committed records in {topic}", interval_s=2)
    return read_topic(bootstrap, topic, idle_s=1.5)


def test_local_cluster_replay_equals_offline_engine_and_standalone_joiner(bootstrap, new_topics, spark_joiners,
                                                                         tmp_path) -> None:
    spark_topics, standalone_topics = new_topics(), new_topics()
    # File order: the real rows' out-of-order records must be dead-lettered as the engine rejects them.
    records = rows_as_records(EVENTS_FILE, time_order=False)[:3000]
    expected, rejected = offline_join(records)
    assert expected and rejected
    produce_records(bootstrap, spark_topics.data, records, key=key_of)
    produce_raw(bootstrap, spark_topics.data, MALFORMED)

    joiner = spark_joiner(spark_joiners, bootstrap, spark_topics, tmp_path, "--master", "local-cluster[2,1,1024]",
                          "--driver-memory", "768m").start()
    # The standalone joiner reads the same input topic and writes its own output topics.
    standalone = JoinerProcess(bootstrap, SimpleNamespace(data=spark_topics.data, out=standalone_topics.out,
                                                          dlq=standalone_topics.dlq), new_group(), tmp_path)
    try:
        standalone.start()
        outputs = committed_outputs(bootstrap, spark_topics.out, len(expected), joiner)
        assert as_multiset([m.value for m in outputs]) == as_multiset(expected)
        assert all(m.key.decode() == f"{json.loads(m.value)['thing']}.{json.loads(m.value)['quantity']}"
                   for m in outputs)
        standalone_outputs = read_topic(bootstrap, standalone_topics.out, expected=len(expected),
                                        deadline_s=OUTPUT_DEADLINE_S)
        assert as_multiset([m.value for m in outputs]) == as_multiset([m.value for m in standalone_outputs])
    finally:
        standalone.close()
        delete_internal_topics(bootstrap, [standalone.group_id])

    letters = [json.loads(m.value) for m in read_topic(bootstrap, spark_topics.dlq,
                                                      expected=len(rejected) + len(MALFORMED))]
    assert len(letters) == len(rejected) + len(MALFORMED)
    assert all(letter["reason"] and letter["stage"] == "spark_joiner" for letter in letters)
    assert sorted(letter["payload"].encode() for letter in letters
                  if not letter["reason"].startswith(("out_of_order", "conflict"))) == sorted(MALFORMED)
    assert joiner.terminate() == 0


def test_kill_9_driver_three_times_gives_the_one_shot_output(bootstrap, new_topics, spark_joiners,
                                                              tmp_path) -> None:
    topics = new_topics()
    records = rows_as_records(EVENTS_FILE, time_order=True)[:2400]
    expected, _ = offline_join(records)
    # The replay arrives in thirds, one per run, so every kill lands while input is still to come;
    # small micro-batches make each run span several batches, so the kills land between and inside them.
    thirds = [records[i * len(records) // 3:(i + 1) * len(records) // 3] for i in range(3)]
    joiner = spark_joiner(spark_joiners, bootstrap, topics, tmp_path, "--max-offsets-per-trigger", "250")
    rng = random.Random(42)
    committed = 0
    for third in thirds:
        produce_records(bootstrap, topics.data, third, key=key_of)
        joiner.start()
        # Kill once this run has committed something more, at a random moment after that.
        committed = wait_for(lambda: more_outputs(bootstrap, topics.out, committed, joiner), OUTPUT_DEADLINE_S,
                             "progress before the kill", interval_s=0.5)
        # Both Python steps (the router, the stateful join) have run in this run: their workers came from one daemon.
        assert worker_daemons(joiner.process.pid) == 1
        time.sleep(rng.uniform(0.0, 2.0))  # the random moment of the crash, not a synchronisation
        joiner.kill()
    joiner.start()
    outputs = committed_outputs(bootstrap, topics.out, len(expected), joiner)
    assert as_multiset([m.value for m in outputs]) == as_multiset(expected)
    assert joiner.terminate() == 0


def more_outputs(bootstrap: str, topic: str, than: int, joiner: SparkJoinerProcess) -> int:
    """The committed output count if it grew beyond `than`, else 0."""
    joiner.check_alive()
    count = len(read_topic(bootstrap, topic, idle_s=0.2))
    return count if count > than else 0


def test_a_deleted_checkpoint_and_new_bucket_counts_give_the_one_shot_output(bootstrap, new_topics, spark_joiners,
                                                                             tmp_path) -> None:
    """Half the replay; the checkpoint deleted and the other half, with other bucket and state partition counts
    (what changing them does, `spark_joiner.checkpoint`). The output is the offline join exactly, nothing
    skipped or written twice, dead letters included: the new checkpoint rebuilds the state from the input's
    beginning and drops what the first run had committed."""
    topics = new_topics()
    # File order: its out-of-order records are dead-lettered, which must not come twice either.
    records = rows_as_records(EVENTS_FILE, time_order=False)[:3000]
    expected, rejected = offline_join(records)
    first_half = records[:len(records) // 2]
    expected_first, _ = offline_join(first_half)
    assert 0 < len(expected_first) < len(expected)
    joiner = spark_joiner(spark_joiners, bootstrap, topics, tmp_path)
    produce_records(bootstrap, topics.data, first_half, key=key_of)
    joiner.start()
    outputs = committed_outputs(bootstrap, topics.out, len(expected_first), joiner)
    assert as_multiset([m.value for m in outputs]) == as_multiset(expected_first)
    assert joiner.terminate() == 0
    shutil.rmtree(tmp_path / "checkpoint")

    produce_records(bootstrap, topics.data, records[len(first_half):], key=key_of)
    joiner.command += ["--buckets", "5", "--shuffle-partitions", "3"]
    joiner.start()
    outputs = committed_outputs(bootstrap, topics.out, len(expected), joiner)
    assert as_multiset([m.value for m in outputs]) == as_multiset(expected)
    # In the same transactions as the outputs: all there, each once.
    letters = [json.loads(m.value) for m in read_topic(bootstrap, topics.dlq, idle_s=1.5)]
    assert len(letters) == len({(letter["partition"], letter["offset"]) for letter in letters}) == len(rejected)
    assert "outputs committed up to input offsets {" in joiner.log()  # the restart knew where the outputs ended
    assert joiner.terminate() == 0
