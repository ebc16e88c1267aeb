"""TOPOLOGY=hosts with each joiner in turn on one bring-up: the Spark joiner's short storm of network faults and
SIGKILLs, then `up JOINER=lsb` switching to the standalone joiners, whose storm is checked on everything both storms
published (every row of both, machine.out the offline join of all of machine.data: the joiners' handover lost and
repeated nothing); after `down` nothing of the hosts is left. `make test` runs the Spark joiner's storm alone
(tests/integration/test_hosts_topology.py)."""
from __future__ import annotations

import pytest

from hosts_support import check_storm_reports, forget_run, storms_across_hosts

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.alone]

# The order the storms run in: Spark's bring-up starts its cluster too, which the switch leaves.
JOINERS = ("spark", "lsb")


# Both storms and their one bring-up: longer than pytest's limit per test (pyproject.toml) allows one test.
@pytest.mark.timeout(2700)
def test_a_joiner_switch_across_hosts_between_two_storms_loses_and_repeats_nothing() -> None:
    reports = storms_across_hosts(JOINERS, rows=5_000, rate=50.0, kills=True)
    check_storm_reports(JOINERS, reports)
    forget_run(reports[-1])
