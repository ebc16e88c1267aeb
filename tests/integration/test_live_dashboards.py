"""The live dashboards (`python -m live_dashboards`, `make dashboards`) in a real browser: both Grafana dashboards
served from a fresh database of known points and loaded in Debian's headless Chromium. Every panel's title is on
the page, each panel holds the values its own InfluxQL returns for those points, a point written while the page
is open shows up on that same page without a reload, and the server stops cleanly on SIGTERM."""
from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from influxdb import InfluxDBClient

from browser_support import Chromium
from fault_support import terminate_process
from grafana_report.dashboards import load_dashboards
from pipeline_core.health_metrics import health_line
from pipeline_core.influx_retention import (HEALTH_POLICY, HISTORY_POLICY, JOINED_POLICY, RAW_POLICY, ensure_retention,
                                            retention_settings)
from pipeline_core.settings import ConnectionSettings
from stack.processes import free_loopback_ports
from support import unique, wait_for

pytestmark = pytest.mark.integration

DASHBOARDS = load_dashboards()
# Often enough for a short test, seldom enough for a page of 20 plots to be drawn between refreshes on 2 cores.
REFRESH_S = 2.0
NS_PER_MS = 1_000_000
SPARK_HEALTH = {"records_in_per_s": 5000.0, "records_out_per_s": 700.0, "dead_letters_per_s": 0.25, "lag": 2500,
                "batch_seconds": 0.75, "state_rows": 64, "state_bytes": 1_048_576, "records_skipped": 3,
                "topics_deleted": 0, "offset_resets": 0, "disk_used_ratio": 0.625, "disk_free_bytes": 987_654_321}
# Panel title -> a value the panel must hold, computed by hand from the points below.
EXPECTED: dict[str, Any] = {
    "Power per axis and machine": 4321.5,
    "Speed per axis (actual and commanded)": 1600.5,
    "Torque per axis": 77.125,
    "Duty cycle (ED) per machine": 50.0,  # one active join result of two, in per cent
    "Load distribution by power level": "high (1, 50%)",
    # Sum 4334 over count 2; once the minute of the live point (4321.5) is over, InfluxDB's continuous query rolls it
    # up into the same 30-minute bucket of the panel: (4334 + 4321.5) over 3.
    "Power per axis and machine, 1-minute history": (2167.0, (4334.0 + 4321.5) / 3),
    "Lag now, by stage": 2500,
    "Lag by stage": 2500,
    "Records in per second, by stage": 5000.0,
    "Records out per second, by stage": 700.0,
    "Dead letters per second, by stage": 0.25,
    "Spark micro-batch duration": 0.75,
    "Spark join state: rows": 64,
    "Spark join state: memory": 1_048_576,
    "Records in": ">3<",  # the stat's number in its HTML: three raw points
    "Joins out": ">2<",
    "Dead letters": ">1<",
    "Late records": ">1<",
    "Records in per machine": 3,
    "Joins out per join case": 1,
    "Dead letters per stage": 1,
    "Latest dead letters": "late: t=1554096458070",
    "Lost outside the pipeline's control, by stage": 3,
    "Disk used where the stages run": 0.625,
    "Disk free where the stages run": 987_654_321,
}
# Per panel title (its tag on the page's models), every number and text of its data sources and texts.
PANEL_VALUES_JS = """(() => {
  const found = {};
  const add = (title, kind, value) => {
    found[title] ??= {numbers: [], texts: []};
    found[title][kind].push(value);
  };
  for (const doc of Bokeh.documents) for (const model of doc.all_models) {
    const title = (model.tags || [])[0];
    if (typeof title !== "string") continue;
    if (model.data !== undefined) {
      const columns = model.data instanceof Map ? [...model.data.values()] : Object.values(model.data);
      for (const column of columns) for (const value of Array.from(column))
        add(title, typeof value === "number" ? "numbers" : "texts", value);
    } else if (typeof model.text === "string") add(title, "texts", model.text);
  }
  return found;
})()"""


def _lines(now_ms: int) -> dict[str, list[str]]:
    """Retention policy -> the points of one small plant, in line protocol (ns times), as the DB connector and
    the stages' health writer write them."""
    now_ns = now_ms * NS_PER_MS
    hour_ago_ns = now_ns - 3_600 * 10**9  # another of the 14-day range's 30-minute buckets
    minute_ns = (now_ms // 60_000 * 60_000 - 60_000) * NS_PER_MS
    late = "late: t=1554096458070 arrived 2345 ms behind the newest t=1554096460415 of R0815.vaTorque_C11"
    power = "joined,case=both,quantity=vaPower_C11,thing=R0815"
    return {
        RAW_POLICY: [f"machinedata,quantity=actSpeed_C11,thing=R0815 result=1500.25 {now_ns}",
                     f"machinedata,quantity=cmdSpeed_C11,thing=R0815 result=1600.5 {now_ns}",
                     f"machinedata,quantity=vaTorque_C11,thing=R0815 result=77.125 {now_ns}",
                     f'deadletters,partition=0,stage=kafka_joiner reason="{late}" {now_ns}'],
        JOINED_POLICY: [f"{power},level=high result=4321.5,active=1.0 {now_ns}",
                        f"{power},level=idle result=12.5,active=0.0 {hour_ago_ns}"],
        HISTORY_POLICY: [f"joined_1m,quantity=vaPower_C11,thing=R0815 mean=2167.0,min=12.5,max=4321.5,sum=4334.0,"
                         f"count=2i {minute_ns}"],
        HEALTH_POLICY: [_health("spark_joiner", SPARK_HEALTH, now_ms)],
    }


def _health(stage: str, fields: dict[str, float], at_ms: int) -> str:
    line = health_line({"stage": stage, "instance": "host-1"}, fields, at_ms * NS_PER_MS)
    assert line is not None
    return line


def _write(client: InfluxDBClient, policy: str, lines: list[str]) -> None:
    assert client.write_points(lines, time_precision="n", retention_policy=policy, protocol="line")


@pytest.fixture(scope="module")
def database(stack: ConnectionSettings) -> Iterator[tuple[str, InfluxDBClient]]:
    """A fresh database with the pipeline's retention policies and the known points."""
    name = unique("test_live").replace(".", "_")
    client = InfluxDBClient(stack.influxdb_host, stack.influxdb_port, database=name, timeout=30)
    try:
        ensure_retention(client, name, retention_settings(stack))
        for policy, lines in _lines(int(time.time() * 1000)).items():
            _write(client, policy, lines)
        yield name, client
    finally:
        client.drop_database(name)


@pytest.fixture(scope="module")
def server(database, tmp_path_factory) -> Iterator[tuple[subprocess.Popen, str, Path]]:
    """`python -m live_dashboards` on a free port, reading the test's database; its base URL and log."""
    name, _ = database
    (port,) = free_loopback_ports(1)
    log_path = tmp_path_factory.mktemp("live") / "live_dashboards.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "live_dashboards", "--port", str(port),
                                    "--influxdb-database", name, "--refresh-s", str(REFRESH_S)],
                                   stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: process.poll() is not None or _answers(f"{base}/{DASHBOARDS[0].uid}"), 60,
                 "the live dashboards' page")
        assert process.poll() is None, f"live_dashboards exited: {log_path.read_text()[-3000:]}"
        yield process, base, log_path
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def browser(server, tmp_path_factory) -> Iterator[Chromium]:
    chromium = Chromium("about:blank", tmp_path_factory.mktemp("chromium"), window=(1440, 1000))
    try:
        yield chromium
    finally:
        chromium.close()


def _open(browser: Chromium, url: str) -> None:
    """Load `url`, unless the browser shows it already, and wait for Bokeh to have built its page (the document
    arrives over the websocket)."""
    path = url.split("/", 3)[3]
    if not browser.evaluate(f"location.pathname === '/{path}'"):
        browser.call("Page.navigate", url=url)
    wait_for(lambda: browser.evaluate(f"location.pathname === '/{path}' && typeof Bokeh !== 'undefined' && "
                                      "Bokeh.documents.length > 0 && document.readyState === 'complete'"),
             60, f"Bokeh's page at {url}")


def _holds(values: dict[str, Any], title: str, expected: Any) -> bool:
    panel = values.get(title, {"numbers": [], "texts": []})
    if isinstance(expected, str):
        return any(expected in text for text in panel["texts"] if isinstance(text, str))
    if isinstance(expected, tuple):  # either of two values, each computed by hand
        return any(_holds(values, title, alternative) for alternative in expected)
    return any(number is not None and abs(number - expected) < 1e-9 for number in panel["numbers"])


@pytest.mark.parametrize("dashboard", DASHBOARDS, ids=lambda dashboard: dashboard.uid)
def test_every_panel_shows_its_title_and_the_stored_values(browser: Chromium, server, dashboard,
                                                             tmp_path: Path) -> None:
    _, base, server_log = server
    _open(browser, f"{base}/{dashboard.uid}")
    titles = [panel.title for panel in dashboard.panels]
    assert set(titles) <= set(EXPECTED), "a panel without an expected value: add one"
    # The values arrive with the first refresh after the page is built: wait for every panel's. On a busy machine
    # a refresh of 20 panels' queries can take several times its period.
    missing: dict[str, Any] = {}

    def every_panel_holds_its_value() -> bool:
        values = browser.evaluate(PANEL_VALUES_JS)
        missing.clear()
        missing.update({title: values.get(title) for title in titles if not _holds(values, title, EXPECTED[title])})
        return not missing

    try:
        wait_for(every_panel_holds_its_value, 90, f"every panel of {dashboard.uid} to hold its value")
    except AssertionError as error:
        log = server_log.read_text()[-3000:] if server_log.exists() else "(no log)"
        raise AssertionError(f"{error}; the panels without it, with what they hold: {missing}; the server's log:\n"
                             f"{log}") from None
    text = browser.text()
    assert dashboard.title in text
    assert [title for title in titles if title not in text] == []
    assert "query failed" not in text and "does not answer" not in text
    shot = browser.screenshot(tmp_path / f"{dashboard.uid}.png")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_open_page_refreshes_by_itself(browser: Chromium, server, database) -> None:
    _, base, _ = server
    _, client = database
    _open(browser, f"{base}/pipeline-health")
    wait_for(lambda: _holds(browser.evaluate(PANEL_VALUES_JS), "Lag by stage", 2500), 30, "the first lag")
    browser.evaluate("window.stillTheSamePage = true")  # gone if the page were loaded again
    assert not _holds(browser.evaluate(PANEL_VALUES_JS), "Lag by stage", 777)
    _write(client, HEALTH_POLICY, [_health("stream_connector", {"lag": 777, "records_in_per_s": 12.5},
                                           int(time.time() * 1000))])
    wait_for(lambda: _holds(browser.evaluate(PANEL_VALUES_JS), "Lag by stage", 777), 30,
             "the new stage's lag on the open page")
    assert _holds(browser.evaluate(PANEL_VALUES_JS), "Lag now, by stage", 777)
    assert browser.evaluate("window.stillTheSamePage === true")


def test_the_server_stops_cleanly_on_sigterm(server, browser: Chromium) -> None:
    process, _, _ = server
    assert terminate_process(process, "the live dashboards' server", 30) == 0
