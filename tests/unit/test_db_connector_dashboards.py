"""Grafana provisioning, the dashboards' JSON and Grafana's macros, without servers: what Grafana would send for each
panel at every range, and how `make report` labels its time axes."""
from __future__ import annotations

import json
import re
from datetime import datetime, timezone

import pytest
import yaml

from grafana_report.dashboards import ALL, DASHBOARDS_DIR, load_dashboards, panel_queries
from grafana_report.macros import (Selection, TimeRange, alias, duration_ms, interval_ms, interval_text, parse_values,
                                   regex_escape, regex_value, round_interval_ms, substitute, variable_waves)
from grafana_report.panels import Series, legend_value_text, no_value_text, with_gaps
from pipeline_core import paths
from stack.clocks import CLOCK_COUNTERS

PROVISIONING = paths.INFLUXDB_GRAFANA_DIR / "grafana" / "provisioning"
DAY_MS = 86_400_000
DASHBOARDS = load_dashboards()
HEALTH = next(dashboard for dashboard in DASHBOARDS if dashboard.uid == "pipeline-health")
POWER = next(dashboard for dashboard in DASHBOARDS if dashboard.uid == "machine-power")
# From a minute to a quarter, each tier's bounds on both sides among them.
RANGES_MS = [60_000, 300_000, 300_001, 900_000, 3_600_000, 21_600_000, 21_600_001, DAY_MS, 3 * DAY_MS,
             3 * DAY_MS + 1, 7 * DAY_MS, 14 * DAY_MS, 30 * DAY_MS, 30 * DAY_MS + 1, 90 * DAY_MS]
NOW_MS = 1_796_572_800_000
# Each variable as the dashboards open: All, and the Top machines some values.
OPENING = {"thing": ".*", "axis": ".*", "top_n": "10", "top": "(M1|M2)", "clock_top": "(M1|M2)"}


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
        assert len({target["refId"] for target in panel["targets"]}) == len(panel["targets"]), panel["title"]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            assert variable["datasource"]["uid"] == uid, variable["name"]


def test_time_filter_interval_globals_and_variables_are_substituted() -> None:
    query = ('SELECT mean("result") FROM "joined" WHERE ${__to} - ${__from} <= 300000 AND "quantity" =~ '
             '/^vaPower_$axis$/ AND "thing" =~ /^$thing$/ AND $timeFilter GROUP BY time($__interval) LIMIT '
             '$__interval_ms')
    text = substitute(query, TimeRange(0, DAY_MS), {"axis": "C11", "thing": regex_value(["R0815", "H31415"])},
                      step_ms=120_000)
    assert text == ('SELECT mean("result") FROM "joined" WHERE 86400000 - 0 <= 300000 AND "quantity" =~ '
                    '/^vaPower_C11$/ AND "thing" =~ /^(R0815|H31415)$/ AND time >= 0ms and time <= 86400000ms '
                    'GROUP BY time(2m) LIMIT 120000')


def test_a_value_holding_a_dollar_is_substituted_once() -> None:
    """One pass, as Grafana's: a machine named `a$axis` does not get the axis substituted into its name."""
    assert substitute("/^$thing$/ /^$axis$/", TimeRange(0, 1000), {"thing": regex_value(["a$axis"]), "axis": "C11"},
                      step_ms=1000) == r"/^a\$axis$/ /^C11$/"


def test_intervals_round_like_grafana() -> None:
    assert round_interval_ms(12_000) == 10_000 and round_interval_ms(13_000) == 15_000
    assert round_interval_ms(7 * DAY_MS / 1000) == 600_000  # a week over 1,000 pixels: 10 minutes
    assert round_interval_ms(90 * DAY_MS / 300) == 21_600_000  # a quarter over 300 points: 6 hours
    assert interval_ms(TimeRange(0, 60_000), 1000) == 1_000  # never below the datasource's 1 s
    assert interval_ms(TimeRange(0, 3_600_000), 300, min_interval_ms=10_000) == 10_000
    assert interval_text(interval_ms(TimeRange(0, 10 * DAY_MS), 800)) == "20m"
    assert interval_text(90_000) == "90s" and duration_ms(">10s") == 10_000


@pytest.mark.parametrize("name", ["Plant1.Hall2.Press3", 'a "b" c', "x\\y", "a/b|c", "(R0815)*", "Presse Süd",
                                  "tab\there", "$top"])
def test_a_name_becomes_a_regex_matching_exactly_itself(name: str) -> None:
    escaped = regex_escape(name)
    assert "/" not in escaped.replace("\\/", "")  # it cannot end InfluxQL's /.../ early
    # Python's re reads RE2's \x{..} as \x..: the same character.
    python_pattern = re.sub(r"\\x\{([0-9a-f]{2})\}", r"\\x\1", escaped)
    assert re.fullmatch(python_pattern, name)
    assert not re.fullmatch(python_pattern, name + "x") and not re.fullmatch(python_pattern, "x" + name)


def test_values_are_given_comma_separated_or_as_json() -> None:
    assert parse_values("R0815, H31415") == ["R0815", "H31415"]
    assert parse_values('["a,b", "c"]') == ["a,b", "c"]
    with pytest.raises(ValueError):
        parse_values('["a", 1]')


def test_a_selection_becomes_what_grafana_substitutes() -> None:
    (thing,) = [variable for variable in POWER.variables if variable.name == "thing"]
    assert Selection(("a.b", "c"), ("a.b", "c"), everything=True).query_text(thing) == ".*"  # its allValue
    assert Selection(("a.b", "c"), ("a.b",)).query_text(thing) == r"a\.b"
    assert Selection((), (), everything=False).query_text(thing) == "()"  # matches no tag value


def test_alias_uses_tags_and_columns() -> None:
    assert alias("$tag_thing $tag_quantity", "joined", {"thing": "R0815", "quantity": "vaPower_C11"}) == \
        "R0815 vaPower_C11"


def test_every_dashboard_query_has_a_time_filter() -> None:
    for dashboard in DASHBOARDS:
        for panel, target in panel_queries(dashboard):
            assert "$timeFilter" in target.query, panel.title
        for variable in dashboard.variables:
            if variable.query.lstrip().upper().startswith("SELECT"):
                assert "$timeFilter" in variable.query, variable.name


def _live(query: str) -> bool:
    """Whether every comparison of numbers in the query holds (InfluxDB drops a target whose gate does not)."""
    comparisons = re.findall(r"(\d+) - (\d+) (<=|>) (\d+)", query)
    return all((int(a) - int(b) <= int(limit)) if op == "<=" else (int(a) - int(b) > int(limit))
               for a, b, op, limit in comparisons)


@pytest.mark.parametrize("dashboard", DASHBOARDS, ids=lambda dashboard: dashboard.uid)
def test_at_every_range_each_query_reads_exactly_one_tier(dashboard) -> None:
    """A panel's targets come in families (its Top machines, the others), one target per tier each: at any range
    one target of each family is live, so no series is drawn twice or missing."""
    for panel in dashboard.panels:
        live_counts = set()
        for length_ms in RANGES_MS:
            time_range = TimeRange(NOW_MS - length_ms, NOW_MS)
            live_counts.add(sum(_live(substitute(target.query, time_range, OPENING, step_ms=1000))
                                for target in panel.targets))
        assert len(live_counts) == 1 and live_counts.pop() >= 1, panel.title
    for variable in dashboard.variables:
        tiers = variable.query.split("SELECT top(")[1:]  # the Top machines: one subquery per tier
        for length_ms in RANGES_MS:
            time_range = TimeRange(NOW_MS - length_ms, NOW_MS)
            assert not tiers or sum(_live(substitute(tier, time_range, OPENING)) for tier in tiers) == 1, variable.name


@pytest.mark.parametrize("dashboard", DASHBOARDS, ids=lambda dashboard: dashboard.uid)
def test_no_query_reads_raw_points_over_more_than_five_minutes_of_the_whole_plant(dashboard) -> None:
    """What keeps a week of 500 machines fast: beyond 5 minutes every query over all selected machines reads the
    history; only the Top machines' series, or a panel's own range of 10 minutes, read raw points."""
    for panel in dashboard.panels:
        for target in panel.targets:
            raw = re.search(r'FROM "(raw"\."machinedata|joined"\."joined)"', target.query)
            if raw is None or panel.time_from:
                continue
            assert "<= 300000" in target.query, (panel.title, target.query)


@pytest.mark.parametrize("dashboard", DASHBOARDS, ids=lambda dashboard: dashboard.uid)
def test_series_are_downsampled_and_legends_bounded(dashboard) -> None:
    """Every time series asks for a bounded number of points (maxDataPoints), groups by time, and shows its legend as
    a table sorted by its measure; a panel with a series per machine draws the Top machines only (a hidden variable
    of the `$top_n` machines)."""
    data = json.loads(dashboard.path.read_text())
    tops = [variable.name for variable in dashboard.variables if variable.hidden and "$top_n" in variable.query]
    for panel in data["panels"]:
        if panel["type"] != "timeseries":
            continue
        assert 0 < panel["maxDataPoints"] <= 600, panel["title"]
        legend = panel["options"]["legend"]
        assert legend["displayMode"] == "table" and legend["calcs"] and legend["sortDesc"], panel["title"]
        for target in panel["targets"]:
            assert "GROUP BY time(" in target["query"], panel["title"]
            if '"thing"' in target["query"].split("GROUP BY")[-1]:  # a series per machine
                assert any(f'"thing" =~ /^${top}$/' in target["query"] for top in tops), panel["title"]


def test_the_machine_selectors_are_template_variables() -> None:
    for dashboard in DASHBOARDS:
        variables = {variable.name: variable for variable in dashboard.variables}
        assert variables["thing"].multi and variables["thing"].include_all and variables["thing"].opens_on_all
        assert variables["thing"].all_value == ".*" and not variables["thing"].hidden
        assert variables["top_n"].type == "custom" and variables["top_n"].current == ("10",)
        assert variables["top"].hidden and variables["top"].current == (ALL,)
        assert '"thing" =~ /^$thing$/' in variables["top"].query and "$top_n" in variables["top"].query
    assert {variable.name for variable in POWER.variables} == {"thing", "axis", "top_n", "top"}


def test_counts_show_zero_where_none_were_counted() -> None:
    counted = [panel for panel in HEALTH.panels if any("count(" in target.query for target in panel.targets)]
    assert len(counted) >= 6
    for panel in counted:
        assert no_value_text(panel) != "No data", panel.title
    assert no_value_text(next(panel for panel in HEALTH.panels if panel.title == "Records in")) == "0"
    assert no_value_text(next(panel for panel in HEALTH.panels if panel.title.startswith("Lag now"))) == "No data"


def test_a_panel_s_min_interval_bounds_its_group_by_interval() -> None:
    hour = TimeRange(0, 3_600_000)
    assert interval_ms(hour, 1000) == 5_000 and interval_ms(hour, 1000, min_interval_ms=10_000) == 10_000
    assert substitute("GROUP BY time($__interval)", hour, step_ms=interval_ms(hour, 1000, 10_000)) == \
        "GROUP BY time(10s)"


def test_a_series_breaks_only_at_gaps_beyond_its_own_spacing() -> None:
    hourly = Series("a", times_ms=[0, 3_600_000, 7_200_000, 10_800_000, 25_200_000], values=[1.0, 2.0, 3.0, 4.0, 5.0])
    times_ms, values = with_gaps(hourly, 60_000)
    assert len(times_ms) == 6 and values[4] != values[4]  # one NaN: the 4-hour gap, not the hourly steps


def test_legend_values_carry_the_panel_s_unit() -> None:
    power = next(panel for panel in POWER.panels if panel.title == "Power per axis and machine")
    assert legend_value_text(power, 2468.4) == "2.468k W"
    assert legend_value_text(power, float("nan")) == "-"


def test_health_panels_add_up_the_processes_of_a_stage_at_their_reporting_interval() -> None:
    """Every process writes its own series (tag instance): a panel per stage must aggregate per instance
    first, then add the instances up, in buckets no shorter than the 10 s the stages report at."""
    panels = [panel for panel in HEALTH.panels if any("pipeline_health" in t.query for t in panel.targets)]
    assert len(panels) >= 8
    for panel in panels:
        assert panel.time_from and panel.min_interval == "10s", panel.title
        for target in panel.targets:
            if 'GROUP BY time($__interval), "stage"' in target.query:
                assert target.query.startswith('SELECT sum("value") FROM (SELECT '), panel.title
                assert 'GROUP BY time($__interval), "stage", "instance"' in target.query, panel.title


def test_the_health_dashboard_shows_every_loss_counter_by_stage() -> None:
    """Loss outside the pipeline's control (pipeline_core.data_loss) has a panel: each counter, per stage."""
    (panel,) = [panel for panel in HEALTH.panels if panel.title == "Lost outside the pipeline's control, by stage"]
    queried = {field for target in panel.targets for field in ("records_skipped", "topics_deleted",
                                                                "offset_resets") if f'last("{field}")' in target.query}
    assert queried == {"records_skipped", "topics_deleted", "offset_resets"}


def test_variables_that_do_not_use_each_other_are_asked_together() -> None:
    """The Top machines by records and by clock faults use the selection and Top but not each other: one wave, asked
    side by side, after the variables they use."""
    assert [[variable.name for variable in wave] for wave in variable_waves(HEALTH)] == [
        ["thing", "top_n"], ["top", "clock_top"]]
    assert [[variable.name for variable in wave] for wave in variable_waves(POWER)] == [
        ["thing", "axis", "top_n"], ["top"]]


def test_the_health_dashboard_shows_the_clock_faults_of_the_machines_with_the_most() -> None:
    """Every clock counter the joiners write per machine (stack.clocks, `make status`'s line) has a line per machine,
    each process's count added up, for the Top of the selection by those counts; none counted shows 0."""
    (panel,) = [panel for panel in HEALTH.panels if panel.title == "Clock faults per machine"]
    # Up to 6 hours the points as written; beyond, their 10-minute history (each counter's highest per interval).
    raw = {field for target in panel.targets for field in CLOCK_COUNTERS if f'last("{field}")' in target.query
           and '"health"."machine_health"' in target.query}
    history = {field for target in panel.targets for field in CLOCK_COUNTERS if f'max("max_{field}")' in target.query
               and '"history"."machine_health_10m"' in target.query}
    assert raw == history == set(CLOCK_COUNTERS)
    for target in panel.targets:
        assert '"stage", "instance", "thing"' in target.query and '"thing" =~ /^$clock_top$/' in target.query
        assert "$tag_thing" in target.alias
    (top,) = [variable for variable in HEALTH.variables if variable.name == "clock_top"]
    assert top.hidden and top.current == (ALL,) and "$top_n" in top.query and '"thing" =~ /^$thing$/' in top.query
    assert all(f'max("{field}")' in top.query and f'max("max_{field}")' in top.query for field in CLOCK_COUNTERS)
    assert no_value_text(panel) == "0"


@pytest.mark.parametrize("length_ms", [60_000, 300_000, 900_000, 3_600_000, 6 * 3_600_000, DAY_MS, 2 * DAY_MS,
                                       3 * DAY_MS, 7 * DAY_MS, 14 * DAY_MS, 30 * DAY_MS],
                         ids=lambda length_ms: interval_text(length_ms))
@pytest.mark.parametrize("width_columns", [8, 12, 24])
def test_make_report_s_time_labels_are_distinct_from_a_minute_to_weeks(length_ms: int, width_columns: int) -> None:
    import matplotlib.pyplot as plt  # noqa: PLC0415 - the report's drawing library, for this test only

    from grafana_report.render import time_axis  # noqa: PLC0415

    figure = plt.figure(figsize=(16 * width_columns / 24, 2), dpi=80)
    try:
        ax = figure.add_axes((0.1, 0.2, 0.85, 0.7))
        end_ms = 1_796_575_735_802  # not on a whole minute, as "now" never is
        ax.plot([datetime.fromtimestamp((end_ms - length_ms) / 1000, tz=timezone.utc),
                 datetime.fromtimestamp(end_ms / 1000, tz=timezone.utc)], [0, 1])
        time_axis(ax, end_ms - length_ms, end_ms, width_columns)
        figure.canvas.draw()
        labels = [label.get_text() for label in ax.get_xticklabels() if label.get_text()]
    finally:
        plt.close(figure)
    assert len(labels) >= 2, labels
    assert len(set(labels)) == len(labels), labels
    assert all(len(label) <= 12 for label in labels), labels  # readable: the date goes beside the axis once
