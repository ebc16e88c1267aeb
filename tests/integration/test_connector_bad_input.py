"""Bad input beside good rows: good quantities pass, every rejected payload is dead-lettered with a
reason, and the connector keeps running."""
from __future__ import annotations

import base64
import dataclasses
import json
import random
import re

from conftest import EVENTS_FILE
from connector_support import connector, expected_records, read_rows, topic_size  # noqa: F401
from simulator.publisher import Publisher
from pipeline_core.kafka_clients import admin_client
from pipeline_core.topics import MACHINE_DATA, ensure_topics
from support import read_topic, unique, wait_for

T_MS = 1_554_096_460_415

# (payload, records it must still yield) for rows that are partly or wholly bad.
BAD_ROWS: list[tuple[bytes, list[dict]]] = [
    (b'{"Thing": "R0815", "Timestamp": 1554096460415, "vaTorque_C11": 2.8', []),  # cut-off JSON
    (b"\xff\xfe\x00garbage", []),  # not UTF-8
    (b"[1, 2, 3]", []),  # JSON, but not an object
    (b'{"Timestamp": 1554096460415, "vaTorque_C11": 1.0, "id": "no-thing"}', []),
    (b'{"Thing": "", "Timestamp": 1554096460415, "vaTorque_C11": 1.0, "id": "empty-thing"}', []),
    (b'{"Thing": 42, "Timestamp": 1554096460415, "vaTorque_C11": 1.0, "id": "numeric-thing"}', []),
    (b'{"Thing": "BAD1", "vaTorque_C11": 1.0, "id": "no-time"}', []),
    (b'{"Thing": "BAD1", "Timestamp": "yesterday", "vaTorque_C11": 1.0, "id": "word-time"}', []),
    (b'{"Thing": "BAD1", "Timestamp": NaN, "vaTorque_C11": 1.0, "id": "nan-time"}', []),
    (b'{"Thing": "BAD1", "Timestamp": 1554096460415, "id": "no-quantity"}', []),
    (b'{"Thing": "BAD2", "Timestamp": 1554096460415, "good": 1.5, "text": "abc", "id": "r1"}',
     [{"thing": "BAD2", "quantity": "good", "phenomenonTime": T_MS, "result": 1.5, "id": "r1"}]),
    (b'{"Thing": "BAD2", "Timestamp": 1554096461415, "good": 2, "nan": NaN, "inf": Infinity, "id": "r2"}',
     [{"thing": "BAD2", "quantity": "good", "phenomenonTime": T_MS + 1000, "result": 2, "id": "r2"}]),
    (b'{"Thing": "BAD2", "Timestamp": 1554096462415, "good": -3.5, "flag": true, "none": null, '
     b'"list": [1], "object": {"a": 1}, "id": "r3"}',
     [{"thing": "BAD2", "quantity": "good", "phenomenonTime": T_MS + 2000, "result": -3.5, "id": "r3"}]),
    (json.dumps({"Thing": "BAD3", "Timestamp": T_MS, "big": 1.0, "padding": "x" * 70_000}).encode(), []),
    # Each of these once stopped the connector or passed it silently.
    (b'{"Thing": "BAD4\\ud800", "Timestamp": 1554096460415, "q": 1.0, "id": "escaped-surrogate"}', []),
    (b'{"Thing": "BAD4\xed\xa0\x80", "Timestamp": 1554096460415, "q": 1.0, "id": "raw-surrogate"}', []),
    (b'{"Thing": "BAD4", "Timestamp": 1e20, "q": 1.0, "id": "time-1e20"}', []),
    (b'{"Thing": "BAD4", "Timestamp": 1e300, "q": 1.0, "id": "time-1e300"}', []),
    (b'{"Thing": "' + b"B" * 257 + b'", "Timestamp": 1554096460415, "q": 1.0, "id": "long-thing"}', []),
    (json.dumps({"Thing": "BAD4", "Timestamp": T_MS, "id": "many",
                 **{f"q{index}": 1.0 for index in range(1001)}}).encode(), []),
    (b"[" * 30_000 + b"]" * 30_000, []),  # nested deeper than any parser recurses, within the size limit
    (b'{"Thing": "BAD5", "Timestamp": 1554096463415, "": 1.0, "\\udc00": 2.0, "ok": 3.0, "id": "r5"}',
     [{"thing": "BAD5", "quantity": "ok", "phenomenonTime": T_MS + 3000, "result": 3.0, "id": "r5"}]),
]

# The same instant in other units: all become epoch milliseconds.
ODD_TIMES = [("s", 1554096460.415), ("us", 1554096460415000), ("ns", 1554096460415000000),
             ("iso", "2019-04-01T05:27:40.415Z"), ("iso-naive", "2019-04-01T05:27:40.415")]


def test_bad_input_is_dead_lettered_and_good_values_pass(connector, stack, bootstrap):
    bridge = connector()
    good_rows = read_rows(EVENTS_FILE)[:100]
    time_rows = [{"Thing": "UNITS", "Timestamp": value, f"q_{unit}": 1.0, "id": unit} for unit, value in ODD_TIMES]
    expected = (expected_records(good_rows) + [record for _, records in BAD_ROWS for record in records]
                + [{"thing": "UNITS", "quantity": f"q_{unit}", "phenomenonTime": T_MS, "result": 1.0, "id": unit}
                   for unit, _ in ODD_TIMES])

    publisher = Publisher(stack, f"{bridge.client_id}-publisher")
    publisher.connect()
    payloads = [json.dumps(row).encode() for row in good_rows[:50]] + [payload for payload, _ in BAD_ROWS]
    payloads += [json.dumps(row).encode() for row in time_rows + good_rows[50:]]
    for payload in payloads:
        publisher.publish(bridge.mqtt_topic, payload)
    assert publisher.drain(30) == 0
    publisher.close()

    data = read_topic(bootstrap, bridge.data_topic, expected=len(expected), deadline_s=60)
    key = lambda r: (r["thing"], r["quantity"], r["phenomenonTime"])  # noqa: E731
    assert sorted((json.loads(m.value) for m in data), key=key) == sorted(expected, key=key)

    letters = [json.loads(m.value) for m in read_topic(bootstrap, bridge.dlq_topic, expected=len(BAD_ROWS))]
    assert len(letters) == len(BAD_ROWS)
    originals = {letter["payload"].encode() if "payload" in letter else base64.b64decode(letter["payloadBase64"])
                 for letter in letters}
    assert originals == {payload for payload, _ in BAD_ROWS}
    for letter in letters:
        assert letter["reason"] and letter["stage"] == "stream_connector"
        assert letter["mqttTopic"] == bridge.mqtt_topic
    reasons = " | ".join(letter["reason"] for letter in letters)
    for fragment in ("malformed JSON", "expected a JSON object", "missing field Thing", "missing field Timestamp",
                     "Thing must be a non-empty string", "is not a time", "not a finite time", "no quantity",
                     '"abc" is not a finite number', "nan: NaN", "inf: Infinity", "flag: true",
                     "exceeds the limit of 65536", 'Thing "BAD4\\ud800" is no text',
                     "malformed JSON: not UTF-8", "Timestamp 1e+20 is outside the valid time range",
                     "Timestamp 1e+300 is outside the valid time range", "is longer than 256 characters",
                     "row carries 1001 quantities, over the limit of 1000", 'quantity name "" is empty',
                     'quantity name "\\udc00" is no text'):
        assert fragment in reasons, fragment

    assert bridge.process.poll() is None, bridge.log()
    wait_for(lambda: f"rejected rows {len(BAD_ROWS)}," in bridge.log(), 10, "the rejected-row count in the log")


def test_poison_rows_ahead_of_good_ones_neither_stop_the_connector_nor_stay_in_its_session(connector, stack,
                                                                                          bootstrap):
    """A lone surrogate once stopped the connector unacknowledged, so the broker sent the row again on
    every restart and the connector died on it again. Now poison is dead-lettered and acknowledged:
    the good rows behind it arrive, and a restart finds nothing of it in the session."""
    bridge = connector()
    poison = [payload for payload, records in BAD_ROWS if not records]
    good_rows = read_rows(EVENTS_FILE)[:50]
    publisher = Publisher(stack, f"{bridge.client_id}-publisher")
    publisher.connect()
    for payload in poison + [json.dumps(row).encode() for row in good_rows]:
        publisher.publish(bridge.mqtt_topic, payload)
    assert publisher.drain(30) == 0
    publisher.close()

    expected = expected_records(good_rows)
    data = read_topic(bootstrap, bridge.data_topic, expected=len(expected), deadline_s=60)
    assert {json.dumps(json.loads(m.value), sort_keys=True) for m in data} == \
        {json.dumps(record, sort_keys=True) for record in expected}
    letters = read_topic(bootstrap, bridge.dlq_topic, expected=len(poison), deadline_s=60)
    assert len(letters) == len(poison)
    assert bridge.process.poll() is None, bridge.log()

    assert bridge.terminate() == 0, bridge.log()
    assert f"acknowledged {len(poison) + len(good_rows)}" in bridge.log()
    bridge.start()
    first_count = wait_for(lambda: re.search(r"rows in [\d,]+ \(", bridge.log()), 20, "the restarted connector's count")
    assert first_count.group() == "rows in 0 (", bridge.log()  # the session held nothing to send again
    assert topic_size(bootstrap, bridge.dlq_topic) == len(poison)


def test_a_bad_row_sent_again_is_dead_lettered_once_across_a_restart(connector, stack, bootstrap):
    """A publisher sends a row again when its acknowledgement got lost (QoS 1 is at least once), and the
    broker sends again what a crashed connector had not acknowledged. A bad row that comes again, while its
    dead letter is on its way, after Kafka confirmed it, or with a second connector process in between, leaves
    one dead letter; each good row behind it shows it was read."""
    bridge = connector()
    bad = [payload for payload, records in BAD_ROWS if not records][:3]
    good = read_rows(EVENTS_FILE)[:2]
    publisher = Publisher(stack, f"{bridge.client_id}-publisher")
    publisher.connect()

    def send_and_wait(good_row: dict, written: int, copies: int = 1) -> None:
        for payload in bad:
            for _ in range(copies):  # back to back: the copy comes while the first letter is on its way
                publisher.publish(bridge.mqtt_topic, payload)
        publisher.publish(bridge.mqtt_topic, json.dumps(good_row).encode())  # read after the bad ones
        assert publisher.drain(30) == 0
        wait_for(lambda: topic_size(bootstrap, bridge.data_topic) >= written, 60, "the good row behind them")

    send_and_wait(good[0], len(expected_records(good[:1])), copies=2)
    send_and_wait(good[0], len(expected_records(good[:1])))  # all again: the good one is a redelivery too
    assert bridge.terminate() == 0, bridge.log()
    bridge.start()  # a new process knows the dead letters only from machine.dlq
    send_and_wait(good[1], len(expected_records(good)))
    publisher.close()

    letters = [json.loads(m.value) for m in read_topic(bootstrap, bridge.dlq_topic, idle_s=1.0)]
    assert sorted(letter["payload"].encode() if "payload" in letter else base64.b64decode(letter["payloadBase64"])
                  for letter in letters) == sorted(bad)
    assert topic_size(bootstrap, bridge.data_topic) == len(expected_records(good))


def test_a_record_kafka_refuses_is_dead_lettered_and_the_connector_goes_on(connector, bootstrap, stack):
    """A record over the topic's max.message.bytes cannot be written. Kafka refuses its whole batch,
    so neighbours in that batch may share its fate: all of them go to the DLQ, none is lost, and the
    connector carries on with the next rows."""
    small = f"machine.data.small.{unique('t').split('.', 1)[1]}"
    admin = admin_client(bootstrap)
    ensure_topics(admin, (dataclasses.replace(MACHINE_DATA, name=small,
                                              config={**MACHINE_DATA.config, "max.message.bytes": "400"}),))
    try:
        bridge = connector("--data-topic", small)
        # A valid record of about 600 bytes (name and id at their 256-character limit) that lz4 cannot shrink.
        noise = random.Random(20261206)  # the same bytes on every run
        incompressible, huge = noise.randbytes(128).hex(), "huge" + noise.randbytes(126).hex()
        publisher = Publisher(stack, f"{bridge.client_id}-publisher")
        publisher.connect()

        def send(row: dict) -> None:
            publisher.publish(bridge.mqtt_topic, json.dumps(row))
            assert publisher.drain(30) == 0

        send({"Thing": "BIG", "Timestamp": T_MS, incompressible: 1.0, "id": huge})
        send({"Thing": "BIG", "Timestamp": T_MS + 1, "ok": 2.0, "id": "neighbour"})
        wait_for(lambda: topic_size(bootstrap, bridge.dlq_topic) >= 1, 30, "the refused record in the DLQ")
        send({"Thing": "BIG", "Timestamp": T_MS + 2, "ok": 3.0, "id": "later"})
        publisher.close()
        wait_for(lambda: topic_size(bootstrap, small) + topic_size(bootstrap, bridge.dlq_topic) >= 3, 30,
                 "all three records, written or dead-lettered")

        data = [json.loads(m.value) for m in read_topic(bootstrap, small, idle_s=1.0)]
        letters = [json.loads(m.value) for m in read_topic(bootstrap, bridge.dlq_topic, idle_s=1.0)]
        dead = [json.loads(letter["payload"]) for letter in letters]
        assert all("Kafka refused the record" in letter["reason"] for letter in letters)
        assert huge in [record["id"] for record in dead]
        assert sorted(record["id"] for record in data + dead) == sorted([huge, "later", "neighbour"])
        assert data[-1]["id"] == "later"
        assert bridge.process.poll() is None, bridge.log()
    finally:
        for future in admin.delete_topics([small], operation_timeout=30).values():
            future.result(30)
