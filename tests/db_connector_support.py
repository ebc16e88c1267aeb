"""Helpers for the DB connector's tests: the real rows as records, the connector as a subprocess,
InfluxDB counts, and a private influxd that a test may stop and start."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from influxdb import InfluxDBClient
from influxdb.resultset import ResultSet

from join_reference import reference_join
from pipeline_core import paths
from pipeline_core.health import influxdb_ready
from pipeline_core.influx import shown_name
from pipeline_core.influx_retention import (DATA_MEASUREMENT, DEADLETTER_MEASUREMENT, JOINED_MEASUREMENT,
                                            JOINED_POLICY, RAW_POLICY, RetentionSettings, ensure_retention)
from pipeline_core.kafka_clients import admin_client
from pipeline_core.records import record_key
from pipeline_core.settings import ConnectionSettings, load_settings
from pipeline_core.topics import MACHINE_DATA, MACHINE_DLQ, MACHINE_OUT, ensure_topics
from stack.processes import free_loopback_ports
from stack.services import render
from fault_support import end_process, kill_process, terminate_process
from support import confirm_down, produce_records, unique, wait_for

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
    """machine.out records of `records` in time order, by the join's definition (join_reference)."""
    return reference_join(sorted(records, key=lambda r: (r["phenomenonTime"], r["thing"], r["quantity"])))


def key_of(record: dict[str, Any]) -> str:
    return record_key(record["thing"], record["quantity"])


def distinct_series_times(records: list[dict[str, Any]]) -> int:
    """How many InfluxDB points the raw records make: one per thing, quantity and time."""
    return len({(r["thing"], r["quantity"], r["phenomenonTime"]) for r in records})


# The retention policy the DB connector writes each of its measurements into.
POLICY_OF = {DATA_MEASUREMENT: RAW_POLICY, JOINED_MEASUREMENT: JOINED_POLICY, DEADLETTER_MEASUREMENT: RAW_POLICY}


def count(client: InfluxDBClient, measurement: str, field: str = "result", database: str | None = None) -> int:
    # An explicit time range: InfluxQL's default upper bound is now(), the data lies anywhere.
    points = list(client.query(f'SELECT count("{field}") FROM "{POLICY_OF[measurement]}"."{measurement}" '
                               f"WHERE time > 0 AND time < '2200-01-01T00:00:00Z'", database=database).get_points())
    return int(points[0]["count"]) if points else 0


def wait_for_count(client: InfluxDBClient, measurement: str, expected: int, deadline_s: float = 90,
                   field: str = "result") -> None:
    """Poll until the count equals `expected`; fail on timeout or on overshoot (duplicates)."""
    def reached() -> bool:
        value = count(client, measurement, field)
        assert value <= expected, f"{measurement}: {value} points, more than the {expected} expected"
        return value == expected
    wait_for(reached, deadline_s, f"{expected} points in {measurement}", interval_s=0.3)


# The DB connector's points, as 07_db_connector/README.md and db_connector/points.py's docstring define them,
# written out here again (no code shared with the connector) for the point-by-point checks.
NS_PER_MS = 1_000_000
LEVELS = ("idle", "low", "medium", "high")  # by |result| against DB_CONNECTOR_LEVEL_THRESHOLDS' bounds
DEFAULT_LEVEL_BOUNDS = (100.0, 1000.0, 5000.0)
RawPoint = tuple[str, str, int]  # thing, quantity, time in ns
JoinedPoint = tuple[str, str, str, str, int]  # thing, quantity, case, level, time in ns


def expected_raw_points(records: Iterable[dict[str, Any]]) -> dict[RawPoint, float]:
    """machine.data records as InfluxDB points: one per thing, quantity and time (epoch ms, whole), its result
    as a float. Records met again (a redelivered copy) must carry the same value."""
    points: dict[RawPoint, float] = {}
    for record in records:
        time_ms = record["phenomenonTime"]
        assert float(time_ms).is_integer(), f"a raw time of a fraction of a ms: {record}"
        key = (record["thing"], record["quantity"], int(time_ms) * NS_PER_MS)
        value = float(record["result"])
        assert points.setdefault(key, value) == value, f"two values for one raw point {key}: {points[key]}, {value}"
    return points


def level_of(result: float, bounds: tuple[float, float, float] = DEFAULT_LEVEL_BOUNDS) -> str:
    return next((name for name, bound in zip(LEVELS, bounds) if abs(result) < bound), LEVELS[-1])


def expected_joined_points(records: Iterable[dict[str, Any]],
                           bounds: tuple[float, float, float] = DEFAULT_LEVEL_BOUNDS
                           ) -> dict[JoinedPoint, tuple[float, float]]:
    """machine.out records as InfluxDB points: series by thing, quantity, case and level; time the mean time's
    whole ms, plus (left time - right time) mod 1,000,000 in ns; fields result and active (0.0 when idle)."""
    points: dict[JoinedPoint, tuple[float, float]] = {}
    for record in records:
        result = float(record["result"])
        level = level_of(result, bounds)
        distance_ms = round(record["left"]["phenomenonTime"] - record["right"]["phenomenonTime"])
        time_ns = math.floor(record["phenomenonTime"]) * NS_PER_MS + distance_ms % NS_PER_MS
        key = (record["thing"], record["quantity"], record["case"], level, time_ns)
        value = (result, 0.0 if level == LEVELS[0] else 1.0)
        assert points.setdefault(key, value) == value, f"two values for one joined point {key}"
    return points


def influx_raw_points(client: InfluxDBClient, database: str | None = None) -> dict[RawPoint, Any]:
    """Every point of the raw measurement, in every retention policy (a point in another one counts as well), by
    the names its tags stand for (`shown_name`: a few names are stored escaped)."""
    points: dict[RawPoint, Any] = {}
    for policy in _policies(client, database):
        for point in _select(client, policy, DATA_MEASUREMENT, database):
            key = (shown_name(point["thing"]), shown_name(point["quantity"]), point["time"])
            assert key not in points, f"raw point {key} in two retention policies"
            points[key] = point["result"] if policy == RAW_POLICY else ("in policy", policy, point["result"])
    return points


def influx_joined_points(client: InfluxDBClient, database: str | None = None) -> dict[JoinedPoint, Any]:
    points: dict[JoinedPoint, Any] = {}
    for policy in _policies(client, database):
        for point in _select(client, policy, JOINED_MEASUREMENT, database):
            key = (shown_name(point["thing"]), shown_name(point["quantity"]), point["case"], point["level"],
                   point["time"])
            assert key not in points, f"joined point {key} in two retention policies"
            value = (point["result"], point["active"])
            points[key] = value if policy == JOINED_POLICY else ("in policy", policy, value)
    return points


# For a client that reads points: the InfluxDB client asks for msgpack unless told otherwise, and cannot read a chunked
# answer in it (several msgpack objects in one body: "unpack(b) received extra data", as a chaos run's 300,000 raw
# points gave).
JSON_ANSWERS = {"Accept": "application/json"}


def _policies(client: InfluxDBClient, database: str | None) -> list[str]:
    return [policy["name"] for policy in client.get_list_retention_policies(database)]


def _select(client: InfluxDBClient, policy: str, measurement: str, database: str | None) -> list[dict[str, Any]]:
    # An explicit time range: InfluxQL's default upper bound is now(), the data lies anywhere. Times in ns. Chunked
    # answers are JSON lines only: the client cannot read them in msgpack (`JSON_ANSWERS`).
    chunks = client.query(f'SELECT * FROM "{policy}"."{measurement}" '
                          f"WHERE time > 0 AND time < '2200-01-01T00:00:00Z'", epoch="ns",
                          database=database, chunked=True, chunk_size=50_000)
    # A msgpack answer (a client without JSON_ANSWERS) comes whole, one result set: fine while it is one chunk.
    return [point for chunk in ([chunks] if isinstance(chunks, ResultSet) else chunks) for point in chunk.get_points()]


def point_differences(found: Mapping[Any, Any], expected: Mapping[Any, Any]) -> str:
    """What differs between InfluxDB's points and the expected ones: missing, surplus, other values (a few of
    each); empty when they are equal."""
    missing = [key for key in expected if key not in found]
    surplus = [key for key in found if key not in expected]
    wrong = [(key, found[key], expected[key]) for key in expected if key in found and found[key] != expected[key]]
    parts = [f"{len(items)} {what}, e.g. {items[:3]}" for items, what in
             ((missing, "missing"), (surplus, "that should not be there"), (wrong, "with another value (found, expected)"))
             if items]
    return "; ".join(parts)


def wait_for_points(client: InfluxDBClient, *, raw: Mapping[RawPoint, float] | None = None,
                    joined: Mapping[JoinedPoint, tuple[float, float]] | None = None, deadline_s: float = 90,
                    interval_s: float = 1.0, database: str | None = None) -> None:
    """Poll until InfluxDB holds exactly the expected raw and joined points (each given), tags, times and values;
    fail at the deadline naming what differs, or at once on a point that should not be there (points are never
    deleted: it would stay)."""
    readers = [(influx_raw_points, raw, "raw", DATA_MEASUREMENT), (influx_joined_points, joined, "joined",
                                                                   JOINED_MEASUREMENT)]
    differences: list[str] = []

    def equal() -> bool:
        differences.clear()
        for read, expected, name, measurement in readers:
            if expected is None:
                continue
            # Counting is cheap: the points are read one by one only once there are as many as expected.
            if (points := count(client, measurement, database=database)) < len(expected):
                differences.append(f"{name}: {points} of {len(expected)} points")
                continue
            found = read(client, database)
            surplus = [key for key in found if key not in expected]
            assert not surplus, f"{len(surplus)} {name} points in InfluxDB that no record makes, e.g. {surplus[:3]}"
            if difference := point_differences(found, expected):
                differences.append(f"{name}: {difference}")
        return not differences

    try:
        wait_for(equal, deadline_s, "InfluxDB to hold exactly the expected points", interval_s=interval_s)
    except AssertionError as error:
        raise AssertionError(f"{error}: {'; '.join(differences)}") from None


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

    def kill(self) -> None:
        """kill -9, a fault: confirmed that the connector ran and that the SIGKILL ended it (`fault_support`)."""
        assert self.process is not None, "the DB connector never started: nothing to kill"
        kill_process(self.process, f"DB connector ({self.log_file.name})")

    def terminate(self, deadline_s: float = 60) -> int:
        """SIGTERM to the running connector, and its exit status once it stopped gracefully."""
        assert self.process is not None, "the DB connector never started: nothing to stop"
        return terminate_process(self.process, f"DB connector ({self.log_file.name})", deadline_s)

    def close(self) -> None:
        """Clean-up after the test, no fault: whatever still runs is killed."""
        end_process(self.process)



@dataclasses.dataclass(frozen=True)
class PipelineTopics:
    data: str
    out: str
    dlq: str


def one_batch_waiting(bootstrap: str, suffix: str, database: str, start: Callable[..., ConnectorProcess],
                      records: list[dict[str, Any]], flush_interval_s: float, session_timeout_ms: int,
                      progress_interval_s: float = 1) -> tuple[PipelineTopics, ConnectorProcess]:
    """The pipeline's three topics with `suffix` made on `bootstrap`, `records` in the data topic, and a connector
    (from the `connectors` fixture's `start`) that took them all in one batch, to be written `flush_interval_s`
    after its first record: what a test does to Kafka before then meets the batch's write and commit."""
    topics = PipelineTopics(*(f"{spec.name}.{suffix}" for spec in (MACHINE_DATA, MACHINE_OUT, MACHINE_DLQ)))
    ensure_topics(admin_client(bootstrap), tuple(dataclasses.replace(spec, name=topic) for spec, topic in
                                                 ((MACHINE_DATA, topics.data), (MACHINE_OUT, topics.out),
                                                  (MACHINE_DLQ, topics.dlq))))
    produce_records(bootstrap, topics.data, records, key=key_of)
    connector = start(connector_args(
        topics, database, None, "--kafka-bootstrap-servers", bootstrap, "--batch-size", "1000000",
        "--flush-interval-s", str(flush_interval_s), "--session-timeout-ms", str(session_timeout_ms),
        "--retry-max-s", "1", "--progress-interval-s", str(progress_interval_s)))
    wait_for(lambda: f"records in {len(records):,}" in connector.log(), 30, "the records consumed, in one batch")
    assert "committing offsets" not in connector.log()  # the batch waits for its flush
    return topics, connector

def connector_args(topics: Any, database: str, group: str | None = None, *extra: str) -> list[str]:
    return ["--data-topic", topics.data, "--out-topic", topics.out, "--dlq-topic", topics.dlq,
            "--group-id", group or unique("db-connector-test"), "--influxdb-database", database,
            "--progress-interval-s", "2", *extra]


class PrivateInfluxDB:
    """An influxd of this test only (own ports and data dir), from the stack's config template."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port, rpc_port = free_loopback_ports(2)
        self.config = render(paths.INFLUXDB_GRAFANA_DIR / "influxdb.conf", directory / "influxdb.conf",
                             port=self.port, rpc_port=rpc_port, data_dir=directory / "data",
                             bind_host="127.0.0.1", auth_enabled="false", https_enabled="false",
                             https_certificate="", https_private_key="")
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
        """An outage, a fault: SIGKILL to the running influxd, confirmed by the signal ending it and its port
        closed (`fault_support`). `start` brings it back on the same data."""
        assert self.process is not None, "the private influxd never started: nothing to stop"
        kill_process(self.process, f"private influxd on port {self.port}")
        confirm_down(f"127.0.0.1:{self.port}", "the private influxd")

    def close(self) -> None:
        """Clean-up after the test, no fault: a running influxd is killed."""
        end_process(self.process)

    def client(self, database: str) -> InfluxDBClient:
        return InfluxDBClient("127.0.0.1", self.port, database=database, timeout=10, headers=dict(JSON_ANSWERS))


def chunks(items: list[Any], parts: int) -> Iterator[list[Any]]:
    size = -(-len(items) // parts)
    for start in range(0, len(items), size):
        yield items[start:start + size]


@pytest.fixture
def database(stack: ConnectionSettings, request: pytest.FixtureRequest) -> Iterator[tuple[str, InfluxDBClient]]:
    """A database of this test only on the shared InfluxDB, with the pipeline's retention policies (as the
    stack makes it), dropped afterwards."""
    name = unique(request.node.module.__name__.rpartition(".")[2]).replace(".", "_")
    client = InfluxDBClient(stack.influxdb_host, stack.influxdb_port, database=name, timeout=30,
                            headers=dict(JSON_ANSWERS))
    ensure_retention(client, name, load_settings(RetentionSettings, []))
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
        process.close()
