"""The columnar batch join (many keys per numpy call) against ``join_batch`` run key by key: the same pairs
and the same state bytes, over any batching, with ties, delta limits, forcing, and keys whose records
break their streams' order (those go through ``join_batch`` inside the keyed join, beside the others)."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from local_stream_buffer.batch import BatchJoinState, join_batch
from local_stream_buffer.columnar_batch import StateColumns, segment_positions
from local_stream_buffer.keyed_batch import KeyedRows, StateDict, join_keyed_batch, state_key
from local_stream_buffer.specs import JoinSpec, SpecResolver
from local_stream_buffer.two_stream_join import LEFT, RIGHT

FORMULA = "product"
EXAMPLES = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def binding(delta_time_s: float | None):
    spec = JoinSpec(name="power", left="speed", right="torque", output="power", formula=FORMULA,
                    delta_time_s=delta_time_s)
    return SpecResolver([spec]).routes("speed")[0].binding


@st.composite
def keyed_streams(draw):
    """Per key: its records as (side, time, value) in arrival order, mostly rising, sometimes not; the batch
    boundaries; a delta; the pending bound."""
    keys = draw(st.integers(1, 6))
    streams = []
    for _ in range(keys):
        records = []
        for side in (LEFT, RIGHT):
            times = sorted(draw(st.sets(st.integers(0, 30), max_size=10)))
            if times and draw(st.booleans()) and draw(st.booleans()):
                times.insert(draw(st.integers(0, len(times))), draw(st.integers(0, 30)))  # out of order or a repeat
            records += [(side, float(t), float(t % 7)) for t in times]
        streams.append(draw(st.permutations(records)) if draw(st.booleans()) else records)
    total = sum(map(len, streams))
    cuts = sorted(draw(st.sets(st.integers(1, max(total - 1, 1)), max_size=4)))
    delta = draw(st.sampled_from([None, 0.002, 0.005]))  # seconds: 2 and 5 ms
    return streams, cuts, delta, draw(st.sampled_from([1, 2, 3, 100]))


def as_pairs(key_codes, pairs) -> Counter:
    return Counter(zip(key_codes.tolist(), pairs.left_time.tolist(), pairs.left_value.tolist(),
                       pairs.right_time.tolist(), pairs.right_value.tolist(), pairs.case.tolist()))


@EXAMPLES
@given(keyed_streams())
def test_the_columnar_join_equals_join_batch_key_by_key(case) -> None:
    streams, cuts, delta_s, max_pending = case
    join_binding = binding(delta_s)
    keys = [(f"M{number}", join_binding) for number in range(len(streams))]
    # Arrival order interleaves the keys round robin; each key's records keep theirs (their offsets).
    numbered = [(position, key, side, t, value) for key, records in enumerate(streams)
                for position, (side, t, value) in enumerate(records)]
    rows = [row[1:] for row in sorted(numbered)]
    states = StateDict()
    expected_states: dict = {}
    for start, end in zip([0, *cuts], [*cuts, len(rows)]):
        batch = rows[start:end]
        if not batch:
            continue
        key, side, t, value = (np.array(column) for column in zip(*batch))
        offsets = np.arange(start, end)
        joined = join_keyed_batch(states, KeyedRows(keys, key.astype(np.int64), side.astype(np.int64),
                                                    np.zeros(len(batch), dtype=np.int64), offsets,
                                                    t.astype(float), value.astype(float)), max_pending)
        expected = Counter()
        for code in sorted(set(key.tolist())):
            stored = state_key(*keys[code])
            before = BatchJoinState.from_bytes(expected_states[stored]) if stored in expected_states else None
            mine = [row for row in batch if row[0] == code]
            arrays = [np.array([row[2] for row in mine if row[1] == s]) for s in (LEFT, RIGHT)]
            values = [np.array([row[3] for row in mine if row[1] == s]) for s in (LEFT, RIGHT)]
            state, pairs = join_batch(before, arrays[LEFT], values[LEFT], arrays[RIGHT], values[RIGHT],
                                      delta_time_ms=join_binding.delta_time_ms, max_pending_per_side=max_pending)
            expected_states[stored] = state.to_bytes()
            expected += as_pairs(np.full(pairs.count, code), pairs)
        assert as_pairs(joined.key, joined.pairs) == expected
        assert states == expected_states


@EXAMPLES
@given(st.lists(st.tuples(st.lists(st.floats(-1e13, 1e13, allow_nan=False), max_size=4),
                          st.lists(st.floats(allow_nan=True), max_size=4), st.integers(0, 2**40)), max_size=5))
def test_state_columns_read_and_write_join_batch_state_bytes(keys) -> None:
    blobs: list[bytes | None] = []
    for left, right, counter in keys:
        state = BatchJoinState()
        state.times = [np.array(sorted(left)), np.array(right[:2], dtype=float)]
        state.values = [np.array(left, dtype=float) * 2, np.array(right[2:4] + [0.0] * (2 - len(right[2:4])))[
            :len(state.times[RIGHT])]]
        state.frontier = [float(len(left)), -math.inf]
        state.last_time = [counter / 3, math.inf]
        state.last_value = [math.nan, float(counter)]
        state.records, state.pairs, state.forced = counter, counter // 2, 7
        blobs.append(state.to_bytes())
    blobs.append(None)
    columns = StateColumns.from_bytes(blobs)
    assert columns.to_bytes() == [*blobs[:-1], BatchJoinState().to_bytes()]


def test_segment_positions() -> None:
    assert segment_positions(np.array([2, 0, 3, 1])).tolist() == [0, 1, 0, 1, 2, 0]
