"""The pure parts of the peer comparison (benchmarks.peers): the pairs of each join semantics, the counting of a
peer's output against the engine's pairs (withdrawals included), the interleavings and the bounded disorder of
the input, and the join specs as the peers' own scripts read them."""
from __future__ import annotations

import dataclasses
import math
from collections import Counter, defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.join_peers import join_specs_for, out_of_orderness_field
from benchmarks.peers import workload
from benchmarks.peers.pairs import (PairComparison, PairKey, Series, asof_pairs, compare_pairs, interval_pairs,
                                    neighbour_pairs, output_difference, pair_key, same_output, series_of,
                                    written_pairs)
from benchmarks.peers.peer_io import FORMULAS as PEER_FORMULAS
from benchmarks.peers.peer_io import PeerSpec
from benchmarks.peers.subprocess_peer import RunInput, end_offsets_of, peer_specs, side_regex
from local_stream_buffer.formulas import FORMULAS
from local_stream_buffer.reference import reference_pairs
from local_stream_buffer.specs import JoinSpec, SpecResolver, load_join_specs
from pipeline_core.partitioning import thing_partition
from pipeline_core.records import decode_record
from simulator.settings import DEFAULT_EVENTS_FILE

POWER = JoinSpec("power", "actSpeed_C{axis}", "vaTorque_C{axis}", "vaPower_C{axis}", "power", 1.0)
UNLIMITED = JoinSpec("power", "actSpeed_C{axis}", "vaTorque_C{axis}", "vaPower_C{axis}", "power")
A, B, C, D = (PairKey("M1", "vaPower_C11", left, right) for left, right in ((1, 1), (2, 3), (4, 3), (5, 9)))


def _series(left: list[int], right: list[int], spec: JoinSpec = POWER) -> Series:
    binding = SpecResolver([spec]).routes("actSpeed_C11")[0].binding
    return Series("M1", binding, [(t, 1.0) for t in left], [(t, 2.0) for t in right])


def _keys(times: set[tuple[int, int]]) -> set[PairKey]:
    return {PairKey("M1", "vaPower_C11", left, right) for left, right in times}


def test_compare_counts_found_missing_extra_and_duplicates() -> None:
    assert compare_pairs({A, B, C}, [A, A, B, D, D, D]) == PairComparison(
        outputs=6, found=2, missing=1, extra=1, duplicates=3)


def test_no_output_misses_every_pair_and_exact_output_is_exact() -> None:
    assert compare_pairs({A, B}, []) == PairComparison(outputs=0, found=0, missing=2, extra=0, duplicates=0)
    assert compare_pairs({A, B}, [B, A]).exact
    assert not compare_pairs({A, B}, [B, A, A]).exact


@given(st.sets(st.sampled_from([A, B, C, D])), st.lists(st.sampled_from([A, B, C, D])))
def test_compare_agrees_with_counting_by_hand(reference: set[PairKey], written: list[PairKey]) -> None:
    result = compare_pairs(reference, written)
    distinct = set(written)
    assert result.outputs == len(written)
    assert result.found == len(distinct & reference)
    assert result.missing == len(reference - distinct)
    assert result.extra == len(distinct - reference)
    assert result.duplicates == len(written) - len(distinct)


def test_same_output_means_the_same_pairs_as_often() -> None:
    assert same_output([A, B], [B, A])
    assert not same_output([A, B], [A, B, B])
    assert output_difference([A, B, C], [B, D, D]) == (2, 1)


def test_pair_key_reads_an_output_record_with_whole_float_times_as_ints() -> None:
    output = {"thing": "M1", "quantity": "vaPower_C11", "phenomenonTime": 1.5e12,
              "left": {"quantity": "actSpeed_C11", "phenomenonTime": 1.554096460415e12, "result": 1.0},
              "right": {"quantity": "vaTorque_C11", "phenomenonTime": 1554096460416, "result": 2.0}}
    key = pair_key(output)
    assert key == PairKey("M1", "vaPower_C11", 1554096460415, 1554096460416)
    assert type(key.left_time) is int


def test_the_three_semantics_on_the_worked_example() -> None:
    # The engine README's example: L 1 2 4, R 0 2 3 6 7 (no delta_time).
    series = [_series([1, 2, 4], [0, 2, 3, 6, 7], UNLIMITED)]
    assert neighbour_pairs(series) == _keys({(1, 0), (1, 2), (2, 2), (2, 3), (4, 3), (4, 6)})
    assert asof_pairs(series) == _keys({(1, 0), (2, 2), (4, 3)})
    assert interval_pairs(series) == _keys({(left, right) for left in (1, 2, 4) for right in (0, 2, 3, 6, 7)})


def test_delta_time_bounds_every_semantics() -> None:
    series = [_series([1000, 5000], [0, 1500, 2500, 4500])]  # delta_time 1 s
    assert neighbour_pairs(series) == _keys({(1000, 1500), (1000, 0), (5000, 4500)})
    assert interval_pairs(series) == _keys({(1000, 0), (1000, 1500), (5000, 4500)})
    assert asof_pairs(series) == _keys({(1000, 0), (5000, 4500)})


@given(st.lists(st.integers(0, 40), unique=True), st.lists(st.integers(0, 40), unique=True),
       st.one_of(st.none(), st.integers(0, 10)))
def test_neighbour_pairs_are_the_engine_reference(left: list[int], right: list[int], delta: int | None) -> None:
    spec = JoinSpec("power", "actSpeed_C{axis}", "vaTorque_C{axis}", "vaPower_C{axis}", "power",
                    None if delta is None else delta / 1000)
    series = _series(sorted(left), sorted(right), spec)
    expected = _keys({(lt, rt) for lt, rt, _ in reference_pairs(sorted(left), sorted(right),
                                                                   series.binding.delta_time_ms)})
    pairs = neighbour_pairs([series])
    assert pairs == expected
    # The engine's pairs are those of an interval join that are neighbours: never more.
    assert pairs <= interval_pairs([series])


def test_series_of_groups_records_by_thing_and_binding_in_arrival_order() -> None:
    resolver = SpecResolver([POWER])
    records = [{"thing": "M1", "quantity": "vaTorque_C11", "phenomenonTime": 2, "result": 1.0},
               {"thing": "M1", "quantity": "actSpeed_C11", "phenomenonTime": 1, "result": 3.0},
               {"thing": "M2", "quantity": "actSpeed_C12", "phenomenonTime": 5, "result": 4.0},
               {"thing": "M1", "quantity": "vaLoad_C11", "phenomenonTime": 1, "result": 9.0},
               {"thing": "M1", "quantity": "vaTorque_C11", "phenomenonTime": 3, "result": 2.0}]
    grouped = {(each.thing, each.binding.output_quantity): (each.left, each.right)
               for each in series_of(records, resolver)}
    assert grouped == {("M1", "vaPower_C11"): ([(1, 3.0)], [(2, 1.0), (3, 2.0)]),
                       ("M2", "vaPower_C12"): ([(5, 4.0)], [])}


def test_every_interleaving_keeps_each_series_in_time_order_and_every_record() -> None:
    resolver = SpecResolver()
    records = workload.fleet(workload.joined_records(DEFAULT_EVENTS_FILE, resolver), copies=2)
    assert {record["thing"] for record in records} == {f"{thing}-{copy:03d}" for thing in ("R0815", "R27182", "H31415")
                                                       for copy in range(2)}
    for name, interleave in workload.INTERLEAVINGS.items():
        order = interleave(records)
        assert sorted(order) == list(range(len(records))), name
        times: dict[tuple[str, str], list[float]] = defaultdict(list)
        for index in order:
            times[(records[index]["thing"], records[index]["quantity"])].append(records[index]["phenomenonTime"])
        assert all(series == sorted(series) for series in times.values()), name
    # So the engine's pairs are the same for each: 2,748 per replayed machine set, as on the file in time order.
    assert len(neighbour_pairs(series_of(records, resolver))) == 2 * 2_748


def test_messages_go_to_their_thing_partition_with_the_record_schema() -> None:
    records = [{"thing": f"M{index}", "quantity": "actSpeed_C11", "phenomenonTime": 1_700_000_000_000 + index,
                "result": 1.5} for index in range(20)]
    messages = workload.messages(records, partitions=5)
    assert [message.partition for message in messages] == [thing_partition(f"M{index}", 5) for index in range(20)]
    assert [decode_record(message.value) for message in messages] == records
    assert Counter(message.key for message in messages) == Counter(f"M{index}.actSpeed_C11".encode()
                                                                   for index in range(20))


def test_withdrawn_records_take_back_their_pair_and_are_counted() -> None:
    def output(left: int, right: int, **extra: int) -> dict:
        return {"thing": "M1", "quantity": "vaPower_C11", "left": {"phenomenonTime": left},
                "right": {"phenomenonTime": right}, **extra}

    # Pathway's revision: (5, 3) written, withdrawn, (5, 4) written instead; a plain peer's records only add.
    written, withdrawn = written_pairs([output(1, 1), output(5, 3, diff=1), output(5, 3, diff=-1),
                                        output(5, 4, diff=1), output(1, 1)])
    assert sorted(written) == [A, A, PairKey("M1", "vaPower_C11", 5, 4)]
    assert withdrawn == 1
    # A withdrawal of a pair never written leaves nothing standing, never a negative count.
    assert written_pairs([output(2, 3, diff=-1)]) == ([], 1)


def _rows(things: int, rows: int, step_ms: int) -> list[dict]:
    return [{"thing": f"M{thing}", "quantity": quantity, "phenomenonTime": 1_000_000 + row * step_ms, "result": 1.0}
            for row in range(rows) for thing in range(things) for quantity in ("actSpeed_C11", "vaTorque_C11")]


@settings(max_examples=50)
@given(st.integers(1, 3), st.integers(1, 60), st.integers(1, 1500), st.floats(0, 3), st.integers(0, 10))
def test_bounded_disorder_is_a_permutation_no_record_later_than_the_bound(things: int, rows: int, step_ms: int,
                                                                           bound_s: float, seed: int) -> None:
    records = _rows(things, rows, step_ms)
    order = workload.bounded_disorder(records, bound_s, seed)
    assert sorted(order) == list(range(len(records)))
    assert max(workload.lateness_ms(records, order)) <= bound_s * 1000
    # A row (a thing's records of one time) is displaced as a whole: its records stay next to each other.
    position = {index: at for at, index in enumerate(order)}
    for index in range(0, len(records), 2):
        assert abs(position[index] - position[index + 1]) == 1


def test_bounded_disorder_is_seeded_and_disorders_the_shipped_events_within_the_bound() -> None:
    resolver = SpecResolver()
    records = workload.fleet(workload.joined_records(DEFAULT_EVENTS_FILE, resolver), copies=1)
    order = workload.bounded_disorder(records, 2.0, seed=7)
    assert order == workload.bounded_disorder(records, 2.0, seed=7)
    assert order != workload.bounded_disorder(records, 2.0, seed=8)
    late = [ms for ms in workload.lateness_ms(records, order) if ms > 0]
    assert late and max(late) <= 2000  # some records arrive behind a newer one of their series, none by more
    assert workload.lateness_ms(records, workload.time_order(records)) == [0.0] * len(records)
    # No bound, no disorder: every record is its series' newest when it arrives.
    assert workload.lateness_ms(records, workload.bounded_disorder(records, 0.0, seed=7)) == [0.0] * len(records)


def test_peer_specs_read_alike_in_the_peers_scripts() -> None:
    spec = JoinSpec("ratio", "a.speed_C{axis}", "a+torque_C{axis}", "out_C{axis}", "ratio", 0.5)
    entry, = peer_specs([spec])
    peer = PeerSpec(entry)
    assert entry["left_regex"] == side_regex("a.speed_C{axis}", r"\d+")
    assert peer.axis(0, "a.speed_C12") == "12" and peer.axis(0, "aXspeed_C12") is None
    assert peer.axis(1, "a+torque_C3") == "3" and peer.axis(1, "a+torque_C3x") is None
    assert peer.output_quantity("12") == "out_C12" and peer.delta_ms == 500
    assert peer.within_delta(1000, 1500) and not peer.within_delta(1000, 1501)
    record = peer.output_record("M1", "12", {"quantity": "a.speed_C12", "phenomenonTime": 1000, "result": 3.0},
                                {"quantity": "a+torque_C12", "phenomenonTime": 1400, "result": 0.0})
    assert pair_key(record) == PairKey("M1", "out_C12", 1000, 1400) and math.isnan(record["result"])
    fixed, = peer_specs([JoinSpec("sum", "left", "right", "both", "product")])
    assert PeerSpec(fixed).axis(0, "left") == "" and PeerSpec(fixed).output_quantity("") == "both"
    assert fixed["delta_ms"] is None


@given(st.floats(-1e6, 1e6), st.floats(-1e6, 1e6))
def test_the_peers_formulas_are_the_engines(left: float, right: float) -> None:
    for name, formula in FORMULAS.items():
        expected, got = formula(left, right), PEER_FORMULAS[name](left, right)
        assert got == expected or (math.isnan(got) and math.isnan(expected)), name


def test_end_offsets_count_each_partitions_messages() -> None:
    records = [{"thing": f"M{index % 7}", "quantity": "actSpeed_C11", "phenomenonTime": index, "result": 1.0}
               for index in range(50)]
    messages = workload.messages(records, partitions=5)
    offsets = end_offsets_of(messages, 5)
    assert sum(offsets) == 50
    assert list(offsets) == [sum(1 for message in messages if message.partition == p) for p in range(5)]


def test_the_disordered_run_gives_the_joiners_the_bound_where_the_engine_has_it(tmp_path) -> None:
    in_order = RunInput(10, 10, 5, 0.0)
    assert join_specs_for(in_order, tmp_path) is None
    path = join_specs_for(RunInput(10, 10, 5, 2.0), tmp_path)
    field = out_of_orderness_field()
    if field is None:
        assert path is None  # this engine has no bound: the joiners run as they are
    else:
        loaded = load_join_specs(path)
        assert [dataclasses.replace(spec, **{field: 0.0}) for spec in loaded] == [
            dataclasses.replace(spec, **{field: 0.0}) for spec in SpecResolver().specs]
        assert {getattr(spec, field) for spec in loaded} == {2.0}
