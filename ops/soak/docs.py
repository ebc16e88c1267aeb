"""`python -m soak.docs [REPORT_DIR]`: the figures of docs/soak.md rendered from runs' results, never typed.

The newest soak run of each joiner in REPORT_DIR (reports/) and the newest capacity run (`make bench`,
benchmarks.capacity) fill the block between the page's markers; each soak run's main picture is copied to
docs/soak/ beside the page, where the README shows it."""
from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from .capacity_results import latest_capacity_results

REPO_ROOT = Path(__file__).resolve().parents[2]
PAGE = REPO_ROOT / "docs" / "soak.md"
PICTURES = REPO_ROOT / "docs" / "soak"
BEGIN, END = "<!-- figures: python -m soak.docs -->", "<!-- end of figures -->"


def latest_soaks(report_dir: Path, minutes: float | None = None) -> dict[str, tuple[Path, dict[str, Any]]]:
    """The newest finished soak run of each joiner (of `minutes` when given)."""
    found: dict[str, tuple[Path, dict[str, Any]]] = {}
    for path in sorted(report_dir.glob("soak-*/results.json"), key=lambda p: p.stat().st_mtime):
        results = orjson.loads(path.read_bytes())
        if minutes is None or results["settings"]["minutes"] == minutes:
            found[results["joiner"]] = (path.parent, results)
    return found


def _jump(results: Mapping[str, Any]) -> str:
    jump_days = results.get("event_jump_days")
    return f" (and {jump_days:.1f} days jumped over: the backfill ran out of time)" if jump_days else ""


def _day(at: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(at))


def soak_section(joiner: str, run_dir: Path, results: Mapping[str, Any]) -> list[str]:
    plant = results["plant"]
    verdicts = results["verdicts"]
    data = next(v for v in verdicts if v["name"].startswith("machine.data"))["figures"]
    live = results.get("live_from")
    loads = ", ".join(f"{value:.0f}" for value in (results["load_average_start"][0], results["load_average_end"][0]))
    lines = [
        f"### JOINER={joiner}: {'every verdict holds' if results['holds'] else 'FAILED'} "
        f"({_day(results['began_at'])})", "",
        f"{plant['machines']} machines x {plant['axes']} axes, {results['rows']:,} rows ({results['records']:,} "
        f"records), {results['event_days']:.1f} days of event time{_jump(results)}; "
        f"backfill {(live - results['published_from']) / 60:.1f} min, live {(results['published_to'] - live) / 60:.1f} "
        f"min; {len(results['faults'])} faults; the run {(results['ended_at'] - results['began_at']) / 60:.1f} min "
        f"in all (load average {loads} at its start and end, on {results.get('host', '?')}). "
        f"Mosquitto's SIGKILLs put {data['rounds_at_risk']} rounds of rows at risk and lost "
        f"{data['lost_to_mosquitto_kill']} rows.", "",
        f"![the soak with JOINER={joiner}](soak/soak-{joiner}.png)", "",
        "| verdict | holds | what the run found |", "|---|---|---|",
    ]
    lines += [f"| {v['name']} | {'yes' if v['holds'] else '**no**'} | {v['detail']} |" for v in verdicts]
    flat = next((v for v in verdicts if v["name"] == "flat over time"), None)
    if flat:
        lines += ["", "| flat over time | first window | last window | rule | holds |", "|---|---|---|---|---|"]
        for item in flat["figures"]["verdicts"]:
            lines.append(f"| {item['what']} | {_figure(item['what'], item['first'])} | "
                         f"{_figure(item['what'], item['last'])} | {item['limit']} | "
                         f"{ {True: 'yes', False: '**no**', None: 'not judged: ' + item['note']}[item['holds']] } |")
    lines += [""]
    PICTURES.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(run_dir / "soak.png", PICTURES / f"soak-{joiner}.png")
    return lines


def _figure(what: str, value: float | None) -> str:
    if value is None:
        return "-"
    if what.startswith("latency"):
        return f"{value:.2f} s"
    if "per record" in what:
        return f"{value:,.1f} B"
    if "files" in what:
        return f"{value:,.0f}"
    return f"{value / 1024 / 1024:,.1f} MiB"


def capacity_section(results: Mapping[str, Any]) -> list[str]:
    pipelines = results["pipelines"]
    ceiling = next((p.get("sustained_rows_s") for p in pipelines if p["name"] == "pass-through"), None)
    lines = [f"### Capacity ({_day(results['began_at'])}, `make bench`)", "",
             f"The soak's plant ({results['machines']} machines x {results['axes']} axes), each rate held "
             f"{results['hold_minutes']:g} minutes on a single stack of its own; {results['cores']} cores, load "
             f"average {results['load_average'][0]:.0f} at the end.", "",
             "| pipeline | sustained rows/s | records/s | of the pass-through | latency p50 / p99 at 0.7 of it |",
             "|---|---|---|---|---|"]
    for pipeline in pipelines:
        rate = pipeline.get("sustained_rows_s")
        records = rate * pipeline["records_per_row"] if rate and pipeline.get("records_per_row") else None
        share = f"{rate / ceiling:.2f}" if rate and ceiling else "-"
        latency = (f"{pipeline['latency_p50_s']:.2f} s / {pipeline['latency_p99_s']:.2f} s"
                   if pipeline.get("latency_p99_s") is not None else "-")
        lines.append(f"| {pipeline['name']} | {rate or 0:,.0f} | {records or 0:,.0f} | {share} | {latency} |")
    programs = sorted({name for p in pipelines for name in p.get("cpu_us_per_row", {})})
    lines += ["", "CPU per row at that rate (µs of each program's process tree per row published):", "",
              "| program | " + " | ".join(p["name"] for p in pipelines) + " |",
              "|---|" + "---|" * len(pipelines)]
    for program in programs:
        cells = [f"{p['cpu_us_per_row'][program]:,.0f}" if program in p.get("cpu_us_per_row", {}) else "-"
                 for p in pipelines]
        lines.append(f"| {program} | " + " | ".join(cells) + " |")
    return lines + [""]


def render(report_dir: Path) -> str:
    lines = [BEGIN, ""]
    capacity = latest_capacity_results(report_dir)
    if capacity:
        lines += capacity_section(capacity)
    for joiner, (run_dir, results) in sorted(latest_soaks(report_dir).items()):
        lines += soak_section(joiner, run_dir, results)
    return "\n".join(lines + [END])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    report_dir = Path(argv[0]) if argv else REPO_ROOT / "reports"
    page = PAGE.read_text()
    head, _, rest = page.partition(BEGIN)
    _, _, tail = rest.partition(END)
    PAGE.write_text(head + render(report_dir) + tail)
    print(f"rendered {PAGE} from {report_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
