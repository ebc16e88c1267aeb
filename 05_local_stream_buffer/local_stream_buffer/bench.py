"""Benchmark of the join engine: ``python -m local_stream_buffer.bench`` (what ``make bench`` runs).

Two workloads, as issue 3 asks: the seed's five_five_many shape (100k records in time order, runs of
five per stream) and 1M records of two random walks ingested in shuffled order. Each is run through the
per-record API (``StreamBuffer`` with the seed's default result dicts) and the batch path (numpy), in
one batch and in many. Inputs are built before the clock starts; each figure is the best of a few runs
(wall clock), because other processes share this machine.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .batch import join_batch
from .stream_buffer import StreamBuffer
from .workloads import Series, alternating_runs, as_records, random_walks, replay

# The seed's LocalStreamBuffer on five_five_many, measured on this machine for issue 3.
SEED_FIGURES = "seed LocalStreamBuffer, five_five_many: ~50-70k records/s, ~90-130k joins/s (1.4-2.0 s)"


@dataclass
class Measurement:
    workload: str
    path: str
    records: int
    joins: int
    seconds: float
    peak_held: int  # most records held by one side at once

    def row(self) -> str:
        return (f"{self.workload:<30} {self.path:<26} {self.records:>10,} {self.joins:>10,} {self.seconds:>8.3f} s "
                f"{self.records / self.seconds:>12,.0f} {self.joins / self.seconds:>12,.0f} {self.peak_held:>8,}")


HEADER = (f"{'workload':<30} {'path':<26} {'records':>10} {'joins':>10} {'time':>10} "
          f"{'records/s':>12} {'joins/s':>12} {'peak held':>9}")


def best_of(repeats: int, run: Callable[[], Measurement]) -> Measurement:
    return min((run() for _ in range(repeats)), key=lambda measurement: measurement.seconds)


def per_record(workload: str, left: Series, right: Series, order: list[int]) -> Measurement:
    left_records, right_records = as_records(left, "r"), as_records(right, "s")
    gc.collect()
    gc.freeze()  # the prepared inputs are not the engine's garbage: keep the collector from rescanning them
    try:
        stream_buffer = StreamBuffer()
        started = time.perf_counter()
        replay(stream_buffer, left_records, right_records, order)
        seconds = time.perf_counter() - started
    finally:
        gc.unfreeze()
    return Measurement(workload, "per-record StreamBuffer", len(order), stream_buffer.get_join_counter(), seconds,
                       stream_buffer.get_peak_buffer_size())


def batched(workload: str, left: Series, right: Series, n_batches: int) -> Measurement:
    arrays = [np.array(series, dtype=np.float64).reshape(-1, 2) for series in (left, right)]
    parts = [np.array_split(array, n_batches) for array in arrays]
    batches = [(l[:, 0].copy(), l[:, 1].copy(), r[:, 0].copy(), r[:, 1].copy()) for l, r in zip(*parts)]
    state = None
    joins = peak = 0
    started = time.perf_counter()
    for left_times, left_values, right_times, right_values in batches:
        state, pairs = join_batch(state, left_times, left_values, right_times, right_values)
        joins += pairs.count
        peak = max(peak, len(state.times[0]), len(state.times[1]))
    seconds = time.perf_counter() - started
    path = "batch, 1 batch" if n_batches == 1 else f"batch, {n_batches:,} batches"
    return Measurement(workload, path, len(left) + len(right), joins, seconds, peak)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m local_stream_buffer.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="records of the random-walk workload")
    parser.add_argument("--repeats", type=int, default=3, help="runs per figure; the best is shown")
    options = parser.parse_args(argv)

    print(f"Join engine benchmark: Python {platform.python_version()}, numpy {np.__version__}, "
          f"{os.cpu_count()} CPUs; best of {options.repeats} runs, wall clock")
    print(HEADER)
    workloads = [
        ("five_five_many (in order)", alternating_runs(100_000, 5)),
        (f"random walks (shuffled)", random_walks(options.records // 2, options.records - options.records // 2)),
    ]
    for name, (left, right, order) in workloads:
        results = [
            best_of(options.repeats, lambda: per_record(name, left, right, order)),
            best_of(options.repeats, lambda: batched(name, left, right, 1)),
            best_of(options.repeats, lambda: batched(name, left, right, 100)),
        ]
        for result in results:
            print(result.row())
        if len({result.joins for result in results}) != 1:
            raise SystemExit(f"{name}: the paths disagree on the number of joins")
    print(f"for comparison: {SEED_FIGURES}")


if __name__ == "__main__":
    main()
