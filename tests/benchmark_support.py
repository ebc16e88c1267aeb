"""Running a benchmark as `make bench` runs it, `python -m benchmarks.<name>` from the repository's root, with a
session's server addresses in its environment: for the smoke runs of `make test` and the full runs of
`make reliability`. A run passes when it ends (exit code 0), printed its table or figure line, printed no figure
that is not a finite number (no nan, no inf), and, for each of its `Figure`s, printed that line at least as often as
it must, every figure in it a positive finite number, and recorded the results it records (benchmarks/results.py),
each figure a finite number and every measure positive; no figure is ever compared with a target. The results go to
a temporary folder (BENCH_RESULTS_DIR), never over the committed ones."""
from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.results import RESULTS_DIR_ENV, problems, read_results
from pipeline_core.settings import ConnectionSettings

REPO_ROOT = Path(__file__).resolve().parents[1]
# A line of figures a run prints: a regular expression (multi-line) whose named groups are figures, and how many
# times at least the run prints it (a table's rows).
Figure = tuple[str, int]
Run = tuple[str, list[str], str, tuple[Figure, ...]]  # (benchmark module, its flags, a line it prints, its figures)
# A number as the benchmarks print them: thousands separated by commas, a decimal point.
NUMBER = r"[\d,]*\.?\d+"
NOT_FINITE = re.compile(r"(?i)(?<![\w.])-?(?:nan|inf|infinity)(?![\w])")


def figure(pattern: str, least: int = 1) -> Figure:
    """A line of figures: `pattern` with `{name}` where each figure stands (a number, parsed and checked)."""
    return re.sub(r"\{(\w+)\}", lambda match: f"(?P<{match[1]}>{NUMBER})", pattern), least


def printed_figures(output: str, figures: tuple[Figure, ...]) -> list[str]:
    """What is wrong with the figures in a run's output (empty when nothing is): a figure that is no finite number,
    a line of figures printed fewer times than it must be, a figure in it that is not positive."""
    wrong = [f"not a finite number: {line.strip()!r}" for line in output.splitlines() if NOT_FINITE.search(line)]
    for pattern, least in figures:
        matches = list(re.finditer(pattern, output, re.MULTILINE))
        if len(matches) < least:
            wrong.append(f"{len(matches)} lines of figures, at least {least} wanted: {pattern!r}")
        for match in matches:
            for name, text in match.groupdict().items():
                value = float(text.replace(",", ""))
                if not (math.isfinite(value) and value > 0):
                    wrong.append(f"{name} = {text}, not a positive finite number: {match[0].strip()!r}")
    return wrong


def run_ids(runs: list[Run]) -> list[str]:
    """A test id per run: the module, numbered where it runs more than once."""
    modules = [module for module, *_ in runs]
    return [f"{module}-{index}" if modules.count(module) > 1 else module for index, module in enumerate(modules)]


def environment(stack: ConnectionSettings, temp_dir: Path) -> dict[str, str]:
    """This process's environment with the session's servers' addresses, and the repository on the path as
    `make bench` puts it; its temporary files (the logs a run names, Spark's) in ``temp_dir``."""
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1", "TMPDIR": str(temp_dir),
            RESULTS_DIR_ENV: str(temp_dir / "results"),
            "MQTT_HOST": stack.mqtt_host, "MQTT_PORT": str(stack.mqtt_port),
            "KAFKA_BOOTSTRAP_SERVERS": stack.kafka_bootstrap_servers,
            "INFLUXDB_HOST": stack.influxdb_host, "INFLUXDB_PORT": str(stack.influxdb_port)}


def assert_runs_to_its_end(stack: ConnectionSettings, module: str, flags: list[str], printed: str,
                           figures: tuple[Figure, ...] = (), recorded: tuple[str, ...] = (),
                           timeout_s: float = 840) -> None:
    """``recorded``: the results files the run writes, by benchmark name (none for a --help)."""
    began = time.monotonic()
    # Removed after the run, passed or not: what a benchmark leaves for `make bench`'s user to read is no news here.
    # Directly under /tmp: the stacks some benchmarks start keep a unix socket, whose path must fit in 108 bytes.
    temp_dir = Path(tempfile.mkdtemp(prefix="bench-"))
    try:
        done = subprocess.run([sys.executable, "-m", f"benchmarks.{module}", *flags], cwd=REPO_ROOT,
                              env=environment(stack, temp_dir), capture_output=True, text=True, timeout=timeout_s)
        results = read_results(temp_dir / "results") if (temp_dir / "results").is_dir() else {}
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)
    output = done.stdout + done.stderr
    # The time goes to the report (pytest -rA, or a failure's output): what a run costs, never checked.
    print(f"benchmarks.{module} {' '.join(flags)}: {time.monotonic() - began:.1f} s")
    assert done.returncode == 0, f"benchmarks.{module} exited with {done.returncode}:\n{output[-6000:]}"
    assert printed in done.stdout, f"benchmarks.{module} did not print {printed!r}:\n{output[-6000:]}"
    wrong = printed_figures(done.stdout, figures)
    assert not wrong, f"benchmarks.{module}'s figures: " + "; ".join(wrong) + f"\n{done.stdout[-6000:]}"
    assert sorted(results) == sorted(recorded), f"benchmarks.{module} recorded {sorted(results)}, not {sorted(recorded)}"
    wrong = [problem for each in results.values() for problem in problems(each)]
    assert not wrong, f"benchmarks.{module}'s recorded figures: {wrong}\n{done.stdout[-6000:]}"
