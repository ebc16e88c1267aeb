"""Output records of a keyed join, built the same way by the standalone joiner and the Spark job.

An output record is a plain dict::

    {"thing": "R0815", "quantity": "vaPower_C11", "phenomenonTime": 1554096460415.5, "result": 84.7,
     "left": {"quantity": "actSpeed_C11", "phenomenonTime": 1554096460415, "result": 288.2},
     "right": {"quantity": "vaTorque_C11", "phenomenonTime": 1554096460416, "result": 2.81},
     "case": "left_successor", "id": "6f1c...-..."}

Times are epoch ms; the output time is the mean of both input times (as the seed's join function did).
Times that are whole numbers are ints, so a record is identical whether its times came as ints (Kafka
JSON) or as float64 (Spark arrays). The id is a UUID5 over thing, output quantity and both input times,
the same on every replay.

Records are built one by one (:func:`output_builder`, the standalone joiner's path) or column by column
for many pairs at once (:func:`output_ids`, :func:`plain_times`, :func:`finite_results`, the Spark job's
path): the same definitions, checked against each other by the tests.
"""

from __future__ import annotations

import hashlib
import math
import uuid
from collections.abc import Sequence
from typing import Any, Callable

import numpy as np

from .batch import PairArrays
from .cases import CASE_LABELS
from .specs import SpecBinding

# Fixed forever: changing it changes every output id.
OUTPUT_ID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "machine-data-pipeline/local_stream_buffer/output")

# uuid.uuid5 spelled out (SHA-1 of namespace and name, version and variant bits set), for the hot path:
# building a UUID object and formatting it costs three times the hash. Equal to str(uuid5(...)).
_ID_HASH = hashlib.sha1(OUTPUT_ID_NAMESPACE.bytes)
_VARIANT_DIGIT = "89ab" * 4  # RFC 4122 variant: the top two bits of the 17th hex digit are 10


def canonical_time(t: float) -> int | float:
    """An epoch-ms time as int when it is a whole number, else as float."""
    if type(t) is int:
        return t
    return int(t) if float(t).is_integer() else float(t)


def _uuid5(name: str) -> str:
    digest = _ID_HASH.copy()
    digest.update(name.encode())
    x = digest.hexdigest()
    return f"{x[:8]}-{x[8:12]}-5{x[13:16]}-{_VARIANT_DIGIT[int(x[16], 16)]}{x[17:20]}-{x[20:32]}"


def id_prefix(thing: str, output_quantity: str) -> str:
    """What the id's name of every pair of one key starts with; the two times follow, "/"-separated."""
    return f"{thing}/{output_quantity}/"


def output_id(thing: str, output_quantity: str, left_time: float, right_time: float) -> str:
    """The deterministic id of the output record of a pair: UUID5 in OUTPUT_ID_NAMESPACE of
    "thing/output quantity/left time/right time"."""
    return _uuid5(f"{id_prefix(thing, output_quantity)}{canonical_time(left_time)}/{canonical_time(right_time)}")


# The column path's times: whole epoch ms below this magnitude are exact in float64, and so are their sums.
_PLAIN_TIME_LIMIT = 2.0 ** 52
_DIGEST = type(_ID_HASH).digest
_HEX_DIGITS = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_ID_DASHES = [8, 13, 18, 23]
_ID_HEX_POSITIONS = [position for position in range(36) if position not in _ID_DASHES]


def plain_times(left_time: np.ndarray, right_time: np.ndarray) -> np.ndarray:
    """bool per pair: both times are whole epoch ms below 2**52. For these pairs float64 arithmetic gives
    exactly what the per-record path computes with ints (times, their mean, the id's name), so their
    records can be built column by column; any other pair takes :func:`output_record`."""
    return ((np.abs(left_time) < _PLAIN_TIME_LIMIT) & (np.abs(right_time) < _PLAIN_TIME_LIMIT)
            & (np.floor(left_time) == left_time) & (np.floor(right_time) == right_time))


def output_ids(id_prefixes: Sequence[str], key: np.ndarray, left_time: np.ndarray, right_time: np.ndarray) -> np.ndarray:
    """:func:`output_id` of many pairs with :func:`plain_times`, as an (n, 36) array of ASCII bytes.

    ``key`` indexes ``id_prefixes`` (see :func:`id_prefix`) per pair. The names are formatted in one
    comprehension and hashed by one C call each (neither numpy nor Arrow has SHA-1); the UUID text is
    laid out column by column.
    """
    named = [OUTPUT_ID_NAMESPACE.bytes + prefix.encode() for prefix in id_prefixes]
    names = [b"%s%d/%d" % name for name in zip(map(named.__getitem__, key.tolist()), left_time.astype(np.int64).tolist(),
                                                right_time.astype(np.int64).tolist())]
    digests = b"".join(map(_DIGEST, map(hashlib.sha1, names)))
    octets = np.frombuffer(digests, dtype=np.uint8).reshape(-1, 20)[:, :16].copy()
    octets[:, 6] = (octets[:, 6] & 0x0F) | 0x50  # version 5
    octets[:, 8] = (octets[:, 8] & 0x3F) | 0x80  # RFC 4122 variant
    digits = np.empty((len(octets), 32), dtype=np.uint8)
    digits[:, 0::2] = octets >> 4
    digits[:, 1::2] = octets & 0x0F
    text = np.empty((len(octets), 36), dtype=np.uint8)
    text[:, _ID_HEX_POSITIONS] = _HEX_DIGITS[digits]
    text[:, _ID_DASHES] = ord("-")
    return text


def finite_results(results: np.ndarray) -> np.ndarray:
    """:func:`is_finite_result` of many results at once."""
    return np.isfinite(results)


OutputBuilder = Callable[[int, float, float, float, float], dict[str, Any]]


def output_builder(thing: str, binding: SpecBinding) -> OutputBuilder:
    """``build(case, left_time, left_value, right_time, right_value)``: the output records of one key's pairs.

    What is fixed per key (quantities, formula, the id's name prefix) is bound once: the keyed joiner
    builds one record per join on its hot path.
    """
    output_quantity = binding.output_quantity
    left_quantity = binding.left_quantity
    right_quantity = binding.right_quantity
    combine = binding.combine
    name_prefix = id_prefix(thing, output_quantity)
    labels = CASE_LABELS

    def build(case: int, left_time: float, left_value: float, right_time: float,
              right_value: float) -> dict[str, Any]:
        if type(left_time) is not int:
            left_time = canonical_time(left_time)
        if type(right_time) is not int:
            right_time = canonical_time(right_time)
        mean = (left_time + right_time) / 2
        return {
            "thing": thing,
            "quantity": output_quantity,
            "phenomenonTime": int(mean) if mean.is_integer() else mean,
            "result": float(combine(left_value, right_value)),
            "left": {"quantity": left_quantity, "phenomenonTime": left_time, "result": left_value},
            "right": {"quantity": right_quantity, "phenomenonTime": right_time, "result": right_value},
            "case": labels[case],
            "id": _uuid5(f"{name_prefix}{left_time}/{right_time}"),
        }

    return build


def is_finite_result(output: dict[str, Any]) -> bool:
    """The join's verdict on an output record: it may go out only with a finite result. Any other (a formula
    overflowing, say) is dead-lettered by the adapters, with ``Rejection.NOT_FINITE``."""
    return math.isfinite(output["result"])


def output_record(
    thing: str, binding: SpecBinding, case: int, left_time: float, left_value: float,
    right_time: float, right_value: float,
) -> dict[str, Any]:
    """The output record of one pair (times in epoch ms, case a JoinCase code)."""
    return output_builder(thing, binding)(case, left_time, left_value, right_time, right_value)


def output_records(thing: str, binding: SpecBinding, pairs: PairArrays) -> list[dict[str, Any]]:
    """The output records of the batch path's pair arrays: equal, record for record, to the keyed joiner's."""
    build = output_builder(thing, binding)
    return [
        build(case, left_time, left_value, right_time, right_value)
        for left_time, left_value, right_time, right_value, case in zip(
            pairs.left_time.tolist(), pairs.left_value.tolist(),
            pairs.right_time.tolist(), pairs.right_value.tolist(), pairs.case.tolist(),
        )
    ]
