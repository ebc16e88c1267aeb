"""The live dashboards (`python -m live_dashboards`, `make dashboards`) in a real browser: both Grafana dashboards
served from a fresh database of known points and loaded in Debian's headless Chromium.

The index at / links both pages and nothing on any page comes from outside the server; every panel's title is on
its page and each panel holds the value its own InfluxQL returns for those points (computed here by hand); a page's
address picks machines by their exact names, dots, quotes and backslashes in them; the time axes' labels are
distinct at every range the page offers; a point written while a page is open shows up on it without a reload; pages
closed at any moment, a refresh on its way among them, leave no error in the server's log; and SIGTERM ends the
server at once, a query to a hung InfluxDB in flight included."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from influxdb import InfluxDBClient

from browser_support import Chromium
from fault_support import terminate_process
from grafana_report.dashboards import load_dashboards
from grafana_report.macros import duration_ms
from live_dashboards.app import RANGES
from pipeline_core.health_metrics import MACHINE_MEASUREMENT, health_line
from pipeline_core.influx import stored_name
from pipeline_core.influx_retention import (HEALTH_POLICY, JOINED_POLICY, RAW_POLICY, backfill_history,
                                            ensure_retention, retention_settings)
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
                "topics_deleted": 0, "offset_resets": 0, "disk_used_ratio": 0.625, "disk_free_bytes": 987_654_321,
                "watchdog_restarts": 2}  # the stack's watchdog writes it beside the stage's own
# Machines whose names a query must treat as data: a dot is no regex wildcard, a quote ends no string, a backslash
# escapes nothing. Each joins once now, with this power (W) and join case.
ODD_MACHINES = {"Plant1.Hall2.Press3": (2000.0, "left_successor"), 'a "b" c': (700.0, "left_successor"),
                "x\\y": (50.0, "left_successor")}
# Panel title -> a value the panel must hold over the dashboards' 24 hours (their 10-minute history), computed by
# hand from the points below.
EXPECTED: dict[str, Any] = {
    "Power per axis and machine": 4321.5,
    "Speed per axis (actual and commanded)": 1600.5,
    "Torque per axis": 77.125,
    "Duty cycle (ED) per machine": 100.0,  # R0815's one join of the last 10 minutes is active
    "Load distribution by power level": "high (1, 25%)",  # of four joins now: high, medium, low, idle
    # The mean over the Top machines (all four) of the 10 minutes of now: (4321.5 + 2000 + 700 + 50) / 4.
    "Power of the Top machines: mean, lowest and highest per axis": (4321.5 + 2000.0 + 700.0 + 50.0) / 4,
    "Lag now, by stage": 2500,
    "Lag by stage": 2500,
    "Records in per second, by stage": 5000.0,
    "Records out per second, by stage": 700.0,
    "Dead letters per second, by stage": 0.25,
    "Spark micro-batch duration": 0.75,
    "Spark join state: rows": 64,
    "Spark join state: memory": 1_048_576,
    "Records in": ">6<",  # the stat's number in its HTML: R0815's three raw points and one of each odd machine
    "Joins out": ">5<",  # R0815's two (now, an hour ago), one of each odd machine
    "Dead letters": ">1<",
    "Late records": ">1<",
    "Records in per machine, per second": 3 / 600,  # R0815's three records in its 10 minutes
    "Joins out per join case": 3,  # the odd machines' three of case left_successor in the last 10 minutes
    "Dead letters per stage": 1,
    "Latest dead letters": "late: t=1554096458070",
    "Lost outside the pipeline's control, by stage": 3,
    "Disk used where the stages run": 0.625,
    "Disk free where the stages run": 987_654_321,
    "Clock faults per machine": 7,  # the outliers of the machine named a "b" c
    "Restarts by the watchdog, by stage": 2,
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
      // A column of lines (a multi_line's xs, ys) holds an array per line.
      for (const column of columns) for (const value of Array.from(column).flatMap(
          (item) => typeof item === "object" && item !== null && item.length !== undefined ? Array.from(item) : [item]))
        add(title, typeof value === "number" ? "numbers" : "texts", value);
    } else if (typeof model.text === "string") add(title, "texts", model.text);
  }
  return found;
})()"""
# Every time axis of the page: its labels as BokehJS makes them for the axis' range, and whether its panel has a
# range of its own.
TIME_LABELS_JS = """(() => {
  const axes = [];
  for (const doc of Bokeh.documents) for (const model of doc.all_models) {
    const axis = (model.below || [])[0];
    if (!axis || !axis.formatter || axis.formatter.type !== "DatetimeTickFormatter") continue;
    const ticks = axis.ticker.get_ticks(model.x_range.start, model.x_range.end, model.x_range, NaN).major;
    axes.push({title: model.tags[0], start: model.x_range.start, end: model.x_range.end,
               own_range: OWN_RANGE.includes(model.tags[0]),
               labels: axis.formatter.doFormat(ticks, {loc: 0}).map(String)});
  }
  return axes;
})()""".replace("OWN_RANGE", json.dumps([panel.title for dashboard in DASHBOARDS for panel in dashboard.panels
                                         if panel.time_from]))
REFRESH_TIMING_JS = """(() => {
  for (const doc of Bokeh.documents) for (const model of doc.all_models)
    if ((model.tags || [])[0] === "refresh-timing") return JSON.parse(model.text);
  return null;
})()"""


def _lines(now_ms: int) -> dict[str, list[str]]:
    """Retention policy -> the points of one small plant, in line protocol (ns times), as the DB connector and
    the stages' health writer write them."""
    now_ns = now_ms * NS_PER_MS
    hour_ago_ns = now_ns - 3_600 * 10**9  # another of the 24 hours' 10-minute intervals
    late = "late: t=1554096458070 arrived 2345 ms behind the newest t=1554096460415 of R0815.vaTorque_C11"
    power = "joined,case=both,quantity=vaPower_C11,thing=R0815"
    raw = [f"machinedata,quantity=actSpeed_C11,thing=R0815 result=1500.25 {now_ns}",
           f"machinedata,quantity=cmdSpeed_C11,thing=R0815 result=1600.5 {now_ns}",
           f"machinedata,quantity=vaTorque_C11,thing=R0815 result=77.125 {now_ns}",
           f'deadletters,partition=0,stage=kafka_joiner reason="{late}" {now_ns}']
    joined = [f"{power},level=high result=4321.5,active=1.0 {now_ns}",
              f"{power},level=idle result=12.5,active=0.0 {hour_ago_ns}"]
    for name, (watts, case) in ODD_MACHINES.items():
        tag = name.replace(" ", "\\ ")  # line protocol's escape of a tag value (pipeline_core.influx.escape_tag)
        level = "idle" if watts < 100 else "low" if watts < 1000 else "medium"
        raw.append(f"machinedata,quantity=actSpeed_C11,thing={tag} result=100.0 {now_ns}")
        joined.append(f"joined,case={case},level={level},quantity=vaPower_C11,thing={tag} result={watts},"
                      f"active={0.0 if level == 'idle' else 1.0} {now_ns}")
    clock = health_line({"stage": "kafka_joiner", "instance": "host-1", "thing": stored_name('a "b" c')},
                        {"clock_outliers": 7, "clock_steps_back": 0, "clock_jumps_ahead": 0}, now_ns,
                        MACHINE_MEASUREMENT)
    return {RAW_POLICY: raw, JOINED_POLICY: joined, HEALTH_POLICY: [_health("spark_joiner", SPARK_HEALTH, now_ms),
                                                                    clock]}


def _health(stage: str, fields: dict[str, float], at_ms: int) -> str:
    line = health_line({"stage": stage, "instance": "host-1"}, fields, at_ms * NS_PER_MS)
    assert line is not None
    return line


def _write(client: InfluxDBClient, policy: str, lines: list[str]) -> None:
    assert client.write_points(lines, time_precision="n", retention_policy=policy, protocol="line")


def _rfc3339(time_ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time_ms / 1000))


@pytest.fixture(scope="module")
def database(stack: ConnectionSettings) -> Iterator[tuple[str, InfluxDBClient]]:
    """A fresh database with the pipeline's retention policies, the known points and their history."""
    name = unique("test_live").replace(".", "_")
    client = InfluxDBClient(stack.influxdb_host, stack.influxdb_port, database=name, timeout=30)
    try:
        ensure_retention(client, name, retention_settings(stack))
        now_ms = int(time.time() * 1000)
        for policy, lines in _lines(now_ms).items():
            _write(client, policy, lines)
        # What the continuous queries compute of every minute as it passes, for the points written just now.
        assert backfill_history(client, name, _rfc3339(now_ms - 7_200_000), _rfc3339(now_ms + 60_000)) > 0
        yield name, client
    finally:
        client.drop_database(name)


def _serve(database_name: str, log_path: Path, *flags: str) -> tuple[subprocess.Popen, str]:
    (port,) = free_loopback_ports(1)
    with log_path.open("wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "live_dashboards", "--port", str(port),
                                    "--influxdb-database", database_name, "--refresh-s", str(REFRESH_S), *flags],
                                   stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: process.poll() is not None or _answers(f"{base}/"), 60, "the live dashboards' index")
    assert process.poll() is None, f"live_dashboards exited: {log_path.read_text()[-3000:]}"
    return process, base


@pytest.fixture(scope="module")
def server(database, tmp_path_factory) -> Iterator[tuple[subprocess.Popen, str, Path]]:
    """`python -m live_dashboards` on a free port, reading the test's database; its base URL and log."""
    name, _ = database
    log_path = tmp_path_factory.mktemp("live") / "live_dashboards.log"
    process, base = _serve(name, log_path)
    try:
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
    """Load `url` and wait for Bokeh to have built its page (the document arrives over the websocket) and shown the
    first snapshot of the queries."""
    browser.call("Page.navigate", url=url)
    path_and_query = url.split("/", 3)[3]
    wait_for(lambda: browser.evaluate(
        f"location.href.endsWith({('/' + path_and_query)!r}) && typeof Bokeh !== 'undefined' && "
        f"Bokeh.documents.length > 0 && document.readyState === 'complete' && ({REFRESH_TIMING_JS}) !== null && "
        f"({REFRESH_TIMING_JS}).taken_ms !== undefined"), 90, f"Bokeh's page at {url} with its first snapshot")


def _holds(values: dict[str, Any], title: str, expected: Any) -> bool:
    panel = values.get(title, {"numbers": [], "texts": []})
    if isinstance(expected, str):
        return any(expected in text for text in panel["texts"] if isinstance(text, str))
    return any(number is not None and abs(number - expected) < 1e-9 for number in panel["numbers"])


def _errors_in(log_path: Path) -> list[str]:
    return [line for line in log_path.read_text().splitlines()
            if "Traceback" in line or " ERROR " in line or "Exception" in line or "AssertionError" in line]


def test_the_index_links_every_dashboard_and_nothing_comes_from_elsewhere(browser: Chromium, server) -> None:
    _, base, _ = server
    browser.call("Page.navigate", url=f"{base}/")
    wait_for(lambda: browser.evaluate("document.readyState === 'complete' && location.pathname === '/'"), 30,
             "the index")
    links = browser.evaluate("[...document.querySelectorAll('a')].map(a => [a.textContent, a.href])")
    assert sorted(links) == sorted([dashboard.title, f"{base}/{dashboard.uid}"] for dashboard in DASHBOARDS)
    assert "Bokeh" not in browser.text()
    for dashboard in DASHBOARDS:
        _open(browser, f"{base}/{dashboard.uid}")
        fetched = browser.evaluate("performance.getEntriesByType('resource').map(entry => entry.name)")
        assert fetched and all(url.startswith(f"{base}/") for url in fetched), fetched


@pytest.mark.parametrize("dashboard", DASHBOARDS, ids=lambda dashboard: dashboard.uid)
def test_every_panel_shows_its_title_and_the_stored_values(browser: Chromium, server, dashboard,
                                                             tmp_path: Path) -> None:
    _, base, server_log = server
    _open(browser, f"{base}/{dashboard.uid}")
    titles = [panel.title for panel in dashboard.panels]
    assert set(titles) <= set(EXPECTED), "a panel without an expected value: add one"
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


def _pick(browser: Chromium, label: str, value: Any) -> None:
    """Set the page's selector titled `label` (Range, Machine, Axis, Top) as a reader would."""
    assert browser.evaluate(f"""(() => {{
      for (const doc of Bokeh.documents) for (const model of doc.all_models)
        if (model.title === {label!r} && model.value !== undefined) {{ model.value = {json.dumps(value)}; return true; }}
      return false;
    }})()"""), f"no selector {label}"


def _power_labels(browser: Chromium) -> set[str]:
    texts = browser.evaluate(PANEL_VALUES_JS).get("Power per axis and machine", {"texts": []})["texts"]
    return {text for text in texts if "vaPower" in text}


def test_the_selectors_pick_machines_by_their_exact_names_and_ranges(browser: Chromium, server) -> None:
    """Machine picks each odd name alone (its power only, not the others' whose names a careless regex would match);
    the address picks one as Grafana's does; at every range Range offers, every time axis' labels are distinct."""
    _, base, _ = server
    first = sorted(ODD_MACHINES)[0]
    _open(browser, f"{base}/machine-power?{urllib.parse.urlencode({'var-thing': first, 'range': '7d'})}")
    wait_for(lambda: _power_labels(browser) == {f"{first} vaPower_C11"}, 60, f"{first}'s power alone")
    assert browser.evaluate(REFRESH_TIMING_JS)["window_ms"] == 7 * 86_400_000
    for machine in sorted(ODD_MACHINES)[1:]:
        _pick(browser, "Machine", [machine])
        wait_for(lambda machine=machine: _power_labels(browser) == {f"{machine} vaPower_C11"}, 60,
                 f"{machine}'s power alone")
        assert _holds(browser.evaluate(PANEL_VALUES_JS), "Power per axis and machine", ODD_MACHINES[machine][0])
    _pick(browser, "Machine", [])  # All
    for name in RANGES:
        window_ms = duration_ms(name)
        _pick(browser, "Range", name)
        wait_for(lambda window_ms=window_ms: browser.evaluate(REFRESH_TIMING_JS)["window_ms"] == window_ms and
                 all(axis["end"] - axis["start"] == window_ms for axis in browser.evaluate(TIME_LABELS_JS)
                     if axis["own_range"] is False), 120, f"the page over the {name}")
        wait_for(lambda: _power_labels(browser) == {"R0815 vaPower_C11"} | {f"{machine} vaPower_C11"
                                                                           for machine in ODD_MACHINES}
                 if name != "5m" else True, 120, f"every machine's power over the {name}")
        for axis in browser.evaluate(TIME_LABELS_JS):
            labels = [label.split("\n")[0] for label in axis["labels"]]
            assert len(labels) >= 2 and len(set(labels)) == len(labels) and all(labels), (name, axis)


def test_the_open_page_refreshes_by_itself(browser: Chromium, server, database) -> None:
    _, base, _ = server
    _, client = database
    _open(browser, f"{base}/pipeline-health")
    wait_for(lambda: _holds(browser.evaluate(PANEL_VALUES_JS), "Lag by stage", 2500), 30, "the first lag")
    browser.evaluate("window.stillTheSamePage = true")  # gone if the page were loaded again
    assert not _holds(browser.evaluate(PANEL_VALUES_JS), "Lag by stage", 777)
    _write(client, HEALTH_POLICY, [_health("stream_connector", {"lag": 777, "records_in_per_s": 12.5},
                                           int(time.time() * 1000))])
    wait_for(lambda: _holds(browser.evaluate(PANEL_VALUES_JS), "Lag by stage", 777), 90,
             "the new stage's lag on the open page")
    assert _holds(browser.evaluate(PANEL_VALUES_JS), "Lag now, by stage", 777)
    assert browser.evaluate("window.stillTheSamePage === true")


def test_pages_closed_at_any_moment_leave_no_error(browser: Chromium, server) -> None:
    """Tabs opened and closed at once, while the page is built, while its first snapshot is on its way and later,
    under refreshes every 2 s: the server logs no error, and discards every closed page's session."""
    _, base, server_log = server
    before = len(_errors_in(server_log))
    closed_before = server_log.read_text().count("a page closed")
    _open(browser, f"{base}/pipeline-health")  # stays open: its refreshes show the server goes on
    delays_s = (0.0, 0.2, 0.6, 1.2, 2.5, 4.0)
    for index, delay_s in enumerate(delays_s):
        dashboard = DASHBOARDS[index % len(DASHBOARDS)]
        target = browser.call("Target.createTarget", url=f"{base}/{dashboard.uid}")["targetId"]
        time.sleep(delay_s)  # the moment of the close is what varies here, not a wait for anything
        browser.call("Target.closeTarget", targetId=target)
    # Bokeh discards a session a few seconds after its last connection went: then every callback of the closed pages
    # has met a destroyed document, or will find the session gone.
    closed = len(delays_s)
    wait_for(lambda: server_log.read_text().count("a page closed") - closed_before >= closed, 60,
             f"the {closed} closed pages' sessions to end")
    # Two refreshes of the page left open after that: the refreshes that were on their way for the closed pages,
    # queued before them, have ended too.
    taken_ms = browser.evaluate(REFRESH_TIMING_JS)["taken_ms"]
    for _ in range(2):
        wait_for(lambda: browser.evaluate(REFRESH_TIMING_JS)["taken_ms"] > taken_ms, 60, "the open page's refresh")
        taken_ms = browser.evaluate(REFRESH_TIMING_JS)["taken_ms"]
    assert _errors_in(server_log)[before:] == []


class SlowLink:
    """A TCP relay in front of InfluxDB that holds each answer back for `delay_s`: a slow network, the real InfluxDB
    behind it. Notes when it delivered each answer."""

    def __init__(self, upstream_port: int, delay_s: float) -> None:
        self.delay_s = delay_s
        self.delivered_at: list[float] = []  # time.time() of every answer passed on
        self._upstream_port = upstream_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed
                return
            upstream = socket.create_connection(("127.0.0.1", self._upstream_port))
            threading.Thread(target=self._pass, args=(client, upstream, 0.0), daemon=True).start()
            threading.Thread(target=self._pass, args=(upstream, client, self.delay_s), daemon=True).start()

    def _pass(self, source: socket.socket, target: socket.socket, delay_s: float) -> None:
        try:
            while data := source.recv(65536):
                if delay_s:
                    time.sleep(delay_s)  # the link's latency: this is the fault, not a wait
                    self.delivered_at.append(time.time())
                target.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, target):
                end.close()

    def close(self) -> None:
        self._listener.close()


def _logged_at(line: str) -> float:
    """The time of a log line ("2026-12-06 17:16:01,270 INFO ...")."""
    return time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S")) + int(line[20:23]) / 1000


def test_a_page_closed_while_influxdb_is_slow_to_answer_leaves_no_error(database, stack: ConnectionSettings,
                                                                         browser: Chromium, tmp_path: Path) -> None:
    """InfluxDB's answers 0.5 s late each: a page closed at once has its first refresh (its queries one after
    another, about 20 s) on its way when Bokeh destroys its document (7 s after the close at most: its unused
    sessions are checked every 2 s and last 5 s); the refresh, ending afterwards, leaves the document alone."""
    name, _ = database
    link = SlowLink(stack.influxdb_port, delay_s=0.5)
    log_path = tmp_path / "live_dashboards.log"
    process, base = _serve(name, log_path, "--influxdb-port", str(link.port))
    try:
        target = browser.call("Target.createTarget", url=f"{base}/pipeline-health")["targetId"]
        wait_for(lambda: "ServerConnection created" in log_path.read_text(), 60, "the page's connection")
        browser.call("Target.closeTarget", targetId=target)
        # The fault happened: the page's refresh ended after Bokeh had destroyed the page.
        wait_for(lambda: "a refresh ended after its page closed" in log_path.read_text(), 120,
                 "the closed page's refresh to end")
        lines = log_path.read_text().splitlines()
        assert min(_logged_at(line) for line in lines if "a page closed" in line) <= \
            min(_logged_at(line) for line in lines if "a refresh ended after its page closed" in line)
        assert terminate_process(process, "the live dashboards' server", 5) == 0
        assert _errors_in(log_path) == []
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)
        link.close()


def test_sigterm_ends_the_server_at_once_while_influxdb_hangs(tmp_path: Path, browser: Chromium) -> None:
    """An InfluxDB that accepts connections and never answers: a page open on it has its queries in flight when
    SIGTERM comes, and the server ends within 5 s anyway (its query threads are daemons)."""
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(16)  # the kernel completes the handshakes; nobody ever reads or answers
    log_path = tmp_path / "live_dashboards.log"
    process, base = _serve("machinedata", log_path, "--influxdb-port", str(hung.getsockname()[1]))
    try:
        browser.call("Page.navigate", url=f"{base}/machine-power")
        wait_for(lambda: browser.evaluate("typeof Bokeh !== 'undefined' && Bokeh.documents.length > 0"), 60,
                 "the page on the hung InfluxDB")
        # The fault happened: the server's queries reached the hung InfluxDB, and wait for an answer it never sends.
        hung.settimeout(30)
        connection, _ = hung.accept()
        assert terminate_process(process, "the live dashboards' server", 5) == 0, log_path.read_text()[-3000:]
        connection.close()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)
        hung.close()


def test_the_server_stops_cleanly_on_sigterm(server, browser: Chromium) -> None:
    process, _, server_log = server
    assert terminate_process(process, "the live dashboards' server", 30) == 0
    assert _errors_in(server_log) == []
