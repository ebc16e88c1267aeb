"""A partition's join when a spec was added while it held records (specs changed on a running stack): the spec
joins the records from its start on only, the records held from before it never reach it, the others join on as
they were. Through the standalone joiner's partition join (`kafka_joiner.partition_join`, cohorts), restored from
what its changelog held at the change, against the oracle (tests/join_reference.py, no code of either joiner)."""
from __future__ import annotations

import json
from collections import Counter

from growth_support import machine_rows
from join_reference import POWER, Spec, reference_join
from kafka_joiner.changelog import StateRecord, record_position
from kafka_joiner.partition_join import PartitionJoin
from local_stream_buffer.keyed import KeyedJoiner
from local_stream_buffer.spec_changes import fingerprints
from local_stream_buffer.specs import JoinSpec, SpecResolver, load_join_specs
from local_stream_buffer.status import IngestStatus
from pipeline_core.records import encode_record
from pipeline_core.spec_starts import read_starts, with_starts

TORQUE_SPEED = JoinSpec("torque_speed", "vaTorque_C{axis}", "actSpeed_C{axis}", "vaTorqueSpeed_C{axis}", "product", 1.0)
TORQUE_SPEED_REFERENCE = Spec("vaTorque_C", "actSpeed_C", "vaTorqueSpeed_C", lambda l, r: l * r, 1000.0)


def new_partition(specs, committed, metadata):
    def new_joiner(on_release, on_evict, on_dead_letter, chosen=None):
        return KeyedJoiner(SpecResolver(chosen if chosen is not None else list(specs.values())),
                           on_release=on_release, on_evict=on_evict, on_dead_letter=on_dead_letter)
    return PartitionJoin("machine.data", 0, new_joiner, committed, metadata, specs)


def canonical(outputs) -> Counter[str]:
    return Counter(json.dumps(output, sort_keys=True) for output in outputs)


def test_a_spec_added_joins_from_its_start_and_the_held_records_stay_with_the_specs_before() -> None:
    before, after = machine_rows(["m1", "m2"], 0, 30), machine_rows(["m1", "m2"], 30, 30)
    power = {fingerprint: spec for fingerprint, spec in fingerprints(load_join_specs()).items()}
    # The joiner with the shipped spec joins `before`; what it holds is its changelog at the change.
    # The joiner knows a record by its place (offset and slot of its frame: `record_position`); two a frame here.
    held = {}
    first = KeyedJoiner(SpecResolver(list(power.values())), on_release=lambda position: held.pop(position))
    outputs = []
    for index, record in enumerate(before):
        position = record_position(index // 2, index % 2)
        status, joined, _ = first.ingest(record, position)
        outputs.extend(joined)
        if status is IngestStatus.ACCEPTED:
            held[position] = encode_record(record)
    assert held, "the join holds records at the change"
    assert len(before) % 2 == 0
    start = len(before) // 2  # the committed offset: the next frame
    metadata = with_starts(None, {fingerprint: 0 for fingerprint in power})
    # Restarted at the change with a spec added (its start: the committed offset), restored from the changelog.
    both = {**power, **fingerprints([TORQUE_SPEED])}
    second = new_partition(both, start, metadata)
    assert read_starts(second._committing(start).metadata) == {**{f: 0 for f in power}, **{f: start for f in
                                                                                           fingerprints([TORQUE_SPEED])}}
    second.restore([StateRecord(position, position.to_bytes(8, "big"), index, value)
                    for index, (position, value) in enumerate(sorted(held.items()))], "state")
    for index, record in enumerate(after, start=len(before)):
        outputs.extend(second.joiner.ingest(record, record_position(index // 2, index % 2)).outputs)
    expected = canonical(reference_join(before + after, POWER)) + canonical(reference_join(after, TORQUE_SPEED_REFERENCE))
    assert canonical(outputs) == expected
    assert sum(1 for key in expected if "vaTorqueSpeed" in key) > 50


def test_once_nothing_held_lies_before_a_start_one_keyed_join_takes_every_spec() -> None:
    specs = {**fingerprints(load_join_specs()), **fingerprints([TORQUE_SPEED])}
    starts = with_starts(None, {fingerprint: (0 if spec.name == "power" else 40) for fingerprint, spec in specs.items()})
    record = encode_record(machine_rows(["m1"], 50, 1)[0])
    join = new_partition(specs, 100, starts)
    after_start, before_start = record_position(80, 1), record_position(39, 1)
    join.restore([StateRecord(after_start, after_start.to_bytes(8, "big"), 0, record)], "state")
    assert isinstance(join.joiner, KeyedJoiner)
    join.restore([StateRecord(before_start, before_start.to_bytes(8, "big"), 0, record)], "state")
    assert not isinstance(join.joiner, KeyedJoiner)  # a record from before the start: the specs apart


def test_a_record_handed_over_feeds_the_specs_started_at_or_before_its_frame() -> None:
    """What a moved record's handover names as the specs it fed (`PartitionJoin.feeds`): a spec added at offset 40
    is fed by the first record of frame 40 on, not by the last one of frame 39."""
    specs = {**fingerprints(load_join_specs()), **fingerprints([TORQUE_SPEED])}
    power = frozenset(fingerprint for fingerprint, spec in specs.items() if spec.name == "power")
    join = new_partition(specs, 100, with_starts(None, {fingerprint: (0 if fingerprint in power else 40)
                                                        for fingerprint in specs}))
    record = encode_record(machine_rows(["m1"], 50, 1)[0])
    held = lambda position: StateRecord(position, position.to_bytes(8, "big"), 0, record)  # noqa: E731
    assert join.feeds(held(record_position(39, 1))) == power
    assert join.feeds(held(record_position(40, 0))) is None  # every spec
