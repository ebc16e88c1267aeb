"""The watchdog on every topology, at the stages' default reporting interval (10 s: stale after 35 s), under a replay:
each kind of stage's loop wedged in turn (fault injection, PIPELINE_WEDGE_ON_SIGUSR2: a read that never returns,
the process alive and answering signals), and ended and started again by supervision with no one asking.

Each wedge is confirmed (chaos_support.PrivateStack.wedge): the heartbeat stopped while the process lived until it
was stale, the old process group went (every process of it: the Spark driver under spark-submit's JVM too), a new
process ran and `make status` called it healthy; `make status` counts the restart apart from supervisord's and shows
it with its main thread's stack, and InfluxDB holds the count. What must not be restarted is not: on the single stack
Kafka is away for two minutes first, during which every stage waits and says so, and afterwards the watchdog's
records are those of the wedges alone (nor did it touch the Spark joiner's slow first batches at start, nor a
successor's). Then machine.out equals
the offline join of machine.data (join_reference), nothing twice, machine.dlq exactly the bad rows, InfluxDB every
point. `make test` runs the single stack's in brief (tests/integration/test_watchdog_short.py)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from benchmarks import recovery
from chaos_support import ChaosPlan, Fault, PrivateStack, chaos_workdir, only_the_wedged_were_restarted, run_chaos
from cluster_support import PrivateClusterStack
from hosts_support import forget_run, storm_across_hosts

pytestmark = [pytest.mark.slow, pytest.mark.integration]

WEDGEABLE = {"PIPELINE_WEDGE_ON_SIGUSR2": "true"}


def begun(topology: str, joiner: str) -> recovery.Results:
    """The run's recovery figures (benchmarks.recovery), recorded once it passed."""
    return recovery.begun("watchdog", topology, joiner,
                          f"make reliability PYTEST_ARGS='tests/reliability/test_watchdog.py -k \"{topology} and {joiner}\"'")


def run(plan: ChaosPlan, faults: list[Fault], base: type[PrivateStack], topology: str) -> PrivateStack:
    results = begun(topology, plan.joiner)
    stacks: list[PrivateStack] = []

    def wedgeable(state_dir, joiner: str) -> PrivateStack:
        stack = base(state_dir, joiner)
        stack.env.update(WEDGEABLE)
        stacks.append(stack)
        return stack

    report = run_chaos(plan, chaos_workdir("watchdog"), faults, stack_class=wedgeable,
                       after=only_the_wedged_were_restarted)
    print(report.summary())
    for wedge in stacks[0].wedges:
        print(wedge.describe())
    recovery.record_watchdog(results, stacks[0].wedges)
    return stacks[0]


@pytest.mark.timeout(3600)
@pytest.mark.parametrize("joiner", ["spark", "lsb"])
def test_every_stage_of_the_single_stack_wedged_is_restarted_and_a_kafka_outage_is_not(joiner: str) -> None:
    plan = ChaosPlan(joiner=joiner, rows=30_000, machines=20, rate=50.0, kills_per_stage=0, bad_rows=20,
                     server_faults=())
    # First Kafka away for two minutes: every stage waits and says so, for longer than its stale time many times
    # over. Then the wedges, each once the one before is confirmed (a Spark driver's start after its restart took
    # three minutes at a load of 50).
    faults = [Fault(20.0, "stop", "kafka"), Fault(140.0, "start", "kafka"), Fault(170.0, "wedge", f"{joiner}-joiner"),
              Fault(260.0, "wedge", "stream-connector"), Fault(350.0, "wedge", "db-connector")]
    stack = run(plan, faults, PrivateStack, "single")
    assert [wedge.target for wedge in stack.wedges] == [f"{joiner}-joiner", "stream-connector", "db-connector"]


@pytest.mark.timeout(3600)
@pytest.mark.parametrize("joiner", ["spark", "lsb"])
def test_wedged_stages_of_the_cluster_are_restarted(joiner: str) -> None:
    plan = ChaosPlan(joiner=joiner, rows=18_000, machines=20, rate=50.0, kills_per_stage=0, bad_rows=20,
                     server_faults=())
    joiner_program = "spark-joiner" if joiner == "spark" else "lsb-joiner-1"
    faults = [Fault(20.0, "wedge", joiner_program), Fault(110.0, "wedge", "stream-connector"),
              Fault(200.0, "wedge", "db-connector-2")]
    stack = run(plan, faults, PrivateClusterStack, "cluster")
    assert len(stack.wedges) == 3


@pytest.mark.alone
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("joiner", ["spark", "lsb"])
def test_wedged_stages_across_hosts_are_restarted_each_by_its_host_s_supervisord(joiner: str) -> None:
    # The joiner on the driver's host (Spark) or on a worker's (the second standalone joiner), a DB connector on a
    # worker's host, the stream connector on the ingest host: three hosts' watchdogs.
    joiner_program = "spark-joiner" if joiner == "spark" else "lsb-joiner-2"
    faults = [Fault(20.0, "wedge", joiner_program), Fault(110.0, "wedge", "db-connector-2"),
              Fault(200.0, "wedge", "stream-connector")]
    results = begun("hosts", joiner)
    report = storm_across_hosts(joiner, rows=18_000, rate=50.0, faults=faults, environment=WEDGEABLE)
    print(report["summary"])
    assert [wedge["target"] for wedge in report["wedges"]] == [joiner_program, "db-connector-2", "stream-connector"]
    recovery.record_watchdog(results, [SimpleNamespace(**wedge) for wedge in report["wedges"]])
    forget_run(report)
