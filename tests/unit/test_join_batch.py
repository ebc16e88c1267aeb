"""The batch path's own duties: state serialisation, order checks on arrays, agreement at scale."""

from __future__ import annotations

import numpy as np

from local_stream_buffer import JoinCase, StreamBuffer
from local_stream_buffer.batch import BatchJoinState, join_batch
from local_stream_buffer.workloads import as_records, random_walks, replay


def test_state_survives_bytes() -> None:
    state, _ = join_batch(None, np.array([1.0, 2.0, 5.0]), np.array([10.0, 20.0, 50.0]),
                          np.array([1.5, 1.5]), np.array([7.0, 8.0]))
    copy = BatchJoinState.from_bytes(state.to_bytes())
    for name in BatchJoinState.__slots__:
        original, restored = getattr(state, name), getattr(copy, name)
        if name in ("times", "values"):
            assert all(np.array_equal(a, b) for a, b in zip(original, restored))
        else:
            assert restored == original or (name == "last_value" and np.allclose(restored, original, equal_nan=True))
    assert BatchJoinState.from_bytes(BatchJoinState().to_bytes()).held() == 0


def test_records_breaking_the_stream_order_are_counted_and_ignored() -> None:
    state, first = join_batch(None, np.array([1.0, 3.0]), np.array([1.0, 3.0]), np.array([2.0]), np.array([2.0]))
    # A redelivered 3 (duplicate), a 2.5 older than 3 and a 3 with another value (rejected), then new records.
    state, second = join_batch(state, np.array([3.0, 2.5, 3.0, 4.0, 4.0]), np.array([3.0, 2.5, 9.0, 4.0, 4.0]),
                               np.array([5.0]), np.array([5.0]))
    assert (state.duplicates, state.rejected, state.records, state.late) == (2, 2, 5, 0)
    clean, expected = join_batch(None, np.array([1.0, 3.0, 4.0]), np.array([1.0, 3.0, 4.0]),
                                 np.array([2.0, 5.0]), np.array([2.0, 5.0]))
    emitted = {(lt, rt) for pairs in (first, second) for lt, rt in zip(pairs.left_time, pairs.right_time)}
    assert emitted == set(zip(expected.left_time, expected.right_time))


def test_batches_agree_with_the_per_record_api_on_the_seed_workload() -> None:
    left, right, order = random_walks(10_000, 10_000)
    stream_buffer = StreamBuffer()
    replay(stream_buffer, as_records(left, "r"), as_records(right, "s"), order)
    per_record = {(r["r.phenomenonTime"], r["s.phenomenonTime"], r["case"]) for r in stream_buffer.fetch_results()}
    arrays = [np.array(series) for series in (left, right)]
    state = None
    batched = set()
    for part in range(7):
        (lt, lv), (rt, rv) = (np.array_split(series, 7)[part].T for series in arrays)
        state, pairs = join_batch(state, lt, lv, rt, rv)
        batched |= {(a, b, JoinCase(c).label) for a, b, c in zip(pairs.left_time, pairs.right_time, pairs.case)}
    assert batched == per_record and state.pairs == 26_497
    # Held: the records one walk has past the other's end (pending), its anchor and the other's last record.
    left_end, right_end = left[-1][0], right[-1][0]
    pending = sum(t > right_end for t, _ in left) + sum(t > left_end for t, _ in right)
    assert state.held() == pending + 2 == len(stream_buffer.get_left_buffer() + stream_buffer.get_right_buffer())


def test_empty_batches_are_fine() -> None:
    state, pairs = join_batch(None, [], [], [], [])
    assert pairs.count == 0 and state.held() == 0
    state, pairs = join_batch(state, [1.0], [1.0], [], [])
    state, pairs = join_batch(state, [], [], [], [])
    assert pairs.count == 0 and state.held() == 1


def test_a_nan_time_is_rejected_without_rejecting_the_rest() -> None:
    state, pairs = join_batch(None, np.array([1.0, np.nan, 2.0, 3.0]), np.ones(4), np.array([2.5]), np.ones(1))
    assert state.rejected == 1 and state.records == 4
    assert set(zip(pairs.left_time.tolist(), pairs.right_time.tolist())) == {(1.0, 2.5), (2.0, 2.5), (3.0, 2.5)}
