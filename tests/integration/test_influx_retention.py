"""The pipeline database's retention policies and history in a real InfluxDB: created with their durations,
left alone when nothing changed and altered when a setting did; the writers' points land in their policy;
the continuous queries exist and their SELECT INTO, run by hand, computes the 1-minute history and the 10-minute
and hourly ones from it, the records per machine of each, and the 10-minute history of the per-machine counters."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from influxdb import InfluxDBClient

from db_connector.writer import InfluxWriter
from pipeline_core.health_metrics import MACHINE_MEASUREMENT, HealthMetrics, health_line
from pipeline_core.influx_retention import (HISTORY_POLICY, RetentionSettings, backfill_history, ensure_retention,
                                            history_query)
from pipeline_core.settings import ConnectionSettings
from support import unique

pytestmark = pytest.mark.integration

SETTINGS = RetentionSettings(influxdb_raw_retention="30d", influxdb_joined_retention="90d",
                             influxdb_health_retention="7d", influxdb_history_retention="104w")
MINUTE_NS = 60 * 10**9


@pytest.fixture
def fresh_database(stack: ConnectionSettings) -> Iterator[tuple[str, InfluxDBClient]]:
    name = unique("retention").replace(".", "_")
    client = InfluxDBClient(stack.influxdb_host, stack.influxdb_port, database=name, timeout=30)
    yield name, client
    client.drop_database(name)


def policies(client: InfluxDBClient, database: str) -> dict[str, tuple[str, bool]]:
    return {row["name"]: (row["duration"], row["default"])
            for row in client.query(f'SHOW RETENTION POLICIES ON "{database}"').get_points()}


def test_policies_are_created_with_their_durations_then_kept_or_altered(fresh_database) -> None:
    database, client = fresh_database
    # Four policies; per measurement (raw quantities, join results) the continuous queries of three tiers; the records
    # per machine of the raw quantities' three; the per-machine counters' 10 minutes.
    assert len(ensure_retention(client, database, SETTINGS)) == 14
    shown = policies(client, database)
    assert shown["raw"] == ("720h0m0s", True)  # the default: a write that names no policy is bounded too
    assert shown["joined"] == ("2160h0m0s", False) and shown["health"] == ("168h0m0s", False)
    assert shown["history"] == ("17472h0m0s", False)
    queries = {name: query for series in client.query("SHOW CONTINUOUS QUERIES").raw["series"]
               if series["name"] == database for name, query in series.get("values", [])}
    assert set(queries) == {f"{measurement}_{tier}" for measurement in ("machinedata", "joined", "machinedata_by_thing")
                            for tier in ("1m", "10m", "1h")} | {"machine_health_10m"}
    assert f"INTO {database}.history.joined_1m FROM {database}.joined.joined" in queries["joined_1m"]
    assert f"INTO {database}.history.joined_10m FROM {database}.history.joined_1m" in queries["joined_10m"]
    assert f"INTO {database}.history.joined_1h FROM {database}.history.joined_10m" in queries["joined_1h"]
    assert (f"INTO {database}.history.machinedata_by_thing_10m FROM {database}.history.machinedata_10m"
            in queries["machinedata_by_thing_10m"])
    assert f"INTO {database}.history.machine_health_10m FROM {database}.health.machine_health" in \
        queries["machine_health_10m"]

    assert ensure_retention(client, database, SETTINGS) == []
    assert ensure_retention(client, database, dataclasses.replace(SETTINGS, influxdb_health_retention="2d")) == [
        "policy health: 168h0m0s -> 2d"]
    assert policies(client, database)["health"] == ("48h0m0s", False)


def test_health_points_land_in_the_health_policy_and_a_missing_policy_is_created(
        fresh_database, stack: ConnectionSettings) -> None:
    database, client = fresh_database
    metrics = HealthMetrics.to_influxdb(dataclasses.replace(stack, influxdb_database=database))
    metrics.record(health_line({"stage": "test", "instance": "a"}, {"lag": 3}, time.time_ns()))
    metrics.close(timeout_s=30)
    assert metrics.written == 1  # into a database that did not exist: made with its policies
    assert [p["lag"] for p in client.query('SELECT "lag" FROM "health"."pipeline_health"').get_points()] == [3]
    assert list(client.query('SELECT "lag" FROM "raw"."pipeline_health"').get_points()) == []


def test_the_history_query_computes_mean_min_max_per_minute_thing_and_quantity(fresh_database) -> None:
    database, client = fresh_database
    ensure_retention(client, database, SETTINGS)
    minute = (time.time_ns() // MINUTE_NS - 5) * MINUTE_NS  # recent: inside the raw policy's 30 days
    client.write_points([{"measurement": "machinedata", "tags": {"thing": "M1", "quantity": "speed"},
                          "time": minute + offset_s * 10**9, "fields": {"result": value}}
                         for offset_s, value in ((0, 1.0), (20, 2.0), (40, 6.0), (60, 10.0))],
                        time_precision="n", retention_policy="raw")
    start = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(minute / 1e9))
    end = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(minute / 1e9 + 120))
    client.write_points([health_line({"stage": "kafka_joiner", "instance": "a", "thing": "M1"},
                                     {"clock_outliers": count, "clock_steps_back": 0}, minute + offset_s * 10**9,
                                     MACHINE_MEASUREMENT) for offset_s, count in ((0, 1), (50, 4))],
                        time_precision="n", retention_policy="health", protocol="line")
    # Two minutes of one thing and quantity; one or two 10-minute and hourly points (the minutes may straddle one);
    # the same again per machine; the counters' one or two 10-minute points.
    assert 2 * (2 + 2) + 1 <= backfill_history(client, database, start, end) <= 2 * (2 + 4) + 2
    rows = list(client.query(f'SELECT * FROM "{HISTORY_POLICY}"."machinedata_1m"', epoch="ns").get_points())
    assert [(row["time"], row["thing"], row["quantity"], row["mean"], row["min"], row["max"], row["sum"],
             row["count"]) for row in rows] == [
        (minute, "M1", "speed", 3.0, 1.0, 6.0, 9.0, 3), (minute + MINUTE_NS, "M1", "speed", 10.0, 10.0, 10.0, 10.0, 1)]
    for tier, size_ns in (("10m", 10 * MINUTE_NS), ("1h", 60 * MINUTE_NS)):
        coarser = list(client.query(f'SELECT * FROM "{HISTORY_POLICY}"."machinedata_{tier}"', epoch="ns").get_points())
        assert {row["time"] for row in coarser} == {minute // size_ns * size_ns,
                                                    (minute + MINUTE_NS) // size_ns * size_ns}, tier
        assert sum(row["count"] for row in coarser) == 4 and sum(row["sum"] for row in coarser) == 19.0, tier
        assert min(row["min"] for row in coarser) == 1.0 and max(row["max"] for row in coarser) == 10.0, tier
        if len(coarser) == 1:  # both minutes in one interval: the mean of all four values
            assert coarser[0]["mean"] == 19.0 / 4, tier
    assert "GROUP BY time(1m)" in history_query(database, "machinedata", "raw")
    # Per machine: every quantity's count added up.
    for tier in ("1m", "10m", "1h"):
        per_machine = list(client.query(f'SELECT * FROM "{HISTORY_POLICY}"."machinedata_by_thing_{tier}"').get_points())
        assert {row["thing"] for row in per_machine} == {"M1"} and sum(row["count"] for row in per_machine) == 4, tier
    # The counters' highest per 10 minutes: their count at its end.
    counters = list(client.query(f'SELECT * FROM "{HISTORY_POLICY}"."machine_health_10m"').get_points())
    assert {(row["thing"], row["stage"], row["instance"]) for row in counters} == {("M1", "kafka_joiner", "a")}
    assert max(row["max_clock_outliers"] for row in counters) == 4
    assert all(row["max_clock_steps_back"] == 0 for row in counters)


def test_a_point_older_than_its_policy_is_refused_not_stored(fresh_database) -> None:
    """What the DB connector meets replaying data older than the raw policy: InfluxDB refuses the point (HTTP
    400), so the connector dead-letters it with InfluxDB's reason instead of losing it silently."""
    database, client = fresh_database
    ensure_retention(client, database, SETTINGS)
    with pytest.raises(Exception, match="beyond retention policy"):
        client.write_points([{"measurement": "machinedata", "tags": {"thing": "M1", "quantity": "speed"},
                              "time": 1554096380468, "fields": {"result": 1.0}}],
                            time_precision="ms", retention_policy="raw")


def test_python_m_stack_influxdb_provisions_any_influxdb(fresh_database, stack: ConnectionSettings) -> None:
    """What Compose's set-up runs: the database's policies from INFLUXDB_*_RETENTION, idempotently."""
    database, client = fresh_database
    env = {**os.environ, "INFLUXDB_DATABASE": database, "INFLUXDB_PORT": str(stack.influxdb_port),
           "INFLUXDB_JOINED_RETENTION": "180d"}
    first = subprocess.run([sys.executable, "-m", "stack", "influxdb"], env=env, capture_output=True, text=True,
                           timeout=60)
    assert first.returncode == 0, first.stderr
    assert "created policy joined (180d)" in first.stdout
    assert policies(client, database)["joined"] == ("4320h0m0s", False)
    again = subprocess.run([sys.executable, "-m", "stack", "influxdb"], env=env, capture_output=True, text=True,
                           timeout=60)
    assert again.stdout.strip() == f"InfluxDB {database}: up to date"


def test_a_backlog_beyond_the_policy_costs_a_request_per_batch_not_two_per_point(fresh_database) -> None:
    """A replay of old data (or a device with a wrong clock): InfluxDB drops every point of a request beyond the
    raw policy and says how many. The writer refuses them all at once instead of splitting the request down to
    single points; a batch that mixes old and fresh points is still split until the fresh ones are stored."""
    database, client = fresh_database
    ensure_retention(client, database, SETTINGS)
    writer = InfluxWriter(client, database, SETTINGS)
    old_ns, fresh_ns = 1554096380468 * 10**6, time.time_ns()
    old = [f"machinedata,quantity=speed,thing=M{n} result=1 {old_ns}" for n in range(1000)]

    rejected = writer.write(old, "raw")
    assert [point.index for point in rejected] == list(range(1000))
    assert "beyond retention policy" in rejected[0].reason
    assert writer.requests == 1

    fresh = [f"machinedata,quantity=speed,thing=F{n} result=2 {fresh_ns}" for n in range(8)]
    rejected = writer.write(old[:8] + fresh, "raw")
    assert [point.index for point in rejected] == list(range(8))
    stored = list(client.query('SELECT count("result") FROM "raw"."machinedata"').get_points())
    assert stored[0]["count"] == 8
