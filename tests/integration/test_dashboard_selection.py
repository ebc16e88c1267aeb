"""The dashboards' machine selection against a real InfluxDB: the Top machines are the ones with the most power (or
records) over the range, whichever history tier the range reads, with their values; and a machine's name, whatever
its characters, selects exactly that machine."""
from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from influxdb import InfluxDBClient

from db_connector.points import data_point
from grafana_report.dashboards import load_dashboards
from grafana_report.macros import TimeRange, query_texts, regex_value, resolve_variables, substitute
from grafana_report.panels import run_panel
from names_support import names
from pipeline_core.influx import shown_name, stored_name
from pipeline_core.influx_retention import (JOINED_POLICY, RAW_POLICY, backfill_history, ensure_retention,
                                            retention_settings)
from pipeline_core.settings import ConnectionSettings
from support import unique

pytestmark = pytest.mark.integration

DASHBOARDS = {dashboard.uid: dashboard for dashboard in load_dashboards()}
NS_PER_MS = 1_000_000
# Machine -> (its power in W, its raw records): a dozen machines, power and records in different orders.
MACHINES = {f"M{index:02d}": (100.0 * (index + 1), (index * 7) % 12 + 1) for index in range(12)}
RANGES = ("5m", "1h", "24h", "7d")  # raw points, and the 1-minute, 10-minute and hourly history


@pytest.fixture(scope="module")
def plant(stack: ConnectionSettings) -> Iterator[tuple[InfluxDBClient, int]]:
    name = unique("test_selection").replace(".", "_")
    client = InfluxDBClient(stack.influxdb_host, stack.influxdb_port, database=name, timeout=30)
    try:
        ensure_retention(client, name, retention_settings(stack))
        now_ms = int(time.time() * 1000)
        at_ns = (now_ms - 60_000) * NS_PER_MS  # a minute ago: inside every range, the last 5 minutes too
        raw, joined = [], []
        for thing, (watts, records) in MACHINES.items():
            joined.append(f"joined,case=both,level=low,quantity=vaPower_C11,thing={thing} result={watts},active=1.0 "
                          f"{at_ns}")
            raw += [f"machinedata,quantity=actSpeed_C11,thing={thing} result=1.0 {at_ns + index}"
                    for index in range(records)]
        assert client.write_points(raw, time_precision="n", retention_policy=RAW_POLICY, protocol="line")
        assert client.write_points(joined, time_precision="n", retention_policy=JOINED_POLICY, protocol="line")
        start = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now_ms / 1000 - 3600))
        end = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now_ms / 1000 + 60))
        assert backfill_history(client, name, start, end) > 0
        yield client, now_ms
    finally:
        client.drop_database(name)


def _panel(uid: str, title: str):
    return next(panel for panel in DASHBOARDS[uid].panels if panel.title == title)


@pytest.mark.parametrize("window", RANGES)
def test_the_top_machines_have_the_most_power_or_records(plant, window: str) -> None:
    client, now_ms = plant
    time_range = TimeRange.last(window, now_ms + 5_000)
    power = DASHBOARDS["machine-power"]
    variables = resolve_variables(client, power, time_range, {"top_n": ["5"]})
    strongest = sorted(MACHINES, key=lambda thing: -MACHINES[thing][0])[:5]
    assert set(variables["top"].options) == set(strongest)
    series = run_panel(client, _panel("machine-power", "Power per axis and machine"), time_range,
                       query_texts(power, variables), 1000)
    assert [entry.label for entry in series] == [f"{thing} vaPower_C11" for thing in strongest]  # largest first
    assert [entry.values for entry in series] == [[MACHINES[thing][0]] for thing in strongest]

    health = DASHBOARDS["pipeline-health"]
    variables = resolve_variables(client, health, time_range, {"top_n": ["5"]})
    busiest = sorted(MACHINES, key=lambda thing: -MACHINES[thing][1])[:5]
    assert set(variables["top"].options) == set(busiest)
    series = run_panel(client, _panel("pipeline-health", "Records in per machine, per second"), time_range,
                       query_texts(health, variables), 1000)
    totals = {entry.label: sum(entry.values) for entry in series}
    # Rates per second of their intervals: over the range they add up to the records over the interval's length.
    interval_s = 1.0 if window == "5m" else {"1h": 60.0, "24h": 600.0, "7d": 3600.0}[window]
    assert [entry.label for entry in series] == busiest  # largest first
    for thing in busiest:
        assert totals[thing] * interval_s == pytest.approx(MACHINES[thing][1])


@settings(max_examples=25)
@given(things=st.lists(names(max_size=12), min_size=2, max_size=6, unique=True))
def test_a_name_selects_exactly_its_machine(stack: ConnectionSettings, things: list[str]) -> None:
    """Names of any characters, written in the DB connector's own point format: the Machine variable set to one of
    them, as InfluxDB gives it back (`stored_name`), selects that one alone; set to several, those alone."""
    database = unique("test_names").replace(".", "_")
    client = InfluxDBClient(stack.influxdb_host, stack.influxdb_port, database=database, timeout=30)
    try:
        client.create_database(database)
        now_ms = int(time.time() * 1000)
        lines = [data_point("machinedata", {"thing": name, "quantity": "actSpeed_C11", "phenomenonTime": now_ms,
                                            "result": float(index)})  # type: ignore[arg-type]
                 for index, name in enumerate(things)]
        assert client.write_points(lines, time_precision="n", protocol="line")
        time_range = TimeRange(now_ms - 60_000, now_ms + 60_000)
        query = 'SELECT count("result") FROM "machinedata" WHERE "thing" =~ /^$thing$/ AND $timeFilter GROUP BY "thing"'
        for picked in ([things[0]], things[1:]):
            text = substitute(query, time_range, {"thing": regex_value([stored_name(name) for name in picked])},
                              step_ms=1000)
            found = {series["tags"]["thing"] for series in client.query(text).raw.get("series", [])}
            assert {shown_name(tag) for tag in found} == set(picked), text
    finally:
        client.drop_database(database)
