"""The seed-compatible API: Record and its time normalisation, StreamBuffer's options and hooks."""

from __future__ import annotations

import logging

import pytest

from local_stream_buffer import IngestStatus, JoinCase, Record, StreamBuffer, record_from_dict
from pipeline_core.timestamps import to_epoch_seconds


@pytest.mark.parametrize("value, seconds", [
    (1554096460, 1554096460),
    (1554096460415, 1554096460.415),
    (1554096460415123, 1554096460.415123),
    (1554096460415123456, 1554096460.4151235),
    ("2019-04-01T05:27:40.415", 1554096460.415),  # naive: UTC
    ("2019-04-01T07:27:40.415+02:00", 1554096460.415),
    ("2019-04-01T05:27:40.415Z", 1554096460.415),
])
def test_times_are_normalised_to_epoch_seconds(value, seconds) -> None:
    assert to_epoch_seconds(value) == pytest.approx(seconds, abs=1e-6)
    assert Record("q", timestamp=value).get_time() == pytest.approx(seconds, abs=1e-6)


def test_record_api() -> None:
    record = record_from_dict({"quantity": "q", "phenomenonTime": 1600000000, "result": 2.5, "thing": "R1"})
    assert (record.get_quantity(), record.get_time(), record.get_result()) == ("q", 1600000000, 2.5)
    assert record.get("thing") == "R1" and record.get("missing") is None
    assert record.get_metadata() == {"thing": "R1"}
    assert Record("q", phenomenon_time=1, result=1).get_time() == 1
    with pytest.raises(ValueError):
        Record("q")


def test_stream_buffer_hooks_counters_and_buffers() -> None:
    committed: list[Record] = []
    stream_buffer = StreamBuffer(delta_time=10, commit_function=lambda record_to_commit: committed.append(record_to_commit))
    left = [Record("r", timestamp=t, result=t, machine="M1") for t in (1, 2, 3)]
    right = [Record("s", timestamp=t, result=t) for t in (2.5, 4)]
    for record in left:
        assert stream_buffer.ingest_left(record) is IngestStatus.ACCEPTED
    assert stream_buffer.ingest_left(left[-1]) is IngestStatus.DUPLICATE
    assert stream_buffer.ingest_left(Record("r", timestamp=0, result=0)) is IngestStatus.REJECTED
    for record in right:
        stream_buffer.ingest_right(record)
    results = stream_buffer.fetch_results()
    assert results[0] == {"r.quantity": "r", "r.phenomenonTime": 1, "r.result": 1, "s.quantity": "s",
                          "s.phenomenonTime": 2.5, "s.result": 2.5, "case": "left_successor",
                          "r.metadata": {"machine": "M1"}}
    assert stream_buffer.fetch_results() == []
    assert (stream_buffer.get_left_counter(), stream_buffer.get_right_counter()) == (5, 2)
    assert (stream_buffer.get_duplicate_counter(), stream_buffer.get_rejected_counter()) == (1, 1)
    assert stream_buffer.get_join_counter() == len(results) == 4  # 1-2.5, 2-2.5, 3-2.5, 3-4
    # Left 3 is the predecessor of right records to come, right 2.5 of left records before 4.
    assert stream_buffer.get_left_buffer() == [left[-1]] and stream_buffer.get_right_buffer() == right
    assert committed == left[:2]
    assert stream_buffer.get_peak_buffer_size() == 3


def test_join_functions_with_and_without_the_case() -> None:
    def product(record_left: Record, record_right: Record) -> float:
        return record_left.get_result() * record_right.get_result()

    def labelled(record_left: Record, record_right: Record, case: JoinCase) -> tuple[JoinCase, float]:
        return case, product(record_left, record_right)

    for join_function, expected in ((product, [6]), (labelled, [(JoinCase.SAME_TIME, 6)])):
        stream_buffer = StreamBuffer(join_function=join_function)
        stream_buffer.ingest_left(Record("r", timestamp=1, result=2))
        stream_buffer.ingest_right(Record("s", timestamp=1, result=3))
        assert stream_buffer.fetch_results() == expected


def test_results_need_not_be_buffered_and_verbose_logs(caplog: pytest.LogCaptureFixture) -> None:
    seen = []
    stream_buffer = StreamBuffer(buffer_results=False, verbose=True,
                                 join_function=lambda record_left, record_right: seen.append(record_left))
    with caplog.at_level(logging.INFO, logger="local_stream_buffer"):
        stream_buffer.ingest_left(Record("r", timestamp=1, result=2))
        stream_buffer.ingest_right(Record("s", timestamp=2, result=3))
    assert stream_buffer.fetch_results() == [] and len(seen) == 1 and stream_buffer.get_join_counter() == 1
    assert "join case left_successor" in caplog.text


def test_only_instant_emission_as_in_the_seed() -> None:
    with pytest.raises(NotImplementedError):
        StreamBuffer(instant_emit=False)


def test_times_must_be_finite() -> None:
    for value in (float("nan"), float("inf")):
        with pytest.raises(ValueError):
            Record("q", timestamp=value)
