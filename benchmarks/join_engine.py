"""Benchmark of the join engine: ``python -m benchmarks.join_engine`` (what ``make bench`` runs).

Two workloads, as issue 3 asks: the seed's five_five_many shape (100k records in time order, runs of
five per stream) and 1M records of two random walks ingested in shuffled order. Each runs through the
per-record API (``StreamBuffer`` with the seed's default result dicts, fetched as a stream's consumer does
and, as the seed's tests did, once at the end) and the batch path (numpy), in one batch and in 100. Inputs
are built before the clock starts. Each figure is the best of a few runs, as wall-clock and as CPU time of
this process: on a machine shared with other work the CPU figure is the engine's own speed, the wall
figure what this run got.
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

from local_stream_buffer.batch import join_batch
from local_stream_buffer.record import Record
from local_stream_buffer.stream_buffer import StreamBuffer
from local_stream_buffer.workloads import Series, alternating_runs, as_records, random_walks, replay

from benchmarks.results import Results, Target, at_least, cpu_ticks, steal_share

# A streaming user takes the results as they come; the seed's tests kept all of them until the end, which
# makes the run pay for growing the process by every result dict (page faults, ~0.3-0.5 µs per record).
STREAMED_FETCH_EVERY = 1_000
# Records/s of CPU time: the per-record API several times the seed's ~50-70k, the batch path what Spark needs.
TARGETS: dict[str, Target] = {"per-record, streamed": at_least(300_000), "batch path, 100 batches": at_least(5_000_000)}


@dataclass
class Measurement:
    path: str
    records: int
    joins: int
    wall: float  # seconds, best run
    cpu: float  # seconds of this process's CPU time, best run
    peak_held: int  # most records held by one side at once
    steal: float | None  # share of the machine's CPU time the host took (steal) during the best run

    def row(self) -> str:
        return (f"  {self.path:<24} {self.records:>10,} {self.joins:>10,} {self.wall:>7.3f} {self.cpu:>7.3f} "
                f"{self.records / self.cpu:>12,.0f} {self.joins / self.cpu:>12,.0f} {self.records / self.wall:>12,.0f} "
                f"{self.peak_held:>6,} {'-' if self.steal is None else f'{self.steal:.0%}':>6}")


HEADER = (f"  {'path':<24} {'records':>10} {'joins':>10} {'wall s':>7} {'cpu s':>7} "
          f"{'records/s':>12} {'joins/s':>12} {'records/s':>12} {'peak':>6} {'host':>6}\n"
          f"  {'':<24} {'':>10} {'':>10} {'':>7} {'':>7} {'(cpu)':>12} {'(cpu)':>12} {'(wall)':>12} {'held':>6} {'steal':>6}")


def timed(run: Callable[[], tuple[int, int]]) -> tuple[float, float, int, int, float | None]:
    """(wall s, cpu s, joins, peak held, host steal share) of one run."""
    gc.collect()
    ticks = cpu_ticks()
    wall, cpu = time.perf_counter(), time.process_time()
    joins, peak = run()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return wall, cpu, joins, peak, steal_share(ticks, cpu_ticks())


def best_of(repeats: int, path: str, records: int, run: Callable[[], tuple[int, int]]) -> Measurement:
    runs = [timed(run) for _ in range(repeats)]
    best = min(runs, key=lambda r: r[1])
    return Measurement(path, records, runs[0][2], min(r[0] for r in runs), best[1], max(r[3] for r in runs), best[4])


def per_record(left: list[Record], right: list[Record], order: list[int], fetch_every: int | None
               ) -> Callable[[], tuple[int, int]]:
    """The seed's default result dicts, fetched every `fetch_every` records (None: once, at the end)."""
    def run() -> tuple[int, int]:
        stream_buffer = StreamBuffer()
        chunk = fetch_every or len(order)
        # Iterators, so that each chunk's replay goes on where the previous one stopped.
        left_records, right_records = iter(left), iter(right)
        joins = 0
        for start in range(0, len(order), chunk):
            replay(stream_buffer, left_records, right_records, order[start:start + chunk])
            joins += len(stream_buffer.fetch_results())
        return joins, stream_buffer.get_peak_buffer_size()

    return run


def batched(left: Series, right: Series, n_batches: int) -> Callable[[], tuple[int, int]]:
    parts = [np.array_split(np.array(series, dtype=np.float64).reshape(-1, 2), n_batches) for series in (left, right)]
    batches = [(l[:, 0].copy(), l[:, 1].copy(), r[:, 0].copy(), r[:, 1].copy()) for l, r in zip(*parts)]

    def run() -> tuple[int, int]:
        state = None
        joins = peak = 0
        for left_times, left_values, right_times, right_values in batches:
            state, pairs = join_batch(state, left_times, left_values, right_times, right_values)
            joins += pairs.count
            peak = max(peak, len(state.times[0]), len(state.times[1]))
        return joins, peak

    return run


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.join_engine", description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="records of the random-walk workload")
    # A smoke run (tests/integration/test_benchmark_smoke.py) takes both workloads through every path, small.
    parser.add_argument("--five-five-records", type=int, default=100_000,
                        help="records of the five_five_many workload")
    options = parser.parse_args(argv)
    results = Results("join_engine", argv)

    print(f"Join engine benchmark: Python {platform.python_version()}, numpy {np.__version__}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.2f}")
    # (name, its name in the results, inputs, runs per figure): the best of several runs, so that one busy moment of
    # the shared machine does not make the figure; short runs are repeated more, such a moment skews them most.
    workloads = [
        (f"five_five_many: {options.five_five_records:,} records in time order, runs of 5",
         "five_five_many", alternating_runs(options.five_five_records, 5), 5),
        (f"random walks: {options.records:,} records, shuffled arrival", "random walks",
         random_walks(options.records // 2, options.records - options.records // 2), 3),
    ]
    for name, short_name, (left, right, order), repeats in workloads:
        print(f"\n{name} (best of {repeats} runs)\n{HEADER}")
        records = len(order)
        left_records, right_records = as_records(left, "r"), as_records(right, "s")
        measurements = [
            best_of(repeats, "per-record, streamed", records,
                    per_record(left_records, right_records, order, STREAMED_FETCH_EVERY)),
            best_of(repeats, "per-record, kept to end", records, per_record(left_records, right_records, order, None)),
            best_of(repeats, "batch path, 1 batch", records, batched(left, right, 1)),
            best_of(repeats, "batch path, 100 batches", records, batched(left, right, 100)),
        ]
        for measured in measurements:
            print(measured.row())
            results.add(f"{short_name}, {measured.path}", measured.records / measured.cpu, "records/s of CPU time",
                        TARGETS.get(measured.path))
        if len({measured.joins for measured in measurements}) != 1:
            raise SystemExit(f"{name}: the paths disagree on the number of joins")
    print(f"\nper-record: StreamBuffer with the seed's default result dicts, fetched every {STREAMED_FETCH_EVERY:,} records "
          "(streamed)\nor all at the end as the seed's tests did (kept to end: the process grows by every result)\n"
          "peak held: most records one side held at once (per-record) or after a batch (batch path); host steal:\n"
          "share of the machine's CPU time the virtual machine's host took during the best run (it slows every figure)")
    results.write()


if __name__ == "__main__":
    main()
