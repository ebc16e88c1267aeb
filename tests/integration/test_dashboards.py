"""The Grafana dashboards, tested by what they query: every panel's InfluxQL, with Grafana's macros
and variables filled in, runs against InfluxDB filled by a real replay (and the stages' health points)
and returns data; the health panels add up a stage's processes; and `python -m grafana_report`
(`make report`) renders them to PNG files."""
from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from influxdb import InfluxDBClient

from conftest import EVENTS_FILE
from db_connector_support import (ConnectorProcess, connector_args, distinct_series_times, join_results, key_of,
                                  raw_records, wait_for_count)
from grafana_report.__main__ import data_range
from grafana_report.dashboards import load_dashboards
from grafana_report.macros import TimeRange, query_texts, resolve_variables, substitute
from grafana_report.panels import panel_step_ms, run_panel
from pipeline_core.health_metrics import MACHINE_MEASUREMENT, HealthMetrics, health_line
from pipeline_core.influx import stored_name
from pipeline_core.kafka_clients import admin_client, producer_config
from pipeline_core.records import dead_letter
from pipeline_core.settings import ConnectionSettings
from pipeline_core.topics import MACHINE_DATA, MACHINE_DLQ, MACHINE_OUT, ensure_topics
from stack.clocks import CLOCK_COUNTERS, machine_clock_faults
from support import produce_records, unique, wait_for

pytestmark = pytest.mark.integration

DASHBOARDS = load_dashboards()
HEALTH = next(dashboard for dashboard in DASHBOARDS if dashboard.uid == "pipeline-health")
# Health points of the stages that do not run here, as two Kafka joiner processes and a Spark joiner
# report them: per stage, instance -> fields.
STAGE_POINTS = {
    "stream_connector": {"host-1": {"records_in_per_s": 900.0, "records_out_per_s": 3600.0, "dead_letters_per_s": 0.5,
                                    "lag": 40}},
    "kafka_joiner": {"host-1": {"records_in_per_s": 1000.0, "records_out_per_s": 100.0, "dead_letters_per_s": 0.0,
                                "lag": 120, "records_skipped": 40, "offset_resets": 1},
                     "host-2": {"records_in_per_s": 2000.0, "records_out_per_s": 300.0, "dead_letters_per_s": 1.0,
                                "lag": 30, "records_skipped": 2, "offset_resets": 1, "topics_deleted": 1}},
    "spark_joiner": {"host-3": {"records_in_per_s": 5000.0, "records_out_per_s": 700.0, "dead_letters_per_s": 0.0,
                                "lag": 2500, "batch_seconds": 0.8, "state_rows": 64, "state_bytes": 1_048_576,
                                "disk_used_ratio": 0.97, "disk_free_bytes": 1_000_000}},
}
# The joiners' clock counters per machine (outliers, steps back, jumps ahead), as two Kafka joiner processes report
# them: instance -> machine -> counts. By their sums the Top 5 leave M1 out; "Press 5" and a line feed is a name
# InfluxDB stores escaped.
CLOCK_POINTS = {
    "host-1": {"Plant1.Hall2.Press3": (3, 1, 0), "Press 5\n": (0, 20, 0), "M1": (0, 0, 3), "M2": (0, 0, 4)},
    "host-2": {"Plant1.Hall2.Press3": (2, 0, 1), "M3": (5, 0, 0), "M4": (0, 0, 6)},
}
# The watchdog's restart counts, one series per program (the stack's watchdog writes them).
WATCHDOG_POINTS = {"kafka_joiner": {"lsb-joiner-1": 2, "lsb-joiner-2": 1}, "db_connector": {"db-connector-1": 0}}


@pytest.fixture(scope="module")
def replayed(stack: ConnectionSettings, bootstrap: str, tmp_path_factory) -> Iterator[tuple[str, InfluxDBClient]]:
    """A database of this module filled by the DB connector from the real rows, their joins and a dead letter."""
    suffix = unique("dash").split(".", 1)[1]
    topics = [dataclasses.replace(spec, name=f"{spec.name}.{suffix}") for spec in (MACHINE_DATA, MACHINE_OUT, MACHINE_DLQ)]
    admin = admin_client(bootstrap)
    ensure_topics(admin, tuple(topics))
    names = type("Topics", (), {"data": topics[0].name, "out": topics[1].name, "dlq": topics[2].name})
    database = f"test_dashboards_{suffix}"
    client = InfluxDBClient(stack.influxdb_host, stack.influxdb_port, database=database, timeout=30)
    connector = ConnectorProcess(tmp_path_factory.mktemp("dashboards") / "connector.log",
                                 connector_args(names, database))
    try:
        raw = raw_records(EVENTS_FILE)
        joined = join_results(raw)
        produce_records(bootstrap, names.data, raw, key=key_of)
        produce_records(bootstrap, names.out, joined, key=key_of)
        producer = Producer(producer_config(bootstrap))
        producer.produce(names.data, b'{"thing": "R0815", "quantity": "vaTorque_C11"}')
        # A record a joiner found beyond its spec's max_out_of_orderness, for the late records panel.
        producer.produce(names.dlq, dead_letter(
            "late: t=1554096458070 arrived 2345 ms behind the newest t=1554096460415 of R0815.vaTorque_C11, 345 ms "
            "beyond max_out_of_orderness 2000 ms", b'{"thing":"R0815","quantity":"vaTorque_C11"}', "kafka_joiner"))
        assert producer.flush(30) == 0
        connector.start()
        wait_for_count(client, "machinedata", distinct_series_times(raw))
        wait_for_count(client, "joined", len(joined))
        wait_for_count(client, "deadletters", 2, field="reason")
        # The continuous queries see only the last 10 minutes; the replay's rows are from 2019: `make data`'s last
        # step computes their history.
        caught_up = _history(database)
        assert caught_up.startswith("history: ") and "hours brought up to date" in caught_up, caught_up
        assert _history(database) == "history: up to date"  # nothing left: the hourly counts agree with the raw
        _write_stage_health(stack, database)
        yield database, client
    finally:
        connector.close()
        client.drop_database(database)
        for future in admin.delete_topics([spec.name for spec in topics], operation_timeout=30).values():
            future.result(30)


def _history(database: str) -> str:
    """`python -m grafana_report.history` (the end of `make data`) over the replay's years: what it printed."""
    done = subprocess.run([sys.executable, "-m", "grafana_report.history", "--influxdb-database", database,
                           "--since", "3000d", "--settle-s", "2"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _write_stage_health(stack: ConnectionSettings, database: str) -> None:
    """`STAGE_POINTS` through the stages' own health writer, two intervals (10 s, the panels' minimum)
    back, at one time inside that interval so the panels' buckets hold one point per process."""
    metrics = HealthMetrics.to_influxdb(dataclasses.replace(stack, influxdb_database=database))
    bucket_ns = 10 * 10**9
    at_ns = (time.time_ns() // bucket_ns - 2) * bucket_ns + bucket_ns // 2
    for stage, instances in STAGE_POINTS.items():
        for instance, fields in instances.items():
            metrics.record(health_line({"stage": stage, "instance": instance}, fields, at_ns))
    for instance, machines in CLOCK_POINTS.items():
        for machine, counts in machines.items():
            metrics.record(health_line({"stage": "kafka_joiner", "instance": instance, "thing": stored_name(machine)},
                                       dict(zip(CLOCK_COUNTERS, counts)), at_ns, MACHINE_MEASUREMENT))
    for stage, counts in WATCHDOG_POINTS.items():
        for program, count in counts.items():
            metrics.record(health_line({"stage": stage, "instance": program}, {"watchdog_restarts": count}, at_ns))
    metrics.close(timeout_s=30)
    assert metrics.written == sum(len(points) for points in (*STAGE_POINTS.values(), *WATCHDOG_POINTS.values())) + \
        sum(len(machines) for machines in CLOCK_POINTS.values())


def _query(panel, query: str, time_range: TimeRange, variables: dict[str, str] | None = None) -> str:
    """A panel's query as Grafana sends it over `time_range` (at 1,000 points where the panel sets no maximum)."""
    return substitute(query, time_range, variables or {}, panel_step_ms(panel, time_range, 1000))


def _panel_series(client: InfluxDBClient, title: str) -> dict[str, list[float]]:
    """Label -> values of a health panel's query over its own (live) range, as Grafana runs it."""
    panel = next(panel for panel in HEALTH.panels if panel.title == title)
    (target,) = panel.targets
    query = _query(panel, target.query, TimeRange.last(panel.time_from))
    return {(series.get("tags") or {}).get("stage", series["name"]): [row[1] for row in series["values"]]
            for series in client.query(query).raw.get("series", [])}


def test_the_dashboards_exist() -> None:
    assert {dashboard.uid for dashboard in DASHBOARDS} == {"machine-power", "pipeline-health"}
    titles = {panel.title for dashboard in DASHBOARDS for panel in dashboard.panels}
    assert {"Power per axis and machine", "Duty cycle (ED) per machine", "Load distribution by power level",
            "Records in", "Joins out", "Dead letters", "Lag now, by stage", "Lag by stage",
            "Records in per second, by stage", "Records out per second, by stage",
            "Dead letters per second, by stage", "Spark micro-batch duration", "Spark join state: rows",
            "Spark join state: memory", "Late records", "Disk used where the stages run",
            "Disk free where the stages run", "Power of the Top machines: mean, lowest and highest per axis"} <= titles


def test_the_late_records_panel_counts_the_late_dead_letters_only(replayed) -> None:
    _, client = replayed
    assert _panel_series(client, "Late records") == {"deadletters": [1]}  # not the invalid record's dead letter


def test_the_lag_panels_add_up_the_processes_of_a_stage(replayed) -> None:
    _, client = replayed
    for title in ("Lag now, by stage", "Lag by stage"):
        lags = _panel_series(client, title)
        assert lags["kafka_joiner"][-1] == 150, title  # 120 + 30 from its two processes
        assert lags["spark_joiner"][-1] == 2500 and lags["stream_connector"][-1] == 40, title
    # The DB connector of the replay reports its own, real lag: once it has read everything, none.
    wait_for(lambda: _panel_series(client, "Lag now, by stage").get("db_connector", [None])[-1] == 0, 30,
             "the DB connector's lag of 0 on the lag panel")


def test_the_rate_panels_add_up_the_processes_of_a_stage(replayed) -> None:
    _, client = replayed
    assert _panel_series(client, "Records in per second, by stage")["kafka_joiner"] == [3000.0]
    assert _panel_series(client, "Records out per second, by stage")["spark_joiner"] == [700.0]
    assert _panel_series(client, "Dead letters per second, by stage")["kafka_joiner"] == [1.0]
    assert _panel_series(client, "Spark micro-batch duration")["pipeline_health"] == [0.8]
    assert _panel_series(client, "Spark join state: memory")["pipeline_health"] == [1_048_576]


def test_the_disk_panels_show_the_fullest_disk_of_any_stage(replayed) -> None:
    _, client = replayed
    # The Spark joiner's nearly full disk wins over the DB connector's real one in its interval.
    assert 0.97 in _panel_series(client, "Disk used where the stages run")["pipeline_health"]
    assert 1_000_000 in _panel_series(client, "Disk free where the stages run")["pipeline_health"]


def test_the_loss_panel_adds_up_the_processes_of_a_stage(replayed) -> None:
    _, client = replayed
    panel = next(panel for panel in HEALTH.panels if panel.title == "Lost outside the pipeline's control, by stage")
    last = {}
    for target in panel.targets:
        query = _query(panel, target.query, TimeRange.last(panel.time_from))
        field = re.search(r'last\("(\w+)"\)', target.query).group(1)
        for series in client.query(query).raw.get("series", []):
            last[(series["tags"]["stage"], field)] = series["values"][-1][1]
    assert last[("kafka_joiner", "records_skipped")] == 42  # 40 + 2 from its two processes
    assert last[("kafka_joiner", "offset_resets")] == 2 and last[("kafka_joiner", "topics_deleted")] == 1
    # The replay's DB connector reports its own counters: it lost nothing.
    wait_for(lambda: _panel_last(client, panel, "db_connector") == 0, 30, "the DB connector's 0 on the loss panel")


def test_the_watchdog_panel_adds_up_the_restarts_of_a_stage_s_programs(replayed) -> None:
    _, client = replayed
    restarts = _panel_series(client, "Restarts by the watchdog, by stage")
    assert restarts["kafka_joiner"] == [3] and restarts["db_connector"] == [0]  # 2 + 1 from its two programs


def _panel_last(client: InfluxDBClient, panel, stage: str) -> float | None:
    query = _query(panel, panel.targets[0].query, TimeRange.last(panel.time_from))
    values = [series["values"][-1][1] for series in client.query(query).raw.get("series", [])
              if series["tags"]["stage"] == stage]
    return values[0] if values else None


def test_the_clock_panel_adds_up_a_machine_s_processes_for_the_machines_with_the_most(replayed) -> None:
    """Each machine's counters of its processes added up, by the name it stands for, for the Top 5 by their sum; what
    InfluxDB holds no more of than the five is left out (M1, 3)."""
    _, client = replayed
    panel = next(panel for panel in HEALTH.panels if panel.title == "Clock faults per machine")
    time_range = TimeRange.last("1h")
    variables = resolve_variables(client, HEALTH, time_range, {"top_n": ["5"]})
    assert sorted(variables["clock_top"].options) == sorted(stored_name(name) for name in
                                                            ("Plant1.Hall2.Press3", "Press 5\n", "M2", "M3", "M4"))
    last = {entry.label: entry.values[-1]
            for entry in run_panel(client, panel, time_range, query_texts(HEALTH, variables), 1000)}
    assert last == {"Plant1.Hall2.Press3: outliers": 5, "Plant1.Hall2.Press3: steps back": 1,
                    "Plant1.Hall2.Press3: jumps ahead": 1, "Press 5\n: outliers": 0, "Press 5\n: steps back": 20,
                    "Press 5\n: jumps ahead": 0, "M2: outliers": 0, "M2: steps back": 0, "M2: jumps ahead": 4,
                    "M3: outliers": 5, "M3: steps back": 0, "M3: jumps ahead": 0, "M4: outliers": 0,
                    "M4: steps back": 0, "M4: jumps ahead": 6}
    # `make status`'s line adds up the same points alike.
    assert machine_clock_faults(client)["Plant1.Hall2.Press3"] == {"clock_outliers": 5, "clock_steps_back": 1,
                                                                   "clock_jumps_ahead": 1}


def _reads_health(text: str) -> bool:
    """Whether a query reads what the stages report of themselves now (not the replay's years)."""
    return '"health".' in text


@pytest.mark.parametrize("dashboard", DASHBOARDS, ids=lambda dashboard: dashboard.uid)
def test_every_panel_query_parses_and_returns_data(replayed, dashboard) -> None:
    """Over the replay's twelve days (the hourly history) and its last hours (the 10-minute one): each target
    parses, and each panel's targets together return data (one tier's target at a time is live)."""
    _, client = replayed
    stored = data_range(client)
    assert stored is not None
    for dashboard_range in (stored, TimeRange(stored.end_ms - 12 * 3_600_000, stored.end_ms)):
        variables = resolve_variables(client, dashboard, dashboard_range)
        # Over the last hour of now: a variable and a panel following the dashboard's range that read the stages'
        # health (the clock faults per machine).
        live_texts = query_texts(dashboard, resolve_variables(client, dashboard, TimeRange.last("1h")))
        for variable in dashboard.variables:
            if not _reads_health(variable.query):
                assert variables[variable.name].options, f"template variable ${variable.name} offers no values"
        assert variables["top"].options and set(variables["top"].options) <= set(variables["thing"].options)
        if "axis" in variables:
            assert variables["axis"].options == ("C11",)
        texts = query_texts(dashboard, variables)
        for panel in dashboard.panels:
            # A panel's own range ends now, or (as `make report` draws it) where the report's range ends: the health
            # points and dead letters are of now, the replayed rows of 2019, whose last 10 minutes may hold no join.
            ranges = ([TimeRange.last(panel.time_from), TimeRange.last(panel.time_from, dashboard_range.end_ms),
                       dashboard_range] if panel.time_from else [dashboard_range])
            asked = [(time_range, texts) for time_range in ranges]
            if not panel.time_from and any(_reads_health(target.query) for target in panel.targets):
                asked.append((TimeRange.last("1h"), live_texts))
            returned = []
            for time_range, panel_texts in asked:
                for target in panel.targets:
                    query = _query(panel, target.query, time_range, panel_texts)
                    # A `$` left before a name is a macro or variable Grafana would have replaced (`$/` is a regex
                    # anchor).
                    assert not re.search(r"\$[\w{]|\[\[", query), f"{panel.title}: unsubstituted macro in {query}"
                    returned += [s for s in client.query(query).raw.get("series", []) if s["values"]]
            assert returned, f"{panel.title}: no data over {ranges}"


def test_report_renders_every_dashboard_to_a_png(replayed, tmp_path: Path) -> None:
    database, _ = replayed
    out = tmp_path / "reports"
    done = subprocess.run([sys.executable, "-m", "grafana_report", "--out", str(out),
                           "--influxdb-database", database], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for dashboard in DASHBOARDS:
        png = out / f"{dashboard.uid}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert png.stat().st_size > 20_000, f"{png} looks empty"
