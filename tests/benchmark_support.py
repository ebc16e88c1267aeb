"""Running a benchmark as `make bench` runs it, `python -m benchmarks.<name>` from the repository's root, with a
session's server addresses in its environment: for the smoke runs of `make test` and the full runs of
`make reliability`. A run passes when it ends (exit code 0) and printed its table or figure line; no timing is
ever checked."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from pipeline_core.settings import ConnectionSettings

REPO_ROOT = Path(__file__).resolve().parents[1]
Run = tuple[str, list[str], str]  # (benchmark module, its flags, a line its run prints)


def run_ids(runs: list[Run]) -> list[str]:
    """A test id per run: the module, numbered where it runs more than once."""
    modules = [module for module, *_ in runs]
    return [f"{module}-{index}" if modules.count(module) > 1 else module for index, module in enumerate(modules)]


def environment(stack: ConnectionSettings) -> dict[str, str]:
    """This process's environment with the session's servers' addresses, and the repository on the path as
    `make bench` puts it."""
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1",
            "MQTT_HOST": stack.mqtt_host, "MQTT_PORT": str(stack.mqtt_port),
            "KAFKA_BOOTSTRAP_SERVERS": stack.kafka_bootstrap_servers,
            "INFLUXDB_HOST": stack.influxdb_host, "INFLUXDB_PORT": str(stack.influxdb_port)}


def assert_runs_to_its_end(stack: ConnectionSettings, module: str, flags: list[str], printed: str,
                           timeout_s: float = 840) -> None:
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", f"benchmarks.{module}", *flags], cwd=REPO_ROOT,
                          env=environment(stack), capture_output=True, text=True, timeout=timeout_s)
    output = done.stdout + done.stderr
    # The time goes to the report (pytest -rA, or a failure's output): what a run costs, never checked.
    print(f"benchmarks.{module} {' '.join(flags)}: {time.monotonic() - began:.1f} s")
    assert done.returncode == 0, f"benchmarks.{module} exited with {done.returncode}:\n{output[-6000:]}"
    assert printed in done.stdout, f"benchmarks.{module} did not print {printed!r}:\n{output[-6000:]}"
