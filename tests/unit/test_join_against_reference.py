"""The engine against the join's reference, which shares no code with it, on generated streams: many machines,
random interleavings, displaced records within and beyond the bound, duplicates and conflicts (tests/join_streams.py).

Both paths the joiners run: the per-record one (KeyedJoiner, the standalone joiner's) and the batch one
(join_keyed_batch, the Spark job's) over random batch cuts, each batch's rows shuffled as a shuffle leaves them and
its states kept as bytes. Each gives join_reference's output records and the verdicts of join_state_reference on
every record: with a bound or without, with an idle release looking for quiet streams, and (per record) with the
key bound evicting keys. Derandomized in CI as every property test (tests/conftest.py); `make explore` draws new
examples.
"""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from join_reference import POWER, Spec
from join_state_reference import Arrival, ReleaseCheck, Verdict, evicting_join, released_join
from join_streams import BOUNDS_MS, PAUSES_MS, Scenario, scenarios
from kafka_joiner_support import as_multiset
from local_stream_buffer.idle_release import due_sides
from local_stream_buffer.keyed import KeyedJoiner
from local_stream_buffer.keyed_batch import KeyedRows, StateDict, join_keyed_batch
from local_stream_buffer.output import output_records
from local_stream_buffer.reorder import load_key_state, release_idle_side
from local_stream_buffer.specs import JoinSpec, SpecResolver
from local_stream_buffer.status import IngestStatus
from support import ManualClock

EXAMPLES = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
IDLE_RELEASE_MS = 1_000
# The reference's product spec: a second join on the speed, so a speed record feeds two keys.
PRODUCT = Spec("actSpeed_C", "vaLoad_C", "vaProduct_C", lambda left, right: left * right, delta_time_ms=None)
PARTITIONS = 3  # of the batch path's input: each thing's records in one, as the stream connector writes them


def engine_specs(bound_ms: float, idle_release_ms: float | None = None) -> list[JoinSpec]:
    """The engine's specs of POWER and PRODUCT, with the bound and the idle release."""
    options = {"max_out_of_orderness_s": bound_ms / 1000,
               "idle_release_s": None if idle_release_ms is None else idle_release_ms / 1000}
    return [JoinSpec("power", "actSpeed_C{axis}", "vaTorque_C{axis}", "vaPower_C{axis}", "power",
                     POWER.delta_time_ms / 1000, **options),
            JoinSpec("product", "actSpeed_C{axis}", "vaLoad_C{axis}", "vaProduct_C{axis}", "product", None, **options)]


def reference_specs(bound_ms: float) -> list[Spec]:
    return [dataclasses.replace(spec, bound_ms=bound_ms) for spec in (POWER, PRODUCT)]


def statuses(verdicts: list[Verdict], bound_ms: float) -> list[IngestStatus]:
    """The engine's status for each of the reference's verdicts: a record behind its stream is late with a bound,
    out of order (rejected) without one."""
    behind = IngestStatus.LATE if bound_ms else IngestStatus.REJECTED
    return [{Verdict.ACCEPTED: IngestStatus.ACCEPTED, Verdict.DUPLICATE: IngestStatus.DUPLICATE,
             Verdict.CONFLICT: IngestStatus.REJECTED, Verdict.BEHIND: behind,
             Verdict.UNROUTED: IngestStatus.UNROUTED}[verdict] for verdict in verdicts]


def per_record(scenario: Scenario, joiner: KeyedJoiner, clock: ManualClock | None = None
               ) -> tuple[list[dict], list[IngestStatus], list[tuple]]:
    """The joiner through the scenario's events: its outputs, the status of every arrival, and its releases (when
    made, thing, spec, axis, side, the time released up to)."""
    outputs, seen, releases = [], [], []
    for event in scenario.events:
        if clock is not None:
            clock.now_s = event.at_ms / 1000  # exact: every processing time is a multiple of 1/8 s
        if isinstance(event, ReleaseCheck):
            released, made = joiner.release_idle()
            outputs += released
            releases += [(event.at_ms, r.thing, r.binding.spec.name, r.binding.axis, r.side, r.up_to_ms)
                         for r in made]
            continue
        outcome = joiner.ingest(event.record)
        outputs += outcome.outputs
        seen.append(outcome.status)
        if outcome.status is IngestStatus.REJECTED:
            assert outcome.reason.startswith(("out_of_order:", "conflict:")), outcome.reason
        elif outcome.status is IngestStatus.LATE:
            assert outcome.reason.startswith("late: "), outcome.reason
    return outputs, seen, releases


def batches_of(scenario: Scenario, cut_after: set[int]) -> list[tuple[float, list[int]] | float]:
    """The scenario as micro-batches: (processing time, arrival numbers) each, cut after the arrivals in `cut_after`
    and at every look for quiet streams (a float, its time), which comes between batches."""
    arrivals = scenario.arrivals
    steps: list[tuple[float, list[int]] | float] = []
    batch: list[int] = []
    number = 0
    for event in scenario.events:
        if isinstance(event, ReleaseCheck):
            if batch:
                steps.append((arrivals[batch[-1]].at_ms, batch))
                batch = []
            steps.append(event.at_ms)
            continue
        batch.append(number)
        if number in cut_after:
            steps.append((event.at_ms, batch))
            batch = []
        number += 1
    if batch:
        steps.append((arrivals[batch[-1]].at_ms, batch))
    return steps


def batch_path(scenario: Scenario, steps: list, specs: list[JoinSpec], rng
               ) -> tuple[list[dict], set[int], list[tuple]]:
    """join_keyed_batch through the batches (rows shuffled, each stream's order its partition and offset), and the
    Spark job's idle release between them: the output records, the arrivals whose rows were turned away, and the
    releases (as `per_record` gives them)."""
    resolver = SpecResolver(specs)
    records = scenario.records
    keys: dict = {}
    states = StateDict()
    outputs: list[dict] = []
    turned_away: set[int] = set()
    releases: list[tuple] = []
    things = sorted({record["thing"] for record in records})
    for step in steps:
        if not isinstance(step, tuple):
            for (thing, binding), code in keys.items():
                stored = (thing, binding.spec.name, binding.axis)
                for side in due_sides(states.get(stored), int(step), binding.idle_release_ms or float("inf")):
                    states[stored], pairs = release_idle_side(states[stored], side, binding.delta_time_ms)
                    outputs += output_records(thing, binding, pairs)
                    up_to = load_key_state(states[stored])[0].released[side]
                    releases.append((step, thing, binding.spec.name, binding.axis, side, up_to))
            continue
        arrived_ms, numbers = step
        rows = [(keys.setdefault((records[n]["thing"], binding), len(keys)), side, n)
                for n in numbers for binding, side in resolver.routes(records[n]["quantity"])]
        if not rows:
            continue
        rng.shuffle(rows)
        key, side, number = (np.array(column, dtype=np.int64) for column in zip(*rows))
        key_list = list(keys)
        joined = join_keyed_batch(states, KeyedRows(
            key_list, key, side, np.array([things.index(records[n]["thing"]) % PARTITIONS for n in number.tolist()]),
            number, np.array([records[n]["phenomenonTime"] for n in number.tolist()], dtype=float),
            np.array([records[n]["result"] for n in number.tolist()], dtype=float)), arrived_ms=int(arrived_ms))
        turned_away.update(int(number[row]) for row in joined.rejected.tolist())
        for code in np.unique(joined.key).tolist():
            thing, binding = key_list[code]
            mine = joined.key == code
            outputs += output_records(thing, binding, type(joined.pairs)(*(column[mine] for column in joined.pairs)))
    return outputs, turned_away, releases


def releases_of(result) -> list[tuple]:
    """The reference's releases as `per_record` gives them."""
    spec_names = {POWER.output: "power", PRODUCT.output: "product"}
    return sorted((release.at_ms, thing, spec_names[output], axis, ("left", "right").index(side), release.up_to)
                  for release in result.releases for thing, output, axis, side in [release.stream])


def at_batch_times(scenario: Scenario, steps: list) -> list:
    """The scenario's events as the batch path meets them: each record arriving at its batch's processing time."""
    events = []
    for step in steps:
        if isinstance(step, tuple):
            events += [Arrival(step[0], scenario.records[n]) for n in step[1]]
        else:
            events.append(ReleaseCheck(step))
    return events


@EXAMPLES
@given(scenarios(extra_quantities=True))
def test_the_per_record_path_gives_the_references_records_and_verdicts(scenario: Scenario) -> None:
    bound_ms = scenario.bound_ms
    expected = released_join(scenario.arrivals, reference_specs(bound_ms), bound_ms)
    outputs, seen, _ = per_record(scenario, KeyedJoiner(engine_specs(bound_ms)))
    assert seen == statuses(expected.verdicts, bound_ms)
    assert as_multiset(outputs) == as_multiset(expected.outputs)


@EXAMPLES
@given(scenarios(extra_quantities=True), st.sets(st.integers(0, 400), max_size=12), st.randoms(use_true_random=False))
def test_every_batching_gives_the_references_records_and_turns_away_what_it_does(
        scenario: Scenario, cut_after: set[int], rng) -> None:
    bound_ms = scenario.bound_ms
    expected = released_join(scenario.arrivals, reference_specs(bound_ms), bound_ms)
    outputs, turned_away, _ = batch_path(scenario, batches_of(scenario, cut_after), engine_specs(bound_ms), rng)
    assert turned_away == {number for number, verdict in enumerate(expected.verdicts)
                           if verdict in (Verdict.BEHIND, Verdict.CONFLICT)}
    assert as_multiset(outputs) == as_multiset(expected.outputs)


@EXAMPLES
@given(scenarios(quiet_spells=True, bounds_ms=BOUNDS_MS[1:]))
def test_the_idle_release_per_record_gives_the_references_releases_and_records(scenario: Scenario) -> None:
    bound_ms = scenario.bound_ms
    expected = released_join(scenario.events, reference_specs(bound_ms), bound_ms, IDLE_RELEASE_MS)
    clock = ManualClock()
    outputs, seen, releases = per_record(scenario, KeyedJoiner(engine_specs(bound_ms, IDLE_RELEASE_MS), clock=clock),
                                         clock)
    assert seen == statuses(expected.verdicts, bound_ms)
    assert sorted(releases) == releases_of(expected)  # each stream released when the reference releases it
    assert as_multiset(outputs) == as_multiset(expected.outputs)


@EXAMPLES
@given(scenarios(quiet_spells=True, bounds_ms=BOUNDS_MS[1:]), st.sets(st.integers(0, 400), max_size=12),
       st.randoms(use_true_random=False))
def test_the_idle_release_between_batches_gives_the_references_releases_and_records(scenario: Scenario,
                                                                                    cut_after: set[int], rng) -> None:
    bound_ms = scenario.bound_ms
    steps = batches_of(scenario, cut_after)
    expected = released_join(at_batch_times(scenario, steps), reference_specs(bound_ms), bound_ms, IDLE_RELEASE_MS)
    outputs, turned_away, releases = batch_path(scenario, steps, engine_specs(bound_ms, IDLE_RELEASE_MS), rng)
    assert sorted(releases) == releases_of(expected)
    assert turned_away == {number for number, verdict in enumerate(expected.verdicts)
                           if verdict in (Verdict.BEHIND, Verdict.CONFLICT)}
    assert as_multiset(outputs) == as_multiset(expected.outputs)


@EXAMPLES
@given(scenarios(max_machines=12, bounds_ms=(0,)), st.integers(1, 12))
def test_the_key_bound_evicts_what_the_reference_evicts_and_joins_the_rest_alike(scenario: Scenario,
                                                                                 max_join_keys: int) -> None:
    evicted: list[dict] = []
    joiner = KeyedJoiner(engine_specs(0)[:1], max_join_keys=max_join_keys,
                         on_evict=lambda records, reason: evicted.extend(record for record, _ in records))
    outputs, seen, _ = per_record(scenario, joiner)
    expected = evicting_join(scenario.records, [POWER], max_join_keys)
    assert seen == statuses(expected.verdicts, 0)
    assert as_multiset(evicted) == as_multiset([record for held in expected.evicted for record in held])
    assert joiner.counters.evicted_keys == len(expected.evicted)
    assert as_multiset(outputs) == as_multiset(expected.outputs)


def test_the_scenarios_reach_every_verdict_and_release() -> None:
    """The strategies are no empty promise: over a fixed handful of draws, every verdict, records exactly the bound
    behind their stream, and idle releases come."""
    seen: set[Verdict] = set()
    released = at_bound = 0

    @settings(max_examples=60, database=None, derandomize=True)
    @given(scenarios(extra_quantities=True, quiet_spells=True))
    def draw(scenario: Scenario) -> None:
        nonlocal released, at_bound
        bound_ms = scenario.bound_ms
        result = released_join(scenario.events, reference_specs(bound_ms), bound_ms, IDLE_RELEASE_MS)
        seen.update(result.verdicts)
        released += len(result.releases)
        newest: dict[tuple[str, str], float] = {}
        for record in scenario.records:
            stream, t = (record["thing"], record["quantity"]), record["phenomenonTime"]
            at_bound += bool(bound_ms) and newest.get(stream, t) - t == bound_ms
            newest[stream] = max(newest.get(stream, t), t)

    draw()
    assert seen == set(Verdict) and released > 0 and at_bound > 0
    assert min(PAUSES_MS) < IDLE_RELEASE_MS <= max(PAUSES_MS)  # quiet spells both shorter and longer than it


def test_the_state_reference_imports_nothing_of_either_joiner() -> None:
    tree = ast.parse((Path(__file__).resolve().parents[1] / "join_state_reference.py").read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= {"__future__", "dataclasses", "enum", "math", "re", "collections.abc", "typing",
                        "join_reference"}
