"""TOPOLOGY=hosts from nothing: the cluster placed on ten hosts (network namespaces) by the inventory, every program
in its host's network stack, a short seeded storm of network faults and SIGKILLs with bad rows mixed in, exact
against the offline join, with each joiner in turn on one bring-up: the Spark joiner's storm, then `up JOINER=lsb`
switching to the standalone joiners, whose storm is checked on everything both storms published (every row of
both, machine.out the offline join of all of machine.data: the joiners' handover lost and repeated nothing); and
after `down` nothing of it is left (`hosts_support.storms_across_hosts`). This is `make test`'s storm of the
cluster: the SIGKILLs are the cluster's (`cluster_support.cluster_fault_schedule`: a Kafka node, the stream
connector, a DB connector, and the Spark driver, a worker with its executor and an executor alone, or a standalone
joiner).

The storm: a Kafka node's host cut off from every other host, the stream connector's path to Mosquitto cut, a DB
connector's path to InfluxDB cut, and with Spark the driver's path to a worker's host cut, with the standalone
joiners the host of one of them cut off; each healed while the replay runs. Every fault is confirmed from inside the
hosts, and `make status` names the server that the operator cannot reach. `make chaos TOPOLOGY=hosts` holds each
fault past the clients' session timeouts."""
from __future__ import annotations

import pytest

from hosts_support import forget_run, storms_across_hosts

pytestmark = [pytest.mark.integration, pytest.mark.alone]

# The joiners in the order their storms run: Spark's bring-up starts its cluster too, which the switch leaves.
JOINERS = ("spark", "lsb")
# The cluster's SIGKILLs of each joiner's storm (cluster_support.cluster_fault_schedule), one each.
KILLED = {"spark": ("kill kafka-", "kill stream-connector", "kill db-connector-", "kill spark-worker-",
                    "kill spark-joiner", "kill-executor spark-worker-"),
          "lsb": ("kill kafka-", "kill stream-connector", "kill db-connector-", "kill lsb-joiner-")}


# Both storms and their one bring-up: longer than pytest's limit per test (pyproject.toml) allows one test.
@pytest.mark.timeout(2700)
def test_the_cluster_across_hosts_survives_a_storm_of_network_faults_and_kills_exactly_with_each_joiner() -> None:
    reports = storms_across_hosts(JOINERS, rows=5_000, rate=50.0, kills=True)
    for joiner, report in zip(JOINERS, reports):
        print(report["summary"], "; recovered after each healing (s):", report["recovered_s"])
        confirmed = report["confirmed"]
        for kill in KILLED[joiner]:
            assert any(line.startswith(kill) for line in confirmed), (joiner, kill, confirmed)
        # The Kafka node cut off is the one coordinating the joiner's group.
        assert any(line.startswith("isolate kafka-") and "coordinated group" in line and "cannot reach kafka-" in line
                   for line in confirmed), (joiner, confirmed)
        assert sum(line.startswith(("cut ", "isolate ")) for line in confirmed) == 4, (joiner, confirmed)
        assert sum(line.startswith(("heal ", "rejoin ")) for line in confirmed) == 4, (joiner, confirmed)
    # The second storm's checks took the first's rows and joins too.
    assert reports[1]["joins"] > reports[0]["joins"] > 0
    forget_run(reports[-1])
