"""A dashboard to one PNG: its panels laid out on Grafana's grid, each drawn from its own queries."""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers and in tests

import matplotlib.dates as mdates  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, PercentFormatter  # noqa: E402

from pipeline_core.influx import InfluxDBClient  # noqa: E402

from .dashboards import Dashboard, Panel  # noqa: E402
from .macros import TimeRange  # noqa: E402
from .panels import (GAP_MS, Series, byte_size, cell_text, panel_interval_ms, panel_range, run_panel,  # noqa: E402
                     short, threshold_color, unit_label, with_gaps)

log = logging.getLogger(__name__)

GRID_COLUMNS = 24
ROW_HEIGHT_IN = 0.32  # one Grafana grid row (30 px) on the page
PAGE_WIDTH_IN = 16.0


def plain(text: str) -> str:
    """Text matplotlib draws as it is: a label with two dollar signs would be read as math (a machine named
    ``$\\frac$`` failed the whole panel), so each is escaped, which matplotlib undoes in plain text."""
    return text.replace("$", r"\$")


def draw_panel(ax: plt.Axes, panel: Panel, series: list[Series], time_range: TimeRange) -> None:
    ax.set_title(panel.title + (f"  (last {panel.time_from})" if panel.time_from else ""), fontsize=10, loc="left")
    if not any(s.values or s.rows for s in series):
        ax.text(0.5, 0.5, "No data", ha="center", va="center", fontsize=12, color="grey", transform=ax.transAxes)
        ax.set_axis_off()
        return
    if panel.type == "timeseries":
        lines = []
        for entry in series:
            times_ms, values = with_gaps(entry, max(GAP_MS, 3 * panel_interval_ms(panel, time_range)))
            times = [datetime.fromtimestamp(time_ms / 1000, tz=timezone.utc) for time_ms in times_ms]
            lines += ax.plot(times, values, linewidth=0.8, marker="o" if len(entry.values) < 20 else None, markersize=3)
        start_ms = time_range.start_ms
        if panel.time_from:
            # A panel over the last hour (or week) of a stack started within it: the axis starts at its first
            # point, where Grafana would leave the time before it empty.
            first_ms = min((entry.times_ms[0] for entry in series if entry.times_ms), default=start_ms)
            start_ms = max(start_ms, first_ms - (time_range.end_ms - first_ms) // 20)
        ax.set_xlim(datetime.fromtimestamp(start_ms / 1000, tz=timezone.utc),
                    datetime.fromtimestamp(time_range.end_ms / 1000, tz=timezone.utc))
        within_a_day = time_range.end_ms - start_ms <= 86_400_000
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M" if within_a_day else "%m-%d %H:%M"))
        # As many time labels as the panel's width holds without running into each other; whole minutes from
        # three on (the default's five gave a few minutes of data a label every 30 s, each minute twice).
        locator = mdates.AutoDateLocator(minticks=3, maxticks=max(4, panel.grid["w"] // 2))
        locator.intervald[mdates.MINUTELY] = [1, 2, 5, 10, 15, 30]  # a narrow panel over minutes: every 2
        ax.xaxis.set_major_locator(locator)
        ax.tick_params(labelsize=7)
        ax.set_ylabel(unit_label(panel), fontsize=8)
        if panel.config.get("min") is not None:
            ax.set_ylim(bottom=panel.config["min"])
        if panel.config.get("unit") == "bytes":
            ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _position: byte_size(value)))
            ax.set_ylabel("")
        elif panel.config.get("unit") == "short":
            ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _position: short(value)))
        elif panel.config.get("unit") == "percentunit":  # a share of 1, shown as Grafana does: 17.5%
            ax.yaxis.set_major_formatter(PercentFormatter(xmax=1, decimals=0))
        ax.grid(alpha=0.3)
        if len(series) <= 12:
            # Headroom above the data for the legend, so it covers no line.
            bottom, top = ax.get_ylim()
            ax.set_ylim(bottom, top + (top - bottom) * 0.08 * (1 + (len(series) - 1) // 3))
            # Labels given, not taken from the lines: matplotlib leaves out a line whose label starts with "_".
            ax.legend(lines, [plain(entry.label) for entry in series], fontsize=6, loc="upper right",
                      ncol=min(3, len(series)))
    elif panel.type == "gauge":
        labels = [plain(entry.label) for entry in series]
        values = [entry.values[-1] if entry.values else 0.0 for entry in series]
        ax.barh(labels, values, color=[threshold_color(panel, v) for v in values])
        ax.set_xlim(panel.config.get("min", 0), panel.config.get("max", max(values) * 1.1 or 1))
        for step in panel.config.get("thresholds", {}).get("steps", []):
            if step.get("value") is not None:
                ax.axvline(step["value"], color="grey", linestyle="--", linewidth=0.8)
        for index, value in enumerate(values):
            ax.text(value, index, f" {value:.1f} {unit_label(panel)}", va="center", fontsize=8)
        ax.tick_params(labelsize=8)
    elif panel.type == "bargauge":
        # As Grafana draws a horizontal bar gauge: one bar per series, top down, its name above it.
        values = [entry.values[-1] if entry.values else 0.0 for entry in series]
        top = panel.config.get("max", max(values) * 1.25 or 1)
        decimals = panel.config.get("decimals", 1)
        for index, (entry, value) in enumerate(zip(series, values)):
            ax.barh(index, top, height=0.45, color="0.93")
            ax.barh(index, min(value, top), height=0.45, color=threshold_color(panel, value))
            ax.text(0, index - 0.3, plain(entry.label), va="bottom", ha="left", fontsize=8)
            ax.text(top, index - 0.3, f"{value:,.{decimals}f} {unit_label(panel)}".strip(), va="bottom",
                    ha="right", fontsize=9, color=threshold_color(panel, value))
        ax.set_xlim(panel.config.get("min", 0), top)
        ax.set_ylim(len(values) - 0.5, -0.9)
        ax.set_axis_off()
    elif panel.type == "piechart":
        labels = [plain(entry.label) for entry in series]
        values = [sum(entry.values) for entry in series]
        ax.pie(values, labels=[f"{label} ({value:,.0f})" for label, value in zip(labels, values)],
               autopct="%1.0f%%", wedgeprops={"width": 0.45}, textprops={"fontsize": 7})
        ax.axis("equal")
    elif panel.type == "stat":
        value = sum(entry.values[-1] for entry in series if entry.values)
        ax.text(0.5, 0.45, f"{value:,.0f}", ha="center", va="center", fontsize=22,
                color=threshold_color(panel, value), transform=ax.transAxes)
        ax.set_axis_off()
    elif panel.type == "table":
        entry = series[0]
        rows = [[plain(cell_text(value)) for value in row] for row in entry.rows[:8]]
        widths = [0.2 if column in ("time", "stage") else 0.6 for column in entry.columns]
        table = ax.table(cellText=rows, colLabels=entry.columns, loc="upper center", cellLoc="left",
                         colWidths=widths)
        table.auto_set_font_size(False)
        table.set_fontsize(6)
        ax.set_axis_off()
    else:
        ax.text(0.5, 0.5, f"panel type {panel.type!r} is not rendered", ha="center", va="center",
                transform=ax.transAxes)
        ax.set_axis_off()


def render_dashboard(client: InfluxDBClient, dashboard: Dashboard, time_range: TimeRange,
                     variables: Mapping[str, Sequence[str]], out_dir: Path) -> Path:
    """Draw every panel where Grafana places it and save `<out_dir>/<uid>.png`."""
    rows = max(panel.grid["y"] + panel.grid["h"] for panel in dashboard.panels)
    height = rows * ROW_HEIGHT_IN + 0.6
    figure = plt.figure(figsize=(PAGE_WIDTH_IN, height), dpi=80)
    start = datetime.fromtimestamp(time_range.start_ms / 1000, tz=timezone.utc)
    end = datetime.fromtimestamp(time_range.end_ms / 1000, tz=timezone.utc)
    figure.suptitle(f"{dashboard.title}   {start:%Y-%m-%d %H:%M} – {end:%Y-%m-%d %H:%M} UTC",
                    x=0.01, ha="left", fontsize=13, y=1 - 0.15 / height)
    top = 1 - 0.6 / height
    for panel in dashboard.panels:
        grid = panel.grid
        shown = panel_range(panel, time_range)
        # Margins inside each cell for titles, tick labels and legends.
        left = grid["x"] / GRID_COLUMNS + 0.045
        width = grid["w"] / GRID_COLUMNS - 0.07
        bottom = top - (grid["y"] + grid["h"]) * ROW_HEIGHT_IN / height + 0.45 / height
        cell_height = grid["h"] * ROW_HEIGHT_IN / height - 0.85 / height
        ax = figure.add_axes((left, bottom, width, cell_height))
        draw_panel(ax, panel, run_panel(client, panel, shown, variables), shown)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{dashboard.uid}.png"
    figure.savefig(target)
    plt.close(figure)
    return target
