"""The standalone Kafka joiner against real Kafka: its committed machine.out equals the offline engine's
join on the same records, exactly once, through file-order input, crashes and a second instance."""
from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import EVENTS_FILE
from kafka_joiner_support import (JoinerProcess, as_multiset, delete_internal_topics, key_of, new_group,
                                  offline_join, read_outputs, rows_as_records)
from support import produce_records, read_topic, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def joiners(bootstrap: str, tmp_path: Path) -> Iterator[list[JoinerProcess]]:
    """Joiner subprocesses of one test; killed, and their internal topics deleted, afterwards."""
    started: list[JoinerProcess] = []
    yield started
    for joiner in started:
        joiner.kill()
    delete_internal_topics(bootstrap, sorted({joiner.group_id for joiner in started}))


def start_joiner(joiners: list[JoinerProcess], bootstrap: str, topics, group: str, tmp_path: Path,
                 instance_id: str | None = None) -> JoinerProcess:
    joiner = JoinerProcess(bootstrap, topics, group, tmp_path, instance_id)
    joiners.append(joiner)
    return joiner.start()


def test_time_order_replay_equals_offline_join(bootstrap, new_topics, joiners, tmp_path) -> None:
    topics = new_topics()
    records = rows_as_records(EVENTS_FILE, time_order=True)
    expected, rejected = offline_join(records)
    assert expected and not rejected
    joiner = start_joiner(joiners, bootstrap, topics, new_group(), tmp_path)
    produce_records(bootstrap, topics.data, records, key=key_of)

    outputs = read_outputs(bootstrap, topics.out, len(expected))
    assert as_multiset([m.value for m in outputs]) == as_multiset(expected)
    assert all(m.key.decode() == f"{json.loads(m.value)['thing']}.{json.loads(m.value)['quantity']}"
               for m in outputs)
    assert read_topic(bootstrap, topics.dlq, idle_s=0.5) == []
    assert joiner.terminate() == 0
    assert "stopped" in joiner.log()
