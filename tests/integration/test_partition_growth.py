"""machine.data grown from 5 to 8 partitions by the admin API under the standalone joiner, machine.out exactly the
oracle's join (tests/join_reference.py), nothing twice, no dead letter. Records are placed as the stream connector
places them, naming their partition counts.

Input partitioned by thing (as every topology runs it), two instances started once records were placed by both
counts, so they meet moved things with their old records still unread (a catch-up after an outage, a rebuild sees
that): the changelog and handover topics follow the input's count, and each moved thing's join state follows its
records (`kafka_joiner.handover`), asked for only once its old records were read. Input partitioned by key: the
joiner's repartition topic keeps its count, the input grows beneath it (the writer switching to the new count once
the joiner had read what it placed by the old one, as the stream connector does)."""
from __future__ import annotations

import pytest

from growth_support import (as_counter, committed_past, ends_of, grow, machine_rows, moving_things, place,
                            read_with_placement, reference_outputs)
from kafka_joiner_support import JoinerProcess, joiners, new_group  # noqa: F401 (fixture)
from pipeline_core.kafka_clients import admin_client
from pipeline_core.topics import partition_count
from support import read_topic, wait_for

pytestmark = pytest.mark.integration

BEFORE, AFTER = 5, 8
THINGS = moving_things(8, BEFORE, AFTER)


def internal_partitions(bootstrap: str, group: str, topic: str) -> dict[str, int]:
    admin = admin_client(bootstrap)
    names = [f"{group}.{topic}.state", f"{group}.{topic}.handover"]
    return {name: partition_count(admin, name) for name in names}


def test_input_partitioned_by_key_grows_beneath_the_repartition_topic(bootstrap, new_topics, joiners, tmp_path):
    """Without --input-partitioned-by-thing the joiner co-partitions through a topic of its own, whose count stays:
    the input grows beneath it, every record forwarded in its order."""
    topics = new_topics()
    group = new_group()
    joiner = JoinerProcess(bootstrap, topics, group, tmp_path, "by-key")
    joiners.append(joiner)
    joiner.start()
    place(bootstrap, topics.data, machine_rows(THINGS, 0, 30), (BEFORE,))
    ends = ends_of(bootstrap, topics.data)
    wait_for(lambda: committed_past(bootstrap, group, topics.data, ends), 90, "the joiner to read what was placed by 5")
    assert grow(bootstrap, topics.data, AFTER) == AFTER
    place(bootstrap, topics.data, machine_rows(THINGS, 30, 30), (BEFORE, AFTER))
    expected = reference_outputs(read_with_placement(bootstrap, topics.data))
    read_topic(bootstrap, topics.out, expected=sum(expected.values()), deadline_s=120)
    outputs = read_topic(bootstrap, topics.out, idle_s=2.0, deadline_s=60)
    assert as_counter(message.value for message in outputs) == expected
    assert read_topic(bootstrap, topics.dlq, idle_s=1.0, deadline_s=30) == []
    admin = admin_client(bootstrap)
    assert partition_count(admin, f"{group}.{topics.data}.by-thing") == BEFORE
    assert joiner.terminate() == 0


def test_a_moved_thing_waits_for_its_records_left_unread(bootstrap, new_topics, joiners, tmp_path):
    topics = new_topics()
    group = new_group()
    place(bootstrap, topics.data, machine_rows(THINGS, 0, 30), (BEFORE,))
    assert grow(bootstrap, topics.data, AFTER) == AFTER
    place(bootstrap, topics.data, machine_rows(THINGS, 30, 30), (BEFORE, AFTER))
    # Two instances: things move between partitions that different instances own.
    first = JoinerProcess(bootstrap, topics, group, tmp_path, "catching-up-1", "--input-partitioned-by-thing")
    second = JoinerProcess(bootstrap, topics, group, tmp_path, "catching-up-2", "--input-partitioned-by-thing")
    joiners.extend([first, second])
    first.start()
    second.start()

    expected = reference_outputs(read_with_placement(bootstrap, topics.data))
    read_topic(bootstrap, topics.out, expected=sum(expected.values()), deadline_s=120)
    outputs = read_topic(bootstrap, topics.out, idle_s=2.0, deadline_s=60)
    assert as_counter(message.value for message in outputs) == expected
    assert read_topic(bootstrap, topics.dlq, idle_s=1.0, deadline_s=30) == []
    handed = first.log().count("handed the join state of") + second.log().count("handed the join state of")
    assert handed == len(THINGS) - 1
    assert internal_partitions(bootstrap, group, topics.data) == {
        f"{group}.{topics.data}.state": AFTER, f"{group}.{topics.data}.handover": AFTER}
    assert first.terminate() == 0 and second.terminate() == 0
