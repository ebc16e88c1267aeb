"""The Spark joiner's progress from Structured Streaming's progress updates, without Spark: the updates
below are trimmed from the JSON of a real run of the job (local[2], at most 1,000 records per batch)."""
from __future__ import annotations

import copy
from typing import Any

from spark_joiner.progress import (Partition, QueryProgress, SparkJoinerCounters, batch_seconds, end_offsets,
                                   input_lag, state_size)
from spark_joiner.sink import SinkCounters

TOPIC = "machine.data.sparkdump"


def update(batch_id: int, timestamp: str, rows: int, trigger_ms: int, end: dict[str, int], latest: dict[str, int],
           state: tuple[int, int] | None = (1, 7060), run: str = "run-1") -> dict[str, Any]:
    return {
        "runId": run, "name": "spark_joiner", "timestamp": timestamp, "batchId": batch_id, "numInputRows": rows,
        "processedRowsPerSecond": 398.0, "durationMs": {"addBatch": trigger_ms - 300, "triggerExecution": trigger_ms},
        "stateOperators": [] if state is None else [
            {"operatorName": "transformWithStateInPandasExec", "numRowsTotal": state[0], "memoryUsedBytes": state[1],
             "customMetrics": {"rocksdbSstFileSize": 1573}}],
        "sources": [{"description": f"KafkaV2[Subscribe[{TOPIC}]]",
                     "endOffset": {TOPIC: dict(end)}, "latestOffset": {TOPIC: dict(latest)},
                     "numInputRows": rows}],
    }


LATEST = {"0": 1422, "1": 532, "2": 518, "3": 0, "4": 528}
FIRST = update(0, "2026-11-24T23:13:18.913Z", 999, 48_681, {"0": 474, "1": 177, "2": 172, "3": 0, "4": 176}, LATEST,
               state=(1, 6316))
SECOND = update(1, "2026-11-24T23:14:07.646Z", 997, 2_495, {"0": 947, "1": 354, "2": 344, "3": 0, "4": 351}, LATEST)
IDLE = update(1, "2026-11-24T23:14:17.650Z", 0, 3, {"0": 947, "1": 354, "2": 344, "3": 0, "4": 351}, LATEST,
              state=None)


BROKER_LATEST = {(TOPIC, partition): offset for partition, offset in enumerate((1500, 532, 600, 0, 528))}


def test_the_end_offsets_of_a_batch_per_partition() -> None:
    assert end_offsets(SECOND) == {(TOPIC, 0): 947, (TOPIC, 1): 354, (TOPIC, 2): 344, (TOPIC, 3): 0, (TOPIC, 4): 351}
    before_first_batch = copy.deepcopy(FIRST)
    before_first_batch["sources"][0]["endOffset"] = None
    assert end_offsets(before_first_batch) is None and end_offsets({"sources": []}) is None


def test_input_lag_is_the_broker_s_latest_minus_the_committed_end_offset() -> None:
    ends = end_offsets(SECOND)
    assert input_lag(ends, BROKER_LATEST) == (1500 - 947) + (532 - 354) + (600 - 344) + 0 + (528 - 351)
    # Partitions the broker gave no answer for do not count; none answered: unknown.
    assert input_lag(ends, {(TOPIC, 0): 950}) == 3 and input_lag(ends, {}) is None


def test_state_size_and_batch_duration() -> None:
    assert state_size(SECOND) == (1, 7060) and state_size(IDLE) is None
    assert batch_seconds(SECOND) == 2.495


class _Broker:
    """Stands in for the broker's latest offsets; records what was asked."""

    def __init__(self, latest: dict[Partition, int] | None) -> None:
        self.latest = latest
        self.asked: list[set[Partition]] = []

    def __call__(self, partitions) -> dict[Partition, int] | None:
        self.asked.append(set(partitions))
        return self.latest


def _progress(broker: _Broker | None = None) -> tuple[QueryProgress, SinkCounters]:
    sink = SinkCounters(batches=2, joins=416, dead_letters=3, skipped_batches=1)
    return QueryProgress(SparkJoinerCounters(), sink, broker or _Broker(BROKER_LATEST)), sink


def test_only_updates_after_the_last_report_count() -> None:
    progress, _ = _progress()
    assert [u["batchId"] for u in progress.new_updates([FIRST, SECOND])] == [0, 1]
    assert progress.new_updates([FIRST, SECOND]) == []
    assert [u["timestamp"] for u in progress.new_updates([FIRST, SECOND, IDLE])] == [IDLE["timestamp"]]
    # A restarted query is a new run: its updates count though their times are not later.
    restarted = update(2, "2026-11-24T23:14:00.000Z", 10, 900, {"0": 1422, "1": 532, "2": 518, "3": 0, "4": 528},
                       LATEST, run="run-2")
    assert progress.new_updates([restarted]) == [restarted]


def test_the_observation_sums_rows_keeps_the_longest_batch_and_the_latest_state() -> None:
    broker = _Broker(BROKER_LATEST)
    progress, sink = _progress(broker)
    assert progress.observation([]).lag is None and broker.asked == []  # no batch yet: no end offsets
    observed = progress.observation([FIRST, SECOND, IDLE])
    counters = progress.counters
    assert counters.records_in == 999 + 997
    assert (counters.records_out, counters.dead_letters, counters.batches, counters.skipped_batches) == (416, 3, 2, 1)
    assert observed.lag == 553 + 178 + 256 + 0 + 177  # beyond the second batch, which the idle update repeats
    assert broker.asked[-1] == set(BROKER_LATEST)
    assert observed.values["batch_seconds"] == 48.681  # the first batch, the longest
    assert (observed.values["state_rows"], observed.values["state_bytes"]) == (1, 7060)
    # Nothing new: the state stands as last seen, no batch ran, the lag is asked again (input keeps coming).
    sink.joins = 500
    broker.latest = {**BROKER_LATEST, (TOPIC, 3): 40}
    again = progress.observation([])
    assert again.lag == observed.lag + 40 and again.values["batch_seconds"] is None
    assert again.values["state_bytes"] == 7060
    assert counters.records_out == 500 and counters.records_in == 1996


def test_without_the_broker_s_answer_the_lag_is_unknown_and_the_job_waits_for_kafka() -> None:
    broker = _Broker(None)
    progress, _ = _progress(broker)
    observed = progress.observation([FIRST])
    assert observed.lag is None and observed.work_waiting  # unknown is not idle: the heartbeat turns stuck
    assert observed.waiting_for == "Kafka (the input's end offsets unanswered)"
    broker.latest = BROKER_LATEST
    assert progress.observation([]).waiting_for is None


def test_a_sink_waiting_for_kafka_is_work_waiting() -> None:
    waiting_for: list[str | None] = [None]
    progress = QueryProgress(SparkJoinerCounters(), SinkCounters(), _Broker(BROKER_LATEST),
                             sink_waiting_for=lambda: waiting_for[0])
    assert progress.observation([FIRST]).waiting_for is None
    waiting_for[0] = "Kafka"  # a transaction unanswered, or resume() waiting for a new producer
    observed = progress.observation([])
    assert observed.waiting_for == "Kafka" and observed.work_waiting


def test_a_query_failing_again_and_again_is_work_waiting_until_a_batch_commits() -> None:
    progress, sink = _progress(_Broker(None))
    assert progress.observation([]).waiting_for is None
    progress.query_failures += 2  # restarted from the checkpoint twice; no update told the lag
    observed = progress.observation([])
    assert observed.lag is None and observed.work_waiting
    assert observed.waiting_for == "its query (failed 2 times since its last batch)"
    sink.batches += 1  # a batch committed after the restarts: the query works again
    assert progress.observation([]).waiting_for is None


def _with_start(batch: dict[str, Any], start: dict[str, int]) -> dict[str, Any]:
    batch = copy.deepcopy(batch)
    batch["sources"][0]["startOffset"] = {TOPIC: dict(start)}
    batch["numInputRows"] = batch["sources"][0]["numInputRows"] = sum(
        batch["sources"][0]["endOffset"][TOPIC][partition] - offset for partition, offset in start.items())
    return batch


def test_a_batch_whose_update_never_came_is_no_skip_but_a_gap_between_consecutive_batches_is() -> None:
    progress, _ = _progress()
    end_0 = FIRST["sources"][0]["endOffset"][TOPIC]
    progress.observation([FIRST])
    # Batch 1 committed, then the query failed before reporting it (a restarted query's first batch): batch 2
    # starts where batch 1 ended, past batch 0's end, and skipped nothing.
    end_1 = {partition: offset + 100 for partition, offset in end_0.items()}
    third = update(2, "2026-11-24T23:15:00.000Z", 0, 900, {p: o + 50 for p, o in end_1.items()}, LATEST, run="run-2")
    progress.observation([_with_start(third, end_1)])
    assert progress.counters.records_skipped == 0
    # The next batch starts 7 records past batch 2's end: those were skipped (failOnDataLoss=false).
    end_2 = third["sources"][0]["endOffset"][TOPIC]
    fourth = update(3, "2026-11-24T23:15:01.000Z", 0, 900, {p: o + 20 for p, o in end_2.items()}, LATEST, run="run-2")
    progress.observation([_with_start(fourth, {**end_2, "0": end_2["0"] + 7})])
    assert progress.counters.records_skipped == 7
