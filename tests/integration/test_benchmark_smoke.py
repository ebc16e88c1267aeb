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
Tiny as they are, ``spark_joiner`` whole (three cold JVMs by design), ``join_peers`` with its Spark peers (fifteen
Spark and joiner runs), ``topology`` (two whole stacks) and ``slow_links`` (a stack across ten hosts) take minutes
each on two shared cores: here they run in part, and whole in `make reliability`
(tests/reliability/test_benchmark_full_runs.py).
"""
from __future__ import annotations

import pytest

from pipeline_core.settings import ConnectionSettings

from benchmark_support import Run, assert_runs_to_its_end, run_ids

pytestmark = pytest.mark.integration

# (benchmark module, its tiny-size flags, a line its normal run prints: part of its table or figures)
SMOKE_RUNS: list[Run] = [
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
    # The job and its pass-through ceiling, two cold JVMs; the previous code's, the floor's, the latency run and the
    # standalone joiner's figures in the full run (tests/reliability/test_benchmark_full_runs.py).
    ("spark_joiner", ["--records", "2000", "--machines", "10", "--batch", "1000", "--no-previous", "--no-latency",
                      "--no-standalone", "--no-floor"], "job / pass-through:"),
    # The harness, the workloads and the standalone joiner's runs; the Spark peers in the full run.
    ("join_peers", ["--peers", "c", "--copies", "1", "--records", "1000", "--rounds", "2", "--rate", "500",
                    "--live-s", "1", "--settle-s", "0.5"], "each run against the engine"),
    # Both kinds of kill: after the last acknowledgement, and in the middle of a paced publication.
    ("mosquitto_persistence", ["--settings", "autosave_on_changes, interval 1", "--rows", "20",
                               "--kill-after-s", "0.1", "--queue", "50", "--cost-rows", "20", "--rate", "2000"],
     "as fast as acks allow:"),
    ("mosquitto_persistence", ["--settings", "autosave_interval 1", "--rows", "40", "--kill-after-s", "0.05",
                               "--kill-rate", "400", "--queue", "0"], "delivered after the restart"),
    # Its two whole stacks run in the full run; here what `make bench-topology` loads first.
    ("topology", ["--help"], "usage: python -m benchmarks.topology"),
    # Its stack across ten hosts likewise (`make bench-links`).
    ("slow_links", ["--help"], "usage: python -m benchmarks.slow_links"),
]


@pytest.mark.parametrize(("module", "flags", "printed"), SMOKE_RUNS, ids=run_ids(SMOKE_RUNS))
def test_the_benchmark_runs_to_its_end_on_tiny_sizes(stack: ConnectionSettings, module: str, flags: list[str],
                                                      printed: str) -> None:
    assert_runs_to_its_end(stack, module, flags, printed)
