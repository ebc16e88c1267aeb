"""The stages' health metrics in a real InfluxDB: each stage's `pipeline_health` points with its lag appear
while it runs, an InfluxDB outage only defers them, and SIGTERM still ends the stage cleanly."""
from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from influxdb import InfluxDBClient

from conftest import EVENTS_FILE
from connector_support import connector, expected_records, read_rows, run_simulator, topic_size  # noqa: F401
from db_connector_support import (ConnectorProcess, PrivateInfluxDB, connector_args, count, distinct_series_times,
                                  key_of, raw_records, wait_for_count, database)  # noqa: F401 (a fixture)
from kafka_joiner_support import JoinerProcess, delete_internal_topics, new_group, offline_join, rows_as_records
from pipeline_core.broker_offsets import BrokerOffsets
from stack.processes import free_loopback_ports
from spark_joiner.progress import LATEST_OFFSETS_TIMEOUT_S
from spark_support import OUTPUT_DEADLINE_S, SparkJoinerProcess
from support import produce_records, wait_for

pytestmark = pytest.mark.integration


def health_points(client: InfluxDBClient, stage: str) -> list[dict[str, Any]]:
    """The stage's points, oldest first, times in ns."""
    return list(client.query(f"SELECT * FROM \"health\".\"pipeline_health\" WHERE \"stage\" = '{stage}'",
                             epoch="ns").get_points())



@pytest.fixture
def db_connector(tmp_path: Path) -> Iterator[Callable[..., ConnectorProcess]]:
    started: list[ConnectorProcess] = []

    def start(args: list[str]) -> ConnectorProcess:
        process = ConnectorProcess(tmp_path / "db_connector.log", args)
        started.append(process)
        return process.start()

    yield start
    for process in started:
        process.close()


def test_the_db_connector_reports_its_lag_through_an_influxdb_outage(bootstrap, new_topics, db_connector, tmp_path):
    """A private influxd (the shared one serves other tests) is stopped while records keep coming: the lag the
    connector measures meanwhile reaches InfluxDB once it is back, and the connector never stopped."""
    raw = raw_records(EVENTS_FILE)
    half = len(raw) // 2
    topics = new_topics()
    influxd = PrivateInfluxDB(tmp_path / "influxd").start()
    try:
        client = influxd.client("machinedata")
        produce_records(bootstrap, topics.data, raw[:half], key=key_of)
        connector = db_connector(connector_args(topics, "machinedata", None, "--influxdb-port", str(influxd.port),
                                                "--batch-size", "100", "--retry-max-s", "1",
                                                "--progress-interval-s", "1"))
        wait_for(lambda: [p for p in health_points(client, "db_connector") if p.get("lag") is not None], 60,
                 "the connector's first health point with its lag")

        influxd.stop()
        stopped_ns = time.time_ns()
        produce_records(bootstrap, topics.data, raw[half:], key=key_of)

        def lag_reported_while_down() -> bool:
            after_warning = connector.log().partition("unreachable")[2]
            return bool(re.search(r"lag [1-9]", after_warning))

        wait_for(lag_reported_while_down, 60, "a progress line with a lag, its health point deferred")
        wait_for(lambda: connector.log().count("retrying") >= 3, 60, "the connector retrying its batch")
        assert connector.alive(), connector.log()

        influxd.start()
        restarted_ns = time.time_ns()
        wait_for_count(client, "machinedata", distinct_series_times(raw))

        def deferred() -> list[dict[str, Any]]:
            return [p for p in health_points(client, "db_connector")
                    if stopped_ns < p["time"] < restarted_ns and p.get("lag")]

        lagging = wait_for(deferred, 90, "points measured during the outage, with the lag then")
        assert all(point["lag"] <= len(raw) - point["records_in"] for point in lagging)
        # Caught up: nothing left to read, and all of it taken in. The lag alone reaches 0 earlier: what the paused
        # consumer had handed out during the outage is read, and waits in the connector's hands (its pending).
        def caught_up() -> dict | None:
            latest = health_points(client, "db_connector")[-1]
            return latest if latest["lag"] == 0 and latest["records_in"] == len(raw) else None

        latest = wait_for(caught_up, 60, "a lag of 0 with every record taken in")
        assert latest["instance"] and latest["influxdb_retries"] >= 3

        assert connector.terminate() == 0, connector.log()
        assert "SIGTERM: finishing what is in flight" in connector.log()
        assert count(client, "machinedata") == distinct_series_times(raw)
    finally:
        influxd.close()


def test_the_spark_joiner_s_input_lag_asks_the_broker_for_the_latest_offsets(bootstrap, new_topics):
    topics = new_topics()
    records = rows_as_records(EVENTS_FILE, time_order=True)[:1000]
    produce_records(bootstrap, topics.data, records, key=key_of, by_thing=True)
    partitions = [(topics.data, partition) for partition in range(5)]
    # A report whose request outlives its 2 s gives an unknown lag (a loaded machine's first request, which looks
    # up the partitions' leaders, can): the next report asks again, as this does.
    latest_offsets = BrokerOffsets(bootstrap, LATEST_OFFSETS_TIMEOUT_S).latest
    latest = wait_for(lambda: latest_offsets(partitions), 60, "the broker's latest offsets", interval_s=0.5)
    assert set(latest) == set(partitions) and sum(latest.values()) == len(records)
    # No broker there: the lag is unknown, after the report's timeout rather than never.
    assert BrokerOffsets(f"127.0.0.1:{free_loopback_ports(1)[0]}", timeout_s=1.0).latest(partitions) is None


@pytest.mark.spark
def test_the_spark_joiner_reports_rows_batches_state_and_input_lag(bootstrap, new_topics, database, tmp_path):
    """A backlog read 250 records per micro-batch: the input lag is above 0 while it lasts, then 0."""
    name, client = database
    topics = new_topics()
    records = rows_as_records(EVENTS_FILE, time_order=True)[:3000]
    produce_records(bootstrap, topics.data, records, key=key_of)
    joiner = SparkJoinerProcess(bootstrap, topics, tmp_path / "checkpoint", tmp_path, "--max-offsets-per-trigger",
                                "250", "--progress-interval-s", "1", "--health-metrics", "--influxdb-database", name)
    try:
        joiner.start()

        def caught_up() -> bool:
            joiner.check_alive()
            points = health_points(client, "spark_joiner")
            return bool(points) and points[-1]["records_in"] == len(records) and points[-1]["lag"] == 0

        wait_for(caught_up, OUTPUT_DEADLINE_S, "the joiner's health points up to the whole backlog", interval_s=1)
        points = health_points(client, "spark_joiner")
        # Twelve batches, each at least a 0.2 s trigger apart, cannot all end within one 1 s report.
        assert any(point["lag"] for point in points), points
        assert max(point["batch_seconds"] or 0 for point in points) > 0
        assert points[-1]["state_bytes"] > 0 and points[-1]["state_rows"] >= 1
        assert points[-1]["records_out"] > 0 and points[-1]["batches"] >= 12
        assert joiner.terminate() == 0, joiner.log()[-3000:]
        assert "SIGTERM: finishing what is in flight" in joiner.log()
    finally:
        joiner.close()


def test_the_stream_connector_reports_its_rows_in_flight(connector, database, bootstrap):
    name, client = database
    bridge = connector("--health-metrics", "--influxdb-database", name)
    simulated = run_simulator(bridge.mqtt_topic, "--events-file", str(EVENTS_FILE), "--order", "file", "--limit", "300")
    assert simulated.returncode == 0, simulated.stdout + simulated.stderr
    records = len(expected_records(read_rows(EVENTS_FILE)[:300]))

    def everything_acknowledged() -> bool:
        points = health_points(client, "stream_connector")
        return bool(points) and points[-1]["records_in"] == 300 and points[-1]["lag"] == 0

    wait_for(everything_acknowledged, 60, "a health point with every row read and acknowledged")
    latest = health_points(client, "stream_connector")[-1]
    assert (latest["records_out"], latest["acked"], latest["dead_letters"]) == (records, 300, 0)
    assert all(point["lag"] is not None for point in health_points(client, "stream_connector"))
    assert bridge.terminate() == 0, bridge.log()


def test_an_unreachable_influxdb_never_stops_the_stream_connector(connector, bootstrap):
    (nowhere,) = free_loopback_ports(1)  # nothing listens there
    bridge = connector("--health-metrics", "--influxdb-port", str(nowhere))
    simulated = run_simulator(bridge.mqtt_topic, "--events-file", str(EVENTS_FILE), "--order", "file", "--limit", "300")
    assert simulated.returncode == 0, simulated.stdout + simulated.stderr
    records = len(expected_records(read_rows(EVENTS_FILE)[:300]))
    wait_for(lambda: topic_size(bootstrap, bridge.data_topic) >= records, 60, "the records of all 300 rows")
    wait_for(lambda: "unreachable" in bridge.log(), 30, "the health metrics' warning")
    assert bridge.terminate() == 0, bridge.log()
    log = bridge.log()
    assert f"127.0.0.1:{nowhere}/machinedata unreachable" in log and log.count("unreachable") == 1
    assert "stopped cleanly: rows 300," in log and "health points not written" in log
    assert topic_size(bootstrap, bridge.data_topic) == records


def test_the_kafka_joiner_reports_its_lag_state_and_commit_latency(bootstrap, new_topics, database, tmp_path):
    """A backlog produced before the joiner starts: its points show the lag, then every record joined."""
    name, client = database
    topics = new_topics()
    records = rows_as_records(EVENTS_FILE, time_order=True)
    expected, _ = offline_join(records)
    produce_records(bootstrap, topics.data, records, key=key_of, by_thing=True)
    joiner = JoinerProcess(bootstrap, topics, new_group(), tmp_path, None, "--input-partitioned-by-thing",
                           "--health-metrics", "--influxdb-database", name)
    try:
        joiner.start()

        def everything_joined() -> bool:
            assert not joiner.failed(), joiner.log()
            points = health_points(client, "kafka_joiner")
            return (bool(points) and points[-1]["records_in"] == len(records) and points[-1]["lag"] == 0
                    and points[-1]["records_out"] == len(expected))

        wait_for(everything_joined, 120, "a health point with every record joined and no lag", interval_s=0.5)
        points = health_points(client, "kafka_joiner")
        assert all(point["lag"] is not None for point in points if point["records_in"])
        joined = [point for point in points if point["records_out_per_s"]]
        assert joined and all(point["commit_latency_p99_ms"] >= point["commit_latency_p50_ms"] >= 0
                              for point in joined)
        assert points[-1]["transactions"] > 0 and points[-1]["held_records"] >= 0
        assert joiner.terminate() == 0, joiner.log()
        assert "SIGTERM: finishing what is in flight" in joiner.log()
    finally:
        joiner.close()
        delete_internal_topics(bootstrap, [joiner.group_id])
