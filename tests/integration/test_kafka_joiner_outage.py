"""Kafka stopped under the standalone joiner in the middle of a transaction, and started again: the joiner's
commit waits for it without hanging (its heartbeat says stuck, not stale: the loop still turns), then resumes,
and the output is exactly the offline join.

The joiner used to block inside `send_offsets_to_transaction`, which librdkafka waits on without bound while
the group coordinator is away (librdkafka issues 5456 and 5511): on the cluster, with two of three nodes
stopped and started again, it never returned. Here, with one broker, it returned once the broker was back;
meanwhile the joiner wrote no heartbeat.

The test stops and starts Kafka, so it runs a Kafka of its own (ports from CLUSTER_TEST_PORTS when set, state
folder of its own, started and stopped through `stack.manager`), never the shared one.
"""
from __future__ import annotations

import dataclasses
import json
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaException

from conftest import EVENTS_FILE
from fault_support import stop_server
from kafka_joiner_support import as_multiset, key_of, offline_join, read_outputs, rows_as_records
from kafka_joiner.service import KafkaJoiner
from kafka_joiner.settings import KafkaJoinerSettings
from pipeline_core.kafka_clients import admin_client
from pipeline_core.lifecycle import StopSignal
from pipeline_core.stage_health import assess, read_heartbeat
from pipeline_core.topics import MACHINE_DATA, MACHINE_DLQ, MACHINE_OUT, ensure_topics
from stack import manager
from stack.services import Kafka
from support import produce_records, read_topic

pytestmark = pytest.mark.integration


def test_kafka_stopped_mid_transaction_the_joiner_waits_then_resumes_exactly(private_kafka: str,
                                                                             tmp_path: Path) -> None:
    bootstrap = private_kafka
    data, out, dlq = (dataclasses.replace(spec, name=f"{spec.name}.outage")
                      for spec in (MACHINE_DATA, MACHINE_OUT, MACHINE_DLQ))
    ensure_topics(admin_client(bootstrap), (data, out, dlq))
    records = rows_as_records(EVENTS_FILE, time_order=True)
    expected, _ = offline_join(records)
    produce_records(bootstrap, data.name, records, key=key_of, by_thing=True)
    progress_file = tmp_path / "progress.json"
    settings = KafkaJoinerSettings(
        kafka_bootstrap_servers=bootstrap, input_topic=data.name, output_topic=out.name, dlq_topic=dlq.name,
        group_id="outage", transactional_id_prefix="outage", instance_id="outage", input_partitioned_by_thing=True,
        progress_interval_s=1.0, progress_file=progress_file, health_metrics=False)
    stop = StopSignal()
    joiner = KafkaJoiner(settings, stop)
    joiner.start()

    # Kafka goes away while the open transaction holds outputs: stopped from inside the joiner's loop.
    stopped = threading.Event()
    frame_of = joiner._frames._frame_of

    def stop_kafka_midway(message):
        transaction = joiner._transaction
        # Not waiting for an earlier commit: on a quiet machine the whole backlog can go in one transaction.
        if not stopped.is_set() and transaction.open and transaction.append_times:
            stop_server(Kafka(), bootstrap, "Kafka")
            stopped.set()
        return frame_of(message)

    joiner._frames._frame_of = stop_kafka_midway
    failure: list[BaseException] = []
    restarts: list[str] = []

    def run() -> None:
        """The joiner, restarted as supervision does should it exit with a Kafka error."""
        instance = joiner
        try:
            while True:
                try:
                    instance.run()
                    return
                except KafkaException as error:
                    restarts.append(str(error))
                instance = KafkaJoiner(settings, stop)
                instance.start()
        except BaseException as error:  # noqa: BLE001 - reported by the test's thread
            failure.append(error)

    runner = threading.Thread(target=run, name="joiner", daemon=True)
    runner.start()

    def health() -> str:
        assert not failure, failure
        return assess(read_heartbeat(progress_file), time.time()).state

    try:
        assert stopped.wait(120), f"the joiner never held outputs in an open transaction: {failure}"
        # The commit cannot go through: the loop still turns and says so (it used to hang: stale).
        wait_for_state(health, {"stuck"}, 60, "the joiner's heartbeat to say stuck while Kafka is away")
        assert "kafka" in manager.up([Kafka()])

        outputs = read_outputs(bootstrap, out.name, len(expected), deadline_s=180)
        assert as_multiset([m.value for m in outputs]) == as_multiset(expected)  # nothing lost, nothing twice
        dead_letters = [json.loads(m.value) for m in read_topic(bootstrap, dlq.name, idle_s=0.5)]
        assert dead_letters == []
        wait_for_state(health, {"progressing", "idle"}, 60, "the joiner healthy again")
    finally:
        stop.set()
        runner.join(120)
    assert not runner.is_alive(), "the joiner did not stop"
    assert not failure, failure


def wait_for_state(health, states: set[str], deadline_s: float, what: str) -> None:
    """Poll the heartbeat's verdict until it is one of `states`; fail with the last verdict at the deadline."""
    end = time.monotonic() + deadline_s
    seen = []
    while time.monotonic() < end:
        state = health()
        if not seen or seen[-1] != state:
            seen.append(state)
        if state in states:
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}: verdicts seen {seen}")
