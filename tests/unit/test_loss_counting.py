"""What counts as lost outside the pipeline's control, without servers: the records of an offset gap that the
broker deleted, and what a Spark micro-batch's progress update shows it skipped."""
from __future__ import annotations

from typing import Any

from pipeline_core.data_loss import deleted_unread
from pipeline_core.progress import ConsumerCounters, counter_totals
from spark_joiner.progress import BatchLoss, batch_loss

TOPIC = "machine.data"


def test_only_the_part_of_a_gap_below_the_log_start_was_deleted_unread() -> None:
    assert deleted_unread(expected=100, offset=150, log_start=150) == 50  # retention took 100..149
    assert deleted_unread(expected=100, offset=150, log_start=120) == 20  # 120..149: markers, aborted records
    assert deleted_unread(expected=100, offset=101, log_start=0) == 0  # a transaction marker
    # The log start moved on after the record was fetched: only what lay before the record counts.
    assert deleted_unread(expected=100, offset=150, log_start=400) == 50


def test_the_loss_counters_are_reported_with_every_consuming_stage_s_counters() -> None:
    assert {"records_skipped", "topics_deleted", "offset_resets"} <= set(counter_totals(ConsumerCounters()))


def update(batch_id: int, start: dict[int, int] | None, end: dict[int, int], rows: int,
           topic: str = TOPIC) -> dict[str, Any]:
    source: dict[str, Any] = {"endOffset": {topic: {str(p): o for p, o in end.items()}}, "numInputRows": rows}
    if start is not None:
        source["startOffset"] = {topic: {str(p): o for p, o in start.items()}}
    return {"runId": "run", "batchId": batch_id, "numInputRows": rows, "sources": [source]}


def ends(offsets: dict[int, int], topic: str = TOPIC) -> dict[tuple[str, int], int]:
    return {(topic, partition): offset for partition, offset in offsets.items()}


class Earliest:
    def __init__(self, offsets: dict[tuple[str, int], int]) -> None:
        self.offsets = offsets
        self.asked = 0

    def __call__(self, partitions) -> dict[tuple[str, int], int]:
        self.asked += 1
        return {partition: self.offsets[partition] for partition in partitions if partition in self.offsets}


def test_a_batch_that_read_all_its_ranges_lost_nothing_and_asks_no_broker() -> None:
    earliest = Earliest({})
    loss = batch_loss(update(3, {0: 100, 1: 50}, {0: 200, 1: 80}, rows=130), ends({0: 100, 1: 50}), earliest)
    assert loss == BatchLoss() and earliest.asked == 0


def test_records_below_the_log_start_of_a_short_batch_were_deleted_unread() -> None:
    # Retention took partition 0 up to 160 before the batch read [100, 200): it got 40 + 30 rows.
    earliest = Earliest(ends({0: 160, 1: 0}))
    loss = batch_loss(update(3, {0: 100, 1: 50}, {0: 200, 1: 80}, rows=70), ends({0: 100, 1: 50}), earliest)
    assert loss == BatchLoss(skipped=60)
    # Rows missing for transaction markers only (nothing below the log start): no loss.
    assert batch_loss(update(3, {0: 100}, {0: 200}, rows=98), ends({0: 100}), Earliest(ends({0: 0}))) == BatchLoss()
    # Never more than the rows missing, whatever the log start says now.
    assert batch_loss(update(3, {0: 100}, {0: 200}, rows=90), ends({0: 100}),
                      Earliest(ends({0: 200}))) == BatchLoss(skipped=10)


def test_a_start_beyond_the_previous_end_skipped_the_records_between() -> None:
    assert batch_loss(update(4, {0: 250}, {0: 300}, rows=50), ends({0: 200}), Earliest({})) == \
        BatchLoss(skipped=50)


def test_offsets_going_back_or_a_topic_gone_count_as_a_deleted_topic() -> None:
    # Recreated: partition 0 ends at 12 now, below its start; the source goes on from 12, past the new records.
    went_back = batch_loss(update(5, {0: 300, 1: 80}, {0: 12, 1: 80}, rows=0), ends({0: 300, 1: 80}),
                           Earliest(ends({0: 0})))
    assert went_back == BatchLoss(skipped=12, offset_resets=1, topics_deleted=frozenset({TOPIC}))
    gone = batch_loss(update(5, {0: 0}, {0: 10}, rows=10, topic="other"), ends({0: 300}), Earliest({}))
    assert gone.topics_deleted == frozenset({TOPIC}) and gone.skipped == 0
