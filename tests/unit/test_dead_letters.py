"""The one dead-letter path (`pipeline_core.records.dead_letter`) never makes a letter Kafka refuses for its
size, whichever stage writes it and whatever the payload: an over-size letter keeps its reason, its origin
and the payload's size, and as much of the payload as fits. A letter Kafka refuses all the same (a machine.dlq
whose limit is lower) is rebuilt without its payload (`payload_omitted`). And the shared `produce()` hands a
record the client refuses for its size back to the caller instead of raising."""
from __future__ import annotations

import base64
import json

import pytest
from confluent_kafka import KafkaError, Producer

from pipeline_core.kafka_clients import produce, producer_config
from pipeline_core.records import DEAD_LETTER_MAX_BYTES, DLQ_MAX_MESSAGE_BYTES, dead_letter, payload_omitted
from stream_connector.redelivery import dead_letter_key, rejected_row_key

# Every origin a stage gives its letters: where the rejected payload came from.
ORIGINS = {
    "stream_connector": {"mqttTopic": "machines/R0815", "rejectedQuantities": ["q"]},
    "kafka_joiner": {"topic": "machine.data", "partition": 3, "offset": 123_456, "key": "R0815.actSpeed_C11"},
    "kafka_joiner state": {"topic": "joiner.state", "partition": 1, "offset": 7, "key": '"b\'\\\\x00\'"'},
    "spark_joiner": {"topic": "machine.data", "partition": 4, "offset": 99},
    "db_connector": {"topic": "machine.out", "partition": 0, "offset": 5},
}
# Payloads that grow most in a letter: control characters (sixfold, JSON-escaped), non-UTF-8 bytes (base64),
# astral characters (threefold as surrogate escapes).
PAYLOADS = {
    "control characters": lambda size: b"\x01" * size,
    "binary": lambda size: b"\xff" * size,
    "astral text": lambda size: "😀".encode() * (size // 4),
    "plain text": lambda size: b"a" * size,
}
SMALL_LIMIT = 20_000


def kept_payload(envelope: dict) -> bytes:
    if "payloadBase64" in envelope:
        return base64.b64decode(envelope["payloadBase64"])
    return envelope.get("payload", "").encode()


@pytest.mark.parametrize("origin", ORIGINS)
@pytest.mark.parametrize("kind", PAYLOADS)
def test_an_over_size_letter_keeps_its_reason_origin_and_size(origin: str, kind: str) -> None:
    stage = origin.split()[0]
    payload = PAYLOADS[kind](SMALL_LIMIT * 2)
    letter = dead_letter("malformed JSON: oops", payload, stage, max_bytes=SMALL_LIMIT, **ORIGINS[origin])
    assert len(letter) <= SMALL_LIMIT
    envelope = json.loads(letter)
    assert envelope["reason"].startswith("malformed JSON: oops") and envelope["stage"] == stage
    assert {name: envelope[name] for name in ORIGINS[origin]} == ORIGINS[origin]
    assert envelope["payloadBytes"] == len(payload)
    kept = kept_payload(envelope)
    assert kept and payload.startswith(kept) and len(kept) < len(payload)
    # A payload that fits is kept whole, without the size that marks a truncated one.
    whole = json.loads(dead_letter("r", payload[:1000], stage, max_bytes=SMALL_LIMIT, **ORIGINS[origin]))
    assert kept_payload(whole) == payload[:1000] and "payloadBytes" not in whole


def test_a_letter_stays_under_machine_dlq_limit_with_the_largest_payloads() -> None:
    """At the default limit: a payload of control characters that would make a letter of 6 x 3 MB."""
    payload = b"\x00" * 3_000_000
    letter = dead_letter("reason", payload, "kafka_joiner", topic="machine.data", partition=0, offset=1)
    assert len(letter) <= DEAD_LETTER_MAX_BYTES < DLQ_MAX_MESSAGE_BYTES
    envelope = json.loads(letter)
    assert envelope["payloadBytes"] == len(payload) and payload.startswith(kept_payload(envelope))


def test_over_size_fields_besides_the_payload_are_clipped() -> None:
    """A key or an output as large as the payload does not push the letter over its limit either."""
    letter = dead_letter("r" * 50_000, b"x" * 50_000, "kafka_joiner", max_bytes=SMALL_LIMIT, key="k" * 50_000,
                         topic="machine.data", partition=0, offset=2**70)
    assert len(letter) <= SMALL_LIMIT
    envelope = json.loads(letter)
    assert envelope["reason"].startswith("rrr") and envelope["topic"] == "machine.data"
    assert envelope["payloadBytes"] == 50_000


@pytest.mark.parametrize("origin", ORIGINS)
def test_a_letter_kafka_refused_goes_again_without_payload(origin: str) -> None:
    stage = origin.split()[0]
    payload = b"\x01" * 100_000
    refused = dead_letter("the reason", payload, stage, **ORIGINS[origin])
    letter = payload_omitted(refused, "Broker: Message size too large", stage)
    assert len(letter) < 2_000
    envelope = json.loads(letter)
    assert envelope["reason"].startswith("the reason") and "Message size too large" in envelope["reason"]
    assert envelope["stage"] == stage and envelope["payloadBytes"] == len(payload)
    assert {name: envelope[name] for name in ORIGINS[origin]} == ORIGINS[origin]
    assert "payload" not in envelope and "payloadBase64" not in envelope


def test_the_connector_knows_its_whole_letters_again_and_not_its_truncated_ones() -> None:
    """The connector does not write a row's letter twice (`redelivery`): it knows a letter again by the row in
    it, which only a letter holding its payload whole carries."""
    payload = b'{"Thing": "R\x01"}'
    whole = dead_letter("r", payload, "stream_connector", mqttTopic="m/1")
    assert dead_letter_key("stream_connector", whole) == rejected_row_key("m/1", payload)
    truncated = dead_letter("r", payload * 5_000, "stream_connector", max_bytes=SMALL_LIMIT, mqttTopic="m/1")
    assert dead_letter_key("stream_connector", truncated) is None


def test_produce_hands_a_record_the_client_refuses_to_the_caller() -> None:
    """The client refuses a record over its message.max.bytes at once (no broker needed): `produce` returns the
    refusal, which the caller dead-letters, instead of raising."""
    producer = Producer(producer_config("127.0.0.1:9", **{"message.max.bytes": 10_000}))
    refused = produce(producer, "machine.dlq", b"x" * 20_000)
    assert refused is not None and refused.code() == KafkaError.MSG_SIZE_TOO_LARGE
    assert produce(producer, "machine.dlq", b"x" * 100) is None
    producer.purge()
