"""The one displacement of bounded disorder (`pipeline_core.disorder`), which the simulator and the benchmarks use."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from benchmarks.peers import workload
from pipeline_core.disorder import arrival_order
from simulator.events import displaced


@given(st.lists(st.integers(0, 10_000), max_size=60).map(sorted), st.integers(0, 3000), st.integers(0, 100))
def test_no_row_arrives_more_than_the_bound_behind_the_newest_before_it(times: list[int], bound_ms: int,
                                                                      seed: int) -> None:
    order = arrival_order(times, bound_ms, seed)
    assert sorted(order) == list(range(len(times)))
    newest = None
    for index in order:
        newest = times[index] if newest is None else max(newest, times[index])
        assert newest - times[index] <= bound_ms


def test_one_seed_gives_one_arrival_order_in_the_simulator_and_the_benchmarks() -> None:
    """Rows of two machines, one row per machine and time: the simulator's replay order and the benchmarks'
    disordered workload put the rows in the same order for the same seed and bound."""
    rows = [{"Thing": thing, "Timestamp": 1_554_096_380_000 + step * 250} for step in range(40) for thing in ("A", "B")]
    records = [{"thing": row["Thing"], "phenomenonTime": row["Timestamp"], "quantity": quantity}
               for row in rows for quantity in ("actSpeed_C11", "vaTorque_C11")]
    replayed = [(row["Thing"], row["Timestamp"]) for row in displaced(rows, 2000, seed=7)]
    workload_order = workload.bounded_disorder(records, 2.0, seed=7)
    benchmarked = list(dict.fromkeys((records[i]["thing"], records[i]["phenomenonTime"]) for i in workload_order))
    assert benchmarked == replayed
    assert replayed != [(row["Thing"], row["Timestamp"]) for row in rows]  # disordered indeed
