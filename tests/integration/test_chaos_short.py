"""The chaos runs in brief, seeded, as part of `make test` (`make chaos` and `make chaos TOPOLOGY=cluster` run the
full ones).

The single stack: each stage and each server (Kafka, Mosquitto, InfluxDB) killed with SIGKILL once. A row may be
missing only if Mosquitto acknowledged it after its last save before its SIGKILL (see chaos_support).

The cluster (three Kafka nodes, two standalone joiners and two DB connectors in their groups, secure as always):
one Kafka node, one joiner instance, one DB connector and the stream connector killed with SIGKILL once. The
standalone joiners keep it short: the Spark master and workers would add three JVMs to the two cores' start."""
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


def test_a_short_storm_on_the_cluster_loses_nothing_and_doubles_nothing():
    plan = ChaosPlan(joiner="lsb", rows=4_000, machines=20, rate=100.0, kills_per_stage=1, bad_rows=8)
    faults = cluster_fault_schedule(plan, plan.rows / plan.rate)
    report = run_chaos(plan, chaos_workdir("cluster-chaos-short"), faults, stack_class=PrivateClusterStack)
    print(report.summary())
