"""Helpers for the DB connector's tests: the real rows as records, the connector as a subprocess,
InfluxDB counts, and a private influxd that a test may stop and start."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from influxdb import InfluxDBClient

from local_stream_buffer.keyed import KeyedJoiner
from pipeline_core import paths
from pipeline_core.health import influxdb_ready
from pipeline_core.records import record_key
from pipeline_core.settings import ConnectionSettings
from stack.services import render
from support import unique, wait_for

ROW_FIELDS = ("Thing", "Timestamp", "id")


def raw_records(events_file: Path) -> list[dict[str, Any]]:
    """machine.data records of the event rows: one per quantity of each row, as the stream connector makes."""
    records = []
    for line in events_file.read_text().splitlines():
        row = json.loads(line)
        for quantity, value in row.items():
            if quantity not in ROW_FIELDS:
                records.append({"thing": row["Thing"], "quantity": quantity, "phenomenonTime": row["Timestamp"],
                                "result": value, "id": row["id"]})
    return records


def join_results(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """machine.out records of `records`, computed offline with the engine's keyed joiner (time order)."""
    joiner = KeyedJoiner()
    results = []
    for record in sorted(records, key=lambda r: (r["phenomenonTime"], r["thing"], r["quantity"])):
        results.extend(joiner.ingest(record).outputs)
    return results


def key_of(record: dict[str, Any]) -> str:
    return record_key(record["thing"], record["quantity"])


def distinct_series_times(records: list[dict[str, Any]]) -> int:
    """How many InfluxDB points the raw records make: one per thing, quantity and time."""
    return len({(r["thing"], r["quantity"], r["phenomenonTime"]) for r in records})


def count(client: InfluxDBClient, measurement: str, field: str = "result") -> int:
    # An explicit time range: InfluxQL's default upper bound is now(), the data lies anywhere.
    points = list(client.query(f'SELECT count("{field}") FROM "{measurement}" '
                               f"WHERE time > 0 AND time < '2200-01-01T00:00:00Z'").get_points())
    return int(points[0]["count"]) if points else 0


def wait_for_count(client: InfluxDBClient, measurement: str, expected: int, deadline_s: float = 90,
                   field: str = "result") -> None:
    """Poll until the count equals `expected`; fail on timeout or on overshoot (duplicates)."""
    def reached() -> bool:
        value = count(client, measurement, field)
        assert value <= expected, f"{measurement}: {value} points, more than the {expected} expected"
        return value == expected
    wait_for(reached, deadline_s, f"{expected} points in {measurement}", interval_s=0.3)


class ConnectorProcess:
    """`python -m db_connector` with test-specific topics, group and database, logging to a file."""

    def __init__(self, log_file: Path, args: list[str], env: dict[str, str] | None = None) -> None:
        self.log_file = log_file
        self.args = args
        self.env = {**os.environ, **(env or {})}
        self.process: subprocess.Popen | None = None

    def start(self) -> ConnectorProcess:
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("a") as log:
            log.write("--- test: starting\n")
            log.flush()
            self.process = subprocess.Popen([sys.executable, "-m", "db_connector", *self.args],
                                            stdout=log, stderr=subprocess.STDOUT, env=self.env)
        wait_for(lambda: self._latest_log().count("READY") or self._exited(), 60, "the connector's READY line")
        assert self.process.poll() is None, f"db_connector exited:\n{self.log()}"
        return self

    def _exited(self) -> bool:
        return self.process is not None and self.process.poll() is not None

    def _latest_log(self) -> str:
        return self.log().rsplit("--- test: starting", 1)[-1]

    def log(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(30)


def connector_args(topics: Any, database: str, group: str | None = None, *extra: str) -> list[str]:
    return ["--data-topic", topics.data, "--out-topic", topics.out, "--dlq-topic", topics.dlq,
            "--group-id", group or unique("db-connector-test"), "--influxdb-database", database,
            "--progress-interval-s", "2", *extra]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class PrivateInfluxDB:
    """An influxd of this test only (own ports and data dir), from the stack's config template."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        self.config = render(paths.INFLUXDB_GRAFANA_DIR / "influxdb.conf", directory / "influxdb.conf",
                             port=self.port, rpc_port=free_port(), data_dir=directory / "data",
                             auth_enabled="false")
        self.process: subprocess.Popen | None = None

    def start(self) -> PrivateInfluxDB:
        with (self.directory / "influxd.log").open("a") as log:
            self.process = subprocess.Popen(["/usr/bin/influxd", "-config", str(self.config)],
                                            stdout=log, stderr=subprocess.STDOUT)
        wait_for(self.ready, 60, f"private influxd on port {self.port}", interval_s=0.1)
        return self

    def ready(self) -> bool:
        assert self.process is not None and self.process.poll() is None, "private influxd exited"
        return influxdb_ready(self.port)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)

    def client(self, database: str) -> InfluxDBClient:
        return InfluxDBClient("127.0.0.1", self.port, database=database, timeout=10)


def chunks(items: list[Any], parts: int) -> Iterator[list[Any]]:
    size = -(-len(items) // parts)
    for start in range(0, len(items), size):
        yield items[start:start + size]


@pytest.fixture
def database(stack: ConnectionSettings, request: pytest.FixtureRequest) -> Iterator[tuple[str, InfluxDBClient]]:
    """A database of this test only on the shared InfluxDB, dropped afterwards."""
    name = unique(request.node.module.__name__.rpartition(".")[2]).replace(".", "_")
    client = InfluxDBClient(stack.influxdb_host, stack.influxdb_port, database=name, timeout=30)
    client.create_database(name)
    yield name, client
    client.drop_database(name)


@pytest.fixture
def connectors(tmp_path: Path) -> Iterator[Callable[..., ConnectorProcess]]:
    """Starts connector subprocesses; every one is killed at the end of the test."""
    started: list[ConnectorProcess] = []

    def start(args: list[str], name: str = "connector") -> ConnectorProcess:
        process = ConnectorProcess(tmp_path / f"{name}.log", args)
        started.append(process)
        return process.start()

    yield start
    for process in started:
        process.kill()
