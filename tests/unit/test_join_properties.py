"""Property tests of the join contract, per-record and batch path, against the brute-force definition.

Times are drawn from a small integer range so that ties between the streams are frequent.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from local_stream_buffer import LEFT, RIGHT, IngestStatus, JoinCase, Record, StreamBuffer, TwoStreamJoin
from local_stream_buffer.batch import BatchJoinState, join_batch
from local_stream_buffer.reference import reference_pairs

EXAMPLES = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
Pair = tuple[float, float, JoinCase]


@st.composite
def two_streams(draw, max_size: int = 16, time_range: int = 40):
    """(left times, right times, interleaving): each stream strictly increasing, interleaving arbitrary."""
    times = st.sets(st.integers(0, time_range), max_size=max_size).map(sorted)
    left, right = draw(times), draw(times)
    order = [LEFT] * len(left) + [RIGHT] * len(right)
    draw(st.randoms(use_true_random=False)).shuffle(order)  # far cheaper to draw than st.permutations
    return left, right, order


deltas = st.one_of(st.none(), st.integers(0, 8))


def per_record(left, right, order, delta_time=None, **options) -> list[Pair]:
    emitted: list[Pair] = []
    join = TwoStreamJoin(lambda case, l, r: emitted.append((l[0], r[0], JoinCase(case))), delta_time_ms=delta_time,
                         **options)
    streams = (iter(left), iter(right))
    for side in order:
        assert join.ingest(side, next(streams[side]), 0.0, None) is IngestStatus.ACCEPTED
    return emitted


def batch_pairs(pairs) -> list[Pair]:
    return [(lt, rt, JoinCase(case)) for lt, rt, case in
            zip(pairs.left_time.tolist(), pairs.right_time.tolist(), pairs.case.tolist())]


@EXAMPLES
@given(two_streams(), deltas)
def test_stream_buffer_emits_exactly_the_defined_pairs_once(streams, delta_time) -> None:
    left, right, order = streams
    stream_buffer = StreamBuffer(delta_time=delta_time)
    records = (iter([Record("r", timestamp=t, result=t) for t in left]),
               iter([Record("s", timestamp=t, result=t) for t in right]))
    for side in order:
        (stream_buffer.ingest_right if side else stream_buffer.ingest_left)(next(records[side]))
    emitted = [(r["r.phenomenonTime"], r["s.phenomenonTime"], JoinCase[r["case"].upper()])
               for r in stream_buffer.fetch_results()]
    assert len(emitted) == len(set(emitted)), "a pair was emitted twice"
    assert set(emitted) == reference_pairs(left, right, delta_time)


@EXAMPLES
@given(two_streams(max_size=60, time_range=200), st.randoms(use_true_random=False))
def test_interleaving_does_not_change_the_emitted_set(streams, random) -> None:
    left, right, order = streams
    other_order = list(order)
    random.shuffle(other_order)
    assert set(per_record(left, right, order)) == set(per_record(left, right, other_order))


@EXAMPLES
@given(two_streams(), deltas, st.integers(1, 5), st.randoms(use_true_random=False))
def test_every_batch_split_emits_the_defined_pairs_once(streams, delta_time, n_batches, random) -> None:
    left, right, _ = streams
    cuts = [sorted(random.choices(range(len(side) + 1), k=n_batches - 1)) for side in (left, right)]
    batches = zip(*(np.split(np.array(side, dtype=float), side_cuts) for side, side_cuts in zip((left, right), cuts)))
    state = None
    emitted: list[Pair] = []
    for left_batch, right_batch in batches:
        if state is not None:
            state = BatchJoinState.from_bytes(state.to_bytes())  # as Spark's state store would
        state, pairs = join_batch(state, left_batch, left_batch * 2, right_batch, right_batch * 3,
                                  delta_time_ms=delta_time)
        assert (pairs.left_value == pairs.left_time * 2).all() and (pairs.right_value == pairs.right_time * 3).all()
        emitted += batch_pairs(pairs)
    assert len(emitted) == len(set(emitted)), "a pair was emitted twice"
    assert set(emitted) == reference_pairs(left, right, delta_time)


@EXAMPLES
@given(two_streams(), st.integers(0, 8))
def test_delta_time_only_filters_pairs(streams, delta_time) -> None:
    left, right, order = streams
    unlimited = per_record(left, right, order)
    assert set(per_record(left, right, order, delta_time)) == {p for p in unlimited if abs(p[0] - p[1]) <= delta_time}


@EXAMPLES
@given(two_streams(time_range=12))
def test_equal_times_make_one_same_time_pair(streams) -> None:
    left, right, order = streams
    emitted = per_record(left, right, order)
    ties = set(left) & set(right)
    same_time = [(lt, rt) for lt, rt, case in emitted if case is JoinCase.SAME_TIME]
    assert sorted(same_time) == sorted((t, t) for t in ties)
    assert not [p for p in emitted if p[0] in ties and p[1] == p[0] and p[2] is not JoinCase.SAME_TIME]


@EXAMPLES
@given(two_streams(max_size=30, time_range=80))
def test_buffers_hold_only_records_that_can_still_pair(streams) -> None:
    left, right, order = streams
    step = 0
    released_at: dict[tuple[int, float], int] = {}
    paired_at: list[tuple[int, tuple[int, float], tuple[int, float]]] = []
    join = TwoStreamJoin(
        emit=lambda case, l, r: paired_at.append((step, l[2], r[2])),
        release=lambda item: released_at.setdefault(item, step),
    )
    streams_iter = (iter(left), iter(right))
    seen: tuple[list[float], list[float]] = ([], [])
    for step, side in enumerate(order):
        t = next(streams_iter[side])
        seen[side].append(t)
        join.ingest(side, t, 0.0, (side, t))
        # Bounded by what is pending (records past the other stream's last time), plus one record per side.
        last = [times[-1] if times else -1 for times in seen]
        pending = sum(1 for t in seen[LEFT] if t > last[RIGHT]) + sum(1 for t in seen[RIGHT] if t > last[LEFT])
        assert len(join) <= pending + 2
    # Nothing released was needed later, and every record is either held or released, once.
    for when, left_item, right_item in paired_at:
        assert released_at.get(left_item, when) >= when and released_at.get(right_item, when) >= when
    held = set(join.held_items())
    assert not held & set(released_at)
    assert held | set(released_at) == {(LEFT, t) for t in left} | {(RIGHT, t) for t in right}


@EXAMPLES
@given(two_streams(), st.randoms(use_true_random=False))
def test_duplicates_and_out_of_order_records_change_nothing(streams, random) -> None:
    left, right, order = streams
    join_pairs: list[Pair] = []
    join = TwoStreamJoin(lambda case, l, r: join_pairs.append((l[0], r[0], JoinCase(case))))
    streams_iter = (iter(left), iter(right))
    duplicates = rejected = 0
    for side in order:
        t = next(streams_iter[side])
        assert join.ingest(side, t, t, None) is IngestStatus.ACCEPTED
        for _ in range(random.randint(0, 2)):  # redeliveries and stragglers after each record
            if random.random() < 0.5:
                assert join.ingest(side, t, t, None) is IngestStatus.DUPLICATE
                duplicates += 1
            else:  # older, or the same time with another result
                assert join.ingest(side, t - random.randint(0, 5), random.choice([t + 1, -1]), None) is IngestStatus.REJECTED
                rejected += 1
    assert (join.duplicates, join.rejected) == (duplicates, rejected)
    assert sorted(join_pairs) == sorted(per_record(left, right, order))
