"""The Spark job's state store stays within the key bound over 100,000 distinct keys (`make reliability`):
its rows after 50,000 machines and after 100,000 are the same bound, not twice as many."""
from __future__ import annotations

import re

import pytest

from kafka_joiner_support import key_of, machine_records
from spark_support import OUTPUT_DEADLINE_S, SparkJoinerProcess, spark_joiners  # noqa: F401 (a fixture)
from support import produce_records, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

HALF = 50_000  # machines per half, one join key each
BUCKETS = 8  # the test command's --buckets
MAX_JOIN_KEYS = 1_000  # per bucket
JOINS_PER_MACHINE = 5  # of machine_records(..., 3): three ticks of speed and torque



def last_figure(log: str, name: str) -> int | None:
    found = re.findall(rf"{name} ([\d,]+)", log)
    return int(found[-1].replace(",", "")) if found else None


def test_state_rows_stay_within_the_bound_over_100_000_keys(bootstrap, new_topics, spark_joiners, tmp_path) -> None:
    topics = new_topics()
    joiner = SparkJoinerProcess(bootstrap, topics, tmp_path / "checkpoint", tmp_path,
                                "--max-join-keys", str(MAX_JOIN_KEYS), "--driver-memory", "768m")
    spark_joiners.append(joiner)
    joiner.start()
    rows = []
    for half in range(2):
        machines = range(half * HALF, (half + 1) * HALF)
        produce_records(bootstrap, topics.data, (record for index in machines
                                                 for record in machine_records(f"m{index}", 0, 3)), key=key_of)
        joins = (half + 1) * HALF * JOINS_PER_MACHINE
        wait_for(lambda: joiner.check_alive() or (last_figure(joiner.log(), "joins out") or 0) >= joins,
                 OUTPUT_DEADLINE_S * 2, f"{joins} joins", interval_s=5)
        wait_for(lambda: last_figure(joiner.log().rsplit("joins out", 1)[-1], "state rows") is not None, 60,
                 "the state size after the half")
        rows.append(last_figure(joiner.log(), "state rows"))
    bound = BUCKETS * (MAX_JOIN_KEYS + 1)  # every bucket's keys and its key count
    assert all(count <= bound for count in rows), rows
    assert rows[1] <= rows[0] * 1.1, rows  # twice the keys, not twice the state
    assert (last_figure(joiner.log(), "dead letters") or 0) > 2 * HALF * 2  # evicted keys' records
    assert joiner.terminate() == 0
