"""The soak's check of machine.data (ops/soak/check.py) on records made here as the pipeline makes them from the
plant's rows: what holds passes, and each way a record can be wrong, twice or missing is found and named."""
from __future__ import annotations

import numpy as np

from join_reference import reference_join
from soak.check import CheckContext, PartitionResult, Stream, check_streams, compare_outputs, digest
from soak.plant import Plant
from soak.readback import PartitionRange

MACHINES, AXES, ROUNDS = 3, 1, 60
START_MS = 1_796_000_000_000
NAMES = ("Werk Süd t.Halle 1.Presse 1", "Werk Süd t.Halle 1.Fräse 1", "Werk Süd t.Halle 1.Säge 1")


def context(**changes) -> CheckContext:
    values = dict(bootstrap="", security={}, machines=MACHINES, axes=AXES, seed=3, probes=0, names=NAMES,
                  phase_ms=(0, 7, 14), round_times_ms=START_MS + 1000 * np.arange(ROUNDS, dtype=np.int64),
                  at_risk=np.zeros(ROUNDS, dtype=bool), sample_points=50, level_bounds=(100.0, 1000.0, 5000.0),
                  sample_seed=1)
    values.update(changes)
    return CheckContext(**values)


def published(check: CheckContext) -> dict[tuple[int, int], Stream]:
    """The records of every row the plant published, as machine.data holds them."""
    plant = Plant(MACHINES, AXES, check.seed)
    streams: dict[tuple[int, int], Stream] = {}
    for round_, time_ms in enumerate(check.round_times_ms.tolist()):
        values = plant.round_values(time_ms)
        present = plant.presence(np.arange(MACHINES), round_)
        for machine in range(MACHINES):
            for quantity in np.flatnonzero(present[machine]).tolist():
                stream = streams.setdefault((machine, quantity), Stream())
                stream.rounds.append(round_)
                stream.times.append(time_ms + check.phase_ms[machine])
                stream.values.append(float(values[machine, quantity]))
    return streams


def run(check: CheckContext, streams: dict[tuple[int, int], Stream]) -> PartitionResult:
    return check_streams(check, Plant(MACHINES, AXES, check.seed), streams,
                         PartitionResult(PartitionRange("machine.data", 0, 0, 0)))


def test_what_the_pipeline_should_hold_passes_and_gives_the_reference_join() -> None:
    check = context()
    streams = published(check)
    quantities = Plant(MACHINES, AXES, check.seed).quantities
    records = [{"thing": NAMES[m], "quantity": quantities[q], "phenomenonTime": t, "result": v}
               for (m, q), s in streams.items() for t, v in zip(s.times, s.values)]
    joins = reference_join(records)
    result = run(check, streams)  # which frees the streams as it goes
    assert not result.problems and result.rows == MACHINES * ROUNDS and not result.lost_at_risk
    assert joins and len(result.digests) == 16 * len(joins)
    assert sum(result.raw_per_hour.values()) == result.records == len(records)
    assert sum(result.joined_per_hour.values()) == len(joins)
    windows = [w for w in result.windows if w.measurement == "raw"]
    assert sum(len(w.points) for w in windows) >= check.sample_points


def test_a_record_twice_of_another_value_or_time_is_named() -> None:
    check = context()
    streams = published(check)
    torque = streams[(0, 0)]  # the first quantity of the first axis: vaTorque, in almost every row
    torque.rounds.append(torque.rounds[5])
    torque.times.append(torque.times[5])
    torque.values.append(torque.values[5])
    torque.values[10] += 0.5
    torque.times[12] += 1
    result = run(check, streams)
    assert set(result.problems) == {"record twice", "record of the wrong value", "record at the wrong time",
                                    "records out of order"}
    assert all(NAMES[0] in example for examples in result.examples.values() for example in examples)


def test_a_lost_row_is_a_loss_unless_a_mosquitto_sigkill_may_have_lost_it() -> None:
    at_risk = np.zeros(ROUNDS, dtype=bool)
    at_risk[20] = True
    check = context(at_risk=at_risk)
    streams = published(check)
    for stream in [s for (machine, _q), s in streams.items() if machine == 1]:
        for index in reversed([i for i, round_ in enumerate(stream.rounds) if round_ in (20, 30)]):
            del stream.rounds[index], stream.times[index], stream.values[index]
    result = run(check, streams)
    assert result.lost_at_risk == [(1, 20)]
    assert result.problems == {"row lost": 1} and "row 30" in result.examples["row lost"][0]


def test_a_row_in_part_is_never_explained() -> None:
    check = context(at_risk=np.ones(ROUNDS, dtype=bool))  # every row may have been lost whole, none in part
    streams = published(check)
    torque, current = streams[(2, 0)], streams[(2, 1)]
    round_ = next(r for r in current.rounds if r in torque.rounds)  # a row of both
    index = list(torque.rounds).index(round_)
    del torque.rounds[index], torque.times[index], torque.values[index]
    result = run(check, streams)
    assert result.problems == {"row in part": 1} and not result.lost_at_risk


def test_machine_out_is_compared_as_multisets_of_whole_records() -> None:
    check = context()
    data = run(check, published(check))
    out = PartitionResult(PartitionRange("machine.out", 0, 0, 0), digests=data.digests,
                          outputs_per_thing=data.outputs_per_thing)
    verdict = compare_outputs([data], [out])
    assert verdict.holds and verdict.found == verdict.expected > 0
    twice = PartitionResult(out.span, digests=out.digests + out.digests[:16], outputs_per_thing=out.outputs_per_thing)
    assert compare_outputs([data], [twice]).twice == 1
    other = PartitionResult(out.span, digests=out.digests[16:] + digest({"thing": "x"}))
    verdict = compare_outputs([data], [other])
    assert (verdict.missing, verdict.extra, verdict.holds) == (1, 1, False)
