"""Grafana provisioning and the dashboards' macros, without servers."""
from __future__ import annotations

import json

import pytest
import yaml

from grafana_report.dashboards import DASHBOARDS_DIR, load_dashboards, panel_queries
from grafana_report.macros import TimeRange, alias, interval_ms, interval_text, regex_value, substitute
from pipeline_core import paths

PROVISIONING = paths.INFLUXDB_GRAFANA_DIR / "grafana" / "provisioning"
DAY_MS = 86_400_000


def test_the_datasource_reads_as_the_read_only_user_with_its_password_from_the_environment() -> None:
    (datasource,) = yaml.safe_load((PROVISIONING / "datasources" / "influxdb.yaml").read_text())["datasources"]
    assert datasource["name"] == "InfluxDB" and datasource["type"] == "influxdb"
    assert datasource["url"] == "http://influxdb:8086"
    assert datasource["jsonData"]["dbName"] == "machinedata"
    assert datasource["user"] == "reader"
    assert datasource["secureJsonData"]["password"] == "$INFLUXDB_READER_PASSWORD"


def test_the_dashboard_provider_reads_the_mounted_folder() -> None:
    (provider,) = yaml.safe_load((PROVISIONING / "dashboards" / "dashboards.yaml").read_text())["providers"]
    assert provider["type"] == "file" and provider["options"]["path"] == "/var/lib/grafana/dashboards"


@pytest.mark.parametrize("path", sorted(DASHBOARDS_DIR.glob("*.json")), ids=lambda path: path.name)
def test_every_panel_uses_the_provisioned_datasource(path) -> None:
    uid = yaml.safe_load((PROVISIONING / "datasources" / "influxdb.yaml").read_text())["datasources"][0]["uid"]
    board = json.loads(path.read_text())
    assert len({panel["id"] for panel in board["panels"]}) == len(board["panels"])
    for panel in board["panels"]:
        assert panel["datasource"]["uid"] == uid, panel["title"]
        assert panel["targets"] and all(target["rawQuery"] for target in panel["targets"]), panel["title"]


def test_time_filter_interval_and_variables_are_substituted() -> None:
    query = ('SELECT mean("result") FROM "joined" WHERE "quantity" =~ /^vaPower_$axis$/ AND "thing" =~ /^$thing$/ '
             "AND $timeFilter GROUP BY time($__interval)")
    text = substitute(query, TimeRange(0, DAY_MS), {"axis": ["C11"], "thing": ["R0815", "H31415"]})
    assert text == ('SELECT mean("result") FROM "joined" WHERE "quantity" =~ /^vaPower_C11$/ AND '
                    '"thing" =~ /^(R0815|H31415)$/ AND time >= 0ms and time <= 86400000ms GROUP BY time(2m)')


def test_intervals_round_like_grafana() -> None:
    assert interval_ms(TimeRange(0, 60_000)) == 1_000  # never below the datasource's 1 s
    assert interval_text(interval_ms(TimeRange(0, 10 * DAY_MS))) == "30m"
    assert interval_text(90_000) == "90s"


def test_variable_values_are_regex_escaped() -> None:
    assert regex_value(["a.b", "c/d"]) == r"(a\.b|c\/d)"


def test_alias_uses_tags() -> None:
    assert alias("$tag_thing $tag_quantity", "joined", {"thing": "R0815", "quantity": "vaPower_C11"}) == \
        "R0815 vaPower_C11"


def test_every_dashboard_query_has_a_time_filter() -> None:
    for dashboard in load_dashboards():
        for panel, target in panel_queries(dashboard):
            assert "$timeFilter" in target.query, panel.title


def test_a_panel_s_min_interval_bounds_its_group_by_interval() -> None:
    hour = TimeRange(0, 3_600_000)
    assert interval_ms(hour) == 5_000 and interval_ms(hour, min_interval_ms=10_000) == 10_000
    assert substitute("GROUP BY time($__interval)", hour, min_interval="10s") == "GROUP BY time(10s)"
    assert substitute("GROUP BY time($__interval)", TimeRange(0, DAY_MS), min_interval="10s") == "GROUP BY time(2m)"


def test_health_panels_add_up_the_processes_of_a_stage_at_their_reporting_interval() -> None:
    """Every process writes its own series (tag instance): a panel per stage must aggregate per instance
    first, then add the instances up, in buckets no shorter than the 10 s the stages report at."""
    (health,) = [dashboard for dashboard in load_dashboards() if dashboard.uid == "pipeline-health"]
    panels = [panel for panel in health.panels if any("pipeline_health" in t.query for t in panel.targets)]
    assert len(panels) >= 8
    for panel in panels:
        assert panel.time_from and panel.min_interval == "10s", panel.title
        for target in panel.targets:
            if 'GROUP BY time($__interval), "stage"' in target.query:
                assert target.query.startswith('SELECT sum("value") FROM (SELECT '), panel.title
                assert 'GROUP BY time($__interval), "stage", "instance"' in target.query, panel.title


def test_the_health_dashboard_shows_every_loss_counter_by_stage() -> None:
    """Loss outside the pipeline's control (pipeline_core.data_loss) has a panel: each counter, per stage."""
    (health,) = [dashboard for dashboard in load_dashboards() if dashboard.uid == "pipeline-health"]
    (panel,) = [panel for panel in health.panels if panel.title == "Lost outside the pipeline's control, by stage"]
    queried = {field for target in panel.targets for field in ("records_skipped", "topics_deleted",
                                                                "offset_resets") if f'last("{field}")' in target.query}
    assert queried == {"records_skipped", "topics_deleted", "offset_resets"}
