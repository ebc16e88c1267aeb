"""The record schema of the pipeline's Kafka topics: one definition, imported by every stage.

`machine.data` carries one record per measured quantity, keyed ``"<thing>.<quantity>"``::

    {"thing": "R0815", "quantity": "actSpeed_C11", "phenomenonTime": 1554096460415,
     "result": 288.2, "id": "<source row id>"}

`machine.out` carries join results in the same shape (plus provenance fields), keyed by the
result quantity. `machine.dlq` carries `DeadLetter` envelopes: the original payload and the reason
it was rejected, so nothing a user sent is ever lost silently.

`decode_record` checks what `pipeline_core.validation` defines: thing and quantity are names (the
thing without a dot), `phenomenonTime` is epoch milliseconds within the valid range (taken as it
is, never re-interpreted), `result` is a finite number.
"""
from __future__ import annotations

import base64
import json
import time
from typing import Any, TypedDict

import orjson

from .timestamps import EARLIEST_MS, LATEST_MS, VALID_RANGE
from .validation import describe, is_finite_number, name_problem, thing_problem

REQUIRED_FIELDS = ("thing", "quantity", "phenomenonTime", "result")


class MachineRecord(TypedDict, total=False):
    thing: str
    quantity: str
    phenomenonTime: int  # epoch milliseconds
    result: float
    id: str


class InvalidRecord(ValueError):
    """A payload that does not follow the record schema; the message is the reason."""


def record_key(thing: str, quantity: str) -> str:
    """The Kafka key of a record: all values of one time series land in one partition, in order."""
    return f"{thing}.{quantity}"


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
    problem = thing_problem(thing)
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


def dead_letter(reason: str, payload: bytes | str | None, stage: str, **context: Any) -> bytes:
    """A machine.dlq record: why, where, and the original payload (text, or base64 if binary)."""
    envelope: dict[str, Any] = {"reason": reason, "stage": stage, "rejectedAt": int(time.time() * 1000)}
    envelope.update({key: value for key, value in context.items() if value is not None})
    if isinstance(payload, bytes):
        try:
            envelope["payload"] = payload.decode("utf-8")
        except UnicodeDecodeError:
            envelope["payloadBase64"] = base64.b64encode(payload).decode("ascii")
    elif payload is not None:
        envelope["payload"] = payload
    # NaN/inf inside a rejected record must not make the envelope itself unencodable.
    return json.dumps(envelope, separators=(",", ":"), default=repr).encode()


def payload_omitted(letter: bytes, why: str, stage: str) -> bytes:
    """The dead letter that replaces one Kafka refused for its size: the start of the refused
    envelope (its reason and origin come before the payload) and its size, without the payload."""
    return dead_letter(f"Kafka refused a dead letter of {len(letter)} bytes ({why}); its payload is omitted",
                       None, stage, refusedDeadLetter=letter[:1000].decode("utf-8", "replace"),
                       refusedDeadLetterBytes=len(letter))
