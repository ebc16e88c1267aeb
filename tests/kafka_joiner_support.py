"""Helpers for the Kafka joiner tests: the real rows as machine.data records, the offline join, and the
joiner as a real subprocess."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from local_stream_buffer.keyed import KeyedJoiner
from local_stream_buffer.status import IngestStatus
from pipeline_core.kafka_clients import admin_client
from pipeline_core.records import record_key
from support import Message, read_topic, unique, wait_for

ROW_FIELDS = ("Thing", "Timestamp", "id")


def rows_as_records(path: Path, *, time_order: bool) -> list[dict[str, Any]]:
    """One record per quantity of each row, as the stream connector writes them to machine.data."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if time_order:
        rows.sort(key=lambda row: row["Timestamp"])  # stable: rows with equal times keep file order
    return [
        {"thing": row["Thing"], "quantity": quantity, "phenomenonTime": row["Timestamp"], "result": value,
         "id": row["id"]}
        for row in rows for quantity, value in row.items() if quantity not in ROW_FIELDS
    ]


def key_of(record: dict[str, Any]) -> str:
    return record_key(record["thing"], record["quantity"])


def offline_join(records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The engine's outputs on the records in this order, and the records it rejected."""
    joiner = KeyedJoiner()
    outputs: list[dict[str, Any]] = []
    rejected: list[dict[str, Any]] = []
    for record in records:
        outcome = joiner.ingest(record)
        outputs.extend(outcome.outputs)
        if outcome.status is IngestStatus.REJECTED:
            rejected.append(record)
    return outputs, rejected


def as_multiset(values: list[bytes | dict[str, Any]]) -> Counter[str]:
    """Records compared by content (canonical JSON), duplicates counted."""
    decoded = (json.loads(value) if isinstance(value, bytes) else value for value in values)
    return Counter(json.dumps(record, sort_keys=True) for record in decoded)


def read_outputs(bootstrap: str, topic: str, expected: int, deadline_s: float = 90) -> list[Message]:
    """Wait for `expected` committed outputs, then read on briefly to catch any surplus (duplicates)."""
    read_topic(bootstrap, topic, expected=expected, deadline_s=deadline_s)
    return read_topic(bootstrap, topic, idle_s=1.0, deadline_s=deadline_s)


class JoinerProcess:
    """`python -m kafka_joiner` as a real subprocess, logging to a file."""

    def __init__(self, bootstrap: str, topics: Any, group_id: str, log_dir: Path, instance_id: str | None = None,
                 *extra: str) -> None:
        self.bootstrap = bootstrap
        self.topics = topics
        self.group_id = group_id
        self.instance_id = instance_id
        self.extra = list(extra)
        self.log_dir = log_dir
        self.process: subprocess.Popen | None = None
        self.log_path: Path | None = None
        self.runs = 0
        self.name = unique(instance_id or "joiner")
        self.stopped_by_test = False

    def start(self, wait_ready: bool = True) -> JoinerProcess:
        self.runs += 1
        self.stopped_by_test = False
        self.log_path = self.log_dir / f"{self.name}-{self.runs}.log"
        command = [sys.executable, "-m", "kafka_joiner",
                   "--kafka-bootstrap-servers", self.bootstrap,
                   "--input-topic", self.topics.data, "--output-topic", self.topics.out,
                   "--dlq-topic", self.topics.dlq, "--group-id", self.group_id,
                   "--transactional-id-prefix", self.group_id,
                   "--session-timeout-ms", "6000", "--log-interval-s", "1", *self.extra]
        if self.instance_id:
            command += ["--instance-id", self.instance_id]
        with open(self.log_path, "wb") as log_file:
            self.process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT,
                                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        if wait_ready:
            wait_for(lambda: self._ready(), 60, f"joiner {self.instance_id} to announce READY")
        return self

    def _ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"joiner exited with {self.process.returncode}:\n{self.log()}")
        return "READY" in self.log()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def failed(self) -> bool:
        """True if the process exited with an error that no kill() or terminate() asked for."""
        return (self.process is not None and not self.stopped_by_test
                and self.process.poll() not in (None, 0))

    def kill(self) -> None:
        self.stopped_by_test = True
        if self.alive():
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(30)

    def terminate(self, deadline_s: float = 60) -> int:
        """SIGTERM, and wait for the graceful exit."""
        self.stopped_by_test = True
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(deadline_s)
        return self.process.returncode


def delete_internal_topics(bootstrap: str, group_ids: list[str]) -> None:
    """Delete the joiner's co-partitioned topics of these groups (the test topics go with new_topics)."""
    admin = admin_client(bootstrap)
    names = [name for name in admin.list_topics(timeout=10).topics
             if any(name.startswith(f"{group}.") for group in group_ids)]
    if names:
        for future in admin.delete_topics(names, operation_timeout=30).values():
            future.result(30)


def new_group() -> str:
    return unique("test-joiner")
