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
"""

from __future__ import annotations

import uuid
from typing import Any

from .batch import PairArrays
from .cases import CASE_LABELS
from .specs import SpecBinding

# Fixed forever: changing it changes every output id.
OUTPUT_ID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "machine-data-pipeline/local_stream_buffer/output")


def canonical_time(t: float) -> int | float:
    """An epoch-ms time as int when it is a whole number, else as float."""
    return int(t) if float(t).is_integer() else float(t)


def output_id(thing: str, output_quantity: str, left_time: float, right_time: float) -> str:
    """The deterministic id of the output record of a pair."""
    name = f"{thing}/{output_quantity}/{canonical_time(left_time)}/{canonical_time(right_time)}"
    return str(uuid.uuid5(OUTPUT_ID_NAMESPACE, name))


def output_record(
    thing: str, binding: SpecBinding, case: int, left_time: float, left_value: float,
    right_time: float, right_value: float,
) -> dict[str, Any]:
    """The output record of one pair (times in epoch ms, case a JoinCase code)."""
    left_time = canonical_time(left_time)
    right_time = canonical_time(right_time)
    return {
        "thing": thing,
        "quantity": binding.output_quantity,
        "phenomenonTime": canonical_time((left_time + right_time) / 2),
        "result": float(binding.combine(left_value, right_value)),
        "left": {"quantity": binding.left_quantity, "phenomenonTime": left_time, "result": left_value},
        "right": {"quantity": binding.right_quantity, "phenomenonTime": right_time, "result": right_value},
        "case": CASE_LABELS[case],
        "id": output_id(thing, binding.output_quantity, left_time, right_time),
    }


def output_records(thing: str, binding: SpecBinding, pairs: PairArrays) -> list[dict[str, Any]]:
    """The output records of the batch path's pair arrays: equal, record for record, to the keyed joiner's."""
    return [
        output_record(thing, binding, case, left_time, left_value, right_time, right_value)
        for left_time, left_value, right_time, right_value, case in zip(
            pairs.left_time.tolist(), pairs.left_value.tolist(),
            pairs.right_time.tolist(), pairs.right_value.tolist(), pairs.case.tolist(),
        )
    ]
