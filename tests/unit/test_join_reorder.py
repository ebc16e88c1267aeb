"""Bounded disorder (a join spec's max_out_of_orderness) against the brute-force definition of the join.

Each stream is displaced in arrival by at most the bound (every record arrives at most the bound behind the
newest record of its stream before it), the two streams interleave at random, and the batch path gets random
batchings. The output must be the in-order output: the same pairs with the same ids, from both the keyed
joiner (the standalone joiner's engine) and the keyed batch join (the Spark job's). Records displaced further
are late, named with how late they were, and the output is the in-order output of the other records.
"""

from __future__ import annotations

import logging

import random as stdlib_random
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafka_joiner_support import as_multiset
from local_stream_buffer import LEFT, RIGHT, IngestStatus, JoinCase, TwoStreamJoin
from local_stream_buffer.batch import BatchJoinState
from local_stream_buffer.keyed import KeyedJoiner
from local_stream_buffer.keyed_batch import KeyedRows, StateDict, join_keyed_batch, state_key
from local_stream_buffer.output import output_records
from local_stream_buffer.reference import reference_pairs
from local_stream_buffer.reorder import ReorderedJoin, is_reordered, load_key_state
from local_stream_buffer.specs import JoinSpec, SpecResolver, load_join_specs

EXAMPLES = settings(max_examples=200, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
THING = "R0815"
QUANTITIES = ("actSpeed_C11", "vaTorque_C11")
START_MS = 1_554_096_380_000


def spec(bound_ms: int, delta_ms: int | None = None) -> JoinSpec:
    return JoinSpec("power", "actSpeed_C{axis}", "vaTorque_C{axis}", "vaPower_C{axis}", "power",
                    None if delta_ms is None else delta_ms / 1000, max_out_of_orderness_s=bound_ms / 1000)


def displaced(times: list[int], max_displacement: int, rng: stdlib_random.Random) -> list[int]:
    """The stream in an arrival order where no record comes more than `max_displacement` behind a record
    before it: each record is held back by up to that much (as the simulator's --disorder-ms does)."""
    # On equal arrival keys the later record first: a record then comes exactly the bound behind.
    return [-t for _, t in sorted((t + rng.randint(0, max_displacement), -t) for t in times)]


@st.composite
def disordered_streams(draw, max_size: int = 24, time_range: int = 60, beyond: bool = False):
    """(left times, right times in time order, arrivals [(side, time)], bound, delta) with each stream
    displaced within the bound (or up to three times it, with `beyond`)."""
    times = st.sets(st.integers(0, time_range), max_size=max_size).map(sorted)
    left, right = draw(times), draw(times)
    bound = draw(st.integers(1, 12))
    rng = draw(st.randoms(use_true_random=False))
    streams = [displaced(side, bound * 3 if beyond else bound, rng) for side in (left, right)]
    order = [LEFT] * len(left) + [RIGHT] * len(right)
    rng.shuffle(order)
    positions = [0, 0]
    arrivals = []
    for side in order:
        arrivals.append((side, streams[side][positions[side]]))
        positions[side] += 1
    delta = draw(st.one_of(st.none(), st.integers(0, 8)))
    return left, right, arrivals, bound, delta


def record(side: int, t: int) -> dict:
    return {"thing": THING, "quantity": QUANTITIES[side], "phenomenonTime": START_MS + t, "result": float(t % 7 + side)}


def in_order_outputs(left: list[int], right: list[int], delta: int | None) -> list[dict]:
    """The keyed joiner without a bound on the streams in time order."""
    joiner = KeyedJoiner([spec(0, delta)])
    outputs = []
    for side, t in sorted([(LEFT, t) for t in left] + [(RIGHT, t) for t in right], key=lambda a: a[1]):
        outputs += joiner.ingest(record(side, t)).outputs
    return outputs


def flush(joiner: KeyedJoiner, arrivals: list[tuple[int, int]], bound: int) -> list[dict]:
    """A record on each side far enough ahead that every record before it is handed to the join; its own
    pairs stay buffered, so the outputs are those of the records before it."""
    last = max((t for _, t in arrivals), default=0) + bound + 1
    return joiner.ingest(record(LEFT, last)).outputs + joiner.ingest(record(RIGHT, last)).outputs


@EXAMPLES
@given(disordered_streams())
def test_disorder_within_the_bound_gives_the_in_order_output(streams) -> None:
    left, right, arrivals, bound, delta = streams
    joiner = KeyedJoiner([spec(bound, delta)])
    outputs = []
    for side, t in arrivals:
        outcome = joiner.ingest(record(side, t))
        assert outcome.status is IngestStatus.ACCEPTED, outcome
        outputs += outcome.outputs
    outputs += flush(joiner, arrivals, bound)
    assert as_multiset(outputs) == as_multiset(in_order_outputs(left, right, delta))  # records and ids, once each


@EXAMPLES
@given(disordered_streams())
def test_pairs_come_as_soon_as_the_bound_makes_them_certain(streams) -> None:
    """After every arrival the emitted pairs are the defined pairs of what is at or before each stream's
    newest time minus the bound: nothing earlier than certain, nothing later."""
    left, right, arrivals, bound, delta = streams
    emitted: list[tuple[float, float, JoinCase]] = []
    join = ReorderedJoin(TwoStreamJoin(lambda case, l, r: emitted.append((l[0], r[0], JoinCase(case))),
                                       delta_time_ms=delta), bound)
    newest = [-np.inf, -np.inf]
    seen: list[list[int]] = [[], []]
    for side, t in arrivals:
        assert join.ingest(side, t, 0.0, None) is IngestStatus.ACCEPTED
        newest[side] = max(newest[side], t)
        seen[side].append(t)
        certain = [sorted(x for x in seen[s] if x <= newest[s] - bound) for s in (LEFT, RIGHT)]
        assert len(emitted) == len(set(emitted)), "a pair was emitted twice"
        assert set(emitted) == reference_pairs(*certain, delta)


def arrival_rows(keys: list, arrivals: list[tuple[int, int]], numbers: list[int]) -> KeyedRows:
    """The batch path's rows of the arrivals `numbers` (in that row order) of the one key in `keys`; each row's
    arrival number is its offset, so the stream order is the arrival order."""
    return KeyedRows(keys, np.zeros(len(numbers), dtype=np.int64),
                     np.array([arrivals[n][0] for n in numbers], dtype=np.int64),
                     np.zeros(len(numbers), dtype=np.int64), np.array(numbers, dtype=np.int64),
                     np.array([record(*arrivals[n])["phenomenonTime"] for n in numbers], dtype=float),
                     np.array([record(*arrivals[n])["result"] for n in numbers], dtype=float))


def keyed_batch_outputs(arrivals: list[tuple[int, int]], bound: int, delta: int | None, cuts: list[int],
                        rng: stdlib_random.Random) -> tuple[list[dict], list[tuple[int, str]], dict]:
    """The keyed batch join over `arrivals` split at `cuts`, rows shuffled within a batch, state as bytes.
    After each batch its outputs so far must be the keyed joiner's after the same arrivals."""
    per_record = KeyedJoiner([spec(bound, delta)])
    per_record_outputs: list[dict] = []
    resolver = SpecResolver([spec(bound, delta)])
    keys = [(THING, resolver.routes(QUANTITIES[LEFT])[0].binding)]
    states = StateDict()
    outputs, rejected = [], []
    for start, end in zip([0, *cuts], [*cuts, len(arrivals)]):
        numbers = list(range(start, end))
        for number in numbers:
            per_record_outputs += per_record.ingest(record(*arrivals[number])).outputs
        rng.shuffle(numbers)
        if not numbers:
            continue
        rows = arrival_rows(keys, arrivals, numbers)
        joined = join_keyed_batch(states, rows)
        rejected += [(numbers[row], reason) for row, reason in zip(joined.rejected.tolist(), joined.reasons)]
        outputs += output_records(THING, keys[0][1], joined.pairs)
        assert as_multiset(outputs) == as_multiset(per_record_outputs)
    return outputs, rejected, states


@EXAMPLES
@given(disordered_streams(), st.integers(1, 6), st.randoms(use_true_random=False))
def test_every_batching_gives_the_keyed_joiners_records(streams, n_batches, rng) -> None:
    left, right, arrivals, bound, delta = streams
    last = max((t for _, t in arrivals), default=0) + bound + 1
    arrivals = arrivals + [(LEFT, last), (RIGHT, last)]
    cuts = sorted(rng.choices(range(len(arrivals) + 1), k=n_batches - 1))
    outputs, rejected, states = keyed_batch_outputs(arrivals, bound, delta, cuts, rng)
    assert rejected == []
    assert as_multiset(outputs) == as_multiset(in_order_outputs(left, right, delta))
    if states:
        (stored,) = states.values()
        assert is_reordered(stored)
        reorder, _ = load_key_state(stored)
        assert reorder.held() == 2  # the flushing records, still waiting for what may come before them


@EXAMPLES
@given(disordered_streams(beyond=True), st.integers(1, 6), st.randoms(use_true_random=False))
def test_records_beyond_the_bound_are_late_the_rest_joins_as_in_order(streams, n_batches, rng) -> None:
    _, _, arrivals, bound, delta = streams
    joiner = KeyedJoiner([spec(bound, delta)])
    outputs, late, accepted = [], [], [[], []]
    newest = [-np.inf, -np.inf]
    for number, (side, t) in enumerate(arrivals):
        outcome = joiner.ingest(record(side, t))
        outputs += outcome.outputs
        if t < newest[side] - bound:
            assert outcome.status is IngestStatus.LATE
            behind = newest[side] - t
            assert outcome.reason == (
                f"late: t={START_MS + t} arrived {behind:.0f} ms behind the newest t={START_MS + newest[side]:.0f} "
                f"of {THING}.{QUANTITIES[side]}, {behind - bound:.0f} ms beyond max_out_of_orderness {bound} ms")
            late.append((number, outcome.reason))
        else:
            assert outcome.status is IngestStatus.ACCEPTED
            accepted[side].append(t)
            newest[side] = max(newest[side], t)
    assert joiner.counters.late == len(late)
    outputs += flush(joiner, arrivals, bound)
    assert as_multiset(outputs) == as_multiset(in_order_outputs(sorted(accepted[LEFT]), sorted(accepted[RIGHT]), delta))

    # The batch path names the same records late, with the same reasons, and emits the same records.
    last = max((t for _, t in arrivals), default=0) + bound + 1
    cuts = sorted(rng.choices(range(len(arrivals) + 1), k=n_batches - 1))
    batch_outputs, rejected, _ = keyed_batch_outputs(arrivals + [(LEFT, last), (RIGHT, last)], bound, delta, cuts, rng)
    assert sorted(rejected) == late
    assert as_multiset(batch_outputs) == as_multiset(outputs)


@EXAMPLES
@given(disordered_streams(), st.data())
def test_repeats_are_dropped_and_conflicts_rejected_without_changing_the_output(streams, data) -> None:
    left, right, arrivals, bound, delta = streams
    if not arrivals:
        return
    # Repeat some records, each right after itself or later but within the bound; some with another result.
    noisy: list[tuple[int, int, bool]] = [(side, t, False) for side, t in arrivals]
    for _ in range(data.draw(st.integers(1, 5))):
        index = data.draw(st.integers(0, len(noisy) - 1))
        side, t, _ = noisy[index]
        noisy.insert(index + 1, (side, t, data.draw(st.booleans())))
    joiner = KeyedJoiner([spec(bound, delta)])
    outputs = []
    statuses: Counter = Counter()
    for side, t, conflicting in noisy:
        repeat = dict(record(side, t), result=record(side, t)["result"] + (0.5 if conflicting else 0))
        outcome = joiner.ingest(repeat)
        statuses[outcome.status] += 1
        outputs += outcome.outputs
        if outcome.status is IngestStatus.REJECTED:
            assert outcome.reason == f"conflict: t={START_MS + t} equals last t of {THING}.{QUANTITIES[side]} " \
                                     "with a different result"
    outputs += flush(joiner, arrivals, bound)
    assert statuses[IngestStatus.ACCEPTED] == len(arrivals)
    assert statuses[IngestStatus.DUPLICATE] + statuses[IngestStatus.REJECTED] == len(noisy) - len(arrivals)
    assert as_multiset(outputs) == as_multiset(in_order_outputs(left, right, delta))


@EXAMPLES
@given(disordered_streams(max_size=30), st.integers(0, 60))
def test_reingesting_the_held_records_restores_the_reorder_buffers(streams, crash_at) -> None:
    """The standalone joiner's restore: the changelog holds the held records (buffered ones included); a
    fresh joiner that re-ingests them in arrival order emits afterwards exactly what the first one did."""
    _, _, arrivals, bound, delta = streams
    crash_at = min(crash_at, len(arrivals))
    uninterrupted = KeyedJoiner([spec(bound, delta)])
    after = [uninterrupted.ingest(record(*a), n).outputs for n, a in enumerate(arrivals)]
    after.append(flush(uninterrupted, arrivals, bound))

    before_crash = KeyedJoiner([spec(bound, delta)])
    for number, arrival in enumerate(arrivals[:crash_at]):
        before_crash.ingest(record(*arrival), number)
    recovered = KeyedJoiner([spec(bound, delta)])
    for number in sorted(before_crash.held_sources()):
        assert recovered.ingest(record(*arrivals[number]), number).status is IngestStatus.ACCEPTED
    replayed = [recovered.ingest(record(*a), n).outputs for n, a in enumerate(arrivals[crash_at:], start=crash_at)]
    replayed.append(flush(recovered, arrivals, bound))
    assert replayed == after[crash_at:]


def test_bound_zero_is_todays_join() -> None:
    """Without a bound no buffer is put in front: an older record is rejected out_of_order, as before."""
    joiner = KeyedJoiner([spec(0)])
    assert joiner.ingest(record(LEFT, 10)).status is IngestStatus.ACCEPTED
    outcome = joiner.ingest(record(LEFT, 5))
    assert outcome.status is IngestStatus.REJECTED
    assert outcome.reason.startswith("out_of_order: ")
    assert type(joiner._keys[(THING, joiner.resolver.routes(QUANTITIES[LEFT])[0].binding)].join.taking(LEFT)) \
        is TwoStreamJoin


def test_a_late_record_is_late_by_how_far_it_is_beyond_the_bound() -> None:
    joiner = KeyedJoiner([spec(2000)])
    joiner.ingest(record(LEFT, 10_000))
    assert joiner.ingest(record(LEFT, 8_000)).status is IngestStatus.ACCEPTED  # exactly the bound behind
    outcome = joiner.ingest(record(LEFT, 7_655))
    assert outcome.status is IngestStatus.LATE
    assert outcome.reason == (f"late: t={START_MS + 7_655} arrived 2345 ms behind the newest t={START_MS + 10_000} "
                              "of R0815.actSpeed_C11, 345 ms beyond max_out_of_orderness 2000 ms")


SPEC_FILE_HEAD = '[[join]]\nname = "power"\nleft = "a{axis}"\nright = "b{axis}"\noutput = "c{axis}"\nformula = "power"\n'


def test_the_spec_file_takes_max_out_of_orderness_s(tmp_path) -> None:
    path = tmp_path / "specs.toml"
    path.write_text(SPEC_FILE_HEAD + "delta_time_s = 1.0\nmax_out_of_orderness_s = 2.5\n")
    (loaded,) = load_join_specs(path)
    assert (loaded.delta_time_s, loaded.max_out_of_orderness_s) == (1.0, 2.5)
    assert loaded.bind("1").max_out_of_orderness_ms == 2500
    assert load_join_specs()[0].max_out_of_orderness_s == 0.0
    with pytest.raises(ValueError, match="max_out_of_orderness_s"):
        spec(-1)


def test_a_spec_file_with_the_keys_former_names_is_read_with_a_warning(tmp_path, caplog) -> None:
    path = tmp_path / "specs.toml"
    path.write_text(SPEC_FILE_HEAD + "delta_time = 1.0\nmax_out_of_orderness = 2.5\n")
    with caplog.at_level(logging.WARNING):
        (loaded,) = load_join_specs(path)
    assert (loaded.delta_time_s, loaded.max_out_of_orderness_s) == (1.0, 2.5)
    assert "max_out_of_orderness is deprecated, write max_out_of_orderness_s" in caplog.text
    assert "delta_time is deprecated, write delta_time_s" in caplog.text
    path.write_text(SPEC_FILE_HEAD + "max_out_of_orderness = 2.5\nmax_out_of_orderness_s = 1.0\n")
    with pytest.raises(ValueError, match="one setting"):
        load_join_specs(path)


def test_state_written_without_a_bound_goes_on_with_one() -> None:
    """A key's plain join state (the spec had no bound) takes up a bound: nothing older than the join's last
    record is joined, everything after is reordered."""
    binding = SpecResolver([spec(3)]).routes(QUANTITIES[LEFT])[0].binding
    plain = SpecResolver([spec(0)]).routes(QUANTITIES[LEFT])[0].binding
    keys_plain, keys_bound = [(THING, plain)], [(THING, binding)]

    def rows(keys, arrivals, first):
        n = len(arrivals)
        return KeyedRows(keys, np.zeros(n, dtype=np.int64), np.array([s for s, _ in arrivals], dtype=np.int64),
                         np.zeros(n, dtype=np.int64), np.arange(first, first + n, dtype=np.int64),
                         np.array([float(t) for _, t in arrivals]), np.ones(n))

    states = StateDict()
    join_keyed_batch(states, rows(keys_plain, [(LEFT, 10), (RIGHT, 11)], 0))
    stored = states[state_key(THING, binding)]
    assert not is_reordered(stored) and BatchJoinState.from_bytes(stored).last_time == [10.0, 11.0]
    joined = join_keyed_batch(states, rows(keys_bound, [(LEFT, 9), (LEFT, 13), (LEFT, 12), (LEFT, 20), (RIGHT, 30)], 2))
    assert joined.reasons == ["out_of_order: t=9 older than last t=10 of R0815.actSpeed_C11"]
    assert is_reordered(states[state_key(THING, binding)])
    # 12 and 13 are at or before the left watermark 17 and go to the join; 20 and 30 wait.
    assert list(zip(joined.pairs.left_time.tolist(), joined.pairs.right_time.tolist())) == [(12.0, 11.0)]
