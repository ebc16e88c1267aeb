"""max_latency (with an injected clock), late records, and bounded state when one stream stalls."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from local_stream_buffer import (
    DEFAULT_MAX_PENDING_PER_SIDE, LEFT, RIGHT, IngestStatus, JoinCase, Record, StreamBuffer, TwoStreamJoin,
)
from local_stream_buffer.batch import join_batch
from local_stream_buffer.reference import reference_pairs
from support import ManualClock


def _pairs(stream_buffer: StreamBuffer) -> list[tuple[float, float, str]]:
    return [(r["r.phenomenonTime"], r["s.phenomenonTime"], r["case"]) for r in stream_buffer.fetch_results()]


def test_max_latency_emits_a_waiting_predecessor_pair_and_reports_late_records() -> None:
    clock = ManualClock()
    late: list[Record] = []
    stream_buffer = StreamBuffer(max_latency=5, clock=clock, late_function=late.append)
    stream_buffer.ingest_right(Record("s", timestamp=0.5, result=1))
    for t in (1, 2, 3):
        stream_buffer.ingest_left(Record("r", timestamp=t, result=1))
    assert _pairs(stream_buffer) == [(1, 0.5, "right_successor")]

    clock.now_s = 5.0  # waited exactly max_latency: not longer
    stream_buffer.poll()
    assert _pairs(stream_buffer) == []

    clock.now_s = 5.5
    stream_buffer.poll()
    # Left 2 and 3 get their predecessor as it stands; left 1's predecessor pair is its successor pair above.
    assert _pairs(stream_buffer) == [(2, 0.5, "left_predecessor"), (3, 0.5, "left_predecessor")]
    assert stream_buffer.get_forced_counter() == 3

    # A right record inside the gap now closed is late: reported, counted, not joined.
    straggler = Record("s", timestamp=2.5, result=1)
    assert stream_buffer.ingest_right(straggler) is IngestStatus.LATE
    assert late == [straggler] and stream_buffer.get_late_counter() == 1
    assert _pairs(stream_buffer) == []

    # The stream resumes: its next record pairs with the newest forced record, nothing comes twice.
    stream_buffer.ingest_right(Record("s", timestamp=4, result=1))
    assert _pairs(stream_buffer) == [(3, 4, "left_successor")]
    assert stream_buffer.get_join_counter() == 4


def test_a_pair_certain_within_max_latency_is_not_forced() -> None:
    clock = ManualClock()
    stream_buffer = StreamBuffer(max_latency=5, clock=clock)
    stream_buffer.ingest_right(Record("s", timestamp=0, result=1))
    stream_buffer.ingest_left(Record("r", timestamp=1, result=1))
    stream_buffer.ingest_left(Record("r", timestamp=2, result=1))
    clock.now_s = 4.0
    stream_buffer.ingest_right(Record("s", timestamp=1.5, result=1))  # in time: certain, nothing forced
    clock.now_s = 100.0
    stream_buffer.ingest_left(Record("r", timestamp=3, result=1))  # the ingest itself checks the latency
    # Left 1's pairs became certain in time; left 2 waited too long (its pair as it stands, right 1.5, is
    # already out as its successor pair); left 3 has only just arrived.
    assert stream_buffer.get_forced_counter() == 1
    assert sorted(_pairs(stream_buffer)) == sorted([
        (1, 0, "right_successor"), (1, 1.5, "left_successor"), (2, 1.5, "right_successor"),
    ])


def test_a_stalled_stream_keeps_memory_bounded() -> None:
    limit = 100
    join_pairs: list[tuple[float, float, int]] = []
    join = TwoStreamJoin(lambda case, l, r: join_pairs.append((l[0], r[0], case)), max_pending_per_side=limit)
    join.ingest(RIGHT, 0.0, 0.0, None)
    peak = 0
    for t in range(1, 10_001):  # the right sensor goes quiet while the left one keeps sending
        join.ingest(LEFT, float(t), 0.0, None)
        peak = max(peak, len(join))
    assert peak <= limit + 2
    assert join.forced == 10_000 - limit
    assert join.ingest(RIGHT, 5.0, 0.0, None) is IngestStatus.LATE  # inside the closed gap
    join.ingest(RIGHT, 20_000.0, 0.0, None)
    assert len(join_pairs) == len(set(join_pairs))
    # Every left record got its predecessor (right 0); the pending ones and the anchor also their successor.
    assert {(lt, rt) for lt, rt, _ in join_pairs} == (
        {(float(t), 0.0) for t in range(1, 10_001)} | {(float(t), 20_000.0) for t in range(10_000 - limit, 10_001)}
    )
    assert len(join) == 3  # right 0 (predecessor of left records before 20000), right 20000, left 10000


def test_the_default_limit_is_far_above_the_test_cases() -> None:
    assert DEFAULT_MAX_PENDING_PER_SIDE >= 10_000


@st.composite
def stalling_streams(draw):
    """(left times, right times, interleaving, pending limit), with limits small enough to force often."""
    times = st.sets(st.integers(0, 60), max_size=25).map(sorted)
    left, right = draw(times), draw(times)
    order = [LEFT] * len(left) + [RIGHT] * len(right)
    draw(st.randoms(use_true_random=False)).shuffle(order)
    return left, right, order, draw(st.integers(1, 4))


@settings(max_examples=300, deadline=None)
@given(stalling_streams(), st.one_of(st.none(), st.integers(0, 6)))
def test_forcing_never_duplicates_and_only_emits_pairs_of_the_accepted_records(streams, delta_time) -> None:
    left, right, order, limit = streams
    emitted: list[tuple[float, float, JoinCase]] = []
    join = TwoStreamJoin(lambda case, l, r: emitted.append((l[0], r[0], JoinCase(case))),
                         delta_time_ms=delta_time, max_pending_per_side=limit)
    accepted: tuple[list[int], list[int]] = ([], [])
    streams_iter = (iter(left), iter(right))
    for side in order:
        t = next(streams_iter[side])
        if join.ingest(side, t, 0.0, None) is IngestStatus.ACCEPTED:
            accepted[side].append(t)
        assert len(join) <= 2 * limit + 2
    assert len(emitted) == len(set(emitted))
    # Forced pairs are predecessor pairs as they stood, not yet certain. With late records dropped, every pair
    # is one of the accepted records with a neighbour; a sentinel closing both streams makes all of those certain.
    sentinel = 1_000
    possible = {p for p in reference_pairs(accepted[LEFT] + [sentinel], accepted[RIGHT] + [sentinel], delta_time)
                if sentinel not in p[:2]}
    assert set(emitted) <= possible
    assert join.late == len(left) + len(right) - len(accepted[LEFT]) - len(accepted[RIGHT])


@settings(max_examples=300, deadline=None)
@given(stalling_streams(), st.one_of(st.none(), st.integers(0, 6)), st.randoms(use_true_random=False))
def test_batch_forcing_matches_per_record_forcing_on_one_sided_batches(streams, delta_time, random) -> None:
    left, right, _, limit = streams
    batches: list[tuple[int, list[int]]] = []
    rest = [list(left), list(right)]
    while rest[LEFT] or rest[RIGHT]:
        side = random.choice([s for s in (LEFT, RIGHT) if rest[s]])
        size = random.randint(1, 5)
        batches.append((side, rest[side][:size]))
        rest[side] = rest[side][size:]
    emitted: list[tuple[float, float, int]] = []
    join = TwoStreamJoin(lambda case, l, r: emitted.append((l[0], r[0], case)),
                         delta_time_ms=delta_time, max_pending_per_side=limit)
    state = None
    batch_emitted: list[tuple[float, float, int]] = []
    for side, times in batches:
        for t in times:
            join.ingest(side, t, 0.0, None)
        side_times = [np.array(times, dtype=float) if s == side else np.empty(0) for s in (LEFT, RIGHT)]
        state, pairs = join_batch(state, side_times[LEFT], side_times[LEFT], side_times[RIGHT], side_times[RIGHT],
                                  delta_time_ms=delta_time, max_pending_per_side=limit)
        batch_emitted += zip(pairs.left_time.tolist(), pairs.right_time.tolist(), pairs.case.tolist())
        assert state.held() <= 2 * limit + 2
    assert sorted(batch_emitted) == sorted(emitted)
    if state is not None:
        assert (state.forced, state.late) == (join.forced, join.late)
