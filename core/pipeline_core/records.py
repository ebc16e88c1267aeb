"""The record schema of the pipeline's Kafka topics: one definition, imported by every stage.

`machine.data` carries one record per measured quantity, keyed by its thing and quantity
(`pipeline_core.record_keys.record_key`: ``"<thing>.<quantity>"``, dots and backslashes in the thing escaped)::

    {"thing": "R0815", "quantity": "actSpeed_C11", "phenomenonTime": 1554096460415,
     "result": 288.2, "id": "<source row id>"}

`machine.out` carries join results in the same shape (plus provenance fields), keyed by the
result quantity. `machine.dlq` carries `DeadLetter` envelopes: the original payload and the reason
it was rejected, so nothing a user sent is ever lost silently.

`decode_record` checks what `pipeline_core.validation` defines: thing and quantity are names,
`phenomenonTime` is epoch milliseconds within the valid range (taken as it
is, never re-interpreted), `result` is a finite number.
"""
from __future__ import annotations

import base64
import json
import time
from typing import Any, TypedDict

import orjson

from .record_keys import record_key  # noqa: F401 (the record's key, where every stage imports it from)
from .timestamps import EARLIEST_MS, LATEST_MS, VALID_RANGE
from .validation import describe, is_finite_number, name_problem

REQUIRED_FIELDS = ("thing", "quantity", "phenomenonTime", "result")


class MachineRecord(TypedDict, total=False):
    thing: str
    quantity: str
    phenomenonTime: int  # epoch milliseconds
    result: float
    id: str


class InvalidRecord(ValueError):
    """A payload that does not follow the record schema; the message is the reason."""


def encode_record(record: MachineRecord | dict[str, Any]) -> bytes:
    """Compact JSON, the wire format of machine.data and machine.out.

    orjson is several times faster than the standard library on every stage's hot path, but it
    would write NaN as null: a non-finite result is refused here instead (inputs were validated).
    Integers beyond 64 bits, which orjson refuses, are written by the standard library."""
    if not is_finite_number(record.get("result")):
        raise ValueError(f"result must be a finite number, got {record.get('result')!r}")
    try:
        return orjson.dumps(record)
    except orjson.JSONEncodeError:
        return json.dumps(record, separators=(",", ":"), allow_nan=False).encode()


def decode_record(payload: bytes | str | None) -> MachineRecord:
    """Parse and validate one machine.data / machine.out record, or raise `InvalidRecord`."""
    if payload is None:
        raise InvalidRecord("empty record: no value")
    try:
        record = orjson.loads(payload)
    except orjson.JSONDecodeError:
        record = _parse_leniently(payload)
    if type(record) is not dict:
        raise InvalidRecord(f"expected a JSON object, got {type(record).__name__}")
    try:
        thing, quantity = record["thing"], record["quantity"]
        phenomenon_time, result = record["phenomenonTime"], record["result"]
    except KeyError:
        missing = [name for name in REQUIRED_FIELDS if name not in record]
        raise InvalidRecord(f"missing field(s): {', '.join(missing)}") from None
    # Checked in the order a valid record passes fastest; this runs once per record on every stage.
    if type(thing) is not str or not thing:
        raise InvalidRecord(f"thing must be a non-empty string, got {describe(thing)}")
    if type(quantity) is not str or not quantity:
        raise InvalidRecord(f"quantity must be a non-empty string, got {describe(quantity)}")
    problem = name_problem(thing)
    if problem is not None:
        raise InvalidRecord(f"thing {describe(thing)} {problem}")
    problem = name_problem(quantity)
    if problem is not None:
        raise InvalidRecord(f"quantity {describe(quantity)} {problem}")
    if not is_finite_number(phenomenon_time):
        raise InvalidRecord(f"phenomenonTime must be a finite number, got {describe(phenomenon_time)}")
    if not EARLIEST_MS <= phenomenon_time < LATEST_MS:
        raise InvalidRecord(f"phenomenonTime {describe(phenomenon_time)} is outside the valid time range "
                            f"(epoch milliseconds of {VALID_RANGE})")
    if not is_finite_number(result):
        raise InvalidRecord(f"result must be a finite number, got {describe(result)}")
    return record  # type: ignore[return-value]


def _parse_leniently(payload: bytes | str) -> Any:
    """The standard library's parser, only on the error path: it accepts NaN and Infinity, so the
    reason names the offending field rather than just "malformed JSON"."""
    try:
        return json.loads(payload)
    # ValueError: also an integer of more digits than Python converts; RecursionError: deep nesting.
    except (ValueError, RecursionError) as error:
        raise InvalidRecord(f"malformed JSON: {error}") from None


# machine.dlq takes records this large (its max.message.bytes, and what the clients send and fetch):
# rejected payloads are kept whole up to about this size, so the DLQ can hold what the connector
# refused for being too large.
DLQ_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
# The largest dead letter any stage writes: machine.dlq's limit less room for the record's key,
# headers and Kafka's framing. A letter that would be larger keeps its reason, origin and the
# payload's size, and as much of its payload as fits (`dead_letter`).
DEAD_LETTER_ROOM_BYTES = 64 * 1024
DEAD_LETTER_MAX_BYTES = DLQ_MAX_MESSAGE_BYTES - DEAD_LETTER_ROOM_BYTES
# In an over-size letter, every field but the payload keeps at most this many characters.
_CLIPPED_FIELD_CHARS = 1000
_PAYLOAD_FIELDS = ("payload", "payloadBase64")


def dead_letter(reason: str, payload: bytes | str | None, stage: str, max_bytes: int = DEAD_LETTER_MAX_BYTES,
                **context: Any) -> bytes:
    """A machine.dlq record: why, where (`stage` and `context`: topic, partition, offset or MQTT topic),
    and the original payload (text, or base64 if binary); the one dead-letter path of every stage.

    It is never larger than `max_bytes`: escaped as JSON, a payload can grow sixfold (a control
    character becomes ``\\u0000``). An over-size letter keeps its reason, origin and the payload's
    size in bytes (``payloadBytes``, which marks a letter that does not hold its payload whole), and
    the start of its payload as far as it fits, or none."""
    envelope: dict[str, Any] = {"reason": reason, "stage": stage, "rejectedAt": int(time.time() * 1000)}
    envelope.update({key: value for key, value in context.items() if value is not None})
    field, text = _payload_field(payload)
    if field is not None:
        envelope[field] = text
    letter = _encode(envelope)
    if len(letter) <= max_bytes:
        return letter
    return _over_size(envelope, field, text, _size(payload), max_bytes)


def payload_omitted(letter: bytes, why: str, stage: str) -> bytes:
    """The dead letter that replaces `letter` when Kafka refused it for its size (`why`; a machine.dlq
    whose limit is below `DEAD_LETTER_MAX_BYTES`): its reason and origin, the payload's size, no payload."""
    try:
        envelope = json.loads(letter)
    except (ValueError, RecursionError):
        envelope = None
    if not isinstance(envelope, dict):  # not one of ours: say what it was
        return dead_letter(f"Kafka refused a dead letter of {len(letter)} bytes ({why}); its payload is omitted",
                           None, stage, refusedDeadLetter=letter[:_CLIPPED_FIELD_CHARS].decode("utf-8", "replace"),
                           refusedDeadLetterBytes=len(letter))
    size = envelope.get("payloadBytes")
    if not isinstance(size, int):
        size = _size(_payload_of(envelope))
    context = {key: _clip(value) for key, value in envelope.items()
               if key not in ("reason", "stage", "payloadBytes", *_PAYLOAD_FIELDS)}
    reason = f"{_clip(envelope.get('reason'))} (Kafka refused its dead letter of {len(letter)} bytes ({why}): " \
             "the payload is omitted)"
    return dead_letter(reason, None, _clip(envelope.get("stage", stage)), payloadBytes=size, **context)


def _payload_field(payload: bytes | str | None) -> tuple[str | None, str | None]:
    if isinstance(payload, (bytes, bytearray, memoryview)):
        payload = bytes(payload)
        try:
            return "payload", payload.decode("utf-8")
        except UnicodeDecodeError:
            return "payloadBase64", base64.b64encode(payload).decode("ascii")
    if payload is not None:
        return "payload", payload
    return None, None


def _payload_of(envelope: dict[str, Any]) -> bytes | str | None:
    if isinstance(envelope.get("payloadBase64"), str):
        try:
            return base64.b64decode(envelope["payloadBase64"])
        except ValueError:
            return envelope["payloadBase64"]
    return envelope.get("payload") if isinstance(envelope.get("payload"), str) else None


def _size(payload: bytes | str | None) -> int:
    """A payload's size in bytes, as it came (text as UTF-8)."""
    if payload is None:
        return 0
    if isinstance(payload, str):
        return len(payload.encode("utf-8", "surrogatepass"))
    return len(payload)


def _encode(envelope: dict[str, Any]) -> bytes:
    # NaN/inf inside a rejected record must not make the envelope itself unencodable.
    return json.dumps(envelope, separators=(",", ":"), default=repr).encode()


def _clip(value: Any) -> Any:
    """A field of an over-size letter: text of at most _CLIPPED_FIELD_CHARS characters, any other value as it is
    if its JSON is that short, else its JSON clipped (as text)."""
    if isinstance(value, str):
        return value if len(value) <= _CLIPPED_FIELD_CHARS else value[:_CLIPPED_FIELD_CHARS - 3] + "..."
    try:
        if len(json.dumps(value, default=repr)) <= _CLIPPED_FIELD_CHARS:
            return value
    except (ValueError, RecursionError):  # an integer too long for str(), a structure too deep
        pass
    return describe(value, _CLIPPED_FIELD_CHARS)


def _over_size(envelope: dict[str, Any], field: str | None, text: str | None, size: int, max_bytes: int) -> bytes:
    """The letter of `envelope` within `max_bytes`: every field but the payload clipped, the payload's size,
    and the longest start of the payload that fits."""
    head = {key: _clip(value) for key, value in envelope.items() if key not in _PAYLOAD_FIELDS}
    head["reason"] = (f"{head['reason']} (payload of {size} bytes truncated: a dead letter holds at most "
                      f"{max_bytes} bytes)")
    head["payloadBytes"] = size
    letter = _encode(head)
    room = max_bytes - len(letter) - len(f',"{field}":""')
    if field is not None and text and room > 0:
        # Escaping makes the encoded length unknown before it is encoded: start from the room, shrink by
        # how much the last try overshot until one fits (a few tries: escaping grows text at most sixfold).
        keep = min(len(text), room if field == "payload" else room // 4 * 4)
        while keep > 0:
            encoded = json.dumps(text[:keep])
            if len(encoded) - 2 <= room:
                head[field] = text[:keep]
                return _encode(head)
            keep = min(keep - 1, int(keep * room / (len(encoded) - 2) * 0.95))
            if field == "payloadBase64":
                keep -= keep % 4
    if len(letter) <= max_bytes:
        return letter
    # A limit too small even for the clipped fields (a few kB): reason, stage and size only.
    return _encode({"reason": head["reason"][:200], "stage": head["stage"], "payloadBytes": size})
