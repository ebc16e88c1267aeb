"""Running a benchmark as `make bench` runs it, `python -m benchmarks.<name>` from the repository's root, with a
session's server addresses in its environment: for the smoke runs of `make test` and the full runs of
`make reliability`. A run passes when it ends (exit code 0) and printed its table or figure line; no timing is
ever checked."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pipeline_core.settings import ConnectionSettings

REPO_ROOT = Path(__file__).resolve().parents[1]
Run = tuple[str, list[str], str]  # (benchmark module, its flags, a line its run prints)


def run_ids(runs: list[Run]) -> list[str]:
    """A test id per run: the module, numbered where it runs more than once."""
    modules = [module for module, *_ in runs]
    return [f"{module}-{index}" if modules.count(module) > 1 else module for index, module in enumerate(modules)]


def environment(stack: ConnectionSettings, temp_dir: Path) -> dict[str, str]:
    """This process's environment with the session's servers' addresses, and the repository on the path as
    `make bench` puts it; its temporary files (the logs a run names, Spark's) in ``temp_dir``."""
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1", "TMPDIR": str(temp_dir),
            "MQTT_HOST": stack.mqtt_host, "MQTT_PORT": str(stack.mqtt_port),
            "KAFKA_BOOTSTRAP_SERVERS": stack.kafka_bootstrap_servers,
            "INFLUXDB_HOST": stack.influxdb_host, "INFLUXDB_PORT": str(stack.influxdb_port)}


def assert_runs_to_its_end(stack: ConnectionSettings, module: str, flags: list[str], printed: str,
                           timeout_s: float = 840) -> None:
    began = time.monotonic()
    # Removed after the run, passed or not: what a benchmark leaves for `make bench`'s user to read is no news here.
    # Directly under /tmp: the stacks some benchmarks start keep a unix socket, whose path must fit in 108 bytes.
    temp_dir = Path(tempfile.mkdtemp(prefix="bench-"))
    try:
        done = subprocess.run([sys.executable, "-m", f"benchmarks.{module}", *flags], cwd=REPO_ROOT,
                              env=environment(stack, temp_dir), capture_output=True, text=True, timeout=timeout_s)
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)
    output = done.stdout + done.stderr
    # The time goes to the report (pytest -rA, or a failure's output): what a run costs, never checked.
    print(f"benchmarks.{module} {' '.join(flags)}: {time.monotonic() - began:.1f} s")
    assert done.returncode == 0, f"benchmarks.{module} exited with {done.returncode}:\n{output[-6000:]}"
    assert printed in done.stdout, f"benchmarks.{module} did not print {printed!r}:\n{output[-6000:]}"
