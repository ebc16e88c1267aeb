"""`make rolling-restart` under a running replay, on the cluster (TOPOLOGY=cluster, each joiner) and across hosts
(TOPOLOGY=hosts): every Kafka node restarted in turn and, with the Spark joiner, every Spark worker, each back in
sync before the next goes, while 30,000 synthetic rows of 20 machines (with bad rows mixed in) flow at 50 rows/s.

Watched from outside (rolling_support, no code of `stack.rolling`): each node seen down, back as a new process and
in sync again (every partition led with its full ISR; a worker running an executor of the joiner's application),
one after another, never two Kafka nodes away at once, all before the replay's last row. Afterwards machine.out
(read_committed) equals the offline join of machine.data (join_reference, no code of either joiner), nothing twice,
machine.dlq holds exactly the bad rows and InfluxDB every point (chaos_support.check_outcome). Each run prints what
the command said of each step and how long each join took to be readable, before, during each step and after."""
from __future__ import annotations

import json

import pytest

from benchmarks import recovery
from chaos_support import ChaosPlan, Fault, PrivateStack, chaos_workdir, run_chaos
from cluster_support import PrivateClusterStack
from hosts_support import forget_run, storm_across_hosts
from rolling_support import delays_around

pytestmark = [pytest.mark.slow, pytest.mark.integration]

ROWS, RATE = 30_000, 50.0
# The replay runs 600 s: the restart begins 20 s in, once the joins flow, and ends before its last row (it took
# 304 s with the Spark joiner, 423 s with the standalone one on a machine at a load of 30).
FAULTS = [Fault(0.0, "watch-latency", "machine.out"), Fault(20.0, "rolling-restart", "cluster")]


def begun(topology: str, joiner: str) -> recovery.Results:
    """The run's recovery figures (benchmarks.recovery), recorded once it passed."""
    return recovery.begun("rolling_restart", topology, joiner, "make reliability PYTEST_ARGS='tests/reliability/"
                          f"test_rolling_restart.py -k \"{topology} and {joiner}\"'")


def _print(document: dict) -> None:
    print(f"rolling restart in {document['took_s']:.0f} s")
    for step, seen in zip(document["steps"], document["seen"]):
        print(f"  {step['name']}: stopped {step['stopped_s']:.1f} s, started {step['started_s']:.1f} s, in sync "
              f"{step['in_sync_s']:.1f} s later ({step['detail']}); seen: {seen}")
    print("  join delays: " + json.dumps(document["latency"], indent=1))


@pytest.mark.timeout(3600)
@pytest.mark.parametrize("joiner", ["spark", "lsb"])
def test_a_rolling_restart_of_the_cluster_under_a_replay_keeps_the_join_exact(joiner: str) -> None:
    plan = ChaosPlan(joiner=joiner, rows=ROWS, machines=20, rate=RATE, kills_per_stage=0, bad_rows=20,
                     server_faults=(), faults_in_replay=True)
    results = begun("cluster", joiner)
    stacks: list[PrivateStack] = []

    def cluster(state_dir, chosen: str) -> PrivateStack:
        stacks.append(PrivateClusterStack(state_dir, chosen))
        return stacks[-1]

    report = run_chaos(plan, chaos_workdir("rolling"), FAULTS, stack_class=cluster, after=delays_around)
    print(report.summary())
    (document,) = stacks[0].rollings
    assert len(document["steps"]) == (5 if joiner == "spark" else 3)
    _print(document)
    recovery.record_rolling_restart(results, document, document["join_delays_during_s"])


@pytest.mark.alone
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("joiner", ["spark", "lsb"])
def test_a_rolling_restart_across_hosts_under_a_replay_keeps_the_join_exact(joiner: str) -> None:
    results = begun("hosts", joiner)
    report = storm_across_hosts(joiner, rows=ROWS, rate=RATE, faults=FAULTS)
    print(report["summary"])
    (document,) = report["rollings"]
    assert len(document["steps"]) == (5 if joiner == "spark" else 3)
    _print(document)
    recovery.record_rolling_restart(results, document, document["join_delays_during_s"])
    forget_run(report)
