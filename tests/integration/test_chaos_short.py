"""The chaos run of the single stack in brief, seeded, as part of `make test` (`make chaos` runs the full one): each
stage and each server (Kafka, Mosquitto, InfluxDB) killed with SIGKILL once. A row may be missing only if Mosquitto
acknowledged it after its last save before its SIGKILL (see chaos_support).

The cluster's short storm, with its SIGKILLs, runs across hosts with network faults beside them
(test_hosts_topology.py); `make chaos TOPOLOGY=cluster` runs the cluster's full one on this host."""
from __future__ import annotations

import pytest

from chaos_support import ChaosPlan, chaos_workdir, run_chaos

pytestmark = pytest.mark.integration


def test_a_short_storm_of_faults_loses_only_what_a_mosquitto_sigkill_lost_and_doubles_nothing(tmp_path_factory):
    plan = ChaosPlan(joiner="lsb", rows=6_000, machines=20, rate=100.0, kills_per_stage=1, bad_rows=16,
                     server_faults=("kill",))
    report = run_chaos(plan, chaos_workdir("chaos"))
    print(report.summary())

