"""The idle release through real Kafka, with each joiner: machines send their streams (displaced within the 2 s
bound) and then go quiet. With `idle_release_s = 1` every pair of every record comes out, the last 2 s of each
stream included, which the bound alone would hold back until the machine spoke again. The joiner is then killed
(kill -9) and started again; records at or before what was released arrive and are dead-lettered as late, with
the reason; new records after them join on. Checked against the offline join of the accepted records
(join_reference, no code of the joiners): every record once, nothing twice across the restart."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from disorder_support import join_specs
from join_reference import POWER, reference_join
from kafka_joiner_support import (JoinerProcess, as_multiset, delete_internal_topics, key_of, machine_records,
                                  new_group, read_outputs)
from spark_support import SparkJoinerProcess
from support import produce_records, read_topic

pytestmark = pytest.mark.integration

MACHINES = 3
TICKS = 40  # of 100 ms: 4 s per machine, the last 2 s of which the bound holds back
IDLE_RELEASE_S = 1.0  # under disorder_support's spec: the power join with a 2 s bound


def releasing_specs(tmp_path: Path) -> Path:
    """disorder_support's spec (the power join, 2 s bound) with the idle release."""
    return join_specs(tmp_path, f"idle_release_s = {IDLE_RELEASE_S}\n")


def displaced(records: list[dict]) -> list[dict]:
    """Each machine's records with every two neighbouring ticks swapped: disorder of 100 ms, within the bound."""
    swapped = []
    for start in range(0, len(records), 4):  # two ticks of speed and torque
        swapped += records[start + 2:start + 4] + records[start:start + 2]
    return swapped


def expected(records: list[dict]) -> list[dict]:
    """The offline join of every record, each stream in time order: what the releases let out in the end."""
    in_order = sorted(records, key=lambda record: record["phenomenonTime"])
    return reference_join(in_order, dataclasses.replace(POWER, bound_ms=0.0))


def run_scenario(bootstrap: str, topics, joiner) -> None:
    first = [record for index in range(MACHINES) for record in displaced(machine_records(f"q{index}", 0, TICKS))]
    produce_records(bootstrap, topics.data, first, key=key_of, by_thing=True)
    # Every pair, the machines' last ones included: the joiner released what the bound held once they went quiet.
    outputs = read_outputs(bootstrap, topics.out, len(expected(first)))
    assert as_multiset([m.value for m in outputs]) == as_multiset(expected(first))

    joiner.kill()  # after the release committed: it must not come again from the restored state
    joiner.start()
    last_speed = {record["thing"]: record for record in first if record["quantity"] == "actSpeed_C11"
                  and record["phenomenonTime"] == max(r["phenomenonTime"] for r in first
                                                      if r["thing"] == record["thing"] and r["quantity"] == "actSpeed_C11")}
    # 50 ms before each machine's last speed: well within the bound, but at or before what was released.
    late = [dict(record, phenomenonTime=record["phenomenonTime"] - 50, result=1.5) for record in last_speed.values()]
    later = [record for index in range(MACHINES) for record in machine_records(f"q{index}", TICKS + 30, 10)]
    produce_records(bootstrap, topics.data, late + later, key=key_of, by_thing=True)
    outputs = read_outputs(bootstrap, topics.out, len(expected(first + later)))
    assert as_multiset([m.value for m in outputs]) == as_multiset(expected(first + later))  # once each
    letters = [json.loads(m.value) for m in read_topic(bootstrap, topics.dlq, expected=len(late), idle_s=1.0)]
    assert sorted(letter["key"] for letter in letters) == sorted(key_of(record) for record in late)
    for letter in letters:
        record = json.loads(letter["payload"])
        released = last_speed[record["thing"]]["phenomenonTime"]
        assert letter["reason"] == (f"late: t={record['phenomenonTime']} arrived after {record['thing']}.actSpeed_C11 "
                                    f"was released up to t={released}, idle for its idle_release_s 1 s"), letter


def test_the_standalone_joiner_releases_quiet_machines_once_through_kill_9(bootstrap, new_topics, tmp_path) -> None:
    topics = new_topics()
    group = new_group()
    joiner = JoinerProcess(bootstrap, topics, group, tmp_path, None, "--join-specs", str(releasing_specs(tmp_path)),
                           "--input-partitioned-by-thing")
    try:
        joiner.start()
        run_scenario(bootstrap, topics, joiner)
        assert "restored" in joiner.log()
    finally:
        joiner.close()
        delete_internal_topics(bootstrap, [group])


@pytest.mark.spark
def test_the_spark_joiner_releases_quiet_machines_once_through_kill_9(bootstrap, new_topics, tmp_path) -> None:
    topics = new_topics()
    joiner = SparkJoinerProcess(bootstrap, topics, tmp_path / "checkpoint", tmp_path,
                                "--join-specs", str(releasing_specs(tmp_path)))
    try:
        joiner.start()
        run_scenario(bootstrap, topics, joiner)
    finally:
        joiner.close()
