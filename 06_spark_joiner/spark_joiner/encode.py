"""The output records of a bucket's pairs as Kafka keys and JSON values, built column by column.

The standalone joiner builds each output record as a dict (``local_stream_buffer.output.output_record``)
and encodes it with ``pipeline_core.records.encode_record`` (orjson). Here the same bytes come from
columns: results from the join spec's formula on arrays, numbers written by orjson as whole arrays
(one call per column, then split), the fixed parts of a key's records (thing, quantities) encoded once
per key, the case text once per case, ids from ``output.output_ids``, and the pieces joined by Arrow.
Pairs whose times the column path cannot reproduce exactly (``output.plain_times``: fractional or huge
times, rare) take the per-record path, and so do results that are not finite, which are dead-lettered.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from local_stream_buffer.batch import PairArrays
from local_stream_buffer.cases import CASE_LABELS
from local_stream_buffer.keyed_batch import JoinKey, KeyedPairs
from local_stream_buffer.output import finite_results, id_prefix, output_ids, output_records, plain_times
from local_stream_buffer.rejections import Rejection
from pipeline_core.records import dead_letter, encode_record, record_key

STAGE = "spark_joiner"
_ID_LENGTH = 36  # characters of a UUID's text
# Each case's text and what follows it up to the id, by case code.
_CASE_PIECES = pa.array([f'{label}","id":"' for label in CASE_LABELS], pa.string())


class EncodedOutputs(NamedTuple):
    """Kafka records for machine.out (keys and values, in the pairs' order) and dead letters for machine.dlq."""

    keys: pa.Array  # string
    values: pa.Array  # binary
    dead_letters: list[bytes]


def encode_outputs(keys: Sequence[JoinKey], joined: KeyedPairs, input_topic: str) -> EncodedOutputs:
    """The records of the pairs of ``joined`` (keys index ``keys``), byte for byte what the standalone joiner
    writes for the same pairs. A pair whose result is not finite becomes a dead letter with its reason."""
    pairs, key = joined.pairs, joined.key
    results = _results(keys, key, pairs)
    finite = finite_results(results)
    columnar = finite & plain_times(pairs.left_time, pairs.right_time)
    output_keys = [record_key(thing, binding.output_quantity).encode() for thing, binding in keys]
    rows = np.flatnonzero(columnar)
    values = _json_values(keys, key[rows], PairArrays(*(column[rows] for column in pairs)), results[rows])
    dead_letters: list[bytes] = []
    if len(rows) < pairs.count:  # rare: pairs with fractional or huge times, results that are not finite
        one_by_one = np.flatnonzero(~columnar)
        records = [output_records(*keys[code], PairArrays(*(column[row:row + 1] for column in pairs)))[0]
                   for code, row in zip(key[one_by_one].tolist(), one_by_one.tolist())]
        dead_letters = [dead_letter(Rejection.NOT_FINITE.reason(), None, STAGE, topic=input_topic,
                                    output=json.dumps(record, default=repr))
                        for record, is_finite in zip(records, finite[one_by_one].tolist()) if not is_finite]
        # Every finite record in the pairs' order: the column path's, then the others', put back in place.
        slow = pa.array([encode_record(record) for record, is_finite in zip(records, finite[one_by_one].tolist())
                         if is_finite], pa.binary())
        rows = np.concatenate([rows, one_by_one[finite[one_by_one]]])
        values = pa.concat_arrays([values, slow]).take(pa.array(np.argsort(rows, kind="stable")))
        rows = np.sort(rows)
    return EncodedOutputs(_per_key(output_keys, key[rows]), values, dead_letters)


def _results(keys: Sequence[JoinKey], key: np.ndarray, pairs: PairArrays) -> np.ndarray:
    """Each pair's result by its key's formula, one array operation per formula."""
    formulas = {binding.spec.formula: binding.combine_columns for _, binding in keys}
    results = np.empty(pairs.count)
    with np.errstate(all="ignore"):  # an overflow is a result that is not finite: dead-lettered, not logged
        if len(formulas) == 1:
            (combine,) = formulas.values()
            results[:] = combine(pairs.left_value, pairs.right_value)
            return results
        formula_of_key = np.array([list(formulas).index(binding.spec.formula) for _, binding in keys])
        formula = formula_of_key[key]
        for index, combine in enumerate(formulas.values()):
            mine = formula == index
            results[mine] = combine(pairs.left_value[mine], pairs.right_value[mine])
    return results


def _json_values(keys: Sequence[JoinKey], key: np.ndarray, pairs: PairArrays, results: np.ndarray) -> pa.Array:
    """The JSON of output records with plain times and finite results, in the field order of output_record.

    Eleven pieces per record, each a column: the fixed texts of its key, its numbers (each with the text
    that follows it up to the next varying part), its case and its id.
    """
    if not len(key):
        return pa.array([], pa.binary())
    heads, lefts, rights = [], [], []
    for thing, binding in keys:
        heads.append(b'{"thing":%s,"quantity":%s,"phenomenonTime":' % (orjson.dumps(thing),
                                                                       orjson.dumps(binding.output_quantity)))
        lefts.append(b'"left":{"quantity":%s,"phenomenonTime":' % orjson.dumps(binding.left_quantity))
        rights.append(b',"right":{"quantity":%s,"phenomenonTime":' % orjson.dumps(binding.right_quantity))
    mean = (pairs.left_time + pairs.right_time) / 2  # exact: plain times and their sums are exact in float64
    whole_mean = np.floor(mean) == mean
    mean_text = (_json_numbers(mean.astype(np.int64), b',"result":') if whole_mean.all() else
                 pc.if_else(pa.array(whole_mean), _json_numbers(mean.astype(np.int64), b',"result":'),
                            _json_numbers(mean, b',"result":')))
    ids = output_ids([id_prefix(thing, binding.output_quantity) for thing, binding in keys], key,
                     pairs.left_time, pairs.right_time)
    id_text = np.empty((len(key), _ID_LENGTH + 2), dtype=np.uint8)
    id_text[:, :_ID_LENGTH] = ids
    id_text[:, _ID_LENGTH:] = np.frombuffer(b'"}', dtype=np.uint8)
    return pc.binary_join_element_wise(
        _per_key(heads, key), mean_text,
        _json_numbers(results, b","),
        _per_key(lefts, key), _json_numbers(pairs.left_time.astype(np.int64), b',"result":'),
        _json_numbers(pairs.left_value, b"}"),
        _per_key(rights, key), _json_numbers(pairs.right_time.astype(np.int64), b',"result":'),
        _json_numbers(pairs.right_value, b'},"case":"'),
        _CASE_PIECES.take(pa.array(pairs.case)), _fixed_width(id_text),
        "").cast(pa.binary())


def _per_key(texts: list[bytes], key: np.ndarray) -> pa.Array:
    """``texts[key[i]]`` for every i, as an Arrow string array; ``key`` runs in ascending order (the pairs come
    per key), so each key's text is repeated as a block of bytes rather than taken row by row."""
    starts = np.flatnonzero(np.diff(key, prepend=-1))
    counts = np.diff(starts, append=len(key)).tolist()
    codes = key[starts].tolist()
    data = b"".join([texts[code] * count for code, count in zip(codes, counts)])
    lengths = np.repeat(np.array([len(texts[code]) for code in codes], dtype=np.int32), counts)
    offsets = np.zeros(len(key) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.Array.from_buffers(pa.string(), len(key), [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _json_numbers(values: np.ndarray, end: bytes) -> pa.Array:
    """Each number as orjson writes it (int64 as ints, float64 as floats), followed by ``end``.

    One orjson call for the whole array gives ``[a,b,...]``; with each comma turned into ``end`` and the
    brackets dropped, every number's text ends where the next begins: an Arrow string array from buffers.
    ``end`` must end in a byte that no number's text contains; the last of its occurrences in each
    ``end`` marks where a number's piece ends.
    """
    text = orjson.dumps(np.ascontiguousarray(values), option=orjson.OPT_SERIALIZE_NUMPY)[1:-1] + b","
    if end != b",":
        text = text.replace(b",", end)
    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    per_end = end.count(end[-1:])
    offsets[1:] = np.flatnonzero(np.frombuffer(text, dtype=np.uint8) == end[-1])[per_end - 1::per_end] + 1
    return pa.Array.from_buffers(pa.string(), len(values), [None, pa.py_buffer(offsets), pa.py_buffer(text)])


def _fixed_width(text: np.ndarray) -> pa.Array:
    """Rows of an (n, width) byte array as an Arrow string array, without a copy."""
    count, width = text.shape
    offsets = np.arange(0, (count + 1) * width, width, dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), count, [None, pa.py_buffer(offsets), pa.py_buffer(text)])
