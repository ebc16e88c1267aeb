"""Output records built column by column (the Spark job) are, byte for byte, the records the standalone
joiner builds one by one: ids, formulas, times, JSON. Fuzzed with hypothesis."""
from __future__ import annotations

import json
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from local_stream_buffer.batch import PairArrays
from local_stream_buffer.formulas import COLUMN_FORMULAS, FORMULAS
from local_stream_buffer.keyed_batch import KeyedPairs
from local_stream_buffer.output import (id_prefix, is_finite_result, output_id, output_ids, output_records,
                                        plain_times)
from local_stream_buffer.specs import JoinSpec, SpecResolver
from pipeline_core.records import encode_record, record_key
from spark_joiner.encode import encode_outputs

SPECS = [
    JoinSpec("power", "actSpeed_C{axis}", "vaTorque_C{axis}", "vaPower_C{axis}", "power", 1.0),
    JoinSpec("load", "vaLoad_C{axis}", "vaCurr_C{axis}", "loadPerCurr_C{axis}", "ratio"),
    JoinSpec("state", "turnState_C{axis}", "aaAcc_C{axis}", "turnAcc_C{axis}", "difference"),
]
finite = st.floats(allow_nan=False, allow_infinity=False)
times = st.one_of(st.integers(-2**52 + 1, 2**52 - 1).map(float), st.integers(1_500_000_000_000, 1_800_000_000_000).map(float),
                  finite, st.sampled_from([2.0**52, -0.0, 0.5, 1e-7, 1e16 + 2]))
results = st.one_of(finite, st.sampled_from([0.0, -0.0, 1e308, -1e308, 2.0, 5e-324]))
things = st.text(min_size=1, max_size=6)


@st.composite
def keyed_pairs(draw):
    resolver = SpecResolver(SPECS)
    keys = []
    for thing in draw(st.lists(things, min_size=1, max_size=4, unique=True)):
        quantity = draw(st.sampled_from(["actSpeed_C11", "vaLoad_C2", "turnState_C7"]))
        keys.append((thing, resolver.routes(quantity)[0].binding))
    n = draw(st.integers(1, 40))
    key = np.sort(np.array(draw(st.lists(st.integers(0, len(keys) - 1), min_size=n, max_size=n)), dtype=np.int64))
    column = lambda strategy: np.array(draw(st.lists(strategy, min_size=n, max_size=n)), dtype=np.float64)
    pairs = PairArrays(column(times), column(results), column(times), column(results),
                       np.array(draw(st.lists(st.integers(0, 4), min_size=n, max_size=n)), dtype=np.int8))
    return keys, KeyedPairs(key, pairs, np.zeros(0, dtype=np.int64), [])


def one_by_one(keys, joined) -> tuple[list[str], list[bytes], list[dict]]:
    """What the standalone joiner writes for the same pairs: keys and values, and the records it dead-letters."""
    out_keys, values, not_finite = [], [], []
    for row, code in enumerate(joined.key.tolist()):
        thing, binding = keys[code]
        (record,) = output_records(thing, binding, PairArrays(*(column[row:row + 1] for column in joined.pairs)))
        if is_finite_result(record):
            out_keys.append(record_key(thing, binding.output_quantity))
            values.append(encode_record(record))
        else:
            not_finite.append(record)
    return out_keys, values, not_finite


@settings(max_examples=300, deadline=None)
@given(keyed_pairs())
def test_columns_encode_what_the_per_record_path_encodes(case) -> None:
    keys, joined = case
    out_keys, values, not_finite = one_by_one(keys, joined)
    encoded = encode_outputs(keys, joined, "machine.data")
    assert encoded.values.to_pylist() == values
    assert encoded.keys.to_pylist() == out_keys
    letters = [json.loads(letter) for letter in encoded.dead_letters]
    assert [letter["reason"] for letter in letters] == ["join result is not a finite number"] * len(not_finite)
    assert [letter["output"] for letter in letters] == [json.dumps(record, default=repr) for record in not_finite]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-2**52 + 1, 2**52 - 1), st.integers(-2**52 + 1, 2**52 - 1)), min_size=1,
                max_size=30), things)
def test_column_ids_are_the_output_ids(times, thing) -> None:
    left, right = (np.array(side, dtype=np.float64) for side in zip(*times))
    assert plain_times(left, right).all()
    ids = output_ids([id_prefix(thing, "vaPower_C11")], np.zeros(len(left), dtype=np.int64), left, right)
    assert [bytes(row).decode() for row in ids] == [output_id(thing, "vaPower_C11", int(l), int(r)) for l, r in times]


def test_plain_times_are_whole_and_exact() -> None:
    left = np.array([1.0, 1.5, 2.0**52, -3.0, 4.0])
    right = np.array([2.0, 2.0, 1.0, -4.0, math.nan])
    assert plain_times(left, right).tolist() == [True, False, False, True, False]


@given(st.lists(st.tuples(finite, st.one_of(finite, st.just(0.0), st.just(-0.0))), min_size=1, max_size=20))
def test_column_formulas_are_the_scalar_formulas(operands) -> None:
    left, right = (np.array(side, dtype=np.float64) for side in zip(*operands))
    for name, formula in FORMULAS.items():
        with np.errstate(all="ignore"):
            columns = COLUMN_FORMULAS[name](left, right)
        scalars = np.array([formula(l, r) for l, r in operands], dtype=np.float64)
        assert np.array_equal(columns, scalars, equal_nan=True), name
