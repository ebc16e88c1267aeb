"""The standalone joiner's bound on join keys per partition (local_stream_buffer.eviction), against real
Kafka: past the bound the least recently used keys are evicted, the records they held are dead-lettered as
evicted, and their changelog entries are deleted, so the changelog holds no more than the bound allows."""
from __future__ import annotations

import json

import pytest

from kafka_joiner_support import (JoinerProcess, as_multiset, delete_internal_topics, key_of, machines_of_one_key,
                                  new_group, offline_join)
from kafka_joiner.changelog import COVERAGE_KEY
from pipeline_core.topics import MACHINE_DATA
from support import produce_records, read_topic

pytestmark = pytest.mark.integration

MACHINES = 60
MAX_JOIN_KEYS = 5


def test_past_the_bound_keys_are_evicted_dead_lettered_and_deleted_from_the_changelog(bootstrap, new_topics,
                                                                                      tmp_path) -> None:
    topics = new_topics()
    # One key per machine, machine after machine: each key is complete (its pairs out) before it is evicted.
    records, held_per_key = machines_of_one_key(MACHINES)
    expected, _ = offline_join(records)
    group = new_group()
    joiner = JoinerProcess(bootstrap, topics, group, tmp_path, None, "--input-partitioned-by-thing",
                           "--max-join-keys", str(MAX_JOIN_KEYS))
    try:
        joiner.start()
        produce_records(bootstrap, topics.data, records, key=key_of, by_thing=True)
        outputs = read_topic(bootstrap, topics.out, expected=len(expected))
        assert as_multiset([m.value for m in outputs]) == as_multiset(expected)
        # Each partition keeps 4 or 5 of its machines' keys: the others were evicted, all they held dead-lettered
        # (in the transactions of the outputs read above, or before them).
        letters = [json.loads(m.value) for m in read_topic(bootstrap, topics.dlq, idle_s=1.0)]
        evicted_things = {letter["key"].split(".")[0] for letter in letters}
        assert all(letter["reason"].startswith("evicted: join key m") for letter in letters)
        assert len(letters) == len(evicted_things) * held_per_key
        kept = MACHINES - len(evicted_things)
        assert 4 * MACHINE_DATA.partitions <= kept <= MAX_JOIN_KEYS * MACHINE_DATA.partitions
        # The changelog, compacted (the latest value per key): only the held records of the kept keys.
        latest: dict[tuple[int, bytes], bytes | None] = {}
        for message in read_topic(bootstrap, f"{group}.{topics.data}.state", idle_s=1.0):
            latest[(message.partition, message.key)] = message.value
        held_records = [value for (_, key), value in latest.items() if key != COVERAGE_KEY and value is not None]
        assert len(held_records) == kept * held_per_key
        assert joiner.terminate() == 0
    finally:
        joiner.close()
        delete_internal_topics(bootstrap, [group])
