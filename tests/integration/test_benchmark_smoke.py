"""Every benchmark runs once, tiny, against the session's servers: one that can no longer run fails here, not
in the next `make bench` weeks later. Nothing here is a figure's check: a smoke run asserts that the benchmark
ran to its end (exit code 0) and printed the table or figure line it prints, never a timing.

Each runs as `make bench` runs it, `python -m benchmarks.<name>` from the repository's root, with the session's
server addresses in its environment. The helper modules run through the benchmarks that import them:
``ceiling``, ``passthrough`` and ``joiner_costs`` through ``kafka_joiner``; ``spark_joiner_baseline`` through
``spark_joiner`` (its 'previous' row); ``peers`` through ``join_peers``. ``baseline`` runs the join engine's
benchmark of HEAD beside the current code's.

``join_peers`` runs the project's joiners and Spark's interval join (peers a, b, c) only: the other peers (Quix
Streams, Flink, Pathway) need virtualenvs of their own, minutes of installs that `make test` never makes.
Tiny as they are, ``spark_joiner`` (three cold JVMs by design), ``join_peers`` (fifteen Spark and joiner runs) and
``topology`` (two whole stacks) take minutes each on two shared cores.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline_core.settings import ConnectionSettings

from support import PORT_RANGE_ENV

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]

# (benchmark module, its tiny-size flags, a line its normal run prints: part of its table or figures)
SMOKE_RUNS = [
    ("join_engine", ["--records", "1000", "--five-five-records", "1000"], "batch path, 100 batches"),
    # HEAD's tree exported by git beside the working tree's code: both take the same flags.
    ("baseline", ["--rounds", "1", "HEAD", "benchmarks.join_engine", "--records", "1000", "--five-five-records",
                  "1000"], "=== round 1, current code"),
    ("mqtt_publish", ["--seed-rows", "5", "--rows", "50", "--rounds", "1"], "ours / seed:"),
    # The seed's figure runs from its first row to its last: at least two rows a round.
    ("stream_connector", ["--rows", "20", "--seed-rows", "4", "--live-rows", "20", "--rounds", "1"],
     "live: simulator and connector at once"),
    ("stream_connector", ["--instances", "2", "--rows", "20", "--machines", "4", "--rounds", "1"],
     "2 instances / 1:"),
    ("db_connector", ["--records", "300", "--seed-records", "20"], "speed-up:"),
    ("kafka_joiner", ["--records", "400", "--machines", "2", "--axes", "1", "--rate", "200", "--warmup-s", "1",
                      "--latency-s", "1", "--ceiling-copies", "1", "--ceiling-records", "400",
                      "--ceiling-rounds", "1", "--max-s", "60"], "latency at a steady"),
    ("spark_joiner", ["--records", "2000", "--machines", "10", "--batch", "1000", "--rate", "200",
                      "--latency-s", "2"], "job / pass-through:"),
    ("join_peers", ["--peers", "a", "b", "c", "--copies", "1", "--records", "1000", "--rounds", "2", "--rate", "500",
                    "--live-s", "1", "--settle-s", "0.5"], "each run against the engine"),
    # Both kinds of kill: after the last acknowledgement, and in the middle of a paced publication.
    ("mosquitto_persistence", ["--settings", "autosave_on_changes, interval 1", "--rows", "20",
                               "--kill-after-s", "0.1", "--queue", "50", "--cost-rows", "20", "--rate", "2000"],
     "as fast as acks allow:"),
    ("mosquitto_persistence", ["--settings", "autosave_interval 1", "--rows", "40", "--kill-after-s", "0.05",
                               "--kill-rate", "400", "--queue", "0"], "delivered after the restart"),
    # Two whole stacks of their own, with the standalone joiner, which starts far faster than Spark; on ports from
    # CLUSTER_TEST_PORTS when set, as the tests' other private stacks, else on any free ones.
    ("topology", ["--rows", "200", "--machines", "2", "--joiner", "lsb", "--settled-s", "3",
                  *(["--ports", os.environ[PORT_RANGE_ENV]] if os.environ.get(PORT_RANGE_ENV) else [])],
     "cluster / single end to end:"),
]


def _environment(stack: ConnectionSettings) -> dict[str, str]:
    """This session's environment with its servers' addresses, and the repository on the path as `make bench`
    puts it."""
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1",
            "MQTT_HOST": stack.mqtt_host, "MQTT_PORT": str(stack.mqtt_port),
            "KAFKA_BOOTSTRAP_SERVERS": stack.kafka_bootstrap_servers,
            "INFLUXDB_HOST": stack.influxdb_host, "INFLUXDB_PORT": str(stack.influxdb_port)}


@pytest.mark.parametrize(("module", "flags", "printed"), SMOKE_RUNS,
                         ids=[f"{module}{'-' + str(index) if [m for m, *_ in SMOKE_RUNS].count(module) > 1 else ''}"
                              for index, (module, *_) in enumerate(SMOKE_RUNS)])
def test_the_benchmark_runs_to_its_end_on_tiny_sizes(stack: ConnectionSettings, module: str, flags: list[str],
                                                      printed: str) -> None:
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", f"benchmarks.{module}", *flags], cwd=REPO_ROOT,
                          env=_environment(stack), capture_output=True, text=True, timeout=840)
    output = done.stdout + done.stderr
    # The time goes to the report (pytest -rA, or a failure's output): what a smoke run costs, never checked.
    print(f"benchmarks.{module} {' '.join(flags)}: {time.monotonic() - began:.1f} s")
    assert done.returncode == 0, f"benchmarks.{module} exited with {done.returncode}:\n{output[-6000:]}"
    assert printed in done.stdout, f"benchmarks.{module} did not print {printed!r}:\n{output[-6000:]}"
