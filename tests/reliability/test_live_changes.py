"""A running stack grown and its join specs changed, on every topology, with each joiner (`make reliability`; the
short run is tests/integration/test_live_changes_stack.py, which says what is changed and checked).

A synthetic replay of 6,000 rows of 20 machines at 100 rows/s (18,000 with the Spark joiner on a cluster) with bad
rows mixed in, the stages reporting every 10 s and the stream connector looking at machine.data's partition count
every 10 s, as the stack runs by default, so the times printed are what an operator meets: how long the joiners
were down for the spec change, how soon after machine.data grew the stream connector placed records by 8
partitions, and every stage caught up.
TOPOLOGY=hosts runs as root, under the hosts lock (`flock /work/helpers/hosts.lock` on a shared machine)."""
from __future__ import annotations

import shutil

import pytest

from benchmarks import recovery
from chaos_support import ChaosPlan, PrivateStack, chaos_workdir, run_chaos
from cluster_support import PrivateClusterStack
from growth_support import StatusBeforeDown
from hosts_support import forget_run, storm_across_hosts
from spec_change_support import (INITIAL, LiveChanges, check_live_changes, live_change_faults, live_change_figures,
                                 live_change_seconds, spec_file)

pytestmark = [pytest.mark.slow, pytest.mark.integration]

ROWS, MACHINES, RATE = 6_000, 20, 100.0
# The Spark joiner's restart for the spec change on a cluster is its driver's start on the cluster (50-70 s measured
# on either cluster), and the growth waits for it: its replay lasts long enough for every change to happen within it.
SPARK_CLUSTER_ROWS = 18_000


def replay_rows(topology: str, joiner: str) -> int:
    return SPARK_CLUSTER_ROWS if joiner == "spark" and topology != "single" else ROWS


def begun(topology: str, joiner: str) -> recovery.Results:
    """The run's recovery figures (benchmarks.recovery), recorded once it passed."""
    return recovery.begun("live_changes", topology, joiner, "make reliability PYTEST_ARGS='tests/reliability/"
                          f"test_live_changes.py -k \"{topology} and {joiner}\"'")


class LiveChangesStack(LiveChanges, StatusBeforeDown, PrivateStack):
    pass


class LiveChangesClusterStack(LiveChanges, StatusBeforeDown, PrivateClusterStack):
    pass


@pytest.mark.timeout(3600)
@pytest.mark.parametrize("topology", ["single", "cluster"])
@pytest.mark.parametrize("joiner", ["lsb", "spark"])
def test_live_changes_on_this_host(topology: str, joiner: str) -> None:
    results = begun(topology, joiner)
    rows = replay_rows(topology, joiner)
    plan = ChaosPlan(joiner=joiner, rows=rows, machines=MACHINES, rate=RATE, bad_rows=20, seed=20261207)
    workdir = chaos_workdir(f"live-changes-{topology}-{joiner}")
    initial = spec_file(workdir, INITIAL, "initial_specs.toml")
    stacks: list[PrivateStack] = []

    def changing(state_dir, joiner_name):
        stack = (LiveChangesStack if topology == "single" else LiveChangesClusterStack)(state_dir, joiner_name)
        stack.start_with_specs(initial)
        stacks.append(stack)
        return stack

    report = run_chaos(plan, workdir, live_change_faults(rows / RATE, workdir), stack_class=changing,
                       keep_workdir=True)
    failing = check_live_changes(report, stacks[0])
    assert not failing, failing
    shutil.rmtree(workdir)
    print(f"TOPOLOGY={topology} {report.summary()}; {live_change_figures(report, stacks[0])}")
    recovery.record_live_changes(results, *live_change_seconds(report, stacks[0]))


@pytest.mark.timeout(3600)
@pytest.mark.parametrize("joiner", ["lsb", "spark"])
def test_live_changes_across_hosts(joiner: str) -> None:
    results = begun("hosts", joiner)
    report = storm_across_hosts(joiner, rows=replay_rows("hosts", joiner), rate=RATE, live_changes=True)
    assert not report["failing"], report["failing"]
    print(f"TOPOLOGY=hosts {report['summary']}; {report['figures']}")
    recovery.record_live_changes(results, *report["recovery_s"])
    forget_run(report)
