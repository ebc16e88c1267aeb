"""The clock rule (local_stream_buffer.clock) against the reference, which shares no code with it: machines whose
clocks send readings far ahead or behind, step back or ahead and stay, on both quantities or one, with gaps and
disorder, interleaved at random; and worked cases of each fault."""
from __future__ import annotations

import random
from collections import Counter
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from clock_support import (HOUR_MS, SPEED, TORQUE, YEAR_MS, Fault, by_stream, faults, interleaved, machine_readings,
                           reading, reference_spec)
from join_reference import reference_join, reference_outliers, reference_turned_away
from kafka_joiner_support import as_multiset
from local_stream_buffer.clocked_batch import is_clocked
from local_stream_buffer.clocked_batch import release_idle_side as clocked_release_idle_side
from local_stream_buffer.keyed import KeyedJoiner
from local_stream_buffer.keyed_batch import KeyedRows, StateDict, join_keyed_batch, state_key
from local_stream_buffer.output import output_records
from local_stream_buffer.specs import JoinSpec, SpecResolver
from local_stream_buffer.status import IngestStatus
from support import ManualClock


def power_spec(bound_s: float = 0.0, confirm: int = 2) -> JoinSpec:
    return JoinSpec("power", "actSpeed_C{axis}", "vaTorque_C{axis}", "vaPower_C{axis}", "power", 1.0,
                    max_out_of_orderness_s=bound_s, clock_confirm_readings=confirm)


def per_record(records: list[dict[str, Any]], spec: JoinSpec) -> tuple[list[dict], list[tuple], list[str]]:
    """The keyed joiner's outputs, the readings it dead-letters later (with their reasons), record by record."""
    dropped: list[tuple[dict, str]] = []
    joiner = KeyedJoiner([spec], on_dead_letter=lambda record, _source, reason: dropped.append((record, reason)))
    outputs = [output for record in records for output in joiner.ingest(record, object()).outputs]
    return outputs, [reading(record) for record, _ in dropped], [reason for _, reason in dropped]


def check_against_reference(records: list[dict[str, Any]], bound_s: float = 0.0) -> list[dict]:
    """The engine's outputs and every dead letter it gives are the reference's: its join, its outliers (as
    clock_outlier) and the records it turns away otherwise (late, conflicts)."""
    spec = reference_spec(bound_s * 1000)
    expected = reference_join(records, spec)
    outputs, letters = dead_letters_per_record(records, power_spec(bound_s))
    assert as_multiset(outputs) == as_multiset(expected)
    outliers, others = Counter(), Counter()
    for (letter_reading, reason), count in letters.items():
        (outliers if reason.startswith("clock_outlier") else others)[letter_reading] += count
    assert outliers == Counter(reading(r) for r in reference_outliers(records, spec))
    assert others == Counter(reading(r) for r in reference_turned_away(records, spec))
    return outputs


def times(outputs: list[dict]) -> set[tuple[float, float]]:
    return {(o["left"]["phenomenonTime"], o["right"]["phenomenonTime"]) for o in outputs}


def test_a_reading_ten_years_ahead_is_an_outlier_and_the_series_joins_as_if_it_never_came() -> None:
    clean = machine_readings("M1", 120, [])
    faulty = machine_readings("M1", 120, [Fault(60, "outlier", 10 * YEAR_MS, (SPEED,))])
    without = [record for record, good in zip(faulty, clean) if record == good]
    outputs, dropped, reasons = per_record(faulty, power_spec())
    assert times(outputs) == times(per_record(without, power_spec())[0])
    assert len(outputs) == (2 * 120 - 1) - 2  # every pair of the clean series but the outlier's two
    assert [r for r in reasons if r.startswith("clock_outlier")] == reasons and len(dropped) == 1
    assert dropped[0][2] == faulty[120]["phenomenonTime"]
    check_against_reference(faulty)


def test_a_whole_row_ahead_gives_two_outliers_that_never_join_each_other() -> None:
    faulty = machine_readings("M1", 120, [Fault(60, "outlier", 10 * YEAR_MS, (SPEED, TORQUE))])
    outputs, dropped, _ = per_record(faulty, power_spec())
    assert len(dropped) == 2 and all(o["left"]["phenomenonTime"] < faulty[-1]["phenomenonTime"] for o in outputs)
    check_against_reference(faulty)


def test_a_clock_set_back_an_hour_and_kept_there_joins_again_on_the_new_timeline_within_two_readings() -> None:
    faulty = machine_readings("M1", 300, [Fault(120, "step", -HOUR_MS, (SPEED, TORQUE))])
    outputs = check_against_reference(faulty)
    stepped = faulty[240]["phenomenonTime"]  # the first speed reading on the new timeline
    # Every reading after the step joins: the new timeline's pairs, none across the two timelines.
    on_new_timeline = [o for o in outputs if o["left"]["phenomenonTime"] >= stepped and
                       o["left"]["phenomenonTime"] < faulty[0]["phenomenonTime"] + 120_000 - HOUR_MS + 300_000]
    assert len(on_new_timeline) == 2 * 180 - 1
    assert all(abs(o["left"]["phenomenonTime"] - o["right"]["phenomenonTime"]) <= 1000 for o in outputs)


def test_a_clock_set_ahead_and_kept_there_is_a_gap_and_a_machine_off_for_an_hour_too() -> None:
    for fault in (Fault(100, "step", 2 * HOUR_MS, (SPEED, TORQUE)), Fault(100, "gap", HOUR_MS + 1, ())):
        faulty = machine_readings("M1", 200, [fault])
        outputs, dropped, _ = per_record(faulty, power_spec())
        assert len(outputs) == 2 * 200 - 2 and not dropped  # all but the one pair across the jump (beyond 1 s)
        check_against_reference(faulty)


def test_a_reading_behind_that_the_next_ones_do_not_follow_is_an_outlier_not_a_new_timeline() -> None:
    faulty = machine_readings("M1", 60, [Fault(30, "outlier", -2 * HOUR_MS, (TORQUE,))])
    outputs, dropped, reasons = per_record(faulty, power_spec())
    assert len(dropped) == 1 and reasons[0].startswith("clock_outlier") and "behind" in reasons[0]
    check_against_reference(faulty)


def test_a_quantity_too_sparse_to_show_a_step_back_keeps_its_timeline_and_says_so(caplog) -> None:
    """Rows every 15 minutes, torque in each, speed in few; the clock steps back an hour and 123 ms. Torque shows the
    step with its next two readings; speed's first reading after it lies 45 minutes behind (set aside) and its next
    one 123 ms behind the old timeline's newest: within clock_step_back_s, so it keeps to the old timeline (late:
    out_of_order), and the next one confirms it, the reading set aside an outlier. The two quantities are then on two
    timelines: no pair joins them (their readings may be an hour apart), the log says so once, and the reference
    agrees record for record, dead letters included."""
    step_ms, row_ms = -HOUR_MS - 123, 15 * 60_000
    records = []
    for row in range(20):
        stamp = 1_796_190_000_228 + row * row_ms + (step_ms if row >= 10 else 0)
        for quantity, present in ((SPEED, row < 10 or row in (11, 13, 14, 15, 16)), (TORQUE, True)):
            if present:
                records.append({"thing": "M1", "quantity": quantity, "phenomenonTime": stamp,
                                "result": 100.0 + row, "id": f"M1-{row}"})
    with caplog.at_level("WARNING", logger="local_stream_buffer.clock"):
        outputs, letters = dead_letters_per_record(records, power_spec())
    said = [r.getMessage() for r in caplog.records if "join nothing until it steps back too" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("M1.actSpeed_C11 keeps to a timeline M1.vaTorque_C11 stepped back from")
    assert sorted(reason.split(":")[0] for _, reason in letters) == ["clock_outlier", "out_of_order"]
    # Only the pairs before the step: speed's readings after it lie on the old timeline, torque's on the new one.
    assert {o["left"]["phenomenonTime"] for o in outputs} == {records[2 * row]["phenomenonTime"] for row in range(10)}
    check_against_reference(records)


def test_without_the_rule_a_reading_far_ahead_silences_its_series() -> None:
    faulty = machine_readings("M1", 120, [Fault(60, "outlier", 10 * YEAR_MS, (SPEED,))])
    joiner = KeyedJoiner([power_spec(confirm=0)])
    statuses = Counter(joiner.ingest(record).status for record in faulty)
    assert statuses[IngestStatus.REJECTED] == 59  # every later speed reading: older than the outlier


def test_a_step_back_on_one_quantity_only_joins_nothing_of_it_until_the_other_steps_too() -> None:
    faulty = machine_readings("M1", 120, [Fault(40, "step", -HOUR_MS, (SPEED,)), Fault(80, "step", -HOUR_MS,
                                                                                          (TORQUE,))])
    outputs = check_against_reference(faulty)
    left_times = sorted(o["left"]["phenomenonTime"] for o in outputs)
    # Speed's readings 40..79 (new timeline) wait for torque's new timeline, which starts at 80: they join none.
    assert not [t for t in left_times if faulty[80]["phenomenonTime"] <= t < faulty[160]["phenomenonTime"]]
    assert len(outputs) > 2 * 40 + 2 * 38


@settings(max_examples=300)
@given(st.lists(st.integers(0, 2**32), min_size=1, max_size=3).flatmap(
    lambda seeds: st.tuples(st.just(seeds), st.lists(faults(40), min_size=len(seeds), max_size=len(seeds)))),
    st.integers(0, 2**32), st.sampled_from([0.0, 2.0]))
def test_any_clock_faults_of_any_machines_in_any_interleaving_give_the_reference_join(
        machines: tuple[list[int], list[list[Fault]]], seed: int, bound_s: float) -> None:
    seeds, machine_faults = machines
    streams = [stream for index, fault_list in enumerate(machine_faults)
               for stream in by_stream(machine_readings(f"M{index}", 40, fault_list))]
    check_against_reference(interleaved(streams, seed), bound_s)


def dead_letters_per_record(records: list[dict[str, Any]], spec: JoinSpec) -> tuple[list[dict], Counter]:
    """The keyed joiner's outputs and every dead letter it gives, as (reading, reason)."""
    letters: Counter = Counter()
    joiner = KeyedJoiner([spec], on_dead_letter=lambda record, _source, reason: letters.update([(reading(record),
                                                                                                 reason)]))
    outputs = []
    for record in records:
        outcome = joiner.ingest(record, object())
        outputs += outcome.outputs
        if outcome.status in (IngestStatus.REJECTED, IngestStatus.LATE):
            letters[(reading(record), outcome.reason)] += 1
    return outputs, letters


def in_batches(records: list[dict[str, Any]], spec: JoinSpec, cuts: list[int], seed: int) -> tuple[list[dict], Counter]:
    """The keyed batch join's (the Spark job's) outputs and dead letters over `records` cut into batches, each
    batch's rows shuffled (a stream's order is its offsets)."""
    resolver = SpecResolver([spec])
    keys: dict = {}
    rows = []
    for number, record in enumerate(records):
        for binding, side in resolver.routes(record["quantity"]):
            rows.append((keys.setdefault((record["thing"], binding), len(keys)), side, number))
    keys_list = list(keys)
    rng = random.Random(seed)
    states = StateDict()
    outputs: list[dict] = []
    letters: Counter = Counter()
    bounds = sorted({cut % len(rows) for cut in cuts} - {0})
    for start, end in zip([0, *bounds], [*bounds, len(rows)]):
        batch = rows[start:end]
        rng.shuffle(batch)
        key, side, number = (np.array(column, dtype=np.int64) for column in zip(*batch))
        joined = join_keyed_batch(states, KeyedRows(
            keys_list, key, side, np.zeros(len(batch), dtype=np.int64), number,
            np.array([records[n]["phenomenonTime"] for n in number.tolist()], dtype=float),
            np.array([records[n]["result"] for n in number.tolist()], dtype=float)))
        letters.update((reading(records[int(number[row])]), reason)
                       for row, reason in zip(joined.rejected.tolist(), joined.reasons))
        for dropped in joined.dropped:
            thing, binding = keys_list[dropped.key]
            letters[((thing, binding.quantity(dropped.side), dropped.time, dropped.result), dropped.reason)] += 1
        for code in np.unique(joined.key).tolist():
            thing, binding = keys_list[code]
            mine = joined.key == code
            outputs += output_records(thing, binding, type(joined.pairs)(*(column[mine] for column in joined.pairs)))
    return outputs, letters


@settings(max_examples=200)
@given(st.lists(faults(30), min_size=1, max_size=3), st.integers(0, 2**32), st.sampled_from([0.0, 2.0]),
       st.lists(st.integers(0, 10_000), max_size=6))
def test_the_batch_path_gives_the_per_record_outputs_and_dead_letters_under_any_batching(
        machine_faults: list[list[Fault]], seed: int, bound_s: float, cuts: list[int]) -> None:
    streams = [stream for index, fault_list in enumerate(machine_faults)
               for stream in by_stream(machine_readings(f"M{index}", 30, fault_list))]
    records = interleaved(streams, seed)
    spec = power_spec(bound_s)
    expected, expected_letters = dead_letters_per_record(records, spec)
    outputs, letters = in_batches(records, spec, cuts, seed)
    assert as_multiset(outputs) == as_multiset(expected)
    assert as_multiset(outputs) == as_multiset(reference_join(records, reference_spec(bound_s * 1000)))
    assert letters == expected_letters


def test_a_step_back_waits_in_the_batch_state_across_calls_and_the_key_goes_back_to_a_plain_state() -> None:
    faulty = machine_readings("M1", 20, [Fault(10, "step", -HOUR_MS, (SPEED, TORQUE))])
    spec = power_spec()
    states_seen = []
    resolver = SpecResolver([spec])
    binding = resolver.routes(SPEED)[0].binding
    states = StateDict()
    outputs = []
    for number, record in enumerate(faulty):
        side = resolver.routes(record["quantity"])[0].side
        one = np.array([number], dtype=np.int64)
        joined = join_keyed_batch(states, KeyedRows([("M1", binding)], np.zeros(1, np.int64), np.array([side]),
                                                     np.zeros(1, np.int64), one,
                                                     np.array([record["phenomenonTime"]], float),
                                                     np.array([record["result"]], float)))
        outputs += output_records("M1", binding, joined.pairs)
        states_seen.append(is_clocked(states[("M1", "power", "11")]))
    assert any(states_seen) and not states_seen[-1]  # clocked while the streams were apart, plain again after
    assert as_multiset(outputs) == as_multiset(reference_join(faulty, reference_spec()))


def restored_after_crash(records: list[dict[str, Any]], spec: JoinSpec, crash_at: int, commits: list[int]
                         ) -> tuple[list[list[dict]], list[list[dict]], Counter, Counter]:
    """The standalone joiner's restore at the engine: a joiner runs to `crash_at`, its held records and the clock
    states it reported at each commit (the changelog) go to a fresh joiner, which joins on. Returns the outputs
    per record after the crash of both joiners, and their later dead letters."""
    def joiner(letters: Counter) -> KeyedJoiner:
        return KeyedJoiner([spec], on_dead_letter=lambda record, _source, reason: letters.update([(reading(record),
                                                                                                  reason)]))
    uninterrupted_letters, letters_before, recovered_letters = Counter(), Counter(), Counter()
    uninterrupted = joiner(uninterrupted_letters)
    after = []
    for number, record in enumerate(records):
        if number == crash_at:
            uninterrupted_letters.clear()  # those of the records before the crash were sent before it
        after.append(uninterrupted.ingest(record, number).outputs)
    if crash_at == len(records):
        uninterrupted_letters.clear()
    before_crash = joiner(letters_before)
    changelog: dict[tuple[str, str, str], dict] = {}
    for number, record in enumerate(records[:crash_at]):
        before_crash.ingest(record, number)
        if number in commits or number == crash_at - 1:
            for thing, spec_name, axis, snapshot in before_crash.clock_changes():
                if snapshot is None:
                    changelog.pop((thing, spec_name, axis), None)
                else:
                    changelog[(thing, spec_name, axis)] = snapshot
    recovered = joiner(recovered_letters)
    for key, snapshot in changelog.items():
        assert recovered.restore_clock(*key, snapshot)
    for number in sorted(before_crash.held_sources()):
        assert recovered.restore_ingest(records[number], number) is IngestStatus.ACCEPTED
    recovered.restored()
    replayed = [recovered.ingest(record, number).outputs for number, record in enumerate(records[crash_at:],
                                                                                          start=crash_at)]
    return after[crash_at:], replayed, uninterrupted_letters, recovered_letters


@settings(max_examples=200)
@given(st.lists(faults(25), min_size=1, max_size=2), st.integers(0, 2**32), st.sampled_from([0.0, 2.0]),
       st.integers(0, 100), st.lists(st.integers(0, 100), max_size=4))
def test_a_restart_anywhere_in_a_clock_fault_changes_nothing(machine_faults: list[list[Fault]], seed: int,
                                                             bound_s: float, crash_at: int, commits: list[int]) -> None:
    streams = [stream for index, fault_list in enumerate(machine_faults)
               for stream in by_stream(machine_readings(f"M{index}", 25, fault_list))]
    records = interleaved(streams, seed)
    after, replayed, letters, recovered_letters = restored_after_crash(records, power_spec(bound_s),
                                                                      min(crash_at, len(records)), commits)
    assert [as_multiset(outputs) for outputs in replayed] == [as_multiset(outputs) for outputs in after]
    assert recovered_letters == letters


def test_a_restart_while_a_record_is_set_aside_and_while_the_streams_are_on_two_timelines() -> None:
    faulty = machine_readings("M1", 40, [Fault(10, "outlier", 10 * YEAR_MS, (SPEED,)),
                                         Fault(20, "step", -HOUR_MS, (SPEED,)), Fault(30, "step", -HOUR_MS, (TORQUE,))])
    for crash_at in (21, 41, 61):  # the outlier set aside; speed on the new timeline, torque not yet; both again
        after, replayed, letters, recovered_letters = restored_after_crash(faulty, power_spec(), crash_at, [])
        assert [as_multiset(outputs) for outputs in replayed] == [as_multiset(outputs) for outputs in after]
        assert recovered_letters == letters


def idle_releases_on_both_paths(fault_list: list[Fault], seed: int, quiet_after: list[int]) -> int:
    """A spec with bounded disorder and an idle release, a machine whose clock lies, and quiet spells after some of
    its records: the per-record path (its own idle clock) and the batch path (releasing the same streams between
    micro-batches) give the same records, however the clock rule set records aside or moved the timelines. Returns
    how many streams the idle release released."""
    records = machine_readings("M1", 30, fault_list)
    spec = JoinSpec("power", "actSpeed_C{axis}", "vaTorque_C{axis}", "vaPower_C{axis}", "power", 1.0,
                    max_out_of_orderness_s=2.0, idle_release_s=5.0)
    idle = ManualClock()
    joiner = KeyedJoiner([spec], clock=idle)
    resolver = SpecResolver([spec])
    binding = resolver.routes(SPEED)[0].binding
    states = StateDict()
    expected, outputs, pending = [], [], []
    rng = random.Random(seed)

    def join_pending() -> None:
        if not pending:
            return
        batch = list(pending)
        pending.clear()
        rng.shuffle(batch)
        sides = np.array([resolver.routes(records[n]["quantity"])[0].side for n in batch])
        joined = join_keyed_batch(states, KeyedRows(
            [("M1", binding)], np.zeros(len(batch), np.int64), sides, np.zeros(len(batch), np.int64),
            np.array(batch, np.int64), np.array([records[n]["phenomenonTime"] for n in batch], float),
            np.array([records[n]["result"] for n in batch], float)))
        outputs.extend(output_records("M1", binding, joined.pairs))

    for number, record in enumerate(records):
        expected += joiner.ingest(record, number).outputs
        pending.append(number)
        if rng.random() < 0.3:
            join_pending()
        if number in quiet_after:
            idle.now_s += 10.0  # quiet for longer than the idle release
            released, releases = joiner.release_idle()
            expected += released
            join_pending()  # a release comes between micro-batches
            for release in releases:
                stored = state_key("M1", binding)
                again = clocked_release_idle_side(states[stored], release.side, binding.delta_time_ms)
                assert again is not None
                states[stored], pairs = again
                outputs.extend(output_records("M1", binding, pairs))
    join_pending()
    assert as_multiset(outputs) == as_multiset(expected)
    return joiner.counters.idle_releases


@settings(max_examples=100)
@given(faults(30), st.integers(0, 2**32), st.lists(st.integers(1, 59), max_size=5, unique=True))
def test_idle_releases_under_clock_faults_give_the_same_records_on_both_paths(fault_list: list[Fault], seed: int,
                                                                          quiet_after: list[int]) -> None:
    idle_releases_on_both_paths(fault_list, seed, quiet_after)


def test_an_idle_release_on_the_new_timeline_after_a_step_back() -> None:
    steps = [Fault(10, "step", -HOUR_MS, (SPEED, TORQUE)), Fault(20, "outlier", 10 * YEAR_MS, (TORQUE,))]
    assert idle_releases_on_both_paths(steps, 3, [15, 30, 50]) >= 3
