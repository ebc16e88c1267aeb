"""Helpers for the simulator and stream-connector tests: the connector as a real subprocess, MQTT
sessions, expected records computed from an events file."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from pipeline_core.kafka_clients import consumer_config
from pipeline_core.logs import READY_MARKER
from pipeline_core.records import record_key
from pipeline_core.settings import ConnectionSettings
from pipeline_core.mqtt import drop_session
from fault_support import end_process, kill_process, terminate_process
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


# Topics whose records `topic_size` counted lately, each with its reader, which reads on from where it was.
_COUNTERS: OrderedDict[tuple[str, str], _RecordCounter] = OrderedDict()
_COUNTERS_KEPT = 16
# How long one count may read before it answers what it has (a lower bound while records keep coming).
COUNT_READ_S = 10.0


class _RecordCounter:
    """The records a read_committed reader sees in a topic. Offsets are no count: the stream connector's start-up
    fence takes two of every partition (an aborted record and its marker), transactions their markers."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = Consumer(consumer_config(bootstrap, unique("test-size"), **{"enable.auto.commit": False}))
        partitions = self.consumer.list_topics(topic, timeout=10).topics[topic].partitions
        self.assigned = [TopicPartition(topic, p) for p in partitions]
        self.consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        self.records = 0

    def count(self) -> int:
        """Reads on up to where every partition ended when asked (or for COUNT_READ_S at most): records written
        meanwhile are counted by the next call."""
        ends = [self.consumer.get_watermark_offsets(partition, timeout=10) for partition in self.assigned]
        deadline = time.monotonic() + COUNT_READ_S
        while True:
            self.records += sum(message.error() is None for message in self.consumer.consume(10_000, 0.05))
            positions = self.consumer.position(self.assigned)
            if all(low == high or position.offset >= high for position, (low, high) in zip(positions, ends)):
                return self.records
            if time.monotonic() > deadline:
                return self.records

    def close(self) -> None:
        self.consumer.close()


def close_record_counters() -> None:
    """Close the readers `topic_size` kept (before the servers stop, which they would keep asking for)."""
    while _COUNTERS:
        _COUNTERS.popitem()[1].close()


def topic_size(bootstrap: str, topic: str) -> int:
    """Records in `topic` as a read_committed reader sees them; cheap enough to poll (each call reads only what
    came since the last one)."""
    key = (bootstrap, topic)
    counter = _COUNTERS.pop(key, None) or _RecordCounter(bootstrap, topic)
    _COUNTERS[key] = counter
    while len(_COUNTERS) > _COUNTERS_KEPT:
        _COUNTERS.popitem(last=False)[1].close()
    return counter.count()


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
        """kill -9, a fault: confirmed that the connector ran and that the SIGKILL ended it (`fault_support`)."""
        assert self.process is not None, f"connector {self.client_id} never started: nothing to kill"
        kill_process(self.process, f"stream connector {self.client_id}")

    def terminate(self, deadline_s: float = 60) -> int:
        """SIGTERM to the running connector, and its exit status once it stopped gracefully."""
        assert self.process is not None, f"connector {self.client_id} never started: nothing to stop"
        return terminate_process(self.process, f"stream connector {self.client_id}", deadline_s)

    def close(self) -> None:
        """Clean-up after the test, no fault: whatever still runs is killed."""
        end_process(self.process)


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
        process.close()
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
