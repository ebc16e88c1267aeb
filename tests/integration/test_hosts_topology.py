"""TOPOLOGY=hosts from nothing: the cluster placed on ten hosts (network namespaces) by the inventory, every program
in its host's network stack, a short seeded storm of network faults and SIGKILLs with bad rows mixed in, exact
against the offline join, with each joiner; and after `down` nothing of it is left
(`hosts_support.storm_across_hosts`). This is `make test`'s storm of the cluster: the SIGKILLs are the cluster's
(`cluster_support.cluster_fault_schedule`: a Kafka node, the stream connector, a DB connector, and the Spark driver,
a worker with its executor and an executor alone, or a standalone joiner).

The storm: a Kafka node's host cut off from every other host, the stream connector's path to Mosquitto cut, a DB
connector's path to InfluxDB cut, and with Spark the driver's path to a worker's host cut, with the standalone
joiners the host of one of them cut off; each healed while the replay runs. Every fault is confirmed from inside the
hosts, and `make status` names the server that the operator cannot reach. `make chaos TOPOLOGY=hosts` holds each
fault past the clients' session timeouts."""
from __future__ import annotations

import pytest

from hosts_support import forget_run, storm_across_hosts

pytestmark = [pytest.mark.integration, pytest.mark.alone]


# The cluster's SIGKILLs of each joiner's storm (cluster_support.cluster_fault_schedule), one each.
KILLED = {"spark": ("kill kafka-", "kill stream-connector", "kill db-connector-", "kill spark-worker-",
                    "kill spark-joiner", "kill-executor spark-worker-"),
          "lsb": ("kill kafka-", "kill stream-connector", "kill db-connector-", "kill lsb-joiner-")}


@pytest.mark.parametrize("joiner", ["spark", "lsb"])
def test_the_cluster_across_hosts_survives_a_storm_of_network_faults_and_kills_exactly(joiner: str) -> None:
    report = storm_across_hosts(joiner, rows=5_000, rate=50.0, kills=True)
    print(report["summary"], "; recovered after each healing (s):", report["recovered_s"])
    confirmed = report["confirmed"]
    for kill in KILLED[joiner]:
        assert any(line.startswith(kill) for line in confirmed), (kill, confirmed)
    # The Kafka node cut off is the one coordinating the joiner's group.
    assert any(line.startswith("isolate kafka-") and "coordinated group" in line and "cannot reach kafka-" in line
               for line in confirmed), confirmed
    assert sum(line.startswith(("cut ", "isolate ")) for line in confirmed) == 4, confirmed
    assert sum(line.startswith(("heal ", "rejoin ")) for line in confirmed) == 4, confirmed
    forget_run(report)
