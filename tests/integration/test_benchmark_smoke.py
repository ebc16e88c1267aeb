"""Every benchmark runs once, tiny, against the session's servers: one that can no longer run fails here, not
in the next `make bench` weeks later. No figure is held to its target here: a smoke run asserts that the benchmark
ran to its end (exit code 0), printed the table or figure line it prints, and that each figure it printed is a
positive finite number (`benchmark_support.printed_figures`), and that it recorded its results (into a temporary
folder, never over benchmarks/results/), each figure a finite number and every measure positive: one that came out
0, nan or inf was not measured.

Each runs as `make bench` runs it, `python -m benchmarks.<name>` from the repository's root, with the session's
server addresses in its environment. The helper modules run through the benchmarks that import them:
``ceiling``, ``passthrough`` and ``joiner_costs`` through ``kafka_joiner``; ``spark_joiner_baseline`` through
``spark_joiner`` (its 'previous' row); ``peers`` through ``join_peers``; ``plant`` through ``dashboards``.
``baseline`` runs the join engine's benchmark of HEAD beside the current code's.

``join_peers`` runs the project's joiners and Spark's interval join (peers a, b, c) only: the other peers (Quix
Streams, Flink, Pathway) need virtualenvs of their own, minutes of installs that `make test` never makes.
Tiny as they are, ``spark_joiner`` whole (three cold JVMs by design), ``join_peers`` with its Spark peers (fifteen
Spark and joiner runs), ``topology`` (two whole stacks), ``capacity`` (three), ``slow_links`` (a stack across ten hosts)
and ``dashboards`` with the pipeline beside (a stack of its own) take minutes each on two shared cores: here they run
in part, and whole in `make reliability` (tests/reliability/test_benchmark_full_runs.py).
"""
from __future__ import annotations

import pytest

from pipeline_core.settings import ConnectionSettings

from benchmark_support import Figure, Run, assert_runs_to_its_end, figure, run_ids

pytestmark = pytest.mark.integration

# The join engine's table: per path, records/s and joins/s of CPU time, records/s of wall time, the peak held.
JOIN_ENGINE_ROWS = figure(r"^  (?:per-record|batch path)[^\n]*?  +[\d,]+ +[\d,]+ +[\d.]+ +[\d.]+ +{records_per_cpu_s} +"
                          r"{joins_per_cpu_s} +{records_per_s} +{peak_held} ", 8)

# (benchmark module, its tiny-size flags, a line its normal run prints: part of its table or figures, and its lines
# of figures, each figure a positive finite number; counts of an outcome (rows lost, saves, dead letters), shares
# that may be 0 % (a host's steal, a phase's share) and times printed to fewer places than tiny runs take are none)
SMOKE_RUNS: list[Run] = [
    ("join_engine", ["--records", "1000", "--five-five-records", "1000"], "batch path, 100 batches",
     (JOIN_ENGINE_ROWS,)),
    # HEAD's tree exported by git beside the working tree's code: both take the same flags.
    ("baseline", ["--rounds", "1", "HEAD", "benchmarks.join_engine", "--records", "1000", "--five-five-records",
                  "1000"], "=== round 1, current code", ((JOIN_ENGINE_ROWS[0], 16),)),
    ("mqtt_publish", ["--seed-rows", "5", "--rows", "50", "--rounds", "1"], "ours / seed:",
     (figure(r"^(?:seed|ours): .*? +[\d,]+ +{rows_per_s} +[\d,]+ +[\d,]+$", 2), figure(r"^ours / seed: {ratio}x"))),
    # The seed's figure runs from its first row to its last: at least two rows a round.
    ("stream_connector", ["--rows", "20", "--seed-rows", "4", "--live-rows", "20", "--rounds", "1"],
     "live: simulator and connector at once",
     (figure(r"^(?:seed|ours|live): .*? +[\d,]+ +[\d,]+ +{rows_per_s} +{records_per_s}$", 3),
      figure(r"^ours / seed: {rows_ratio}x rows/s, {records_ratio}x records/s .*; ours {ours_rows_per_s} rows/s"),
      figure(r"^what bounds ours: CPU, {cpu_us_per_row} µs per row .*, i\.e\. {rows_per_core_s} rows/s"))),
    # Enough rows that each connector's CPU time while it drains them is several clock ticks (10 ms).
    ("stream_connector", ["--instances", "2", "--rows", "1000", "--machines", "4", "--rounds", "1"],
     "2 instances / 1:",
     (figure(r"^\d connectors?, .*? +[\d,]+ +[\d,]+ +{rows_per_s} +{records_per_s} +{cpu_us_per_row}$", 2),
      figure(r"^2 instances / 1: {ratio}x rows/s"))),
    ("db_connector", ["--records", "300", "--seed-records", "20"], "speed-up:",
     (figure(r"^(?:seed|db_connector): .*? +[\d,]+ +{points_per_s}$", 2), figure(r"^speed-up: {ratio}x"))),
    # A plant of 5 machines without the pipeline beside (its stack in the full run), one range, one refresh.
    ("dashboards", ["--pipeline-rate", "0", "--machines", "5", "--axes", "1", "--days", "1", "--minute-history-h", "1",
                    "--raw-minutes", "1", "--clock-faulty-machines", "2", "--ranges", "1h", "--refreshes", "1",
                    "--refresh-s", "2"],
     "slowest first render or refresh",
     (figure(r"^live +.+? +1h +{first_render_s} +[\d.]+ +{refresh_s} / [\d.]+ ", 2),
      figure(r"^report +.+? +1h +{render_s} ", 2), figure(r"^slowest first render or refresh: {slowest_s} s"))),
    ("kafka_joiner", ["--records", "400", "--machines", "2", "--axes", "1", "--rate", "200", "--warmup-s", "1",
                      "--latency-s", "1", "--ceiling-copies", "1", "--ceiling-records", "400",
                      "--ceiling-rounds", "1", "--max-s", "60"], "latency at a steady",
     (figure(r"^  by (?:thing|key), .*? +\d +[\d,]+ +[\d.]+ +{joins_per_s} +{records_per_s} +\d+ +{cpu_us_per_record}$",
             3),
      figure(r"^  (?:real mix|all-joinable)[^\n]*?, (?:pass-through|joiner) +1 +[\d,]+ +[\d.]+ +{records_per_s} +"
             r"{cpu_us_per_record}$", 4),
      figure(r"^  (?:real mix x1|all-joinable): {ratio} of the pass-through's records/s, .*; CPU per record "
             r"{joiner_cpu_us} µs against {pass_through_cpu_us} µs \({cpu_ratio}\)", 2),
      figure(r"^    sum +{phases_us} µs; the joiner measured {measured_us} µs per record", 2),
      figure(r"^latency at .*: append to commit p50 {p50_ms} ms, p99 {p99_ms} ms, p99\.9 {p999_ms} ms, "
             r"max {max_ms} ms"))),
    # The job and its pass-through ceiling, two cold JVMs; the previous code's, the floor's, the latency run and the
    # standalone joiner's figures in the full run (tests/reliability/test_benchmark_full_runs.py).
    ("spark_joiner", ["--records", "2000", "--machines", "10", "--batch", "1000", "--no-previous", "--no-latency",
                      "--no-standalone", "--no-floor"], "job / pass-through:",
     (figure(r"^ +10 +(?:job|pass-through) +[\d,]+ +[\d,]+ +{records_per_s} +{joins_per_s} +{steady_records_per_s} +"
             r"{first_batch_s} +[\d.]+ +{cpu_us_per_record} +{load} \|", 2),
      figure(r"^ +10 +job / pass-through: {ratio} of the pass-through's records/s"),
      figure(r"^ +10 +checkpoint state on disk after the run: {bytes_per_machine} bytes per machine"),
      figure(r"^ +10 +(?:job|pass-through) +[\d.]+ +[\d.]+ +[\d.]+ +{cpu_us_after_first_batch}$", 2))),
    # The harness, the workloads and the standalone joiner's runs; the Spark peers in the full run.
    ("join_peers", ["--peers", "c", "--copies", "1", "--records", "1000", "--rounds", "2", "--rate", "500",
                    "--live-s", "1", "--settle-s", "0.5"], "each run against the engine",
     (figure(r"^\(c\) standalone joiner .*? {records_per_s} \({round_1}, {round_2}\) +{cpu_us_per_record} +{p50_ms} +"
             r"{p99_ms} \|"),)),
    # Both kinds of kill: after the last acknowledgement, and in the middle of a paced publication. Enough rows for the
    # broker's CPU time to be more than a clock tick, and for its database to weigh a tenth of a MB.
    ("mosquitto_persistence", ["--settings", "autosave_on_changes, interval 1", "--rows", "20",
                               "--kill-after-s", "0.1", "--queue", "500", "--cost-rows", "300", "--rate", "2000"],
     "as fast as acks allow:",
     (figure(r"queue [\d,]+ rows, database {database_mb} MB, one save {save_s} s"),
      figure(r"^  (?:as fast as acks allow|at [\d,]+ rows/s): {rows_per_s} rows/s, broker CPU {cpu_s} s per 1,000 rows",
             2))),
    # Its figures are counts: rows delivered and lost, saves.
    ("mosquitto_persistence", ["--settings", "autosave_interval 1", "--rows", "40", "--kill-after-s", "0.05",
                               "--kill-rate", "400", "--queue", "0"], "delivered after the restart", ()),
    # Its two whole stacks run in the full run; here what `make bench-topology` loads first.
    ("topology", ["--help"], "usage: python -m benchmarks.topology", ()),
    # Its three whole stacks likewise (`make bench` runs it last).
    ("capacity", ["--help"], "usage: python -m benchmarks.capacity", ()),
    # Its stack across ten hosts likewise (`make bench-links`).
    ("slow_links", ["--help"], "usage: python -m benchmarks.slow_links", ()),
]


# The results each run records, by the run's id: one file per benchmark, named as it records (benchmarks/results.py);
# a baseline's runs record theirs in its own temporary folder, a --help none.
RECORDED: dict[str, tuple[str, ...]] = {
    "join_engine": ("join_engine",), "baseline": (), "mqtt_publish": ("mqtt_publish",),
    "stream_connector-3": ("stream_connector",), "stream_connector-4": ("stream_connector_instances",),
    "db_connector": ("db_connector",), "kafka_joiner": ("kafka_joiner",), "spark_joiner": ("spark_joiner",),
    "join_peers": ("join_peers",), "mosquitto_persistence-10": ("mosquitto_persistence",),
    "mosquitto_persistence-11": ("mosquitto_persistence_during_publication",), "topology": (), "slow_links": (),
    "dashboards": ("dashboards",), "capacity": (),
}
IDS = run_ids(SMOKE_RUNS)


def test_every_run_says_what_it_records() -> None:
    assert set(RECORDED) == set(IDS)


@pytest.mark.parametrize(("module", "flags", "printed", "figures", "recorded"),
                         [(*run, RECORDED.get(run_id, ())) for run, run_id in zip(SMOKE_RUNS, IDS)], ids=IDS)
def test_the_benchmark_runs_to_its_end_on_tiny_sizes(stack: ConnectionSettings, module: str, flags: list[str],
                                                      printed: str, figures: tuple[Figure, ...],
                                                      recorded: tuple[str, ...]) -> None:
    assert_runs_to_its_end(stack, module, flags, printed, figures, recorded)
