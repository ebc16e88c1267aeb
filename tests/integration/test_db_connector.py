"""The DB connector against real Kafka and InfluxDB: exact counts through replays, crashes and outages."""
from __future__ import annotations

import base64
import json
import math
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer

from conftest import EVENTS_FILE
from db_connector_support import (PrivateInfluxDB, connector_args, connectors, count,  # noqa: F401 (fixtures)
                                  database, distinct_series_times, expected_joined_points, expected_raw_points,
                                  join_results, key_of, raw_records, wait_for_count, wait_for_points)
from pipeline_core.kafka_clients import consumer_config, producer_config
from support import produce_records, read_topic, unique, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def raw() -> list[dict[str, Any]]:
    return raw_records(EVENTS_FILE)


@pytest.fixture(scope="module")
def joined(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return join_results(raw)




def test_replay_lands_every_record_and_join_result_once(bootstrap, new_topics, database, connectors, raw, joined):
    topics = new_topics()
    name, client = database
    produce_records(bootstrap, topics.data, raw, key=key_of)
    # Join results twice: a replay must overwrite, not duplicate.
    produce_records(bootstrap, topics.out, joined + joined, key=key_of)
    connectors(connector_args(topics, name))

    # Point by point: each record its point, with its tags, time and value; one point per distinct join result
    # (none overwrote another, none was duplicated); nothing else.
    raw_points, joined_points = expected_raw_points(raw), expected_joined_points(joined)
    assert len(joined_points) == len({result["id"] for result in joined})
    wait_for_points(client, raw=raw_points, joined=joined_points)
    assert len({level for (_thing, _quantity, _case, level, _time) in joined_points}) > 1


def test_kill_9_mid_replay_then_restart_counts_exact(bootstrap, new_topics, database, connectors, raw):
    topics = new_topics()
    name, client = database
    group = unique("db-connector-kill")
    half = len(raw) // 2
    produce_records(bootstrap, topics.data, raw[:half], key=key_of)
    # Small batches, so the kill lands between commits with work in flight.
    args = connector_args(topics, name, group, "--batch-size", "500", "--group-instance-id", unique("instance"))
    first = connectors(args, "first")
    wait_for(lambda: count(client, "machinedata") > 0, 60, "the first points")
    first.kill()
    produce_records(bootstrap, topics.data, raw[half:], key=key_of)

    connectors(args, "second")
    wait_for_points(client, raw=expected_raw_points(raw))


def test_a_static_member_fenced_by_its_successor_exits_instead_of_idling(bootstrap, new_topics, database, connectors):
    """A static member whose group.instance.id a newer member took (as after its coordinator was cut off from it)
    gets a fatal consumer error and serves nothing any more: the connector exits, for supervision to start it again
    with a new consumer. It used to log the error and idle for good, reporting an unknown lag."""
    topics = new_topics()
    name, _client = database
    group, instance = unique("db-connector-fenced"), unique("instance")
    fenced = connectors(connector_args(topics, name, group, "--group-instance-id", instance), "fenced")
    wait_for(lambda: "assigned machine" in fenced.log(), 60, "the connector's first assignment")
    successor = Consumer(consumer_config(bootstrap, group, **{"group.instance.id": instance}))
    successor.subscribe([topics.data, topics.out, topics.dlq])
    try:
        wait_for(lambda: successor.poll(0.2) is None and not fenced.alive(), 90, "the fenced connector to exit")
    finally:
        successor.close()
    assert fenced.process.returncode not in (None, 0), fenced.process.returncode
    assert "fenced" in fenced.log(), fenced.log()


def test_influxdb_outage_mid_replay_loses_nothing(bootstrap, new_topics, connectors, raw, tmp_path):
    """A private influxd (the shared one serves other tests) is killed mid-replay and started again."""
    topics = new_topics()
    influxd = PrivateInfluxDB(tmp_path / "influxd").start()
    try:
        client = influxd.client("machinedata")
        half = len(raw) // 2
        produce_records(bootstrap, topics.data, raw[:half], key=key_of)
        connector = connectors(connector_args(topics, "machinedata", None, "--influxdb-port", str(influxd.port),
                                              "--batch-size", "1000", "--retry-max-s", "1"))
        wait_for(lambda: count(client, "machinedata") > 0, 60, "the first points")

        influxd.stop()
        produce_records(bootstrap, topics.data, raw[half:], key=key_of)
        wait_for(lambda: connector.log().count("retrying") >= 3, 60, "the connector retrying")
        assert connector.alive(), connector.log()

        influxd.start()
        wait_for_points(client, raw=expected_raw_points(raw))
        assert connector.alive(), connector.log()
    finally:
        influxd.close()


def produce_raw(bootstrap: str, topic: str, payloads: list[bytes | None]) -> None:
    producer = Producer(producer_config(bootstrap))
    for payload in payloads:
        producer.produce(topic, payload)
    assert producer.flush(30) == 0


def original(letter: dict[str, Any]) -> bytes:
    """The rejected payload a dead letter carries (as text, or base64 when it was not UTF-8)."""
    if "payloadBase64" in letter:
        return base64.b64decode(letter["payloadBase64"])
    return letter.get("payload", "").encode()


def test_poisoned_records_go_to_the_dlq_and_the_good_ones_are_stored(bootstrap, new_topics, database,
                                                                     connectors, raw):
    topics = new_topics()
    name, client = database
    # A string-typed `result` in a week of its own: InfluxDB refuses float points of that shard
    # (a field type conflict), which only InfluxDB can tell.
    conflict_ms = 978_307_200_000  # 2001-01-01
    client.write_points([f"machinedata,quantity=other,thing=X result=\"text\" {conflict_ms * 1_000_000}"],
                        protocol="line", time_precision="n")
    good = raw[:300]
    poisoned = [
        (json.dumps({**raw[0], "result": "288.2"}).encode(), "result must be a finite number"),
        (b'{"thing": "R0815", "quantity": "vaTorque_C11", "phenomenonTime": 1554096460415, "result": NaN}',
         "result must be a finite number"),
        (json.dumps({**raw[0], "phenomenonTime": 1e20}).encode(), "time range"),
        (b'{"thing": "R0815", "quantity": ', "malformed JSON"),
        (json.dumps({**raw[0], "phenomenonTime": conflict_ms}).encode(), "field type conflict"),
        (b"\xff\xfe not text", "malformed JSON"),
        (None, "tombstone"),
        # Each of these once stopped the connector (a lone surrogate made the batch's body unencodable).
        (json.dumps({**raw[0], "thing": "R\ud800"}).encode(), "is no text"),
        (json.dumps({**raw[0], "thing": "R\ud800"}, ensure_ascii=False).encode("utf-8", "surrogatepass"),
         "is no text"),
        (json.dumps({**raw[0], "quantity": "vaTorque" * 33}).encode(), "longer than 256"),
        (b"[" * 100_000 + b"]" * 100_000, "malformed JSON"),
    ]
    produce_records(bootstrap, topics.data, good[:150], key=key_of)
    produce_raw(bootstrap, topics.data, [payload for payload, _ in poisoned])
    produce_records(bootstrap, topics.data, good[150:], key=key_of)
    connectors(connector_args(topics, name))

    # count() counts the float points only, not the conflicting string.
    wait_for_count(client, "machinedata", distinct_series_times(good))
    letters = [json.loads(message.value) for message in read_topic(bootstrap, topics.dlq, expected=len(poisoned))]
    assert sorted(map(original, letters)) == sorted(payload or b"" for payload, _ in poisoned)
    for letter in letters:
        reason = next(reason for payload, reason in poisoned if (payload or b"") == original(letter))
        assert reason in letter["reason"], letter
        assert letter["stage"] == "db_connector" and letter["topic"] == topics.data
    # The connector counts the dead-letter topic too, for the pipeline-health dashboard.
    wait_for_count(client, "deadletters", len(poisoned), field="reason")
    assert not any(math.isnan(p["result"]) for p in client.query(
        "SELECT result FROM machinedata WHERE time > 0").get_points())



def test_the_point_check_fails_on_a_wrong_value_a_wrong_tag_a_missing_or_a_surplus_point(database):
    """wait_for_points, which the end-to-end and chaos runs use, compares values and tags, not counts."""
    _name, client = database
    records = [{"thing": "R1", "quantity": "actSpeed_C11", "phenomenonTime": 1_554_076_800_000 + n, "result": 1.5 + n}
               for n in range(3)]
    ns = 1_554_076_800_000 * 1_000_000

    def write(lines: list[str], policy: str) -> None:
        assert client.write_points(lines, protocol="line", time_precision="n", retention_policy=policy)

    write(["machinedata,quantity=actSpeed_C11,thing=R1 result=1.5 %d" % ns,
           "machinedata,quantity=actSpeed_C11,thing=R1 result=9.5 %d" % (ns + 1_000_000)], "raw")  # 2.5 expected
    with pytest.raises(AssertionError, match=r"1 with another value \(found, expected\), e\.g\. .*9\.5, 2\.5"):
        wait_for_points(client, raw=expected_raw_points(records[:2]), deadline_s=2)
    with pytest.raises(AssertionError, match="raw: 2 of 3 points"):
        wait_for_points(client, raw=expected_raw_points(records), deadline_s=2)
    write(["machinedata,quantity=actSpeed_C11,thing=R1 result=1.5 %d" % (ns + 5_000_000)], "raw")
    with pytest.raises(AssertionError, match="raw points in InfluxDB that no record makes"):
        wait_for_points(client, raw=expected_raw_points(records[:1]), deadline_s=2)

    joined = {"thing": "R1", "quantity": "vaPower_C11", "phenomenonTime": 1_554_076_800_000.5, "result": 150.0,
              "left": {"quantity": "actSpeed_C11", "phenomenonTime": 1_554_076_800_000, "result": 1.5},
              "right": {"quantity": "vaTorque_C11", "phenomenonTime": 1_554_076_800_001, "result": 2.0},
              "case": "left_successor", "id": "x"}
    # The joined point's time: the mean's ms, and the distance (0 - 1 mod 1e6 = 999,999 ns) below it; 150 W is
    # "low" by the default thresholds.
    write(["joined,case=left_successor,level=low,quantity=vaPower_C11,thing=R1 result=150.0,active=1.0 %d"
           % (ns + 999_999)], "joined")
    wait_for_points(client, joined=expected_joined_points([joined]), deadline_s=10)
    write(["joined,case=left_successor,level=medium,quantity=vaPower_C11,thing=R1 result=150.0,active=1.0 %d"
           % (ns + 999_999)], "joined")
    with pytest.raises(AssertionError, match="joined points in InfluxDB that no record makes"):
        wait_for_points(client, joined=expected_joined_points([joined]), deadline_s=2)
