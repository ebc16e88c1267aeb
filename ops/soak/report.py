"""The soak's report, from its run folder alone (`results.json`, `timeline.jsonl`): `report.md`, which a plant
engineer reads in a minute, and its pictures: `soak.png` (rows and records per second per stage, lag per stage,
end-to-end latency p50/p99/max per minute, the faults drawn on the time axis), `memory.png` (resident memory per
program) and `disk.png` (each server's data, the Spark checkpoint). Every figure in them comes from the run.

`python -m soak.report <run folder>` renders them again."""
from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from .monitor import TIMELINE_FILE

MIB = 1024 * 1024
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
          "#17becf")


def load_run(run_dir: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    results = orjson.loads((run_dir / "results.json").read_bytes())
    samples = [orjson.loads(line) for line in (run_dir / TIMELINE_FILE).read_bytes().splitlines() if line]
    return results, samples


def rates(samples: Sequence[Mapping[str, Any]], value) -> tuple[np.ndarray, np.ndarray]:
    """Per second between consecutive samples of a counter: (times, rates)."""
    points = [(s["at"], value(s)) for s in samples if value(s) is not None]
    if len(points) < 2:
        return np.empty(0), np.empty(0)
    times, counts = np.array([p[0] for p in points]), np.array([p[1] for p in points], dtype=float)
    elapsed = np.diff(times)
    return times[1:], np.where(elapsed > 0, np.diff(counts) / np.maximum(elapsed, 1e-9), 0.0).clip(min=0)


def per_minute_latency(latencies: Sequence[Sequence[float]], origin: float, bin_s: float = 60.0
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Bins of `bin_s` (their middles in minutes since `origin`) with their p50, p99 and max latency in seconds."""
    if not latencies:
        return (np.empty(0),) * 4
    sent = np.array([entry[0] for entry in latencies])
    values = np.array([entry[1] for entry in latencies])
    minute = ((sent - origin) // bin_s).astype(int)
    keys = np.unique(minute)
    p50 = np.array([np.percentile(values[minute == key], 50) for key in keys])
    p99 = np.array([np.percentile(values[minute == key], 99) for key in keys])
    top = np.array([values[minute == key].max() for key in keys])
    return (keys + 0.5) * bin_s / 60, p50, p99, top


def _faults(axes, results: Mapping[str, Any], origin: float, label: bool) -> None:
    for number, fault in enumerate(results.get("faults", []), 1):
        if not fault.get("began_at"):
            continue
        start, end = (fault["began_at"] - origin) / 60, (max(fault["ended_at"], fault["began_at"] + 5) - origin) / 60
        axes.axvspan(start, end, color="#d62728", alpha=0.12, linewidth=0)
        if label:
            axes.annotate(str(number), xy=(start, 1.0), xycoords=("data", "axes fraction"), fontsize=7,
                          color="#d62728", ha="left", va="bottom")
    live = results.get("live_from")
    if live:
        axes.axvline((live - origin) / 60, color="#555555", linestyle="--", linewidth=0.8)
        if label:
            axes.annotate("live", xy=((live - origin) / 60, 1.0), xycoords=("data", "axes fraction"), fontsize=7,
                          color="#555555", ha="left", va="bottom")


def _style(axes, ylabel: str) -> None:
    axes.set_ylabel(ylabel, fontsize=8)
    axes.set_ylim(bottom=0)
    axes.grid(True, linewidth=0.3, alpha=0.6)
    axes.tick_params(labelsize=7)
    axes.legend(fontsize=7, loc="upper right", ncol=2, frameon=False)


def main_picture(results: Mapping[str, Any], samples: Sequence[Mapping[str, Any]], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    origin = results["published_from"]
    figure, (rows, records, lag, latency) = plt.subplots(4, 1, figsize=(10, 10), sharex=True,
                                                         gridspec_kw={"height_ratios": (2, 3, 3, 3)})
    figure.suptitle(f"Soak {results['run']}: JOINER={results.get('joiner', '?')}, {results['plant']['machines']} "
                    f"machines x {results['plant']['axes']} axes, {results.get('event_days', 0):.1f} days of event "
                    f"time: {'PASS' if results.get('holds') else 'FAIL'}", fontsize=10)
    thousands = FuncFormatter(lambda value, _pos: f"{value:,.0f}")
    times, values = rates(samples, lambda s: s["publisher"]["rows_acked"])
    rows.plot((times - origin) / 60, values, label="rows/s published (acknowledged by Mosquitto)", color=COLORS[0],
              linewidth=0.8)
    _style(rows, "rows/s")
    series = [("into machine.data", lambda s: (s.get("offsets") or {}).get("machine.data")),
              ("into machine.out", lambda s: (s.get("offsets") or {}).get("machine.out"))]
    for (name, value), color in zip(series, COLORS[1:]):
        times, values = rates(samples, value)
        records.plot((times - origin) / 60, values, label=f"records/s {name}", color=color, linewidth=0.8)
    for (stage, values), color in zip(sorted(_health_rates(results).items()), COLORS[3:]):
        records.plot([(t - origin) / 60 for t, _ in values], [v for _, v in values], label=f"{stage} out/s (its own)",
                     color=color, linewidth=0.8, linestyle=":")
    _style(records, "records/s")
    stages = sorted({name for s in samples for name, v in s["services"].items() if v.get("lag") is not None})
    for stage, color in zip(stages, COLORS):
        points = [((s["at"] - origin) / 60, s["services"][stage]["lag"]) for s in samples
                  if s["services"].get(stage, {}).get("lag") is not None]
        lag.plot([p[0] for p in points], [p[1] for p in points], label=f"{stage}", color=color, linewidth=0.8)
    _style(lag, "lag (records waiting)")
    minutes, p50, p99, top = per_minute_latency(results.get("latencies", []), origin,
                                                _bin_s(results["published_to"] - origin))
    latency.plot(minutes, top, label="max", color="#bbbbbb", linewidth=0.8)
    latency.plot(minutes, p99, label="p99", color=COLORS[1], linewidth=1.0)
    latency.plot(minutes, p50, label="p50", color=COLORS[0], linewidth=1.0)
    if len(top) and np.nanmax(top) > 20 * max(float(np.nanmedian(p99)), 0.1):
        latency.set_yscale("symlog", linthresh=1.0)
    _style(latency, "publish -> in InfluxDB (s)")
    latency.set_xlabel("minutes since the first row (red: the faults, numbered as in the report; dashed: live "
                       "from here)", fontsize=8)
    for axes in (rows, records, lag, latency):
        axes.yaxis.set_major_formatter(thousands if axes is not latency else FuncFormatter(
            lambda value, _pos: f"{value:g}"))
        _faults(axes, results, origin, label=axes is rows)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _bin_s(span_s: float) -> float:
    """Latency percentiles per minute, or per 10 s over a run of less than half an hour."""
    return 60.0 if span_s >= 1800 else 10.0


def _health_rates(results: Mapping[str, Any]) -> dict[str, list[tuple[float, float]]]:
    return {stage: [(point[0], point[1]) for point in points] for stage, points in results.get("health", {}).items()}


def memory_picture(results: Mapping[str, Any], samples: Sequence[Mapping[str, Any]], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    origin = results["published_from"]
    figure, axes = plt.subplots(1, 1, figsize=(10, 4))
    programs = sorted({name for s in samples for name in s.get("usage", {})})
    for program, color in zip(programs, COLORS):
        points = [((s["at"] - origin) / 60, s["usage"][program]["rss_bytes"] / MIB) for s in samples
                  if program in s.get("usage", {})]
        axes.plot([p[0] for p in points], [p[1] for p in points], label=program, color=color, linewidth=0.8)
    _style(axes, "resident memory (MiB)")
    axes.set_xlabel("minutes since the first row", fontsize=8)
    _faults(axes, results, origin, label=True)
    _windows(axes, results, origin)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _windows(axes, results: Mapping[str, Any], origin: float) -> None:
    for key in ("first", "last"):
        window = (results.get("flat_windows") or {}).get(key)
        if window:
            axes.axvspan((window[0] - origin) / 60, (window[1] - origin) / 60, color="#2ca02c", alpha=0.07,
                         linewidth=0)


def disk_picture(results: Mapping[str, Any], samples: Sequence[Mapping[str, Any]], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    origin = results["published_from"]
    figure, axes = plt.subplots(1, 1, figsize=(10, 4))
    with_disk = [s for s in samples if s.get("disk")]
    names = sorted({name for s in with_disk for name in s["disk"].get("data", {})})
    lines = [(name, lambda d, name=name: d.get("data", {}).get(name)) for name in names]
    if any(s["disk"].get("checkpoint") for s in with_disk):
        lines.append(("spark checkpoint", lambda d: d.get("checkpoint")))
    for (name, value), color in zip(lines, COLORS):
        points = [((s["at"] - origin) / 60, value(s["disk"]) / MIB) for s in with_disk if value(s["disk"]) is not None]
        axes.plot([p[0] for p in points], [p[1] for p in points], label=name, color=color, linewidth=0.8)
    _style(axes, "on disk (MiB)")
    axes.set_xlabel("minutes since the first row", fontsize=8)
    _faults(axes, results, origin, label=True)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _when(results: Mapping[str, Any], at: float | None) -> str:
    return f"{(at - results['published_from']) / 60:.1f}" if at else "-"


def _size(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / MIB:,.1f} MiB" if value >= MIB else f"{value:,.0f}"


def markdown(results: Mapping[str, Any]) -> str:
    plant = results["plant"]
    published_min = (results["published_to"] - results["published_from"]) / 60
    live = results.get("live_from")
    phases = (f"backfill {(live - results['published_from']) / 60:.1f} min, live "
              f"{(results['published_to'] - live) / 60:.1f} min" if live else "backfill only, never live")
    intro = (f"JOINER={results['joiner']}, TOPOLOGY={results['topology']}: a plant of {plant['machines']} machines "
             f"with {plant['axes']} axes ({len(plant['quantities'])} quantities each, in the real rows' mix; names such "
             f"as `{plant['names_example'][0]}`) through the whole pipeline: {results['rows']:,} rows "
             f"({results['records']:,} records) covering {results['event_days']:.1f} days of event time in "
             f"{published_min:.1f} minutes ({phases}); the whole run, bring-up and check included, "
             f"{(results['ended_at'] - results['began_at']) / 60:.1f} minutes.")
    if results.get("event_jump_days"):
        intro += (f" **The backfill ran out of time**: the rows jumped over {results['event_jump_days']:.1f} days of "
                  f"event time, not covered.")
    pace = results.get("backfill_pace") or {}
    if pace.get("minutes"):
        against = ("the pipeline's capacity from `make bench`" if pace.get("capacity_rows_s")
                   else "the backfill's own best minute (no capacity figure in reports/: `make bench`)")
        intro += (f" The backfill moved {pace['minutes_at_0_7']} of its {pace['minutes']} minutes at 0.7 or more of "
                  f"{pace['reference_rows_s']:,.0f} rows/s, {against}.")
    lines = [f"# Soak {results['run']}: {'PASS' if results.get('holds') else 'FAIL'}", "", intro, "",
             "![soak](soak.png)", "", "## Verdicts", "", "| verdict | holds | what the run found |", "|---|---|---|"]
    for verdict in results["verdicts"]:
        lines.append(f"| {verdict['name']} | {'yes' if verdict['holds'] else '**no**'} | {verdict['detail']} |")
    lines += ["", "## Faults", "", "| # | fault | at (min) | back after (s) | confirmed |", "|---|---|---|---|---|"]
    for number, fault in enumerate(results.get("faults", []), 1):
        back = fault["ended_at"] - fault["began_at"] if fault.get("began_at") else None
        confirmed = "; ".join(fault["confirmed"]) if not fault.get("error") else f"NOT CONFIRMED: {fault['error']}"
        lines.append(f"| {number} | {fault['kind']} {fault['target']}"
                     f"{' for ' + format(fault['hold_s'], '.0f') + ' s' if fault['hold_s'] else ''} | "
                     f"{_when(results, fault.get('began_at'))} | {back:.0f} | {confirmed} |" if back is not None else
                     f"| {number} | {fault['kind']} {fault['target']} | - | - | {confirmed} |")
    flat = next((v for v in results["verdicts"] if v["name"] == "flat over time"), None)
    if flat:
        windows = results.get("flat_windows") or {}
        lines += ["", "## Flat over time", ""]
        if windows.get("first"):
            lines.append(f"The live phase's first window ({_when(results, windows['first'][0])}-"
                         f"{_when(results, windows['first'][1])} min) against its last "
                         f"({_when(results, windows['last'][0])}-{_when(results, windows['last'][1])} min):")
        else:
            lines.append(f"Not judged: {windows.get('reason')}")
        lines += ["", "| figure | first | last | rule | holds |", "|---|---|---|---|---|"]
        for item in flat["figures"]["verdicts"]:
            shown = (lambda v: f"{v:.3f} s" if v is not None else "-") if item["what"].startswith("latency") else _size
            holds = {True: "yes", False: "**no**", None: f"not judged ({item['note']})"}[item["holds"]]
            lines.append(f"| {item['what']} | {shown(item['first'])} | {shown(item['last'])} | {item['limit']} | {holds} |")
    lines += ["", "![memory](memory.png)", "", "![disk](disk.png)", "",
              f"Measured {time.strftime('%Y-%m-%d', time.gmtime(results['began_at']))} on {results.get('host', '?')}; "
              f"results in `results.json`, samples every few seconds in `timeline.jsonl`.", ""]
    return "\n".join(lines)


def write_report(run_dir: Path) -> Path:
    results, samples = load_run(run_dir)
    main_picture(results, samples, run_dir / "soak.png")
    memory_picture(results, samples, run_dir / "memory.png")
    disk_picture(results, samples, run_dir / "disk.png")
    path = run_dir / "report.md"
    path.write_text(markdown(results))
    return path


if __name__ == "__main__":
    print(write_report(Path(sys.argv[1])))
