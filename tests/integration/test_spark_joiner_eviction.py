"""The Spark job's bound on join keys per bucket (local_stream_buffer.eviction), for real: past the bound the
least recently used keys leave the state store, the records they held are dead-lettered as evicted, and the
joins already certain are all written."""
from __future__ import annotations

import json
import re

import pytest

from kafka_joiner_support import as_multiset, key_of, machines_of_one_key, offline_join
from spark_support import OUTPUT_DEADLINE_S, SparkJoinerProcess, spark_joiners  # noqa: F401 (a fixture)
from support import produce_records, read_topic, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.spark]

MACHINES = 60
MAX_JOIN_KEYS = 20



def state_rows(log: str) -> int | None:
    rows = re.findall(r"state rows ([\d,]+)", log)
    return int(rows[-1].replace(",", "")) if rows else None


def test_past_the_bound_the_least_recently_used_keys_are_evicted_and_dead_lettered(bootstrap, new_topics,
                                                                                   spark_joiners, tmp_path) -> None:
    topics = new_topics()
    # One key per machine (one axis), all in one micro-batch: every pair is certain within it, then the
    # bucket holds 60 keys, 40 past the bound of 20.
    records, held_per_key = machines_of_one_key(MACHINES)
    expected, _ = offline_join(records)
    produce_records(bootstrap, topics.data, records, key=key_of)

    joiner = SparkJoinerProcess(bootstrap, topics, tmp_path / "checkpoint", tmp_path, "--buckets", "1",
                                "--max-join-keys", str(MAX_JOIN_KEYS))
    spark_joiners.append(joiner)
    joiner.start()
    evicted_keys = MACHINES - int(MAX_JOIN_KEYS * 0.9)
    letters = [json.loads(m.value) for m in read_topic(bootstrap, topics.dlq, expected=evicted_keys * held_per_key,
                                                         deadline_s=OUTPUT_DEADLINE_S)]
    outputs = read_topic(bootstrap, topics.out, expected=len(expected), deadline_s=OUTPUT_DEADLINE_S)
    assert as_multiset([m.value for m in outputs]) == as_multiset(expected)
    assert all(letter["reason"].startswith("evicted: join key m") and letter["stage"] == "spark_joiner"
               for letter in letters)
    assert len({letter["key"].split(".")[0] for letter in letters}) == evicted_keys
    evicted = [json.loads(letter["payload"]) for letter in letters]
    assert {json.dumps(record, sort_keys=True) for record in evicted} <= {
        json.dumps({k: record[k] for k in ("thing", "quantity", "phenomenonTime", "result")}, sort_keys=True)
        for record in records}
    # The state store keeps the bound: the bucket's 18 keys and its key count.
    wait_for(lambda: state_rows(joiner.log()) is not None, 60, "a progress line with the state size")
    assert state_rows(joiner.log()) <= MAX_JOIN_KEYS + 1
    assert len(read_topic(bootstrap, topics.dlq, idle_s=1.0)) == len(letters)  # no surplus
    assert joiner.terminate() == 0
