"""Lying clocks and the Spark job's checkpoint: the machines of tests/integration/test_clock_faults.py (outliers
ahead and behind, a clock set back and one set ahead, a machine off for an hour) through the stack, the job
killed (kill -9, its whole process group) midway and restarted from its checkpoint, whose state store alone holds
the records the clock rule set aside and the streams' timelines: still exactly the reference's join and outliers,
once each. Two Spark starts on a shared machine take minutes, hence `make reliability`."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from clock_support import check_the_reference, dead_lettered_readings, replay_plant
from connector_support import connector, topic_size  # noqa: F401
from kafka_joiner_support import as_multiset
from spark_support import OUTPUT_DEADLINE_S, SparkJoinerProcess
from support import read_topic, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]


def test_spark_joiner_killed_in_the_middle_of_clock_faults_changes_nothing(connector, bootstrap,  # noqa: F811
                                                                         new_topics, tmp_path) -> None:
    bridge = connector()
    bridge.bootstrap = bootstrap
    expected, outliers = check_the_reference(replay_plant(bridge, tmp_path))
    topics = new_topics()
    # Small micro-batches (a few dozen over the input), so the kill lands with records set aside in the state.
    spark = SparkJoinerProcess(bootstrap, SimpleNamespace(data=bridge.data_topic, out=topics.out, dlq=topics.dlq),
                               tmp_path / "checkpoint", tmp_path, "--max-offsets-per-trigger", "100")
    try:
        spark.start()
        wait_for(lambda: spark.check_alive() or topic_size(bootstrap, topics.out) >= len(expected) // 3,
                 OUTPUT_DEADLINE_S, "a third of the joins", interval_s=0.5)
        spark.kill()
        assert topic_size(bootstrap, topics.out) < 2 * len(expected) // 3, "the kill came too late to prove anything"
        spark.start()
        wait_for(lambda: spark.check_alive() or topic_size(bootstrap, topics.out) >= len(expected),
                 OUTPUT_DEADLINE_S, f"{len(expected)} committed records", interval_s=2)
        outputs = read_topic(bootstrap, topics.out, idle_s=1.5)
        assert as_multiset([m.value for m in outputs]) == as_multiset(expected)  # once each
        assert dead_lettered_readings(bootstrap, topics.dlq) == outliers
    finally:
        spark.close()
