"""What a panel shows, apart from how it is drawn: its queries run over its own range, the series they return,
the colour of a value by the panel's thresholds and its unit's label. `make report` (matplotlib) and the live
dashboards (Bokeh) draw the same data from here, so the two cannot drift apart."""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from pipeline_core.influx import InfluxDBClient

from .dashboards import Dashboard, Panel
from .macros import TimeRange, alias, duration_ms, interval_ms, substitute

GAP_MS = 60_000  # the dashboards' spanNulls: longer gaps break the line
UNIT_LABELS = {"watt": "W", "rotrpm": "rpm", "torque": "Nm", "percent": "%", "percentunit": "", "short": "",
               "bytes": "bytes", "s": "s", "cps": "/s"}
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

    def measure(self, calc: str) -> float:
        """A legend's calculation over the series (Grafana's calcs): mean, max, min, sum, lastNotNull."""
        if not self.values:
            return math.nan
        if calc == "mean":
            return sum(self.values) / len(self.values)
        if calc in ("sum", "total"):
            return sum(self.values)
        if calc == "max":
            return max(self.values)
        if calc == "min":
            return min(self.values)
        return self.values[-1]


# A legend's sortBy (the calc's display name in Grafana) -> the calc.
_SORT_CALCS = {"Mean": "mean", "Max": "max", "Min": "min", "Total": "sum", "Last *": "lastNotNull",
               "Last": "lastNotNull"}


def max_points(panel: Panel, width_px: int) -> int:
    """Points per series Grafana asks for: the panel's maxDataPoints, else its width in pixels."""
    return panel.max_data_points or max(width_px, 1)


def panel_step_ms(panel: Panel, time_range: TimeRange, width_px: int) -> int:
    """The $__interval Grafana gives this panel over `time_range` at `width_px`."""
    return interval_ms(time_range, max_points(panel, width_px),
                       duration_ms(panel.min_interval) if panel.min_interval else 0)


def run_panel(client: InfluxDBClient, panel: Panel, time_range: TimeRange, variables: Mapping[str, str],
              width_px: int) -> list[Series]:
    """Every series the panel's targets return, a value column each (time in ms), in the order of the panel's
    legend (its sortBy, largest first) where it has one. `variables`: each variable's text in queries."""
    step_ms = panel_step_ms(panel, time_range, width_px)
    series = []
    for target in panel.targets:
        query = substitute(target.query, time_range, variables, step_ms)
        for raw in client.query(query, epoch="ms").raw.get("series", []):
            series.extend(_split(target.alias, raw))
    calc = _SORT_CALCS.get(panel.legend.get("sortBy", ""))
    if calc:
        descending = panel.legend.get("sortDesc", True)
        series.sort(key=lambda entry: (math.isnan(entry.measure(calc)),
                                       -entry.measure(calc) if descending else entry.measure(calc)))
    return series


def _split(alias_template: str, raw: dict[str, Any]) -> list[Series]:
    """An InfluxDB series as Grafana reads it: a series per value column (`$col` in the alias names it, or the
    column's name is added where there are several); the rows kept whole for tables."""
    columns, rows = raw["columns"], raw["values"]
    tags = raw.get("tags") or {}
    several = len(columns) > 2
    split = []
    for index in range(1, len(columns)):
        label = alias(alias_template.replace("$col", columns[index]), raw["name"], tags)
        if several and "$col" not in alias_template:
            label = f"{label} {columns[index]}"
        entry = Series(label, columns=columns, rows=rows)
        for row in rows:
            value = row[index]
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                entry.times_ms.append(row[0])
                entry.values.append(float(value))
        split.append(entry)
    return split


def panel_range(panel: Panel, time_range: TimeRange, now_ms: int | None = None) -> TimeRange:
    """The range a panel shows: its own relative one ("last 1h") where it has one, as Grafana does, else the
    dashboard's."""
    return TimeRange.last(panel.time_from, now_ms) if panel.time_from else time_range


def dashboard_window_ms(dashboard: Dashboard) -> int:
    """The length of the range a dashboard opens on ("now-24h" -> 24 hours)."""
    start = dashboard.time.get("from", "now-24h")
    return duration_ms(start.removeprefix("now-")) if start.startswith("now-") else duration_ms("24h")


def no_value_text(panel: Panel) -> str:
    """What a panel shows when its queries answered and returned nothing: its noValue (zero, for counts: none
    counted is a count of 0), else Grafana's "No data"."""
    value = panel.config.get("noValue")
    return str(value) if value not in (None, "") else "No data"


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


def with_gaps(entry: Series, min_gap_ms: int) -> tuple[list[int], list[float]]:
    """The points, with a NaN wherever data is missing for longer than `min_gap_ms` and three times the series' own
    spacing (a history tier's hour apart are no gap): a line across a weekend without data would invent values."""
    spacings = sorted(later - earlier for earlier, later in zip(entry.times_ms, entry.times_ms[1:]) if later > earlier)
    gap_ms = max(min_gap_ms, 3 * spacings[len(spacings) // 2]) if spacings else min_gap_ms
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


def legend_value_text(panel: Panel, value: float) -> str:
    """A legend's calc as the panel's unit shows it, short."""
    if math.isnan(value):
        return "-"
    unit = panel.config.get("unit", "")
    if unit == "bytes":
        return byte_size(value)
    if unit == "percentunit":
        return f"{value:.0%}"
    return short(value) + ("" if unit in ("short", "") else f" {unit_label(panel)}")


def short(value: float) -> str:
    """A count as Grafana's `short` unit shows it: 250k, 1.5M."""
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:.4g}{suffix}"
    return f"{value:.4g}"


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
