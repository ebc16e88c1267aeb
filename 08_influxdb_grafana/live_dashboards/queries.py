"""The latest results of a dashboard's panels for a choice of range and variables, shared by every page that shows
that choice.

Each open page refreshes on its own timer, but InfluxDB is asked at most once per refresh interval and choice,
whatever the number of pages: the first page due runs the queries, the others with the same choice take its results.
The queries run in daemon worker threads (`QueryThreads`), a few at a time, off the server's event loop: a slow
InfluxDB delays the numbers, never the pages, and a query in flight never holds the server's exit up."""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from pipeline_core.influx import InfluxDBClient

from grafana_report.dashboards import Dashboard, Panel
from grafana_report.macros import Selection, TimeRange, query_texts, resolve_variables
from grafana_report.panels import Series, panel_range, panel_step_ms, run_panel

log = logging.getLogger(__name__)
T = TypeVar("T")
# Snapshots kept per dashboard: one per choice on the open pages, the oldest dropped beyond.
KEPT_CHOICES = 16


class QueryThreads(Executor):
    """A few daemon threads, each with an InfluxDB client of its own (the client's HTTP session is not
    thread-safe): InfluxDB answers two or three queries at once about as fast as one, and a page's panels are
    asked side by side. Daemon threads: a query in flight when the server stops dies with it."""

    def __init__(self, make_client: Callable[[], InfluxDBClient], threads: int) -> None:
        self._work: queue.SimpleQueue[tuple[Future, Callable[[], Any]] | None] = queue.SimpleQueue()
        self._make_client = make_client
        self._local = threading.local()
        self._spare_clients: queue.SimpleQueue[InfluxDBClient] = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._run, name=f"influxdb-query-{index}", daemon=True)
                         for index in range(threads)]
        for thread in self._threads:
            thread.start()

    def client(self) -> InfluxDBClient:
        """This worker thread's client."""
        if not hasattr(self._local, "client"):
            self._local.client = self._make_client()
        return self._local.client

    def lend_client(self) -> InfluxDBClient:
        """A client of the caller's alone until it gives it back (`give_back`): one kept from before, else a new one."""
        try:
            return self._spare_clients.get_nowait()
        except queue.Empty:
            return self._make_client()

    def give_back(self, client: InfluxDBClient) -> None:
        self._spare_clients.put(client)

    def _run(self) -> None:
        while (item := self._work.get()) is not None:
            future, call = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(call())
                except BaseException as error:  # noqa: BLE001 - handed to whoever awaits the future
                    future.set_exception(error)

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        self._work.put((future, partial(fn, *args, **kwargs)))
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        for _ in self._threads:
            self._work.put(None)
        if wait:
            for thread in self._threads:
                thread.join()


@dataclass(frozen=True)
class Choice:
    """What a page asks for: a range up to now and the values picked per variable (absent: the dashboard's own)."""

    window_ms: int
    picked: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @property
    def chosen(self) -> dict[str, list[str]]:
        return {name: list(values) for name, values in self.picked}


@dataclass(frozen=True)
class PanelResult:
    series: list[Series] = field(default_factory=list)
    time_range: TimeRange = TimeRange(0, 0)
    step_ms: int = 0
    error: str | None = None  # why the panel's queries failed; its last series stay on the page


@dataclass(frozen=True)
class Snapshot:
    """Every panel's series at one moment (`taken_ms`), in the dashboard's panel order, with the variables' values;
    what it cost: `took_ms` from asking to answered, `influx_ms` of it spent waiting for InfluxDB (added up over
    queries run side by side)."""

    taken_ms: int
    panels: list[PanelResult]
    variables: dict[str, Selection]
    took_ms: float = 0.0
    influx_ms: float = 0.0
    error: str | None = None  # InfluxDB could not be asked at all


class TimedClient:
    """An InfluxDB client's `query`, counting the time spent in it."""

    def __init__(self, client: InfluxDBClient) -> None:
        self._client = client
        self.spent_s = 0.0

    def query(self, *args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return self._client.query(*args, **kwargs)
        finally:
            self.spent_s += time.perf_counter() - began


class DashboardQueries:
    """One dashboard's queries against InfluxDB, run at most once per `refresh_s` and choice."""

    def __init__(self, dashboard: Dashboard, threads: QueryThreads, refresh_s: float, panel_width_px: Sequence[int]
                 ) -> None:
        self.dashboard = dashboard
        self._threads = threads
        self._refresh_s = refresh_s
        self._width_px = list(panel_width_px)  # each panel's plot width: Grafana's maxDataPoints default
        self._latest: dict[Choice, Snapshot] = {}
        self._running: dict[Choice, asyncio.Future[Snapshot]] = {}
        self._failing = False

    def latest(self, choice: Choice) -> Snapshot | None:
        return self._latest.get(choice)

    async def refreshed(self, choice: Choice) -> Snapshot:
        """The latest snapshot of `choice`, queried anew when it is a refresh interval old (or there is none); pages
        asking meanwhile await the same queries."""
        running = self._running.get(choice)
        if running is None:
            latest = self._latest.get(choice)
            # A page whose timer fires a little before the interval ends still gets a fresh snapshot, not one
            # almost an interval older than its refresh promises.
            if latest is not None and time.time() * 1000 - latest.taken_ms < self._refresh_s * 1000 * 0.9:
                return latest
            running = asyncio.ensure_future(self._query(choice))
            self._running[choice] = running
            running.add_done_callback(lambda _done: self._running.pop(choice, None))
        return await asyncio.shield(running)

    async def _query(self, choice: Choice) -> Snapshot:
        snapshot = await self.query(choice)
        self._latest.pop(choice, None)
        self._latest[choice] = snapshot
        while len(self._latest) > KEPT_CHOICES:
            self._latest.pop(next(iter(self._latest)))
        return snapshot

    async def query(self, choice: Choice, now_ms: int | None = None) -> Snapshot:
        """Every panel's queries over the choice's range up to now: the variables first (the Top machines depend on
        the range), then the panels side by side in the worker threads."""
        loop = asyncio.get_running_loop()
        began = time.perf_counter()
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        time_range = TimeRange(now_ms - choice.window_ms, now_ms)
        previous = self._latest.get(choice)
        try:
            variables, variables_s = await loop.run_in_executor(self._threads, self._variables, time_range, choice)
        except Exception as error:  # noqa: BLE001 - InfluxDB or the network failing: the page says so, goes on
            if not self._failing:
                log.warning("%s: InfluxDB does not answer (%s); the pages keep their last values and ask again "
                            "every refresh", self.dashboard.title, error)
            self._failing = True
            return Snapshot(now_ms, previous.panels if previous else [], previous.variables if previous else {},
                            error=f"InfluxDB does not answer: {error}")
        if self._failing:
            log.info("%s: InfluxDB answers again", self.dashboard.title)
            self._failing = False
        texts = query_texts(self.dashboard, variables)
        answers = await asyncio.gather(*(
            loop.run_in_executor(self._threads, self._panel, panel, panel_range(panel, time_range, now_ms), texts,
                                 width_px)
            for panel, width_px in zip(self.dashboard.panels, self._width_px)))
        return Snapshot(now_ms, [result for result, _spent in answers], variables,
                        took_ms=(time.perf_counter() - began) * 1000,
                        influx_ms=(variables_s + sum(spent for _result, spent in answers)) * 1000)

    def _variables(self, time_range: TimeRange, choice: Choice) -> tuple[dict[str, Selection], float]:
        """The variables, those that do not use each other side by side (each beyond the first on a client lent for
        this resolution: the other worker threads may be busy with other pages)."""
        clients = [TimedClient(self._threads.client())]
        lent: list[InfluxDBClient] = []

        def connect() -> TimedClient:
            lent.append(self._threads.lend_client())
            clients.append(TimedClient(lent[-1]))
            return clients[-1]

        try:
            variables = resolve_variables(clients[0], self.dashboard, time_range,  # type: ignore[arg-type]
                                          choice.chosen, connect=connect)  # type: ignore[arg-type]
        finally:
            for client in lent:
                self._threads.give_back(client)
        return variables, sum(client.spent_s for client in clients)

    def _panel(self, panel: Panel, shown: TimeRange, texts: Mapping[str, str], width_px: int
               ) -> tuple[PanelResult, float]:
        client = TimedClient(self._threads.client())
        step_ms = panel_step_ms(panel, shown, width_px)
        try:
            series = run_panel(client, panel, shown, texts, width_px)  # type: ignore[arg-type]
            return PanelResult(series, shown, step_ms), client.spent_s
        except Exception as error:  # noqa: BLE001 - one panel's failing query (a policy missing) spares the others
            log.warning("%s / %s: query failed: %s", self.dashboard.title, panel.title, error)
            return PanelResult([], shown, step_ms, error=str(error)), client.spent_s
