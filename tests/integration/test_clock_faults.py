"""Machines whose clocks lie, through the running stack (simulator -> Mosquitto -> stream connector -> Kafka ->
each joiner): a reading or a whole row ten years ahead, a reading two hours behind, a clock set back an hour and
kept there, a clock set two hours ahead and kept there, a machine off for an hour, and a well-behaved machine
(one reading a row, as each quantity's sensor sends it).
Each joiner gives exactly the join the reference (tests/join_reference.py, which shares no code with them) gives
for machine.data as they read it, once each, and dead-letters exactly the reference's outliers, with the reason
clock_outlier; the standalone joiner is killed (kill -9) twice in the middle of the faults and restarts from its
changelog. The join goes on on every new timeline: each machine joins all its readings but the outliers."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from clock_support import check_the_reference, dead_lettered_readings, replay_plant
from connector_support import connector, topic_size  # noqa: F401
from kafka_joiner_support import JoinerProcess, as_multiset, delete_internal_topics, new_group, read_outputs
from spark_support import OUTPUT_DEADLINE_S, SparkJoinerProcess
from support import read_topic, wait_for

pytestmark = pytest.mark.integration

def test_both_joiners_follow_lying_clocks_as_the_reference_does(connector, bootstrap, new_topics,  # noqa: F811
                                                                tmp_path) -> None:
    bridge = connector()
    bridge.bootstrap = bootstrap
    records = replay_plant(bridge, tmp_path)
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
        assert lsb.kills == 2 and lsb.runs == 3 and not lsb.failed()  # two confirmed kills, three starts
    finally:
        lsb.close()
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
        spark.close()
