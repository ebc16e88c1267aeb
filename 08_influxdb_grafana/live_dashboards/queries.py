"""The latest results of a dashboard's panels, shared by every page that shows it.

Each open page refreshes on its own timer, but InfluxDB is asked at most once per refresh interval and dashboard
whatever the number of pages: the first page due runs the queries, the others take its results. The queries run
in a worker thread, off the server's event loop, so a slow InfluxDB delays the numbers, never the pages."""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from pipeline_core.influx import InfluxDBClient

from grafana_report.dashboards import Dashboard
from grafana_report.macros import TimeRange, all_values
from grafana_report.panels import Series, dashboard_window_ms, panel_range, run_panel

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PanelResult:
    series: list[Series] = field(default_factory=list)
    time_range: TimeRange = TimeRange(0, 0)
    error: str | None = None  # why the panel's queries failed; its last series stay on the page


@dataclass(frozen=True)
class Snapshot:
    """Every panel's series at one moment (`taken_ms`), in the dashboard's panel order."""

    taken_ms: int
    panels: list[PanelResult]
    variables: dict[str, list[str]]
    error: str | None = None  # InfluxDB could not be asked at all


class DashboardQueries:
    """One dashboard's queries against InfluxDB, run at most once per `refresh_s`."""

    def __init__(self, dashboard: Dashboard, client: InfluxDBClient, refresh_s: float,
                 window_ms: int | None = None) -> None:
        self.dashboard = dashboard
        self.window_ms = window_ms or dashboard_window_ms(dashboard)
        # Used by one worker thread at a time (the lock below): requests' sessions are not thread-safe.
        self._client = client
        self._refresh_s = refresh_s
        self._lock = asyncio.Lock()
        self._latest: Snapshot | None = None
        self._failing = False

    @property
    def latest(self) -> Snapshot | None:
        return self._latest

    async def refreshed(self) -> Snapshot:
        """The latest snapshot, queried anew when it is a refresh interval old (or there is none)."""
        async with self._lock:
            # A page whose timer fires a little before the interval ends still gets a fresh snapshot, not one
            # almost an interval older than its refresh promises.
            due_ms = self._refresh_s * 1000 * 0.9
            if self._latest is None or time.time() * 1000 - self._latest.taken_ms >= due_ms:
                self._latest = await asyncio.get_running_loop().run_in_executor(None, self.query)
            return self._latest

    def query(self, now_ms: int | None = None) -> Snapshot:
        """Every panel's queries over the dashboard's range up to now (blocking)."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        time_range = TimeRange(now_ms - self.window_ms, now_ms)
        try:
            # Template variables set to "All", as the dashboards open; asked each time, so a new machine appears.
            variables = all_values(self._client, self.dashboard)
        except Exception as error:  # noqa: BLE001 - InfluxDB or the network failing: the page says so, goes on
            if not self._failing:
                log.warning("%s: InfluxDB does not answer (%s); the page keeps its last values and asks again "
                            "every refresh", self.dashboard.title, error)
            self._failing = True
            previous = self._latest
            return Snapshot(now_ms, previous.panels if previous else [], previous.variables if previous else {},
                            error=f"InfluxDB does not answer: {error}")
        if self._failing:
            log.info("%s: InfluxDB answers again", self.dashboard.title)
            self._failing = False
        results = []
        for panel in self.dashboard.panels:
            shown = panel_range(panel, time_range, now_ms)
            try:
                results.append(PanelResult(run_panel(self._client, panel, shown, variables), shown))
            except Exception as error:  # noqa: BLE001 - one panel's failing query (a policy missing) spares the others
                log.warning("%s / %s: query failed: %s", self.dashboard.title, panel.title, error)
                results.append(PanelResult([], shown, error=str(error)))
        return Snapshot(now_ms, results, variables)
