"""``python -m benchmarks.render``: the tables of measured figures in the docs, written from the recorded results
(``benchmarks/results/``, ``benchmarks.results``); `make bench` runs it at its end.

A page asks for a table with a marker line, and the table goes between it and the end marker::

    <!-- results: kafka_joiner -->
    <!-- end of results -->

``<!-- results: kafka_joiner: latency* ; by thing* -->`` takes only the figures whose names match one of the
patterns (fnmatch, ``;`` between them), in the order recorded. Each table has one row per figure (its value, unit,
target, the date of the run and its load average) and a line below saying what ran: the command, the commit and
the machine. A benchmark with no recorded run yet gets a line saying so and how to record it, never a figure. The
pages are README.md, every folder's README.md and docs/*.md.

``--check`` writes nothing and exits 1 when a page's tables are not what the results give (tests/unit/
test_benchmark_results.py runs the same check).
"""
from __future__ import annotations

import argparse
import fnmatch
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from benchmarks.recovery import RESULTS_OF
from benchmarks.results import REPO_ROOT, Figure, Recorded, read_results, results_dir

PAGES = ("README.md", "*/README.md", "docs/*.md")
BLOCK = re.compile(r"(?P<begin><!-- results: (?P<spec>[^>]*?) -->\n)(?P<body>.*?)(?P<end><!-- end of results -->)",
                   re.DOTALL)
HEADER = "| figure | value | unit | target | date | load, start–end |\n|---|---:|---|---|---|---|\n"


class RenderError(ValueError):
    """A marker that cannot be rendered: patterns that match no figure of its benchmark's results."""


@dataclass(frozen=True)
class Request:
    """What one marker asks for."""

    benchmark: str
    patterns: tuple[str, ...]

    @classmethod
    def parse(cls, spec: str) -> Request:
        benchmark, _, patterns = spec.partition(":")
        return cls(benchmark.strip(), tuple(p.strip() for p in patterns.split(";") if p.strip()))

    def wanted(self, figure: Figure) -> bool:
        return not self.patterns or any(fnmatch.fnmatchcase(figure.name, pattern) for pattern in self.patterns)


def number(value: float, count: bool = False) -> str:
    """A figure as a table shows it: whole from 100 on (with thousands separators), or when it is whole; else
    three significant digits."""
    if count or abs(value) >= 100 or value == int(value):
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def target_cell(figure: Figure) -> str:
    if figure.target is None:
        return "–"
    bound = f"{'≥' if figure.target.at_least else '≤'} {number(figure.target.bound)}"
    return f"{bound}, met" if figure.target.met(figure.value) else f"{bound}, **not met**"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def run_line(document: dict) -> str:
    """The line under a table: what ran, on which code and machine."""
    machine = document["machine"]
    cpu = f" ({machine['cpu_model']})" if machine.get("cpu_model") else ""
    memory = f", {machine['memory_gib']:g} GiB" if machine.get("memory_gib") else ""
    commit = document["commit"][:10]
    code = f"commit `{commit}`" + (" with changes not committed" if document.get("modified") else "")
    steal = document.get("steal")
    stolen = f"; the host took {steal:.1%} of the CPU time (steal)" if steal else ""
    return (f"`{document['command']}`, {code}, ended {document['ended'].replace('T', ' ').removesuffix('Z')} UTC; "
            f"{machine['cpus']} CPUs{cpu}{memory}, {machine['os']}, Python {machine['python']}{stolen}.")


def table(recorded: Recorded, request: Request) -> str:
    figures = [figure for figure in recorded.figures if request.wanted(figure)]
    if not figures:
        raise RenderError(f"no figure of {request.benchmark} matches {'; '.join(request.patterns)}")
    document = recorded.document
    date = document["ended"][:10]
    load = document["load_average"]
    loads = f"{number(load['start'])}–{number(load['end'])}"
    rows = "".join(f"| {_cell(figure.name)} | {number(figure.value, figure.count)} | {_cell(figure.unit)} | "
                   f"{target_cell(figure)} | {date} | {loads} |\n" for figure in figures)
    return f"{HEADER}{rows}\n{run_line(document)}\n"


def not_recorded(benchmark: str) -> str:
    """What a page shows where a benchmark has no recorded run: how to record one."""
    if benchmark in {"_".join(run) for run in RESULTS_OF}:
        return f"*No recorded run of `{benchmark}` yet: the `make reliability` run named above records it.*\n"
    return (f"*No recorded run of `{benchmark}` yet: `make bench` records it (the benchmark's module is named where "
            f"it is described above).*\n")


def render_text(text: str, results: dict[str, Recorded]) -> str:
    """``text`` with every marked table written from ``results``."""
    def replaced(match: re.Match) -> str:
        request = Request.parse(match["spec"])
        if request.benchmark not in results:
            return match["begin"] + not_recorded(request.benchmark) + match["end"]
        return match["begin"] + table(results[request.benchmark], request) + match["end"]

    return BLOCK.sub(replaced, text)


def pages(root: Path = REPO_ROOT) -> list[Path]:
    return sorted({path for pattern in PAGES for path in root.glob(pattern)})


def requested(root: Path = REPO_ROOT) -> set[str]:
    """The benchmarks whose figures some page shows."""
    return {Request.parse(match["spec"]).benchmark for page in pages(root) for match in BLOCK.finditer(page.read_text())}


def stale_pages(root: Path, results: dict[str, Recorded]) -> dict[Path, str]:
    """The pages whose tables differ from what ``results`` give, each with its rendering."""
    stale = {}
    for page in pages(root):
        text = page.read_text()
        rendered = render_text(text, results)
        if rendered != text:
            stale[page] = rendered
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.render", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page is out of date")
    args = parser.parse_args(argv)
    try:
        stale = stale_pages(REPO_ROOT, read_results(results_dir()))
    except RenderError as error:
        print(f"benchmarks.render: {error}", file=sys.stderr)
        return 1
    for page, rendered in stale.items():
        if args.check:
            print(f"{page.relative_to(REPO_ROOT)}: its tables are older than benchmarks/results/")
        else:
            page.write_text(rendered)
            print(f"rendered {page.relative_to(REPO_ROOT)}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
