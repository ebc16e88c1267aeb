"""Machines whose clocks lie, through the running stack (simulator -> Mosquitto -> stream connector -> Kafka ->
each joiner): a reading or a whole row ten years ahead, a reading two hours behind, a clock set back an hour and
kept there, a clock set two hours ahead and kept there, a machine off for an hour, and a well-behaved machine
(one reading a row, as each quantity's sensor sends it).
Each joiner gives exactly the join the reference (tests/join_reference.py, which shares no code with them) gives
for machine.data as they read it, once each, and dead-letters exactly the reference's outliers, with the reason
clock_outlier; the standalone joiner is killed (kill -9) twice in the middle of the faults and restarts from its
changelog. The join goes on on every new timeline: each machine joins all its readings but the outliers."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from clock_support import HOUR_MS, YEAR_MS
from connector_support import connector, run_simulator, topic_size  # noqa: F401
from join_reference import POWER, reference_join, reference_outliers
from kafka_joiner_support import JoinerProcess, as_multiset, delete_internal_topics, new_group, read_outputs
from spark_support import OUTPUT_DEADLINE_S, SparkJoinerProcess
from support import read_topic, wait_for

pytestmark = pytest.mark.integration

TICKS = 120  # readings per machine, one a second
START_MS = 1_700_000_000_000
SPEED, TORQUE = "actSpeed_C11", "vaTorque_C11"


def machine_rows(thing: str, *, outlier_at: int | None = None, outlier_ms: int = 0, only: str | None = None,
                 step_at: int | None = None, step_ms: int = 0, gap_at: int | None = None) -> list[dict]:
    """A machine's rows, speed and torque each second (torque half a second later), with one fault: the readings
    of one tick stamped `outlier_ms` off (of `only` that quantity), a clock moved by `step_ms` from `step_at` on,
    or an hour's pause at `gap_at`."""
    rows = []
    for tick in range(TICKS):
        shift = (step_ms if step_at is not None and tick >= step_at else 0) + \
                (HOUR_MS if gap_at is not None and tick >= gap_at else 0)
        for quantity, half, value in ((SPEED, 0, 1000.0 + tick), (TORQUE, 500, 2.0 + tick % 7)):
            stamp = START_MS + tick * 1000 + half + shift
            if tick == outlier_at and only in (None, quantity):
                stamp += outlier_ms
            rows.append({"Thing": thing, "Timestamp": stamp, quantity: value, "id": f"{thing}-{tick}-{quantity}"})
    return rows


def plant_rows() -> list[dict]:
    """The machines' rows, machine after machine as each sends them (one topic per machine keeps its order)."""
    machines = [
        machine_rows("ahead-one-reading", outlier_at=60, outlier_ms=10 * YEAR_MS, only=SPEED),
        machine_rows("ahead-both-readings", outlier_at=60, outlier_ms=10 * YEAR_MS),
        machine_rows("behind-one-reading", outlier_at=40, outlier_ms=-2 * HOUR_MS, only=TORQUE),
        machine_rows("set-back", step_at=60, step_ms=-HOUR_MS),
        machine_rows("set-ahead", step_at=60, step_ms=2 * HOUR_MS),
        machine_rows("off-for-an-hour", gap_at=60),
        machine_rows("well-behaved"),
    ]
    return [row for rows in machines for row in rows]


def records_of(bootstrap: str, topic: str) -> list[dict]:
    """machine.data as the joiners read it: each stream in partition order."""
    return [json.loads(m.value) for m in sorted(read_topic(bootstrap, topic), key=lambda m: (m.partition, m.offset))]


def dead_lettered_readings(bootstrap: str, dlq: str) -> list[tuple]:
    letters = [json.loads(m.value) for m in read_topic(bootstrap, dlq)]
    assert all(letter["reason"].startswith("clock_outlier: ") for letter in letters), letters
    return sorted((json.loads(letter["payload"])["thing"], json.loads(letter["payload"])["quantity"],
                   json.loads(letter["payload"])["phenomenonTime"]) for letter in letters)


def replay(bridge, tmp_path: Path) -> list[dict]:
    rows = plant_rows()
    events = tmp_path / "clock_faults.json"
    events.write_text("".join(json.dumps(row) + "\n" for row in rows))
    simulated = run_simulator(bridge.mqtt_topic, "--events-file", str(events), "--order", "file")
    assert simulated.returncode == 0 and f"published {len(rows)} rows" in simulated.stdout, simulated.stdout
    wait_for(lambda: topic_size(bridge.bootstrap, bridge.data_topic) >= len(rows), 90, f"{len(rows)} records")
    return records_of(bridge.bootstrap, bridge.data_topic)


def check_the_reference(records: list[dict]) -> tuple[list[dict], list[tuple]]:
    """The reference's join and outliers of machine.data, and what they say of each machine."""
    expected = reference_join(records, POWER)
    outliers = sorted((r["thing"], r["quantity"], r["phenomenonTime"]) for r in reference_outliers(records, POWER))
    joins = {}
    for output in expected:
        joins[output["thing"]] = joins.get(output["thing"], 0) + 1
    clean = 2 * TICKS - 1  # each reading with the other quantity's before and after it, but the last torque
    assert joins["well-behaved"] == clean
    # An outlier's two pairs are gone, and nothing takes their place (its neighbours are 1.5 s apart, beyond 1 s).
    assert joins["ahead-one-reading"] == joins["behind-one-reading"] == clean - 2
    assert joins["ahead-both-readings"] == clean - 3
    # A pair across the jump is none (over a second apart); the set-back clock's old timeline ends with its last
    # pair and the new one joins every reading.
    assert joins["set-ahead"] == joins["off-for-an-hour"] == joins["set-back"] == clean - 1
    assert [thing for thing, _, _ in outliers] == ["ahead-both-readings", "ahead-both-readings", "ahead-one-reading",
                                                   "behind-one-reading"]
    return expected, outliers


def test_both_joiners_follow_lying_clocks_as_the_reference_does(connector, bootstrap, new_topics,  # noqa: F811
                                                                tmp_path) -> None:
    bridge = connector()
    bridge.bootstrap = bootstrap
    records = replay(bridge, tmp_path)
    expected, outliers = check_the_reference(records)
    data = SimpleNamespace(data=bridge.data_topic)

    lsb_topics = new_topics()
    lsb = JoinerProcess(bootstrap, SimpleNamespace(data=data.data, out=lsb_topics.out, dlq=lsb_topics.dlq),
                        new_group(), tmp_path, "clock", "--max-transaction-records", "50")
    try:
        lsb.start()
        for committed in (len(expected) // 4, len(expected) // 2):  # kill -9 while faults are in its state
            wait_for(lambda: topic_size(bootstrap, lsb_topics.out) >= committed, 120, f"{committed} joins")
            lsb.kill()
            lsb.start()
            wait_for(lambda: "changelog records" in lsb.log(), 60, "the restarted joiner's restore")
        outputs = read_outputs(bootstrap, lsb_topics.out, len(expected))
        assert as_multiset([m.value for m in outputs]) == as_multiset(expected)  # once each
        assert dead_lettered_readings(bootstrap, lsb_topics.dlq) == outliers
        assert lsb.runs == 3 and not lsb.failed()
    finally:
        lsb.kill()
        delete_internal_topics(bootstrap, [lsb.group_id])

    spark_topics = new_topics()
    spark = SparkJoinerProcess(bootstrap, SimpleNamespace(data=data.data, out=spark_topics.out, dlq=spark_topics.dlq),
                               tmp_path / "checkpoint", tmp_path)
    try:
        spark.start()
        wait_for(lambda: spark.check_alive() or topic_size(bootstrap, spark_topics.out) >= len(expected),
                 OUTPUT_DEADLINE_S, f"{len(expected)} committed records", interval_s=2)
        outputs = read_topic(bootstrap, spark_topics.out, idle_s=1.5)
        assert as_multiset([m.value for m in outputs]) == as_multiset(expected)
        assert dead_lettered_readings(bootstrap, spark_topics.dlq) == outliers
    finally:
        spark.kill()
