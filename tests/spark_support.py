"""Helpers for the Spark joiner tests: the job as a real subprocess, routed rows for the processor."""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from spark_joiner.parse import RecordRouter
from pipeline_core.records import InvalidRecord, decode_record, encode_record, record_key
from chaos_support import command_line, descendants
from stack.processes import parent_pid
from fault_support import end_process, kill_process, terminate_process
from support import wait_for

# Spark on two shared cores: a JVM start, a session and the first stateful batch take a while.
START_DEADLINE_S = 240
OUTPUT_DEADLINE_S = 400


class SparkJoinerProcess:
    """`python -m spark_joiner` as a real subprocess (own process group, so a kill takes its JVM too)."""

    def __init__(self, bootstrap: str, topics: Any, checkpoint: Path, log_dir: Path, *extra: str) -> None:
        self.command = [sys.executable, "-m", "spark_joiner", "--kafka-bootstrap-servers", bootstrap,
                        "--input-topic", topics.data, "--output-topic", topics.out, "--dlq-topic", topics.dlq,
                        "--checkpoint-dir", str(checkpoint), "--master", "local[2]",
                        "--shuffle-partitions", "2", "--buckets", "8", "--trigger-s", "0.2",
                        "--progress-interval-s", "2", *extra]
        self.log_dir = log_dir
        self.process: subprocess.Popen | None = None
        self.log_path: Path | None = None
        self.runs = 0

    def start(self) -> SparkJoinerProcess:
        self.runs += 1
        self.log_path = self.log_dir / f"spark-joiner-{self.runs}.log"
        with open(self.log_path, "wb") as log_file:
            # Health metrics off unless a test asks for them (--health-metrics): they would go to the shared
            # stack's database, which the dashboards show. Temporary files beside the log, as the stack keeps a
            # stage's under its state: a killed driver cannot remove its own, and pytest rotates these folders.
            self.process = subprocess.Popen(self.command, stdout=log_file, stderr=subprocess.STDOUT,
                                            env={**os.environ, "PYTHONUNBUFFERED": "1", "HEALTH_METRICS": "false",
                                                 "TMPDIR": str(self.log_dir)},
                                            start_new_session=True)
        wait_for(self._ready, START_DEADLINE_S, "the Spark joiner to announce READY", interval_s=0.5)
        return self

    def _ready(self) -> bool:
        self.check_alive()
        return "READY" in self.log()

    def check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None and self.process.returncode != 0:
            raise AssertionError(f"spark joiner exited with {self.process.returncode}:\n{self.log()[-5000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL the driver and everything it started (the JVM, Python workers): a machine crash, a fault,
        confirmed: the driver ran, the SIGKILL ended it, and nothing of its process group is left (`fault_support`)."""
        assert self.process is not None, "the Spark joiner never started: nothing to kill"
        kill_process(self.process, f"Spark joiner (run {self.runs})", group=True)

    def terminate(self, deadline_s: float = 120) -> int:
        """SIGTERM to the running driver, and its exit status once it stopped gracefully."""
        assert self.process is not None, "the Spark joiner never started: nothing to stop"
        return terminate_process(self.process, f"Spark joiner (run {self.runs})", deadline_s)

    def close(self) -> None:
        """Clean-up after the test, no fault: whatever still runs of its process group is killed."""
        end_process(self.process, group=True)


def worker_daemons(ancestor_pid: int) -> int:
    """How many Python worker daemons run below `ancestor_pid` (a joiner's process, a session's JVM): processes
    running the daemon module whose parent does not (a daemon's forked workers run the same command line)."""
    running = {pid for pid in descendants(ancestor_pid) if "spark_joiner.worker_daemon" in command_line(pid)}
    return sum(1 for pid in running if parent_pid(pid) not in running)


def kafka_batch(payloads: list[bytes | None], first_offset: int = 0) -> pa.RecordBatch:
    """Payloads as the job reads them from Kafka partition 0 in this order, from `first_offset` on: each under
    its own key as the stream connector writes it (`record_key`), or without a key if it is no record."""
    return pa.RecordBatch.from_pydict({
        "key": pa.array([own_key(payload) for payload in payloads], pa.binary()),
        "value": pa.array(payloads, pa.binary()),
        "partition": pa.array([0] * len(payloads), pa.int32()),
        "offset": pa.array(range(first_offset, first_offset + len(payloads)), pa.int64()),
    })


def own_key(payload: bytes | None) -> bytes | None:
    try:
        record = decode_record(payload)
    except InvalidRecord:
        return None
    return record_key(record["thing"], record["quantity"]).encode()


def routed_rows(records: list[dict[str, Any]], buckets: int = 8, raw: list[bytes] = ()) -> pa.RecordBatch:
    """The router's output for records (and raw payloads) as if read from Kafka partition 0 in this order."""
    return RecordRouter(None, buckets).route(kafka_batch([encode_record(record) for record in records] + list(raw)))


@pytest.fixture
def spark_joiners() -> Iterator[list[SparkJoinerProcess]]:
    """The Spark joiner processes a test starts; every one is killed at its end."""
    started: list[SparkJoinerProcess] = []
    yield started
    for joiner in started:
        joiner.close()
