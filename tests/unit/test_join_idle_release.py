"""The idle release (a join spec's idle_release_s): a quiet stream's reorder buffer is released.

Against a brute-force model: a stream whose last record arrived at least idle_release_s ago is released, and
from then on a record at or before its newest time is late. After every arrival and release the emitted pairs
are exactly the defined pairs of what is certain: per stream the records at or before its newest time minus
the bound, or at or before the time it was released up to. The batch path (the Spark job's) releases the same
streams into the same records; the standalone joiner's restore (held records, then the recorded releases)
emits afterwards exactly what the uninterrupted joiner did.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafka_joiner_support import as_multiset
from local_stream_buffer import LEFT, RIGHT, IngestStatus
from local_stream_buffer.batch import PairArrays
from local_stream_buffer.idle_release import IdleStreams, due_sides, next_due_ms
from local_stream_buffer.keyed import KeyedJoiner
from local_stream_buffer.keyed_batch import KeyedRows, StateDict, join_keyed_batch, state_key
from local_stream_buffer.output import output_records
from local_stream_buffer.reference import reference_pairs
from local_stream_buffer.reorder import load_key_state, release_idle_side
from local_stream_buffer.specs import JoinSpec, SpecResolver, load_join_specs
from support import ManualClock
from test_join_reorder import (EXAMPLES, QUANTITIES, START_MS, THING, arrival_rows, disordered_streams, flush,
                               in_order_outputs, record)

IDLE_TICKS = 3  # the idle release, in ticks of the test's clock (one tick per arrival)


def spec(bound_ms: int, delta_ms: int | None = None, idle_release_s: float | None = IDLE_TICKS) -> JoinSpec:
    return JoinSpec("power", "actSpeed_C{axis}", "vaTorque_C{axis}", "vaPower_C{axis}", "power",
                    None if delta_ms is None else delta_ms / 1000, max_out_of_orderness_s=bound_ms / 1000,
                    idle_release_s=idle_release_s)


@st.composite
def quiet_spells(draw, arrivals: list) -> list[tuple[str, int]]:
    """The arrivals with waits of 1-5 ticks between some of them: ("record", index) and ("wait", ticks)."""
    events: list[tuple[str, int]] = []
    for index in range(len(arrivals)):
        if draw(st.integers(0, 3)) == 0:
            events.append(("wait", draw(st.integers(1, 5))))
        events.append(("record", index))
    events.append(("wait", draw(st.integers(0, 5))))
    return events


def run_model_and_joiner(arrivals, events, bound, delta):
    """Drive the keyed joiner with a ticking clock; check it against the model after every step. Returns the
    joiner's outputs, the late arrivals (index, reason) and the releases per step."""
    ticks = ManualClock()
    joiner = KeyedJoiner([spec(bound, delta)], clock=ticks)
    newest = [-np.inf, -np.inf]
    floor = [-np.inf, -np.inf]
    last_arrival: list[float | None] = [None, None]
    accepted: list[list[int]] = [[], []]
    outputs, late, steps = [], [], []
    for kind, value in events:
        if kind == "record":
            side, t = arrivals[value]
            ticks.now_s += 1
            last_arrival[side] = ticks.now_s
            outcome = joiner.ingest(record(side, t), value)
            outputs += outcome.outputs
            if t < newest[side] - bound or t <= floor[side]:
                assert outcome.status is IngestStatus.LATE, (value, outcome)
                late.append((value, outcome.reason))
                if not t < newest[side] - bound:
                    assert outcome.reason.startswith(f"late: t={START_MS + t} arrived after {THING}.{QUANTITIES[side]}"
                                                     f" was released up to t={START_MS + floor[side]:.0f}, idle")
            else:
                assert outcome.status is IngestStatus.ACCEPTED, (value, outcome)
                accepted[side].append(t)
                newest[side] = max(newest[side], t)
            steps.append(("record", value))
        else:
            ticks.now_s += value
            released, releases = joiner.release_idle()
            outputs += released
            # A stream is released when it buffers something: its newest record, unless released since.
            expected = {side for side in (LEFT, RIGHT) if last_arrival[side] is not None
                        and ticks.now_s - last_arrival[side] >= IDLE_TICKS and newest[side] > floor[side]}
            assert {release.side for release in releases} == expected
            for release in releases:
                assert release.up_to_ms == START_MS + newest[release.side]
                floor[release.side] = newest[release.side]
            for side in (LEFT, RIGHT):
                if last_arrival[side] is not None and ticks.now_s - last_arrival[side] >= IDLE_TICKS:
                    last_arrival[side] = None  # named once until its next record
            steps.append(("release", [(r.side, r.up_to_ms) for r in releases]))
        certain = [sorted(t for t in accepted[side] if t <= max(newest[side] - bound, floor[side]))
                   for side in (LEFT, RIGHT)]
        assert as_multiset(outputs) == as_multiset(model_outputs(certain, delta, bound))
    return joiner, outputs, late, steps


def model_outputs(certain: list[list[int]], delta: int | None, bound: int) -> list[dict]:
    """The records of the defined pairs of `certain` (brute force), as the joiner writes them."""
    binding = SpecResolver([spec(bound, delta)]).routes(QUANTITIES[LEFT])[0].binding
    pairs = sorted(reference_pairs(*certain, delta), key=lambda p: (p[0], p[1]))
    arrays = PairArrays(np.array([START_MS + p[0] for p in pairs], dtype=float),
                        np.array([record(LEFT, p[0])["result"] for p in pairs], dtype=float),
                        np.array([START_MS + p[1] for p in pairs], dtype=float),
                        np.array([record(RIGHT, p[1])["result"] for p in pairs], dtype=float),
                        np.array([int(p[2]) for p in pairs], dtype=np.int8))
    return output_records(THING, binding, arrays)


@EXAMPLES
@given(disordered_streams(beyond=True), st.data())
def test_a_quiet_stream_is_released_and_its_later_records_are_late(streams, data) -> None:
    _, _, arrivals, bound, delta = streams
    run_model_and_joiner(arrivals, data.draw(quiet_spells(arrivals)), bound, delta)


@EXAMPLES
@given(disordered_streams(beyond=True), st.data(), st.randoms(use_true_random=False))
def test_the_batch_path_releases_into_the_same_records(streams, data, rng) -> None:
    _, _, arrivals, bound, delta = streams
    _, outputs, late, steps = run_model_and_joiner(arrivals, data.draw(quiet_spells(arrivals)), bound, delta)
    resolver = SpecResolver([spec(bound, delta)])
    binding = resolver.routes(QUANTITIES[LEFT])[0].binding
    keys = [(THING, binding)]
    states = StateDict()
    batch_outputs, rejected, pending = [], [], []

    def join_pending() -> None:
        numbers = list(pending)
        rng.shuffle(numbers)
        pending.clear()
        if not numbers:
            return
        rows = arrival_rows(keys, arrivals, numbers)
        joined = join_keyed_batch(states, rows)
        rejected.extend((numbers[row], reason) for row, reason in zip(joined.rejected.tolist(), joined.reasons))
        batch_outputs.extend(output_records(THING, binding, joined.pairs))

    for kind, value in steps:
        if kind == "record":
            pending.append(value)
            if rng.random() < 0.4:
                join_pending()
            continue
        join_pending()  # a release comes between micro-batches
        for side, up_to in value:
            stored = state_key(THING, binding)
            released = release_idle_side(states[stored], side, binding.delta_time_ms)
            assert released is not None
            states[stored], pairs = released
            assert load_key_state(states[stored])[0].released[side] == up_to
            batch_outputs.extend(output_records(THING, binding, pairs))
    join_pending()
    assert sorted(rejected) == sorted(late)
    assert as_multiset(batch_outputs) == as_multiset(outputs)


@EXAMPLES
@given(disordered_streams(beyond=True), st.data(), st.integers(0, 80))
def test_held_records_and_the_recorded_releases_restore_the_join(streams, data, crash_at) -> None:
    """The standalone joiner's restore: a fresh joiner re-ingests the held records in their order, then applies
    the latest release of each stream. Its streams count as arrived at the restore (their next release may come
    later than without the crash), but what the two runs emit together is each pair of the accepted records
    once: nothing released before the crash comes again, nothing is lost."""
    _, _, arrivals, bound, delta = streams
    events = data.draw(quiet_spells(arrivals))
    crash_at = min(crash_at, len(events))
    ticks = ManualClock()

    def drive(joiner, part, accepted):
        outputs, releases = [], {}
        for kind, value in part:
            if kind == "record":
                ticks.now_s += 1
                outcome = joiner.ingest(record(*arrivals[value]), value)
                outputs += outcome.outputs
                if outcome.status is IngestStatus.ACCEPTED:
                    accepted[arrivals[value][0]].append(arrivals[value][1])
            else:
                ticks.now_s += value
                released, made = joiner.release_idle()
                outputs += released
                releases.update({(r.thing, r.binding.spec.name, r.binding.axis, r.side): r.up_to_ms for r in made})
        return outputs, releases

    accepted: list[list[int]] = [[], []]
    before_crash = KeyedJoiner([spec(bound, delta)], clock=ticks)
    outputs, releases = drive(before_crash, events[:crash_at], accepted)
    recovered = KeyedJoiner([spec(bound, delta)], clock=ticks)
    for number in sorted(before_crash.held_sources()):
        recovered.ingest(record(*arrivals[number]), number)
    for (thing, name, axis, side), up_to in releases.items():
        assert recovered.restore_release(thing, name, axis, side, up_to)
    outputs += drive(recovered, events[crash_at:], accepted)[0]
    outputs += flush(recovered, arrivals, bound)
    assert as_multiset(outputs) == as_multiset(in_order_outputs(sorted(accepted[LEFT]), sorted(accepted[RIGHT]), delta))


def test_idle_streams_name_each_quiet_stream_once_in_order_of_arrival() -> None:
    ticks = ManualClock()
    streams = IdleStreams(ticks)
    streams.arrived(("a", LEFT), 2.0)
    ticks.now_s = 1
    streams.arrived(("b", RIGHT), 2.0)
    streams.arrived(("c", LEFT), 10.0)
    assert streams.due() == []
    ticks.now_s = 2
    assert streams.due() == [("a", LEFT)]
    streams.arrived(("b", RIGHT), 2.0)  # it spoke again: its quiet spell starts over
    ticks.now_s = 3.5
    assert streams.due() == []
    ticks.now_s = 12
    assert streams.due() == [("b", RIGHT), ("c", LEFT)]
    assert streams.due() == [] and len(streams) == 0
    streams.arrived(("d", LEFT), 2.0)
    streams.forget("d")
    assert len(streams) == 0


def test_the_batch_state_names_its_due_sides() -> None:
    binding = SpecResolver([spec(5)]).routes(QUANTITIES[LEFT])[0].binding
    states = StateDict()
    rows = KeyedRows([(THING, binding)], np.zeros(2, dtype=np.int64), np.array([LEFT, RIGHT]), np.zeros(2, dtype=np.int64),
                     np.arange(2), np.array([10.0, 12.0]), np.ones(2))
    join_keyed_batch(states, rows, arrived_ms=1_000)
    stored = states[state_key(THING, binding)]
    assert due_sides(stored, 3_999, 3_000) == [] and next_due_ms(stored, 3_000) == 4_000
    assert due_sides(stored, 4_000, 3_000) == [LEFT, RIGHT]
    released, pairs = release_idle_side(stored, LEFT)
    assert due_sides(released, 9_000, 3_000) == [RIGHT] and pairs.count == 0
    assert release_idle_side(released, LEFT) is None  # nothing buffered on that side any more


def test_the_spec_file_takes_idle_release_s(tmp_path) -> None:
    path = tmp_path / "specs.toml"
    head = '[[join]]\nname = "p"\nleft = "a{axis}"\nright = "b{axis}"\noutput = "c{axis}"\nformula = "power"\n'
    path.write_text(head + "max_out_of_orderness_s = 2.0\nidle_release_s = 30\n")
    (loaded,) = load_join_specs(path)
    assert loaded.idle_release_s == 30.0 and loaded.bind("1").idle_release_ms == 30_000
    assert load_join_specs()[0].idle_release_s is None  # the shipped default: never
    with pytest.raises(ValueError, match="without a max_out_of_orderness_s above 0"):
        spec(0, idle_release_s=5)
    with pytest.raises(ValueError, match="idle_release_s must be"):
        spec(100, idle_release_s=0)
