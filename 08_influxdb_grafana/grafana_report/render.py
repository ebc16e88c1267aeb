"""A dashboard to one PNG: its panels laid out on Grafana's grid, each drawn from its own queries."""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers and in tests

import matplotlib.dates as mdates  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, PercentFormatter  # noqa: E402

from pipeline_core.influx import InfluxDBClient  # noqa: E402

from .dashboards import Dashboard, Panel  # noqa: E402
from .macros import Selection, TimeRange, query_texts  # noqa: E402
from .panels import (GAP_MS, Series, byte_size, cell_text, legend_value_text, no_value_text,  # noqa: E402
                     panel_range, panel_step_ms, run_panel, short, threshold_color, unit_label, with_gaps)

log = logging.getLogger(__name__)

GRID_COLUMNS = 24
QUERY_THREADS = 3  # InfluxDB's two cores, and one query in flight while it parses the next
ROW_HEIGHT_IN = 0.32  # one Grafana grid row (30 px) on the page
PAGE_WIDTH_IN = 16.0
DPI = 80
LEGEND_ROW_IN = 0.13  # one legend row of 6-point text
# Time labels by the spacing of the ticks (matplotlib's ConciseDateFormatter levels: years, months, days, hours,
# minutes, seconds): a label names what changes from tick to tick, down to the second, and the date is written once
# beside the axis. Ticks a minute or less apart carry their seconds, so no two labels are alike.
TICK_FORMATS = ["%Y", "%b %d", "%b %d", "%H:%M", "%H:%M", "%H:%M:%S"]
ZERO_FORMATS = ["", "%Y", "%b %d", "%b %d", "%H:%M", "%H:%M"]
OFFSET_FORMATS = ["", "%Y", "%Y-%m", "%Y-%m-%d", "%Y-%m-%d", "%Y-%m-%d %H:%M"]
DAY_MS = 86_400_000
_CALC_NAMES = {"mean": "Mean", "max": "Max", "min": "Min", "sum": "Total", "lastNotNull": "Last"}


def plain(text: str) -> str:
    """Text matplotlib draws as it is: a label with two dollar signs would be read as math (a machine named
    ``$\\frac$`` failed the whole panel), so each is escaped, which matplotlib undoes in plain text."""
    return text.replace("$", r"\$")


def _utc(time_ms: int) -> datetime:
    return datetime.fromtimestamp(time_ms / 1000, tz=timezone.utc)


def time_axis(ax: plt.Axes, start_ms: int, end_ms: int, width_columns: int) -> None:
    """An x axis over [start_ms, end_ms] whose labels are distinct and readable, from a minute to weeks: as many as
    the panel's width (Grafana columns) holds."""
    ax.set_xlim(_utc(start_ms), _utc(end_ms))
    locator = mdates.AutoDateLocator(tz=timezone.utc, minticks=3, maxticks=max(5, width_columns // 2))
    locator.intervald[mdates.SECONDLY] = [1, 2, 5, 10, 15, 30]
    locator.intervald[mdates.MINUTELY] = [1, 2, 5, 10, 15, 30]
    locator.intervald[mdates.HOURLY] = [1, 2, 3, 6, 12]
    locator.intervald[mdates.DAILY] = [1, 2, 3, 4, 5, 7, 14]
    ax.xaxis.set_major_locator(locator)
    formats = list(TICK_FORMATS)
    if end_ms - start_ms > DAY_MS:  # hours of several days: "12:00" would stand for each of them
        formats[3] = "%b %d %H:%M"
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=timezone.utc, formats=formats,
                                                             zero_formats=ZERO_FORMATS,
                                                             offset_formats=OFFSET_FORMATS))


def _legend(ax: plt.Axes, panel: Panel, series: list[Series], colors: list[str]) -> None:
    """Grafana's legend as a table, inside its own box: a row per series in the panel's order (largest first by
    its sortBy), the panel's calcs as columns; what does not fit is counted in a last row."""
    ax.set_axis_off()
    calcs = panel.legend.get("calcs", [])
    height_in = ax.get_position().height * ax.figure.get_figheight()
    width_chars = int(ax.get_position().width * ax.figure.get_figwidth() * 72 / 3.7) - 3  # 6-point monospace
    drawn = [(entry, color) for entry, color in zip(series, colors) if entry.values]
    label_chars = min(max(8, width_chars - 12 * len(calcs)), max((len(entry.label) for entry, _ in drawn), default=8))
    fits = max(1, int(height_in / LEGEND_ROW_IN + 1e-6) - 1)  # a header's row above the series' rows
    shown = drawn if len(drawn) <= fits else drawn[:fits - 1]
    step = LEGEND_ROW_IN / height_in

    def row(y: float, label: str, cells: list[str], color: str = "black") -> None:
        label = label if len(label) <= label_chars else label[:label_chars - 1] + "…"
        text = f"{label:<{label_chars}}" + "".join(f" {cell:>11}" for cell in cells)
        ax.text(0.05, y, plain(text), transform=ax.transAxes, fontsize=6, va="top", ha="left", family="monospace",
                color=color)

    row(1.0, "", [_CALC_NAMES.get(calc, calc) for calc in calcs], "grey")
    for index, (entry, color) in enumerate(shown):
        y = 1.0 - (index + 1) * step
        ax.plot([0.0, 0.04], [y - step / 2, y - step / 2], transform=ax.transAxes, color=color, linewidth=2,
                clip_on=False)
        row(y, entry.label, [legend_value_text(panel, entry.measure(calc)) for calc in calcs])
    if len(shown) < len(drawn):
        row(1.0 - (len(shown) + 1) * step, f"and {len(drawn) - len(shown)} more", [], "grey")


def draw_panel(ax: plt.Axes, panel: Panel, series: list[Series], time_range: TimeRange, step_ms: int,
               legend_ax: plt.Axes | None = None) -> None:
    ax.set_title(panel.title + (f"  (last {panel.time_from})" if panel.time_from else ""), fontsize=10, loc="left")
    if not any(s.values or s.rows for s in series):
        text = no_value_text(panel)
        ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=22 if text == "0" else 12,
                color="grey" if text == "No data" else "black", transform=ax.transAxes)
        ax.set_axis_off()
        if legend_ax is not None:
            legend_ax.set_axis_off()
        return
    if panel.type == "timeseries":
        colors = [plt.get_cmap("tab10" if len(series) <= 10 else "tab20")(index % 20) for index in range(len(series))]
        for entry, color in zip(series, colors):
            times_ms, values = with_gaps(entry, max(GAP_MS, 3 * step_ms))
            ax.plot([_utc(time_ms) for time_ms in times_ms], values, linewidth=0.8, color=color,
                    marker="o" if len(entry.values) < 20 else None, markersize=3)
        start_ms = time_range.start_ms
        if panel.time_from:
            # A panel over the last hour (or week) of a stack started within it: the axis starts at its first
            # point, where Grafana would leave the time before it empty.
            first_ms = min((entry.times_ms[0] for entry in series if entry.times_ms), default=start_ms)
            start_ms = max(start_ms, first_ms - (time_range.end_ms - first_ms) // 20)
        time_axis(ax, start_ms, time_range.end_ms, panel.grid["w"])
        ax.tick_params(labelsize=7)
        ax.xaxis.get_offset_text().set_fontsize(7)
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
        if legend_ax is not None:
            _legend(legend_ax, panel, series, colors)
    elif panel.type == "gauge":
        labels = [plain(entry.label) for entry in series]
        values = [entry.values[-1] if entry.values else 0.0 for entry in series]
        ax.barh(labels, values, color=[threshold_color(panel, v) for v in values])
        ax.invert_yaxis()  # the first series on top
        ax.set_xlim(panel.config.get("min", 0), panel.config.get("max", max(values) * 1.1 or 1))
        for step in panel.config.get("thresholds", {}).get("steps", []):
            if step.get("value") is not None:
                ax.axvline(step["value"], color="grey", linestyle="--", linewidth=0.8)
        for index, value in enumerate(values):
            ax.text(value, index, f" {value:.1f} {unit_label(panel)}", va="center", fontsize=7)
        ax.tick_params(labelsize=7)
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


def _cell(grid: dict[str, int], top: float, height: float) -> tuple[float, float, float, float]:
    """A panel's box on the figure (left, bottom, width, height in figure fractions), margins inside for titles,
    tick labels and the legend."""
    left = grid["x"] / GRID_COLUMNS + 0.045
    width = grid["w"] / GRID_COLUMNS - 0.07
    bottom = top - (grid["y"] + grid["h"]) * ROW_HEIGHT_IN / height + 0.45 / height
    cell_height = grid["h"] * ROW_HEIGHT_IN / height - 0.85 / height
    return left, bottom, width, cell_height


def _axes(figure: plt.Figure, panel: Panel, box: tuple[float, float, float, float], legend_rows: int
          ) -> tuple[plt.Axes, plt.Axes | None]:
    """The panel's plot, and its legend's box beside it (right) or below it (bottom, as high as `legend_rows` and
    its header need, at most 40 % of the panel) where it shows a legend."""
    left, bottom, width, height = box
    legend = panel.legend
    if (panel.type != "timeseries" or not legend_rows or not legend.get("showLegend", True)
            or legend.get("displayMode") == "hidden"):
        return figure.add_axes(box), None
    if legend.get("placement") == "right":
        legend_width = min(0.4 * width, (legend.get("width", 300) / DPI) / PAGE_WIDTH_IN)
        return (figure.add_axes((left, bottom, width - legend_width - 0.01, height)),
                figure.add_axes((left + width - legend_width, bottom, legend_width, height)))
    figure_height_in = figure.get_figheight()
    legend_height = min(0.4 * height, (legend_rows + 1) * LEGEND_ROW_IN / figure_height_in)
    tick_labels = 0.3 / figure_height_in  # room for the time axis' labels between the plot and its legend
    return (figure.add_axes((left, bottom + legend_height + tick_labels, width, height - legend_height - tick_labels)),
            figure.add_axes((left, bottom, width, legend_height)))


def render_dashboard(connect: Callable[[], InfluxDBClient], dashboard: Dashboard, time_range: TimeRange,
                     variables: Mapping[str, Selection], out_dir: Path) -> Path:
    """Draw every panel where Grafana places it and save `<out_dir>/<uid>.png`. The panels' queries run side by side
    (QUERY_THREADS at a time, a client from `connect` each), as Grafana's browser sends them, then the drawing."""
    rows = max(panel.grid["y"] + panel.grid["h"] for panel in dashboard.panels)
    height = rows * ROW_HEIGHT_IN + 0.6
    figure = plt.figure(figsize=(PAGE_WIDTH_IN, height), dpi=DPI)
    picked = "   ".join(f"{variable.label}: {_selection_text(variables[variable.name])}"
                        for variable in dashboard.variables if not variable.hidden and variable.name in variables)
    figure.suptitle(f"{dashboard.title}   {_utc(time_range.start_ms):%Y-%m-%d %H:%M} – "
                    f"{_utc(time_range.end_ms):%Y-%m-%d %H:%M} UTC   {picked}",
                    x=0.01, ha="left", fontsize=12, y=1 - 0.15 / height)
    texts = query_texts(dashboard, variables)
    top = 1 - 0.6 / height
    boxes = [_cell(panel.grid, top, height) for panel in dashboard.panels]
    # The panel's width, as Grafana's maxDataPoints default.
    widths_px = [int(box[2] * PAGE_WIDTH_IN * DPI) for box in boxes]
    ranges = [panel_range(panel, time_range, time_range.end_ms) for panel in dashboard.panels]
    clients = threading.local()

    def query(panel: Panel, shown: TimeRange, width_px: int) -> list[Series] | Exception:
        if not hasattr(clients, "client"):
            clients.client = connect()
        try:
            return run_panel(clients.client, panel, shown, texts, width_px)
        except Exception as error:  # noqa: BLE001 - one panel's failing query spares the others
            return error

    with ThreadPoolExecutor(QUERY_THREADS, thread_name_prefix="report-query") as threads:
        answers = list(threads.map(query, dashboard.panels, ranges, widths_px))
    for panel, box, shown, width_px, answer in zip(dashboard.panels, boxes, ranges, widths_px, answers):
        if isinstance(answer, Exception):
            log.warning("%s / %s: query failed: %s", dashboard.title, panel.title, answer)
            ax = figure.add_axes(box)
            ax.set_title(panel.title, fontsize=10, loc="left")
            ax.text(0.5, 0.5, f"query failed: {str(answer)[:120]}", ha="center", va="center", fontsize=8,
                    color="#d62728", transform=ax.transAxes, wrap=True)
            ax.set_axis_off()
            continue
        ax, legend_ax = _axes(figure, panel, box, sum(1 for entry in answer if entry.values))
        draw_panel(ax, panel, answer, shown, panel_step_ms(panel, shown, width_px), legend_ax)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{dashboard.uid}.png"
    figure.savefig(target)
    plt.close(figure)
    return target


def _selection_text(selection: Selection) -> str:
    if selection.everything:
        return f"All ({len(selection.options)})"
    shown = ", ".join(selection.selected[:3])
    return shown + (f" and {len(selection.selected) - 3} more" if len(selection.selected) > 3 else "")

