"""Helpers for the simulator and stream-connector tests: the connector as a real subprocess, MQTT
sessions, expected records computed from an events file."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from pipeline_core.kafka_clients import consumer_config
from pipeline_core.logs import READY_MARKER
from pipeline_core.records import record_key
from pipeline_core.settings import ConnectionSettings
from pipeline_core.mqtt import drop_session
from support import unique, wait_for

QUANTITY_EXCLUDED = ("Thing", "Timestamp", "id")


def expected_records(rows: list[dict]) -> list[dict]:
    """One record per (row, quantity): every key of a row except Thing, Timestamp and id; results
    are floats, as the connector writes them."""
    return [{"thing": row["Thing"], "quantity": quantity, "phenomenonTime": row["Timestamp"],
             "result": float(value), "id": row["id"]}
            for row in rows for quantity, value in row.items() if quantity not in QUANTITY_EXCLUDED]


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def topic_size(bootstrap: str, topic: str) -> int:
    """Messages in `topic` (sum of high watermarks): cheap enough to poll."""
    consumer = Consumer(consumer_config(bootstrap, unique("test-size")))
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions)
    finally:
        consumer.close()


@dataclass
class ConnectorProcess:
    """`python -m stream_connector` with its own MQTT topic, client id and Kafka topics."""

    mqtt_topic: str
    client_id: str
    data_topic: str
    dlq_topic: str
    log_path: Path
    extra: list[str] = field(default_factory=list)
    process: subprocess.Popen | None = None
    _log_offset: int = 0

    def start(self) -> ConnectorProcess:
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "stream_connector", "--topic-filters", self.mqtt_topic,
                 "--mqtt-client-id", self.client_id, "--data-topic", self.data_topic,
                 "--dlq-topic", self.dlq_topic, "--progress-interval-s", "1", *self.extra],
                # Health metrics off unless a test asks for them (--health-metrics): they would go to the
                # shared stack's database, which the dashboards show.
                stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1", "HEALTH_METRICS": "false"})
        wait_for(lambda: READY_MARKER in self.log() or self.process.poll() is not None, 30, "connector READY")
        assert self.process.poll() is None, f"connector exited early:\n{self.log()}"
        return self

    def log(self) -> str:
        with open(self.log_path, "rb") as log:
            log.seek(self._log_offset)
            return log.read().decode(errors="replace")

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def terminate(self, deadline_s: float = 60) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(deadline_s)


@pytest.fixture
def connector(stack: ConnectionSettings, new_topics, tmp_path: Path) -> Iterator:
    """Factory: a started connector on fresh topics; killed and its MQTT session removed afterwards."""
    started: list[ConnectorProcess] = []

    def make(*extra: str) -> ConnectorProcess:
        topics = new_topics()
        name = unique("connector").replace(".", "-")
        process = ConnectorProcess(mqtt_topic=f"test/{name}/states", client_id=name, data_topic=topics.data,
                                   dlq_topic=topics.dlq, log_path=tmp_path / f"{name}.log", extra=list(extra))
        started.append(process)
        return process.start()

    yield make
    for process in started:
        process.kill()
        drop_session(stack, process.client_id)


def run_simulator(mqtt_topic: str, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    """`python -m simulator` to completion (the broker comes from the same environment as `stack`)."""
    return subprocess.run([sys.executable, "-m", "simulator", "--mqtt-topic", mqtt_topic, "--no-progress", *args],
                          capture_output=True, text=True, timeout=timeout_s)


def start_simulator(mqtt_topic: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "simulator", "--mqtt-topic", mqtt_topic, "--no-progress", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def by_key(records: list[dict]) -> dict[str, list[dict]]:
    grouped: dict[str, list[dict]] = {}
    for record in records:
        grouped.setdefault(record_key(record["thing"], record["quantity"]), []).append(record)
    return grouped
