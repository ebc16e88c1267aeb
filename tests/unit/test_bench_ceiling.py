"""The pure parts of each joiner's ceiling in `make bench`: the ratio of a joiner to its pass-through and the
lines printed for it (benchmarks.ceiling), the real-mix input of the standalone joiner's ceiling, and the
Spark pass-through's step that hands records to the job's sink unchanged."""
from __future__ import annotations

import math

import pyarrow as pa
import pytest

from benchmarks.ceiling import Run, cost_lines, ratio, ratio_line, run_line, verdict
from benchmarks.kafka_joiner import real_mix
from benchmarks.spark_joiner import ceiling_line, emit_unchanged
from pipeline_core.records import decode_record, record_key
from spark_joiner.bucket_join import OUT, unpack_emitted

SHIPPED_RECORDS = 19_825  # records of the 5,000 shipped rows, every quantity
SHIPPED_PAIRS = 2_748


def test_a_run_gives_its_rate_and_cpu_per_record() -> None:
    run = Run(records=200_000, seconds=4.0, cpu_s=5.0)
    assert run.records_per_s == 50_000
    assert run.cpu_us_per_record == 25.0
    assert math.isnan(Run(10, 0.0, 1.0).records_per_s)


def test_the_ratio_pairs_rounds_in_order_and_takes_medians() -> None:
    joiner = [Run(100_000, 4.0, 2.5), Run(100_000, 2.0, 2.0), Run(100_000, 5.0, 3.0)]  # 25k, 50k, 20k records/s
    ceiling = [Run(100_000, 1.0, 0.5), Run(100_000, 1.0, 0.4), Run(100_000, 2.0, 0.6)]  # 100k, 100k, 50k
    result = ratio(joiner, ceiling)
    assert result.rounds == (0.25, 0.5, 0.4)
    assert result.median == 0.4
    assert result.joiner_cpu_us == 25.0 and result.ceiling_cpu_us == 5.0
    assert result.cpu_ratio == 0.2


def test_rounds_must_pair() -> None:
    with pytest.raises(ValueError):
        ratio([Run(1, 1.0, 1.0)], [])


@pytest.mark.parametrize(("value", "expected"), [(0.7, "met"), (0.71, "met"), (0.69, "NOT met"),
                                                 (float("nan"), "NOT met")])
def test_the_verdict_against_a_target(value: float, expected: str) -> None:
    assert verdict(value, 0.7) == expected


def test_the_ratio_line_says_rounds_target_verdict_and_cpu() -> None:
    result = ratio([Run(100, 2.0, 0.002), Run(100, 4.0, 0.003)], [Run(100, 1.0, 0.0005), Run(100, 1.0, 0.0005)])
    line = ratio_line("all-joinable", result, 0.7)
    assert line == ("all-joinable: 0.38 of the pass-through's records/s (rounds 0.50, 0.25), target >= 0.7 NOT met; "
                    "CPU per record 25.0 µs against 5.0 µs (0.20)")


def test_a_single_round_names_no_rounds() -> None:
    line = ratio_line("job / pass-through", ratio([Run(100, 2.0, 0.002)], [Run(100, 1.0, 0.001)]), 0.5)
    assert line == ("job / pass-through: 0.50 of the pass-through's records/s, target >= 0.5 met; "
                    "CPU per record 20.0 µs against 10.0 µs (0.50)")


def test_a_run_line_holds_its_figures() -> None:
    line = run_line("real mix x20, joiner", 2, Run(396_500, 10.0, 4.0))
    assert line.split()[-5:] == ["2", "396,500", "10.0", "39,650", "10.1"]


def test_cost_lines_give_each_phase_per_record_its_share_and_the_sum() -> None:
    lines = cost_lines({"decode": 1.0, "engine": 3.0}, 1_000_000, measured_us=4.5)
    assert lines == ["  decode   1.00 µs   25%",
                     "  engine   3.00 µs   75%",
                     "  sum      4.00 µs; the joiner measured 4.5 µs per record in the same run"]
    with pytest.raises(ValueError):
        cost_lines({"decode": 1.0}, 0)


def test_the_real_mix_replicates_every_record_of_the_shipped_events_under_new_names() -> None:
    records, joins = real_mix(2)
    assert len(records) == 2 * SHIPPED_RECORDS
    assert joins == 2 * SHIPPED_PAIRS
    things = {thing for _key, _value, thing in records}
    assert things and all(thing.endswith(("-000", "-001")) for thing in things)
    for key, value, thing in records[:500]:
        record = decode_record(value)
        assert record["thing"] == thing and key == record_key(thing, record["quantity"])
    times = [decode_record(value)["phenomenonTime"] for _key, value, _thing in records]
    assert times == sorted(times)


def test_the_spark_pass_through_hands_every_value_to_the_sink_unchanged() -> None:
    values = [b'{"a":1}', b"", b'{"b":2}']
    batch = pa.RecordBatch.from_arrays([pa.array(values, pa.binary()), pa.array([0, 0, 1], pa.int32()),
                                        pa.array([5, 6, 7], pa.int64())], names=["value", "partition", "offset"])
    blobs = [emitted.column(0)[0].as_py() for emitted in emit_unchanged(iter([batch, batch.slice(1)]))]
    table = unpack_emitted(blobs)
    assert table.column("value").to_pylist() == values + values[1:]
    assert set(table.column("kind").to_pylist()) == {OUT}
    assert table.column("key").null_count == table.num_rows


def test_the_spark_ceiling_line_gives_whole_runs_and_after_the_first_batch() -> None:
    job = {"records": 1_000_000, "seconds": 100.0, "steady_records_per_s": 15_000.0, "cpu_us_per_record": 30.0,
           "steady_cpu_us_per_record": {"driver": 2.0, "JVM": 12.0, "Python workers": 6.0}}
    pass_through = {"records": 1_000_000, "seconds": 40.0, "steady_records_per_s": 50_000.0, "cpu_us_per_record": 15.0,
                    "steady_cpu_us_per_record": {"driver": 1.0, "JVM": 5.0, "Python workers": 0.0}}
    assert ceiling_line(job, pass_through) == (
        "job / pass-through: 0.40 of the pass-through's records/s, target >= 0.5 NOT met; CPU per record 30.0 µs "
        "against 15.0 µs (0.50); after the first batch 0.30 (NOT met), CPU per record 20.0 µs against 6.0 µs (0.30)")
