"""`python -m benchmarks.dashboards`: both dashboards at the size of a plant, with the pipeline running beside them.

A stack of its own (`python -m stack up` in a state dir and on ports of its own, the joiner of JOINER) gets a plant's
week (`benchmarks.plant`: 500 machines of 2 axes by default) in its InfluxDB, and the simulator streams the same
machines through the whole pipeline at `--pipeline-rate` rows/s (1,000: half of what the single stack carries end to
end with the Spark joiner, docs/scaling.md). Then, per dashboard and range:

* the live pages (`python -m live_dashboards`, in Debian's headless Chromium): the time from asking for the page to
  every panel drawn with its first data, and per refresh the time from the server starting it to the page showing
  it; beside each, the InfluxDB time it contains (the queries' waits added up, several run side by side);
* `make report` (`grafana_report`, in this process): the time to one dashboard's PNG, and its InfluxDB time.

For scale, in the same run: a plain query (one machine's power over its last 10 minutes), and the whole plant as the
dashboards used to ask for it (every machine's power over the range at 1-minute points). `--pipeline-rate 0` skips
the stack and fills a fresh database of the InfluxDB in the environment instead (the smoke run of `make test`).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import requests

from pipeline_core.influx import InfluxDBClient, influx_client
from pipeline_core.logs import configure_logging
from pipeline_core.settings import InfluxSettings, load_settings
from stack.processes import free_loopback_ports
from stack.topology import SINGLE_PORTS, private_ports

from grafana_report.dashboards import Dashboard, load_dashboards
from grafana_report.macros import TimeRange, duration_ms, resolve_variables
from grafana_report.render import render_dashboard

from benchmarks.plant import PlantSettings, expected_points, fill, plant_axes
from benchmarks.results import Results, at_most

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests"))  # the tests' DevTools driver of Chromium, the one browser code we have
from browser_support import Chromium  # noqa: E402

TARGET_S = 5.0
# Every refresh the page shows: when the server began it (its snapshot's time) and when the page had drawn it.
WATCH_JS = """(() => {
  window.benchShown = [];
  let last = null;
  const timing = () => {
    for (const doc of Bokeh.documents) for (const model of doc.all_models)
      if ((model.tags || [])[0] === "refresh-timing") return model.text;
    return null;
  };
  setInterval(() => {
    const text = typeof Bokeh === "undefined" ? null : timing();
    if (!text || text === "{}" || text === last) return;
    last = text;
    requestAnimationFrame(() => requestAnimationFrame(() =>
      window.benchShown.push({...JSON.parse(text), shown_ms: Date.now()})));
  }, 20);
})()"""


@dataclasses.dataclass
class Figures:
    """One dashboard at one range: seconds to the first render and per refresh, and the InfluxDB time in each."""

    first_s: float
    first_influx_s: float
    refresh_s: list[float] = dataclasses.field(default_factory=list)
    refresh_influx_s: list[float] = dataclasses.field(default_factory=list)


class TimedClient:
    """An InfluxDB client adding the time its queries take to a total several clients share."""

    def __init__(self, client: InfluxDBClient, total: list[float], lock: threading.Lock) -> None:
        self._client = client
        self._total = total
        self._lock = lock

    def query(self, *args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return self._client.query(*args, **kwargs)
        finally:
            with self._lock:
                self._total[0] += time.perf_counter() - began


@contextmanager
def pipeline_stack(joiner: str, port_range: str | None) -> Iterator[dict[str, str]]:
    """A whole stack of its own (servers and pipeline) on free ports (of `port_range`, "first-last", when given):
    its environment; deleted afterwards."""
    state_dir = Path(tempfile.mkdtemp(prefix="bench-dashboards-"))
    ports = private_ports(SINGLE_PORTS, port_range)
    env = {**os.environ, **{name: str(port) for name, port in ports.items()}, "TOPOLOGY": "single", "JOINER": joiner,
           "STACK_STATE_DIR": str(state_dir), "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{ports['KAFKA_PORT']}",
           "INFLUXDB_HOST": "127.0.0.1", "INFLUXDB_DATABASE": "machinedata"}

    def stack(*args: str) -> None:
        subprocess.run([sys.executable, "-m", "stack", *args], env=env, cwd=REPO_ROOT, check=True,
                       stdout=subprocess.DEVNULL, timeout=1200)

    try:
        began = time.monotonic()
        stack("up")
        print(f"stack up (JOINER={joiner}) in {time.monotonic() - began:.0f} s", flush=True)
        yield env
    finally:
        stack("clean")
        shutil.rmtree(state_dir, ignore_errors=True)


@contextmanager
def streaming(env: dict[str, str], plant: PlantSettings, rows_per_s: float) -> Iterator[subprocess.Popen]:
    """The simulator streaming the plant's machines at `rows_per_s` from now on, each machine's rows as far apart
    as that makes them."""
    interval_ms = max(1, round(1000 * plant.machines / rows_per_s))
    process = subprocess.Popen(
        [sys.executable, "-m", "simulator", "--synthetic", "--machines", str(plant.machines), "--axes", str(plant.axes),
         "--seed", str(plant.seed), "--rate", str(rows_per_s), "--interval-ms", str(interval_ms), "--ending-now",
         "--replay-log", "none", "--no-progress"], env=env, cwd=REPO_ROOT, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    try:
        yield process
    finally:
        process.terminate()
        process.wait(30)


def pipeline_rates(client: InfluxDBClient, window: str = "1m") -> tuple[float, float, float]:
    """What the pipeline's stages reported over the last `window` (their health points): rows/s the stream
    connector read, points/s the DB connector stored, and the DB connector's lag at its last report."""
    def mean(field: str, stage: str) -> float:
        points = list(client.query(
            f'SELECT sum("value") FROM (SELECT mean("{field}") AS "value" FROM "health"."pipeline_health" WHERE '
            f'"stage" = \'{stage}\' AND time > now() - {window} GROUP BY "instance")').get_points())
        return float(points[0]["sum"] or 0) if points else 0.0
    lag = list(client.query('SELECT last("lag") FROM "health"."pipeline_health" WHERE "stage" = \'db_connector\' '
                            f'AND time > now() - {window}').get_points())
    return (mean("records_in_per_s", "stream_connector"), mean("records_out_per_s", "db_connector"),
            float(lag[0]["last"] or 0) if lag else 0.0)


def plain_query_s(client: InfluxDBClient, thing: str, rounds: int = 5) -> float:
    """One machine's power over its last 10 minutes: the median of a few runs."""
    took = []
    for _ in range(rounds):
        began = time.perf_counter()
        client.query(f'SELECT mean("result") FROM "joined"."joined" WHERE "thing" = \'{thing}\' AND '
                     f'time > now() - 10m GROUP BY time(10s), "quantity"')
        took.append(time.perf_counter() - began)
    return statistics.median(took)


def whole_plant_s(settings: InfluxSettings, window: str, timeout_s: float = 600.0) -> tuple[float, int] | None:
    """Every machine's power over the range at 1-minute points, as the dashboards asked before: seconds, points; or
    None when InfluxDB gave no answer within `timeout_s`."""
    client = influx_client(settings, timeout_s=timeout_s)
    began = time.perf_counter()
    try:
        series = client.query(f'SELECT sum("sum") / sum("count") FROM "history"."joined_1m" WHERE time > now() - '
                              f'{window} GROUP BY time(1m), "thing", "quantity" fill(none)').raw.get("series", [])
    except (OSError, requests.RequestException):
        return None
    return time.perf_counter() - began, sum(len(entry["values"]) for entry in series)


def report_figures(settings: InfluxSettings, dashboard: Dashboard, window: str, out_dir: Path) -> Figures:
    """`make report`'s work for one dashboard: its variables, every panel's queries, the PNG."""
    spent, lock = [0.0], threading.Lock()

    def connect() -> TimedClient:
        return TimedClient(influx_client(settings), spent, lock)

    began = time.perf_counter()
    time_range = TimeRange.last(window)
    variables = resolve_variables(connect(), dashboard, time_range, connect=connect)  # type: ignore[arg-type]
    render_dashboard(connect, dashboard, time_range, variables, out_dir)  # type: ignore[arg-type]
    return Figures(time.perf_counter() - began, spent[0])


def live_figures(browser: Chromium, base: str, dashboard: Dashboard, window: str, refreshes: int,
                 refresh_s: float) -> Figures:
    """A page opened afresh at `window`: until every panel is drawn with its first data, then `refreshes` refreshes."""
    browser.call("Page.navigate", url="about:blank")
    began = time.time()
    browser.call("Page.navigate", url=f"{base}/{dashboard.uid}?range={window}")
    deadline = time.monotonic() + 300
    while not browser.evaluate("typeof Bokeh !== 'undefined' && Bokeh.documents.length > 0 && "
                               "document.readyState === 'complete'"):
        if time.monotonic() > deadline:
            raise SystemExit(f"{dashboard.uid}: no page after 300 s")
        time.sleep(0.02)
    browser.evaluate(WATCH_JS)
    wanted = 1 + refreshes
    deadline = time.monotonic() + 300 + refreshes * refresh_s * 3
    while len(shown := browser.evaluate("window.benchShown")) < wanted:
        if time.monotonic() > deadline:
            raise SystemExit(f"{dashboard.uid} over {window}: {len(shown)} of {wanted} refreshes after the deadline")
        time.sleep(0.1)
    first, *later = shown
    figures = Figures(first["shown_ms"] / 1000 - began, first["influx_ms"] / 1000)
    for refresh in later:
        figures.refresh_s.append((refresh["shown_ms"] - refresh["taken_ms"]) / 1000)
        figures.refresh_influx_s.append(refresh["influx_ms"] / 1000)
    return figures


@contextmanager
def live_server(settings: InfluxSettings, refresh_s: float, log_path: Path) -> Iterator[str]:
    (port,) = free_loopback_ports(1)
    env = {**os.environ, "INFLUXDB_HOST": settings.influxdb_host, "INFLUXDB_PORT": str(settings.influxdb_port),
           "INFLUXDB_DATABASE": settings.influxdb_database}
    with log_path.open("wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "live_dashboards", "--port", str(port), "--refresh-s",
                                    str(refresh_s)], env=env, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while b"Dashboards:" not in log_path.read_bytes():
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"live_dashboards did not start: {log_path.read_text()[-2000:]}")
            time.sleep(0.1)
        yield base
    finally:
        process.terminate()
        process.wait(30)


def _seconds(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} / {max(values):.2f}"


def measure(settings: InfluxSettings, plant: PlantSettings, windows: list[str], refreshes: int, refresh_s: float,
            work_dir: Path, recorded: Results, screenshots: Path | None = None) -> None:
    """Measure and print both dashboards at each range, and record the figures (`recorded`, written at the end)."""
    client = influx_client(settings)
    dashboards = load_dashboards()
    thing = plant_axes(plant)[0].thing
    print(f"plain query, one machine's power over its last 10 minutes: {plain_query_s(client, thing) * 1000:.0f} ms "
          "(median of 5)", flush=True)
    for window in windows:
        answer = whole_plant_s(settings, window)
        print(f"the whole plant without tiers, every machine's power over {window} at 1-minute points: "
              + (f"{answer[0]:.2f} s, {answer[1]:,} points" if answer else "no answer within 600 s"), flush=True)
    print(f"\n{'':<8}{'dashboard':<26}{'range':>6}{'first render s':>16}{'InfluxDB s':>12}"
          f"{'per refresh s (median / max)':>31}{'InfluxDB s':>14}   target {TARGET_S:g} s")
    rows = []
    with live_server(settings, refresh_s, work_dir / "live_dashboards.log") as base:
        browser = Chromium("about:blank", work_dir / "chromium", window=(1440, 1000))
        try:
            for window in windows:
                for dashboard in dashboards:
                    figures = live_figures(browser, base, dashboard, window, refreshes, refresh_s)
                    rows.append(("live", dashboard, window, figures))
                    _print_row("live", dashboard, window, figures)
                    if screenshots is not None and window == windows[0]:
                        screenshots.mkdir(parents=True, exist_ok=True)
                        browser.screenshot(screenshots / f"live-{dashboard.uid}.png")
        finally:
            browser.close()
    for window in windows:
        for dashboard in dashboards:
            figures = report_figures(settings, dashboard, window, work_dir / "reports")
            rows.append(("report", dashboard, window, figures))
            _print_row("report", dashboard, window, figures)
    worst = max(max([figures.first_s, *figures.refresh_s]) for *_rest, figures in rows)
    print(f"\nslowest first render or refresh: {worst:.2f} s (target {TARGET_S:g} s); load "
          f"{', '.join(f'{load:.1f}' for load in os.getloadavg())}")
    for kind, dashboard, window, figures in rows:
        _record(recorded, kind, dashboard, window, figures)
    recorded.add("slowest first render or refresh", worst, "s", at_most(TARGET_S))
    recorded.write()


def _record(recorded: Results, kind: str, dashboard: Dashboard, window: str, figures: Figures) -> None:
    """One dashboard's figures at one range: the first render (a live page drawn; the report's PNG) and, of a live
    page, the median refresh, each with the InfluxDB time inside it. A time too short for the clock is left out."""
    name = f"{kind}, {dashboard.title}, {window}"
    times = [(f"{name}: first render", figures.first_s), (f"{name}: InfluxDB time in the first render",
                                                           figures.first_influx_s)]
    if figures.refresh_s:
        times.append((f"{name}: per refresh, median", statistics.median(figures.refresh_s)))
    if figures.refresh_influx_s:
        times.append((f"{name}: InfluxDB time per refresh, median", statistics.median(figures.refresh_influx_s)))
    for figure, seconds in times:
        if seconds > 0:
            recorded.add(figure, seconds, "s", at_most(TARGET_S) if "InfluxDB" not in figure else None)


def _print_row(kind: str, dashboard: Dashboard, window: str, figures: Figures) -> None:
    print(f"{kind:<8}{dashboard.title[:25]:<26}{window:>6}{figures.first_s:>16.2f}{figures.first_influx_s:>12.2f}"
          f"{_seconds(figures.refresh_s):>31}{_seconds(figures.refresh_influx_s):>14}", flush=True)


def fill_plant(plant: PlantSettings) -> None:
    total = expected_points(plant, plant.machines * plant.axes)
    print(f"filling {plant.influxdb_database}: {plant.machines} machines x {plant.axes} axes, {plant.days:g} days, "
          f"{min(plant.clock_faulty_machines, plant.machines)} with clock faults (about {total:,} points) ...", flush=True)
    began = time.monotonic()
    from tqdm import tqdm  # noqa: PLC0415 - the progress bar of this step only
    with tqdm(total=total, unit=" points", unit_scale=True, disable=not plant.progress, file=sys.stderr) as bar:
        written = fill(plant, progress=bar.update)
    took = time.monotonic() - began
    print(f"plant filled: {written:,} points in {took:.0f} s ({written / max(took, 1e-9):,.0f} points/s)", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dashboards", description=__doc__.splitlines()[0])
    parser.add_argument("--machines", type=int, default=500)
    parser.add_argument("--axes", type=int, default=2)
    parser.add_argument("--days", type=float, default=7.0, help="days of the plant's history")
    parser.add_argument("--minute-history-h", type=float, default=24.0, help="hours of its 1-minute history")
    parser.add_argument("--raw-minutes", type=float, default=10.0, help="minutes of its raw points")
    parser.add_argument("--clock-faulty-machines", type=int, default=25,
                        help="machines with clock counters over the last day (the clock faults panel)")
    parser.add_argument("--pipeline-rate", type=float, default=1000.0,
                        help="rows/s the simulator streams through the pipeline beside the dashboards (0: no stack; "
                             "a fresh database of the InfluxDB in the environment)")
    parser.add_argument("--joiner", choices=("spark", "lsb"), default=os.environ.get("JOINER", "spark"))
    parser.add_argument("--warmup-s", type=float, default=60.0, help="seconds the pipeline streams before measuring")
    parser.add_argument("--ranges", default="24h,7d", help="the dashboards' ranges to measure, comma-separated")
    parser.add_argument("--refreshes", type=int, default=3, help="refreshes measured per page")
    parser.add_argument("--refresh-s", type=float, default=5.0, help="the live pages' refresh interval")
    parser.add_argument("--database", default=None,
                        help="with --pipeline-rate 0: a database `python -m benchmarks.plant` filled with the same "
                             "plant, measured as it is (neither filled nor dropped)")
    parser.add_argument("--screenshots", type=Path, default=None,
                        help="a folder for a picture of each live page at the first range")
    parser.add_argument("--ports", default=os.environ.get("BENCH_PORTS"),
                        help="first-last: the stack's ports from this range (default: any free ones)")
    args = parser.parse_args(argv)
    configure_logging("WARNING")
    recorded = Results("dashboards", argv)
    windows = [window.strip() for window in args.ranges.split(",") if window.strip()]
    for window in windows:
        duration_ms(window)  # a typo stops here, not after the fill
    with tempfile.TemporaryDirectory(prefix="bench-dashboards-") as work:
        work_dir = Path(work)
        shape = {"machines": args.machines, "axes": args.axes, "days": args.days,
                 "minute_history_h": args.minute_history_h, "raw_minutes": args.raw_minutes,
                 "clock_faulty_machines": args.clock_faulty_machines,
                 "progress": sys.stderr.isatty()}
        if args.pipeline_rate <= 0:
            settings = dataclasses.replace(load_settings(InfluxSettings, []), influxdb_database=(
                args.database or f"bench_dashboards_{uuid.uuid4().hex[:8]}"))
            plant = PlantSettings(**{**dataclasses.asdict(settings), **shape})
            try:
                if args.database:
                    print(f"the plant of {args.database} as `python -m benchmarks.plant` filled it", flush=True)
                else:
                    fill_plant(plant)
                print("no pipeline beside (--pipeline-rate 0)", flush=True)
                measure(settings, plant, windows, args.refreshes, args.refresh_s, work_dir, recorded,
                        args.screenshots)
            finally:
                if not args.database:
                    influx_client(settings).drop_database(settings.influxdb_database)
            return 0
        with pipeline_stack(args.joiner, args.ports) as env:
            settings = load_settings(InfluxSettings, [], environ=env)
            plant = PlantSettings(**{**dataclasses.asdict(settings), **shape})
            fill_plant(plant)
            with streaming(env, plant, args.pipeline_rate) as simulator:
                deadline = time.monotonic() + args.warmup_s
                while time.monotonic() < deadline:
                    if simulator.poll() is not None:
                        raise SystemExit(f"the simulator exited with {simulator.returncode}")
                    time.sleep(1)
                rows_in, stored, lag = pipeline_rates(influx_client(settings))
                print(f"pipeline beside: the simulator at {args.pipeline_rate:,.0f} rows/s; over the last minute the "
                      f"stream connector read {rows_in:,.0f} rows/s and the DB connector stored {stored:,.0f} "
                      f"points/s, {lag:,.0f} records behind (JOINER={args.joiner})", flush=True)
                measure(settings, plant, windows, args.refreshes, args.refresh_s, work_dir, recorded,
                        args.screenshots)
    return 0


if __name__ == "__main__":
    sys.exit(main())
