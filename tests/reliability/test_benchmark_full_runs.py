"""The benchmarks `make test` smoke-runs only in part, whole and tiny (tests/integration/test_benchmark_smoke.py):
the Spark joiner's benchmark with the previous code, the floor, the latency run and the standalone joiner's figures
(three cold JVMs by design), the peers' benchmark with Spark's peers (fifteen Spark and joiner runs), the
topology benchmark (two whole stacks of its own), the capacity one (three), the slow-links one (a stack across
ten hosts) and the dashboards' with the pipeline streaming beside them (a stack of its own). Minutes each on two
shared cores."""
from __future__ import annotations


import pytest

from benchmark_support import Figure, Run, assert_runs_to_its_end, run_ids
from pipeline_core.settings import ConnectionSettings
from support import private_port_range

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FULL_RUNS: list[Run] = [
    # Two machine counts: the job's rate at the more machines against the fewer, and against the standalone joiner.
    ("spark_joiner", ["--records", "2000", "--machines", "10", "20", "--batch", "1000", "--rate", "200",
                      "--latency-s", "2"], "of its records/s at 10 machines", ()),
    ("join_peers", ["--peers", "a", "b", "c", "--copies", "1", "--records", "1000", "--rounds", "2", "--rate", "500",
                    "--live-s", "1", "--settle-s", "0.5"], "each run against the engine", ()),
    # Two whole stacks of their own, with the standalone joiner, which starts far faster than Spark; on ports from
    # CLUSTER_TEST_PORTS when set, as the tests' other private stacks, else on any free ones.
    ("topology", ["--rows", "200", "--machines", "2", "--joiner", "lsb", "--settled-s", "3",
                  *(["--ports", private_port_range()] if private_port_range() else [])],
     "cluster / single end to end:", ()),
    # A small plant and its pipeline streaming beside the dashboards, in a stack of its own with the standalone joiner.
    ("dashboards", ["--machines", "10", "--axes", "1", "--days", "1", "--minute-history-h", "1", "--raw-minutes", "1",
                    "--clock-faulty-machines", "2",
                    "--pipeline-rate", "20", "--joiner", "lsb", "--warmup-s", "15", "--ranges", "1h", "--refreshes",
                    "1", "--refresh-s", "2", *(["--ports", private_port_range()] if private_port_range() else [])],
     "pipeline beside: the simulator at", ()),
    # Three whole stacks of its own (the standalone joiner, the Spark joiner, the pass-through), each held briefly.
    ("capacity", ["--machines", "20", "--axes", "2", "--probe-s", "20", "--hold-minutes", "0.5", "--latency-s", "15",
                  "--report-dir", "/tmp/capacity-smoke",
                  *(["--ports", private_port_range()] if private_port_range() else [])],
     "sustained rows/s", ()),
    # Its own stack across ten hosts (as root), undelayed and delayed, each run's joins compared.
    ("slow_links", ["--joiner", "lsb", "--round-trip-ms", "50", "--settled-s", "5"], "RTT +  50 ms", ()),
]


@pytest.mark.parametrize(("module", "flags", "printed", "figures"), FULL_RUNS, ids=run_ids(FULL_RUNS))
def test_the_benchmark_runs_whole_to_its_end(stack: ConnectionSettings, module: str, flags: list[str],
                                             printed: str, figures: tuple[Figure, ...]) -> None:
    # Each records its results under its own name (benchmarks/results.py).
    assert_runs_to_its_end(stack, module, flags, printed, figures, recorded=(module,))
