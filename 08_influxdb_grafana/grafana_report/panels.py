"""What a panel shows, apart from how it is drawn: its queries run over its own range, the series they return,
the colour of a value by the panel's thresholds and its unit's label. `make report` (matplotlib) and the live
dashboards (Bokeh) draw the same data from here, so the two cannot drift apart."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from pipeline_core.influx import InfluxDBClient

from .dashboards import Dashboard, Panel
from .macros import TimeRange, alias, duration_ms, interval_ms, substitute

GAP_MS = 60_000  # the dashboards' spanNulls: longer gaps break the line
UNIT_LABELS = {"watt": "W", "rotrpm": "rpm", "torque": "Nm", "percent": "%", "percentunit": "", "short": "",
               "bytes": "bytes", "s": "s"}
# Grafana's dashboards name their threshold colours; both drawings show them as these.
THRESHOLD_COLORS = {"green": "#2ca02c", "orange": "#ff7f0e", "red": "#d62728", "blue": "#1f77b4"}
DEFAULT_COLOR = THRESHOLD_COLORS["blue"]


@dataclass
class Series:
    label: str
    times_ms: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)
    rows: list[list[Any]] = field(default_factory=list)


def run_panel(client: InfluxDBClient, panel: Panel, time_range: TimeRange,
              variables: Mapping[str, Sequence[str]]) -> list[Series]:
    """Every series the panel's targets return (time in ms, first value column)."""
    series = []
    for target in panel.targets:
        result = client.query(substitute(target.query, time_range, variables, min_interval=panel.min_interval),
                              epoch="ms")
        for raw in result.raw.get("series", []):
            entry = Series(alias(target.alias, raw["name"], raw.get("tags") or {}), columns=raw["columns"],
                           rows=raw["values"])
            for row in raw["values"]:
                if row[1] is not None and isinstance(row[1], (int, float)):
                    entry.times_ms.append(row[0])
                    entry.values.append(float(row[1]))
            series.append(entry)
    return series


def panel_range(panel: Panel, time_range: TimeRange, now_ms: int | None = None) -> TimeRange:
    """The range a panel shows: its own relative one ("last 1h") where it has one, as Grafana does, else the
    dashboard's."""
    return TimeRange.last(panel.time_from, now_ms) if panel.time_from else time_range


def dashboard_window_ms(dashboard: Dashboard) -> int:
    """The length of the range a dashboard opens on ("now-14d" -> 14 days)."""
    start = dashboard.time.get("from", "now-14d")
    return duration_ms(start.removeprefix("now-")) if start.startswith("now-") else duration_ms("14d")


def panel_interval_ms(panel: Panel, time_range: TimeRange) -> int:
    """The GROUP BY interval Grafana picks for this panel over `time_range`."""
    return interval_ms(time_range, min_interval_ms=duration_ms(panel.min_interval) if panel.min_interval else 0)


def threshold_color(panel: Panel, value: float) -> str:
    """The colour of the highest threshold step `value` reaches (Grafana's absolute thresholds), as hex."""
    color = DEFAULT_COLOR
    for step in panel.config.get("thresholds", {}).get("steps", []):
        if step.get("value") is None or value >= step["value"]:
            color = THRESHOLD_COLORS.get(step["color"], step["color"])
    return color


def threshold_values(panel: Panel) -> list[float]:
    """The values where the panel's threshold steps start (the base step has none)."""
    return [step["value"] for step in panel.config.get("thresholds", {}).get("steps", [])
            if step.get("value") is not None]


def unit_label(panel: Panel) -> str:
    return UNIT_LABELS.get(panel.config.get("unit", ""), panel.config.get("unit", ""))


def with_gaps(entry: Series, gap_ms: int) -> tuple[list[int], list[float]]:
    """The points, with a NaN wherever data is missing for longer than `gap_ms` (Grafana's spanNulls): a line
    across a weekend without data would invent values."""
    times_ms: list[int] = []
    values: list[float] = []
    previous = None
    for time_ms, value in zip(entry.times_ms, entry.values):
        if previous is not None and time_ms - previous > gap_ms:
            times_ms.append(previous + 1)
            values.append(math.nan)
        times_ms.append(time_ms)
        values.append(value)
        previous = time_ms
    return times_ms, values


def short(value: float) -> str:
    """A count as Grafana's `short` unit shows it: 250k, 1.5M."""
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:g}{suffix}"
    return f"{value:g}"


def byte_size(value: float) -> str:
    """A byte count as Grafana's `bytes` unit shows it (SI prefixes)."""
    if abs(value) < 1000:
        return f"{value:,.0f} B"
    for unit in ("kB", "MB"):
        value /= 1000
        if abs(value) < 1000:
            return f"{value:,.1f} {unit}"
    return f"{value / 1000:,.1f} GB"


def cell_text(value: Any) -> str:
    """A table cell as Grafana shows it: an epoch-ms time as UTC date and time, long text cut."""
    if isinstance(value, int) and value > 10**11:
        return datetime.fromtimestamp(value / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    return str(value)[:70]
