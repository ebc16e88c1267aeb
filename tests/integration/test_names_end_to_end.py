"""Machines named as plants name them (`names_support.PLANT_NAMES`: ISA-95 paths, Windows paths, a CSV's stray tab
and line breaks, NUL, MQTT wildcards, quotes, line-protocol specials, non-ASCII, the longest name) through the
whole pipeline with each joiner: simulator -> Mosquitto (a topic per machine, the fallback topic for a Thing the
broker refuses in a topic) -> stream connector -> machine.data -> the standalone joiner and the Spark joiner ->
their machine.out -> a DB connector each -> InfluxDB -> the dashboards' queries and `make report`.

Checked against what shares no code with the stages: the records are the rows' own (one per quantity), the keys
the documented escape, the joins `join_reference`'s, and InfluxDB's points read back by value under each exact
name (or, for the few names InfluxDB cannot carry as they are, under their documented escape)."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from influxdb import InfluxDBClient

from connector_support import ConnectorProcess, run_simulator
from db_connector_support import (JSON_ANSWERS, ConnectorProcess as DbConnectorProcess, connector_args,
                                  expected_joined_points, expected_raw_points, wait_for_points)
from grafana_report.dashboards import DASHBOARDS_DIR, load_dashboards
from grafana_report.macros import TimeRange, query_texts, regex_value, resolve_variables
from grafana_report.panels import run_panel
from join_reference import reference_join
from kafka_joiner_support import JoinerProcess, as_multiset, delete_internal_topics, new_group
from names_support import PLANT_NAMES
from pipeline_core.influx_retention import RetentionSettings, ensure_retention
from pipeline_core.mqtt import drop_session
from pipeline_core.settings import load_settings
from spark_support import OUTPUT_DEADLINE_S, SparkJoinerProcess
from support import read_topic, unique

pytestmark = [pytest.mark.integration, pytest.mark.spark]

TICKS = 6
STEP_MS = 400  # within a join's delta_time of 1 s: every row pairs with its neighbours
ODD_QUANTITY = "Temp.°C \\\t"  # no join's: a raw point of its own, under a name with a dot, a backslash, a tab
QUANTITIES = ("actSpeed_C11", "vaTorque_C11", ODD_QUANTITY)


def plant_rows(start_ms: int) -> list[dict]:
    """TICKS rows per machine, all machines' rows of one tick before the next tick's, each machine in time order."""
    rows = []
    for tick in range(TICKS):
        for index, thing in enumerate(PLANT_NAMES):
            rows.append({"Thing": thing, "Timestamp": start_ms + tick * STEP_MS + index, "id": f"{index}/{tick}",
                         "actSpeed_C11": 100.0 + 10 * index + tick, "vaTorque_C11": 2.0 + tick / 4,
                         ODD_QUANTITY: 20.5 + index})
    return rows


def records_of(rows: list[dict]) -> list[dict]:
    """machine.data's records of the rows: one per quantity (as 03_stream_connector/README.md defines them)."""
    return [{"thing": row["Thing"], "quantity": quantity, "phenomenonTime": row["Timestamp"],
             "result": float(row[quantity]), "id": row["id"]} for row in rows for quantity in QUANTITIES]


def documented_key(thing: str, quantity: str) -> bytes:
    """The key as pipeline_core/record_keys.py's docstring defines it."""
    return (thing.replace("\\", "\\\\").replace(".", "\\.") + "." + quantity).encode()


def documented_tag(name: str) -> str:
    """The tag value of a name as pipeline_core/influx.py's `stored_name` docstring defines it."""
    if any(char in name for char in "\x00\n\r") or name.endswith("\\") or name.startswith('\\"'):
        return "\\" + json.dumps(name, ensure_ascii=False)
    return name


def influxql_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


class Started(threading.Thread):
    """Starts a process (its `start` waits for READY) beside the test's other work: a Spark job takes a while."""

    def __init__(self, process) -> None:
        super().__init__(daemon=True)
        self.process, self.error = process, None

    def run(self) -> None:
        try:
            self.process.start()
        except BaseException as error:  # reported by the test thread
            self.error = error


@pytest.fixture
def databases(stack) -> list[tuple[str, InfluxDBClient]]:
    made = []
    for joiner in ("lsb", "spark"):
        name = unique(f"names_{joiner}").replace(".", "_")
        client = InfluxDBClient(stack.influxdb_host, stack.influxdb_port, database=name, timeout=30,
                                headers=dict(JSON_ANSWERS))
        ensure_retention(client, name, load_settings(RetentionSettings, []))
        made.append((name, client))
    yield made
    for name, client in made:
        client.drop_database(name)


def test_any_plant_name_flows_end_to_end_with_each_joiner(stack, bootstrap, new_topics, databases, tmp_path) -> None:
    data, lsb_topics, spark_topics = new_topics(), new_topics(), new_topics()
    lsb_topics = SimpleNamespace(data=data.data, out=lsb_topics.out, dlq=lsb_topics.dlq)
    spark_topics = SimpleNamespace(data=data.data, out=spark_topics.out, dlq=spark_topics.dlq)
    spark = SparkJoinerProcess(bootstrap, spark_topics, tmp_path / "checkpoint", tmp_path)
    spark_start = Started(spark)
    spark_start.start()
    name = unique("names").replace(".", "-")
    bridge = ConnectorProcess(mqtt_topic=f"test/{name}/states/#", client_id=name, data_topic=data.data,
                              dlq_topic=data.dlq, log_path=tmp_path / "connector.log")
    lsb = JoinerProcess(bootstrap, lsb_topics, new_group(), tmp_path, None, "--input-partitioned-by-thing")
    db_connectors = [DbConnectorProcess(tmp_path / f"db-{joiner}.log", connector_args(topics, database))
                     for joiner, topics, (database, _client) in (("lsb", lsb_topics, databases[0]),
                                                                 ("spark", spark_topics, databases[1]))]
    rows = plant_rows(int(time.time() * 1000) - 600_000)
    events = tmp_path / "plant.json"
    events.write_text("".join(json.dumps(row) + "\n" for row in rows))
    try:
        bridge.start()
        lsb.start()
        for connector in db_connectors:
            connector.start()
        simulated = run_simulator(f"test/{name}/states/{{thing}}", "--events-file", str(events), "--order", "file")
        assert simulated.returncode == 0 and f"published {len(rows)} rows" in simulated.stdout \
            and ", 0 failures" in simulated.stdout, simulated.stdout + simulated.stderr

        # The stream connector: every row's records, under their documented keys, nothing refused.
        records = records_of(rows)
        written = read_topic(bootstrap, data.data, expected=len(records))
        assert as_multiset([m.value for m in written]) == as_multiset(records)
        for message in written:
            record = json.loads(message.value)
            assert message.key == documented_key(record["thing"], record["quantity"])
        assert read_topic(bootstrap, data.dlq, idle_s=0.5) == []

        # Each joiner: the reference's joins, once each, under their documented keys; no dead letter.
        in_partition_order = [json.loads(m.value) for m in sorted(written, key=lambda m: (m.partition, m.offset))]
        expected = reference_join(in_partition_order)
        assert {output["thing"] for output in expected} == set(PLANT_NAMES)
        spark_start.join(OUTPUT_DEADLINE_S)
        assert spark_start.error is None, spark_start.error
        for joiner, topics in (("standalone", lsb_topics), ("spark", spark_topics)):
            outputs = read_topic(bootstrap, topics.out, expected=len(expected), deadline_s=OUTPUT_DEADLINE_S)
            assert as_multiset([m.value for m in outputs]) == as_multiset(expected), joiner
            assert all(m.key == documented_key(json.loads(m.value)["thing"], "vaPower_C11") for m in outputs), joiner
            assert read_topic(bootstrap, topics.dlq, idle_s=0.5) == [], joiner

        # InfluxDB, per joiner: every point (names as the readers show them), and each machine's values read
        # back by the exact name, or by the documented escape where InfluxDB cannot carry the name as it is.
        for database, client in databases:
            wait_for_points(client, raw=expected_raw_points(records), joined=expected_joined_points(expected),
                            database=database)
            tags = {point["value"] for point in
                    client.query('SHOW TAG VALUES FROM "raw"."machinedata" WITH KEY = "thing"').get_points()}
            assert tags == {documented_tag(thing) for thing in PLANT_NAMES}
            assert set(PLANT_NAMES) & tags == {thing for thing in PLANT_NAMES if documented_tag(thing) == thing}
            for thing in PLANT_NAMES:
                speeds = [point["result"] for point in client.query(
                    f'SELECT "result" FROM "raw"."machinedata" WHERE "thing" = {influxql_string(documented_tag(thing))}'
                    f" AND \"quantity\" = 'actSpeed_C11'").get_points()]
                assert speeds == [float(row["actSpeed_C11"]) for row in rows if row["Thing"] == thing], thing
                powers = [point["result"] for point in client.query(
                    f'SELECT "result" FROM "joined"."joined" WHERE "thing" = {influxql_string(documented_tag(thing))}'
                    ).get_points()]
                assert sorted(powers) == sorted(o["result"] for o in expected if o["thing"] == thing), thing

        # The dashboards (live pages and `make report` run the same queries): each machine's power under its name.
        dashboard = next(d for d in load_dashboards(DASHBOARDS_DIR) if d.title == "Machine power and load")
        panel = next(p for p in dashboard.panels if p.title == "Power per axis and machine")
        time_range = TimeRange(rows[0]["Timestamp"] - 60_000, rows[-1]["Timestamp"] + 60_000)
        database, client = databases[1]
        variables = resolve_variables(client, dashboard, time_range)
        # Every machine, not the Top 20 the panel draws of them.
        texts = {**query_texts(dashboard, variables), "top": regex_value(variables["thing"].options)}
        labels = {series.label for series in run_panel(client, panel, time_range, texts, 1000)}
        assert labels == {f"{thing} vaPower_C11" for thing in PLANT_NAMES}
        report = subprocess.run([sys.executable, "-m", "grafana_report", "--out", str(tmp_path / "reports"),
                                 "--influxdb-database", database], capture_output=True, text=True, timeout=300)
        assert report.returncode == 0, report.stdout + report.stderr
        assert {path.name for path in (tmp_path / "reports").iterdir()} >= {f"{dashboard.uid}.png"}
    finally:
        spark.close()
        lsb.close()
        bridge.close()
        for connector in db_connectors:
            connector.close()
        drop_session(stack, name)
        delete_internal_topics(bootstrap, [lsb.group_id])
