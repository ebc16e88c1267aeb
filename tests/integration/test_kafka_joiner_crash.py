"""A crash of the standalone joiner commits nothing half-done: an exception raised inside the loop, with
outputs and state changes already produced in the open transaction, aborts that transaction; a restart
then writes exactly the offline join, with no record dead-lettered as out of order."""
from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from conftest import EVENTS_FILE
from kafka_joiner_support import (JoinerProcess, as_multiset, delete_internal_topics, key_of, new_group,
                                  offline_join, read_outputs, rows_as_records)
from kafka_joiner.service import KafkaJoiner
from kafka_joiner.settings import KafkaJoinerSettings
from support import produce_records, read_topic

pytestmark = pytest.mark.integration


class InjectedFault(RuntimeError):
    """The fault the test raises inside the joiner's loop."""


def fail_midway(joiner: KafkaJoiner, after_records: int) -> Callable[[], int]:
    """Make the joiner raise while it reads a frame once `after_records` records were framed and the open
    transaction holds outputs; returns a function telling how many outputs the transaction held then."""
    frames = joiner._frames
    frame_of = frames._frame_of
    seen = 0
    held_outputs = 0

    def failing_frame_of(message):
        nonlocal seen, held_outputs
        transaction = joiner._transaction
        if seen >= after_records and transaction.open and transaction.append_times:
            held_outputs = len(transaction.append_times)
            raise InjectedFault(f"after {seen} records")
        records = frame_of(message)
        seen += len(records)
        return records

    frames._frame_of = failing_frame_of
    return lambda: held_outputs


@pytest.mark.parametrize("by_thing", [True, False], ids=["by_thing", "by_key"])
def test_an_exception_mid_transaction_aborts_it_and_a_restart_joins_exactly(bootstrap, new_topics, tmp_path,
                                                                           by_thing) -> None:
    topics = new_topics()
    records = rows_as_records(EVENTS_FILE, time_order=True)
    expected, _ = offline_join(records)
    group = new_group()
    # The whole input waits before the joiner starts: consume batches come back full, so the open
    # transaction spans several of them (no commit on a short batch) when the fault strikes.
    produce_records(bootstrap, topics.data, records, key=key_of, by_thing=by_thing)
    settings = KafkaJoinerSettings(
        kafka_bootstrap_servers=bootstrap, input_topic=topics.data, output_topic=topics.out, dlq_topic=topics.dlq,
        group_id=group, transactional_id_prefix=group, instance_id="crashing", input_partitioned_by_thing=by_thing,
        commit_interval_ms=600_000, health_metrics=False)
    restart = JoinerProcess(bootstrap, topics, group, tmp_path, "crashing", *(("--input-partitioned-by-thing",)
                                                                              if by_thing else ()))
    try:
        joiner = KafkaJoiner(settings)
        joiner.start()
        # About 40% of the 7,386 joinable records (the others are of quantities no spec joins).
        outputs_in_transaction = fail_midway(joiner, after_records=3_000)
        with pytest.raises(InjectedFault):
            joiner.run(until=lambda run: run.stats.records_out >= len(expected))  # no fault: no hang either
        assert outputs_in_transaction() > 0  # the fault struck a transaction holding outputs
        assert joiner.stats.aborted == 1  # ... which the failure aborted, not committed

        restart.start()
        outputs = read_outputs(bootstrap, topics.out, len(expected))
        assert as_multiset([m.value for m in outputs]) == as_multiset(expected)
        dead_letters = [json.loads(m.value) for m in read_topic(bootstrap, topics.dlq, idle_s=0.5)]
        assert dead_letters == []  # in particular no out_of_order: no record met its own state again
        assert restart.terminate() == 0
    finally:
        restart.close()
        delete_internal_topics(bootstrap, [group])
