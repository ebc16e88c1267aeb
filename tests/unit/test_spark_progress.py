"""The Spark joiner's progress from Structured Streaming's progress updates, without Spark: the updates
below are trimmed from the JSON of a real run of the job (local[2], at most 1,000 records per batch)."""
from __future__ import annotations

import copy
from typing import Any

from spark_joiner.progress import QueryProgress, SparkJoinerCounters, batch_seconds, input_lag, state_size
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


def test_input_lag_is_latest_minus_end_offset_over_the_partitions() -> None:
    assert input_lag(FIRST) == (1422 - 474) + (532 - 177) + (518 - 172) + 0 + (528 - 176)
    assert input_lag(SECOND) == 475 + 178 + 174 + 0 + 177


def test_an_update_without_offsets_has_no_lag() -> None:
    before_first_batch = copy.deepcopy(FIRST)
    before_first_batch["sources"][0]["endOffset"] = None
    assert input_lag(before_first_batch) is None and input_lag({"sources": []}) is None


def test_state_size_and_batch_duration() -> None:
    assert state_size(SECOND) == (1, 7060) and state_size(IDLE) is None
    assert batch_seconds(SECOND) == 2.495


def _progress() -> tuple[QueryProgress, SinkCounters]:
    sink = SinkCounters(batches=2, joins=416, dead_letters=3, skipped_batches=1)
    return QueryProgress(SparkJoinerCounters(), sink), sink


def test_only_updates_after_the_last_report_count() -> None:
    progress, _ = _progress()
    assert [u["batchId"] for u in progress.new_updates([FIRST, SECOND])] == [0, 1]
    assert progress.new_updates([FIRST, SECOND]) == []
    assert [u["timestamp"] for u in progress.new_updates([FIRST, SECOND, IDLE])] == [IDLE["timestamp"]]
    # A restarted query is a new run: its updates count though their times are not later.
    restarted = update(2, "2026-11-24T23:14:00.000Z", 10, 900, {"0": 1422, "1": 532, "2": 518, "3": 0, "4": 528},
                       LATEST, run="run-2")
    assert progress.new_updates([restarted]) == [restarted]


def test_the_observation_sums_rows_keeps_the_longest_batch_and_the_latest_lag_and_state() -> None:
    progress, sink = _progress()
    observed = progress.observation([FIRST, SECOND, IDLE])
    counters = progress.counters
    assert counters.records_in == 999 + 997
    assert (counters.records_out, counters.dead_letters, counters.batches, counters.skipped_batches) == (416, 3, 2, 1)
    assert observed.lag == 1004  # the idle update repeats the second batch's offsets
    assert observed.values["batch_seconds"] == 48.681  # the first batch, the longest
    assert (observed.values["state_rows"], observed.values["state_bytes"]) == (1, 7060)
    # Nothing new: the lag and state stand as last seen, no batch ran.
    sink.joins = 500
    again = progress.observation([])
    assert again.lag == 1004 and again.values["batch_seconds"] is None and again.values["state_bytes"] == 7060
    assert counters.records_out == 500 and counters.records_in == 1996
