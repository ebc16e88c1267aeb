"""TOPOLOGY=hosts from nothing: the cluster placed on ten hosts (network namespaces) by the inventory, every program
in its host's network stack, a short seeded storm of network faults and SIGKILLs with bad rows mixed in, with the
Spark joiner (the default), exact against the offline join; and after `down` nothing of it is left
(`hosts_support.storms_across_hosts`). This is `make test`'s storm of the cluster: the SIGKILLs are the cluster's
(`cluster_support.cluster_fault_schedule`: a Kafka node, the stream connector, a DB connector, the Spark driver, a
worker with its executor and an executor alone). `make reliability` runs it with each joiner in turn on one bring-up,
switching to the standalone joiners in between (tests/reliability/test_hosts_joiner_switch.py).

The storm: a Kafka node's host cut off from every other host, the stream connector's path to Mosquitto cut, a DB
connector's path to InfluxDB cut, and the driver's path to a worker's host cut; each healed while the replay runs.
Every fault is confirmed from inside the hosts, and `make status` names the server that the operator cannot reach.
`make chaos TOPOLOGY=hosts` holds each fault past the clients' session timeouts."""
from __future__ import annotations

import pytest

from hosts_support import check_storm_reports, forget_run, storms_across_hosts

pytestmark = [pytest.mark.integration, pytest.mark.alone]


@pytest.mark.timeout(1800)
def test_the_cluster_across_hosts_survives_a_storm_of_network_faults_and_kills_exactly() -> None:
    joiners = ("spark",)
    reports = storms_across_hosts(joiners, rows=5_000, rate=50.0, kills=True)
    check_storm_reports(joiners, reports)
    forget_run(reports[-1])
