"""The smoke runs' figure check (tests/benchmark_support.py): a figure that came out 0, negative, nan or inf, or a
line of figures printed fewer times than a table has rows, is named; positive finite figures pass."""
from __future__ import annotations

from benchmark_support import figure, printed_figures

RATE = figure(r"^(?:seed|ours): .*? +{rows_per_s} rows/s$", 2)


def test_positive_finite_figures_pass() -> None:
    assert printed_figures("seed: one at a time 1,234.5 rows/s\nours: batched 98,765 rows/s\n", (RATE,)) == []


def test_a_zero_a_nan_and_a_missing_row_are_each_named() -> None:
    assert printed_figures("seed: one at a time 0 rows/s\nours: batched 12 rows/s\n", (RATE,)) == [
        "rows_per_s = 0, not a positive finite number: 'seed: one at a time 0 rows/s'"]
    wrong = printed_figures("seed: one at a time nan rows/s\nours: batched 12 rows/s\n", (RATE,))
    assert wrong[0] == "not a finite number: 'seed: one at a time nan rows/s'"
    assert wrong[1].startswith("1 lines of figures, at least 2 wanted")  # nan is no number: the row is not one
    assert printed_figures("ratio: inf x\n", ()) == ["not a finite number: 'ratio: inf x'"]
    assert printed_figures("information: none lost\n", ()) == []  # a word is no figure
