"""The stages' health metrics in a real InfluxDB: each stage's `pipeline_health` points with its lag appear
while it runs, an InfluxDB outage only defers them, and SIGTERM still ends the stage cleanly."""
from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from influxdb import InfluxDBClient

from conftest import EVENTS_FILE
from db_connector_support import (ConnectorProcess, PrivateInfluxDB, connector_args, count, distinct_series_times,
                                  key_of, raw_records, wait_for_count)
from support import produce_records, wait_for

pytestmark = pytest.mark.integration


def health_points(client: InfluxDBClient, stage: str) -> list[dict[str, Any]]:
    """The stage's points, oldest first, times in ns."""
    return list(client.query(f"SELECT * FROM \"pipeline_health\" WHERE \"stage\" = '{stage}'",
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
        process.kill()


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
        wait_for(lambda: [p for p in health_points(client, "db_connector") if p["lag"] is not None], 60,
                 "the connector's first health point with its lag")

        influxd.stop()
        stopped_ns = time.time_ns()
        produce_records(bootstrap, topics.data, raw[half:], key=key_of)
        wait_for(lambda: "health metrics" in connector.log() and "unreachable" in connector.log(), 60,
                 "the health metrics deferred")
        wait_for(lambda: connector.log().count("retrying") >= 3, 60, "the connector retrying its batch")
        assert connector.alive(), connector.log()

        influxd.start()
        restarted_ns = time.time_ns()
        wait_for_count(client, "machinedata", distinct_series_times(raw))

        def deferred() -> list[dict[str, Any]]:
            return [p for p in health_points(client, "db_connector")
                    if stopped_ns < p["time"] < restarted_ns and p["lag"]]

        lagging = wait_for(deferred, 90, "points measured during the outage, with the lag then")
        assert all(point["lag"] <= len(raw) - point["records_in"] for point in lagging)
        wait_for(lambda: health_points(client, "db_connector")[-1]["lag"] == 0, 30, "a lag of 0 once caught up")
        latest = health_points(client, "db_connector")[-1]
        assert latest["records_in"] == len(raw) and latest["instance"] and latest["influxdb_retries"] >= 3

        assert connector.kill(signal.SIGTERM) == 0, connector.log()
        assert "SIGTERM: finishing what is in flight" in connector.log()
        assert count(client, "machinedata") == distinct_series_times(raw)
    finally:
        influxd.stop()
