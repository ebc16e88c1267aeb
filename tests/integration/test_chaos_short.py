"""The chaos runs in brief, seeded, as part of `make test` (`make chaos` and `make chaos TOPOLOGY=cluster` run the
full ones).

The single stack: each stage and each server (Kafka, Mosquitto, InfluxDB) killed with SIGKILL once. A row may be
missing only if Mosquitto acknowledged it after its last save before its SIGKILL (see chaos_support).

The cluster (three Kafka nodes, two DB connectors in their group, secure as always), once with each joiner: one
Kafka node, one DB connector and the stream connector killed with SIGKILL once; with the standalone joiners, one of
the two; with Spark (a master and two workers), the driver, one worker with its executor, and one executor alone
on the other worker. Every fault is confirmed before the replay's last row is sent, and machine.out equals the
offline join of machine.data exactly."""
from __future__ import annotations

import pytest

from chaos_support import ChaosPlan, chaos_workdir, run_chaos
from cluster_support import PrivateClusterStack, cluster_fault_schedule

pytestmark = pytest.mark.integration


def test_a_short_storm_of_faults_loses_only_what_a_mosquitto_sigkill_lost_and_doubles_nothing(tmp_path_factory):
    plan = ChaosPlan(joiner="lsb", rows=6_000, machines=20, rate=100.0, kills_per_stage=1, bad_rows=16,
                     server_faults=("kill",))
    report = run_chaos(plan, chaos_workdir("chaos"))
    print(report.summary())


@pytest.mark.parametrize("joiner", ["lsb", "spark"])
def test_a_short_storm_on_the_cluster_loses_nothing_and_doubles_nothing(joiner: str):
    plan = ChaosPlan(joiner=joiner, rows=4_000, machines=20, rate=100.0, kills_per_stage=1, bad_rows=8,
                     faults_in_replay=True)
    faults = cluster_fault_schedule(plan, plan.rows / plan.rate)
    report = run_chaos(plan, chaos_workdir(f"cluster-chaos-short-{joiner}"), faults, stack_class=PrivateClusterStack)
    print(report.summary())
