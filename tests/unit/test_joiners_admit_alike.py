"""One admission rule (`pipeline_core.admission`), two joiners: fed the same arbitrary Kafka records (keys,
values, headers, tombstones; good records under their own key, under another's and under none), the standalone
joiner and the Spark joiner write the same output records and the same dead letters (reason, origin, key,
payload), whether the standalone joiner joins its input where it lies (partitioned by thing) or repartitions it
first."""
from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from joiner_doubles import (DLQ_TOPIC, OUTPUT_TOPIC, PARTITIONS, RESOLVER, consumed, spark_joiner_records,
                            standalone_joiner_repartitioned, standalone_joiner_where_it_lies)
from pipeline_core.admission import skips
from pipeline_core.partitioning import thing_partition
from pipeline_core.records import encode_record, record_key
from test_strange_input import HEADERS, KEYS, VALUES

EXAMPLES = settings(max_examples=80, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
# Weighted towards one thing's one axis, so that most examples hold pairs, not only lone records.
THINGS = ["R0815", "R0815", "M1", "Säge 4", "Plant1.Hall2.Press3", "C:\\P3\t\n"]
QUANTITIES = ["actSpeed_C11", "vaTorque_C11"] * 3 + ["actSpeed_C12", "vaTorque_C12", "temperature"]
BASE_MS = 1_554_096_460_000


@st.composite
def good_records(draw) -> tuple[bytes, bytes]:
    """A valid record of a few series that join, near in time (pairs form), and its own key."""
    thing, quantity = draw(st.sampled_from(THINGS)), draw(st.sampled_from(QUANTITIES))
    record = {"thing": thing, "quantity": quantity, "phenomenonTime": BASE_MS + 100 * draw(st.integers(0, 40)),
              "result": draw(st.floats(-1e6, 1e6, allow_nan=False)), "id": draw(st.uuids()).hex}
    return record_key(thing, quantity).encode(), encode_record(record)


@st.composite
def kafka_records(draw) -> tuple[bytes | None, bytes | None, list | None, int]:
    """(key, value, headers, partition): mostly good records where the stream connector puts them; some under
    another record's key or a strange one, elsewhere, or strange values under any key."""
    headers = draw(HEADERS)
    kind = draw(st.sampled_from(["own", "own", "own", "own", "other key", "strange key", "strange value"]))
    if kind == "strange value":
        return draw(KEYS), draw(VALUES), headers, draw(st.integers(0, PARTITIONS - 1))
    key, value = draw(good_records())
    thing = json.loads(value)["thing"]
    if kind == "other key":
        key = draw(good_records())[0]
    elif kind == "strange key":
        key = draw(KEYS)
    return key, value, headers, thing_partition(thing, PARTITIONS)


def as_set(letters: list[bytes]) -> list[dict]:
    """Dead letters without what names the stage or the moment, in a stable order."""
    envelopes = [{field: value for field, value in json.loads(letter).items() if field not in ("stage", "rejectedAt")}
                 for letter in letters]
    return sorted(envelopes, key=lambda envelope: json.dumps(envelope, sort_keys=True))


@EXAMPLES
@given(st.lists(kafka_records(), min_size=4, max_size=60))
def test_both_joiners_write_the_same_records_and_dead_letters(records: list) -> None:
    messages = consumed(records)
    spark_outputs, spark_letters = spark_joiner_records(messages)
    for standalone in (standalone_joiner_where_it_lies(messages), standalone_joiner_repartitioned(messages)):
        assert sorted(standalone.on(OUTPUT_TOPIC)) == sorted(spark_outputs)
        assert as_set(standalone.on(DLQ_TOPIC)) == as_set(spark_letters)


def test_the_examples_reach_every_step_of_the_rule() -> None:
    """The strategy is no straw man: its records are skipped, dead-lettered for each reason, and joined."""
    seen: set[str] = set()

    @settings(max_examples=80, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.lists(kafka_records(), min_size=4, max_size=60))
    def collect(records: list) -> None:
        outputs, letters = spark_joiner_records(consumed(records))
        seen.update({"joined"} if outputs else set())
        for letter in letters:
            reason = json.loads(letter)["reason"]
            seen.add("wrong key" if reason.startswith("key ") else "late" if "late" in reason else "no record")
        if any(skips(key, RESOLVER.joinable_thing) for key, *_ in records):
            seen.add("skipped")

    collect()
    assert {"joined", "wrong key", "no record", "skipped"} <= seen, seen
