"""What a benchmark measured, recorded: one JSON file per benchmark under ``benchmarks/results/``, which each run
replaces (one current value per figure, no history), and from which ``python -m benchmarks.render`` writes the
tables of docs/benchmarks.md.

A benchmark makes a ``Results`` when it starts (the run's start time and load average), adds each figure as it
measures it, and writes them when it has run to its end::

    results = Results("db_connector")
    results.add("db_connector, batched line protocol", ours, "points/s")
    results.add("speed-up over the seed's method", ours / seed, "x", target=at_least(100))
    results.write()

The file holds the figures (name, value, unit, target where the benchmark has one) and the run: its command line,
when it ended (UTC), the commit of the code it ran (and whether the working tree differed from it), the machine
(CPUs, memory, operating system, Python) and the 1-minute load average at its start and end, with the share of
the machine's CPU time the virtual machine's host took meanwhile (steal).

``BENCH_RESULTS_DIR`` writes elsewhere: the smoke runs of `make test` write their tiny runs' figures to a
temporary folder, never over the committed ones.
"""
from __future__ import annotations

import json
import math
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
RESULTS_DIR_ENV = "BENCH_RESULTS_DIR"
# Files a run of `make bench` itself changes, and pages (the tables it renders among them): a tree that differs from
# its commit only there ran the commit's code.
WRITTEN_BY_BENCH = ("benchmarks/results/",)
PAGE_SUFFIX = ".md"
BENCHMARK_NAME = re.compile(r"[a-z][a-z0-9_]*")


@dataclass(frozen=True)
class Target:
    """What a figure should reach: at least ``bound`` (a rate), or at most (a latency, a loss)."""

    bound: float
    at_least: bool = True

    def met(self, value: float) -> bool:
        return value >= self.bound if self.at_least else value <= self.bound


def at_least(bound: float) -> Target:
    return Target(bound, at_least=True)


def at_most(bound: float) -> Target:
    return Target(bound, at_least=False)


@dataclass(frozen=True)
class Figure:
    """One measured figure. ``count``: the count of an outcome (rows lost, pairs missing), which may rightly be 0;
    every other figure is a measure (a rate, a time, a size, a ratio), which a run that measured it makes positive."""

    name: str
    value: float
    unit: str
    target: Target | None = None
    count: bool = False


def results_dir() -> Path:
    """Where results are written and read: ``BENCH_RESULTS_DIR``, else the committed ``benchmarks/results/``."""
    configured = os.environ.get(RESULTS_DIR_ENV)
    return Path(configured) if configured else DEFAULT_RESULTS_DIR


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def code_version() -> tuple[str, bool]:
    """The commit the working tree is at, and whether its code differs from it (results and pages aside);
    ("unknown", True) outside a git checkout."""
    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return "unknown", True
    status = _git("status", "--porcelain", "--untracked-files=no") or ""
    changed = [path for path in (line[3:] for line in status.splitlines())
               if path and not path.startswith(WRITTEN_BY_BENCH) and not path.endswith(PAGE_SUFFIX)]
    return commit.strip(), bool(changed)


def _first_line_after(path: str, prefix: str) -> str | None:
    try:
        with open(path) as lines:
            for line in lines:
                if line.startswith(prefix):
                    return line.split(":", 1)[1].strip() if ":" in line else line[len(prefix):].strip()
    except OSError:
        return None
    return None


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    memory_kb = _first_line_after("/proc/meminfo", "MemTotal")
    os_name = _first_line_after("/etc/os-release", "PRETTY_NAME=")
    return {"cpus": os.cpu_count(), "cpu_model": _first_line_after("/proc/cpuinfo", "model name"),
            "memory_gib": round(int(memory_kb.split()[0]) / 2**20, 1) if memory_kb else None,
            "os": os_name.split("=", 1)[-1].strip('"') if os_name else platform.platform(),
            "python": platform.python_version()}


def cpu_ticks() -> tuple[int, int] | None:
    """(steal, total) CPU ticks of the machine so far, from /proc/stat (None where there is none).

    On a virtual machine the host may run other guests on our cores ("steal"); the guest still counts that time to
    whatever it was running, so a busy host slows every figure, the CPU ones included."""
    try:
        with open("/proc/stat") as stat:
            ticks = [int(field) for field in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return (ticks[7] if len(ticks) > 7 else 0), sum(ticks[:8])


def steal_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of the machine's CPU time the host took between two readings of ``cpu_ticks``."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


class Results:
    """The figures of one run of a benchmark, written as one file that replaces the benchmark's previous one."""

    def __init__(self, benchmark: str, argv: list[str] | None = None) -> None:
        if not BENCHMARK_NAME.fullmatch(benchmark):
            raise ValueError(f"a benchmark's results name is lower-case letters, digits and _: {benchmark!r}")
        self.benchmark = benchmark
        self.command = shlex.join(["python", "-m", _main_module(benchmark), *(sys.argv[1:] if argv is None else argv)])
        self.started_at = time.time()
        self.load_at_start = os.getloadavg()[0]
        self.ticks_at_start = cpu_ticks()
        self.figures: list[Figure] = []

    def add(self, name: str, value: float, unit: str, target: Target | None = None, count: bool = False) -> None:
        """One figure; its name says what was measured, unique within the benchmark."""
        if any(figure.name == name for figure in self.figures):
            raise ValueError(f"{self.benchmark}: the figure {name!r} was added twice")
        self.figures.append(Figure(name, float(value), unit, target, count))

    def document(self) -> dict[str, Any]:
        commit, modified = code_version()
        return {
            "benchmark": self.benchmark,
            "command": self.command,
            "started": _utc(self.started_at),
            "ended": _utc(time.time()),
            "commit": commit,
            "modified": modified,
            "machine": machine(),
            "load_average": {"start": round(self.load_at_start, 2), "end": round(os.getloadavg()[0], 2)},
            "steal": _rounded(steal_share(self.ticks_at_start, cpu_ticks())),
            "figures": [_figure_fields(figure) for figure in self.figures],
        }

    def write(self, directory: Path | None = None) -> Path:
        """The run's file, ``<benchmark>.json``, in ``directory`` (default ``results_dir()``), replacing the one
        before; written whole or not at all."""
        directory = results_dir() if directory is None else directory
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{self.benchmark}.json"
        partial = path.with_suffix(".json.partial")
        partial.write_text(_dumps(self.document()))
        partial.replace(path)
        print(f"results: {len(self.figures)} figures in {_shown(path)}", flush=True)
        return path


def _figure_fields(figure: Figure) -> dict[str, Any]:
    """A figure as its file holds it: its value to six significant digits, a target and `count` where it has them."""
    fields = {"name": figure.name, "value": float(f"{figure.value:.6g}"), "unit": figure.unit}
    if figure.target is not None:
        fields["target"] = asdict(figure.target)
    if figure.count:
        fields["count"] = True
    return fields


def _dumps(document: dict[str, Any]) -> str:
    """The file's text: the run's fields indented, each figure on a line of its own (diffs read figure by figure)."""
    run = json.dumps({key: value for key, value in document.items() if key != "figures"}, indent=1,
                     ensure_ascii=False)
    figures = ",\n".join("  " + json.dumps(figure, ensure_ascii=False) for figure in document["figures"])
    return f'{run[:-2]},\n "figures": [\n{figures}\n ]\n}}\n'


def _main_module(benchmark: str) -> str:
    """The module this process runs as `python -m` (a benchmark may record under a name of its own)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return spec.name if spec is not None and spec.name else f"benchmarks.{benchmark}"


def _utc(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


@dataclass(frozen=True)
class Recorded:
    """A benchmark's results as read back from its file."""

    benchmark: str
    document: dict[str, Any]

    @property
    def figures(self) -> list[Figure]:
        return [Figure(each["name"], each["value"], each["unit"],
                       Target(**each["target"]) if "target" in each else None, each.get("count", False))
                for each in self.document["figures"]]


def read_results(directory: Path | None = None) -> dict[str, Recorded]:
    """Every benchmark's recorded results in ``directory`` (default ``results_dir()``), by benchmark."""
    directory = results_dir() if directory is None else directory
    found = {}
    for path in sorted(directory.glob("*.json")):
        document = json.loads(path.read_text())
        found[path.stem] = Recorded(path.stem, document)
    return found


def problems(recorded: Recorded) -> list[str]:
    """What is wrong with a results file (empty when nothing): a field missing, a figure that is not a finite
    number, a measure that is not positive, a name twice."""
    document, name = recorded.document, recorded.benchmark
    wrong = [f"{name}: no {field}" for field in ("benchmark", "command", "ended", "commit", "machine",
                                                   "load_average", "figures") if field not in document]
    if wrong:
        return wrong
    if document["benchmark"] != name:
        wrong.append(f"{name}: the file names the benchmark {document['benchmark']!r}")
    if not document["figures"]:
        wrong.append(f"{name}: no figure")
    names: set[str] = set()
    for figure in recorded.figures:
        if figure.name in names:
            wrong.append(f"{name}: {figure.name!r} twice")
        names.add(figure.name)
        if not math.isfinite(figure.value):
            wrong.append(f"{name}: {figure.name} = {figure.value}, not a finite number")
        elif figure.value < 0 or (figure.value == 0 and not figure.count):
            wrong.append(f"{name}: {figure.name} = {figure.value}, not positive" + ("" if figure.count else
                         " (a measure; a count of outcomes may be 0)"))
    return wrong
