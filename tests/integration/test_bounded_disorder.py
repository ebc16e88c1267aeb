"""Bounded disorder through the running stack: the shipped events replayed with each machine's rows displaced
by up to 2 s of event time, a few by exactly 2 s (simulator -> Mosquitto -> stream connector -> Kafka), joined
under a spec with max_out_of_orderness 2 s by the standalone joiner and by the Spark job: each gives exactly the
pairs the join's definition gives (join_reference, which are the in-order join's), the same records with the
same ids, and no dead letter. The standalone joiner is
killed (kill -9) and restarted while the replay flows, so its reorder buffers come back from the changelog.
The Spark job killed midway, its buffers coming back from the checkpoint's state store, runs in
`make reliability` (tests/reliability/test_bounded_disorder_restart.py): two Spark starts take minutes."""
from __future__ import annotations

import random
import time
from types import SimpleNamespace

import pytest

from connector_support import connector, topic_size  # noqa: F401
from disorder_support import (SEED, check_displaced, expected_outputs, join_specs, replay,
                              spark_joins_the_disordered_replay)
from kafka_joiner_support import JoinerProcess, as_multiset, delete_internal_topics, new_group, read_outputs, restored
from support import wait_for

pytestmark = pytest.mark.integration


def test_standalone_joiner_absorbs_bounded_disorder_through_kill_9(connector, bootstrap, new_topics,  # noqa: F811
                                                                  tmp_path) -> None:
    bridge = connector()
    topics = new_topics()
    joiner = JoinerProcess(bootstrap, SimpleNamespace(data=bridge.data_topic, out=topics.out, dlq=topics.dlq),
                           new_group(), tmp_path, "disorder", "--join-specs", str(join_specs(tmp_path)),
                           "--input-partitioned-by-thing")
    rng = random.Random(SEED)
    restored_held = []

    def kill_and_restart(simulator) -> None:
        """Kill -9 a few times while the replay flows, each after the joiner committed joins of it."""
        for _ in range(3):
            committed = topic_size(bootstrap, topics.out)
            wait_for(lambda: topic_size(bootstrap, topics.out) > committed or simulator.poll() is not None, 120,
                     "joins committed since the joiner started")
            if simulator.poll() is not None:
                return
            moment = time.monotonic() + rng.uniform(0.0, 1.0)
            wait_for(lambda: time.monotonic() >= moment, 10, "a moment while the replay flows")
            joiner.kill()  # what the reorder buffers held is only in the changelog now
            joiner.start()
            wait_for(lambda: "changelog records" in joiner.log(), 60, "the restarted joiner's restore")
            restored_held.append(restored(joiner.log())[0])

    try:
        joiner.start()
        replay(bridge, tmp_path, kill_and_restart, rate=150)
        assert len(restored_held) >= 2 and max(restored_held) > 0, restored_held
        check_displaced(bootstrap, bridge)
        expected = expected_outputs(bootstrap, bridge)
        outputs = read_outputs(bootstrap, topics.out, len(expected))
        assert as_multiset([m.value for m in outputs]) == as_multiset(expected)  # once each
        assert topic_size(bootstrap, topics.dlq) == 0
    finally:
        joiner.close()
        delete_internal_topics(bootstrap, [joiner.group_id])


@pytest.mark.spark
def test_spark_joiner_absorbs_bounded_disorder(connector, bootstrap, new_topics, tmp_path) -> None:  # noqa: F811
    bridge = connector()
    replay(bridge, tmp_path)
    check_displaced(bootstrap, bridge)
    spark_joins_the_disordered_replay(bridge, bootstrap, new_topics(), tmp_path, kill_midway=False)
