"""Records a plain Kafka client can write to machine.data or machine.out, one of each kind no stage may stop
on: a tombstone, no key, an empty value, binary, JSON that is no object, wrong types, non-finite numbers,
integers beyond 64 bits, deep nesting, odd headers, and a value near the topic's size limit.

Every one is invalid whatever the key, so each stage that reads it writes one dead letter: the joiners
for machine.data's (their keys either route to a join, so the join decodes them, or are unusable, which
the standalone joiner dead-letters too), the DB connector for both topics'. Their thing, ``poison``, is no
machine of the events file, so none of them can touch the joins of a replay.
"""
from __future__ import annotations

from typing import NamedTuple

SPEED_KEY = b"poison.actSpeed_C11"
TORQUE_KEY = b"poison.vaTorque_C11"
_TIME = b"1554096460415"


class PoisonRecord(NamedTuple):
    what: str
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] | None = None


def _record(thing: bytes = b'"poison"', quantity: bytes = b'"actSpeed_C11"', time: bytes = _TIME,
            result: bytes = b"1.5") -> bytes:
    return b'{"thing":%s,"quantity":%s,"phenomenonTime":%s,"result":%s}' % (thing, quantity, time, result)


def poison_records(near_limit_bytes: int) -> list[PoisonRecord]:
    """The corpus; `near_limit_bytes`: the size of its largest value, just below the topic's limit."""
    deep = b"[" * 100_000 + b"]" * 100_000
    return [
        PoisonRecord("tombstone", SPEED_KEY, None),
        PoisonRecord("tombstone without key", None, None),
        PoisonRecord("no key", None, b'{"thing":"poison"}'),
        PoisonRecord("empty value", TORQUE_KEY, b""),
        PoisonRecord("empty key and value", b"", b""),
        PoisonRecord("binary", SPEED_KEY, bytes(range(256))),
        PoisonRecord("binary key and value", b"\x00\xff\xfe", b"\xff\xfe\x00\x80"),
        PoisonRecord("key without a dot", b"poison", b"not json"),
        PoisonRecord("list", SPEED_KEY, b"[1,2,3]"),
        PoisonRecord("string", SPEED_KEY, b'"poison"'),
        PoisonRecord("number", TORQUE_KEY, b"42"),
        PoisonRecord("null", TORQUE_KEY, b"null"),
        PoisonRecord("wrong types", SPEED_KEY, _record(thing=b"1", time=b'"yesterday"', result=b'"1.5"')),
        PoisonRecord("bool result", SPEED_KEY, _record(result=b"true")),
        PoisonRecord("NaN", SPEED_KEY, _record(result=b"NaN")),
        PoisonRecord("Infinity", TORQUE_KEY, _record(quantity=b'"vaTorque_C11"', result=b"-Infinity")),
        PoisonRecord("overflowing float", SPEED_KEY, _record(result=b"1e999")),
        PoisonRecord("time beyond 64 bits", SPEED_KEY, _record(time=b"%d" % 2 ** 70)),
        PoisonRecord("result beyond floats", TORQUE_KEY, _record(quantity=b'"vaTorque_C11"',
                                                                  result=b"1" + b"0" * 400)),
        PoisonRecord("integer of 5000 digits", SPEED_KEY, _record(result=b"9" * 5000)),
        PoisonRecord("deep nesting", SPEED_KEY, deep),
        PoisonRecord("deep nesting in a field", SPEED_KEY, _record(thing=b'{"a":' * 2000 + b"1" + b"}" * 2000)),
        PoisonRecord("lone surrogate", SPEED_KEY, _record(thing=b'"\\ud800"')),
        PoisonRecord("empty thing", SPEED_KEY, _record(thing=b'""')),
        PoisonRecord("thing over the name length", b"p" * 257 + b".actSpeed_C11",
                     _record(thing=b'"%s"' % (b"p" * 257))),
        PoisonRecord("time out of range", SPEED_KEY, _record(time=b"-1")),
        PoisonRecord("two lines", SPEED_KEY, _record() + b"\n" + _record()),
        PoisonRecord("odd headers", SPEED_KEY, b"{}", [("", b""), ("no value", None), ("\u2603", b"\x00\xff" * 500),
                                                       ("dup", b"1"), ("dup", b"2")]),
        # Control characters grow sixfold as a JSON-escaped dead letter.
        PoisonRecord("near the size limit", SPEED_KEY, b"\x01" * near_limit_bytes),
    ]
