"""The seed's test inputs, reproduced exactly (same generators, same random sequence), for tests and benchmark.

A series is a list of (time in epoch seconds, result); an ingestion order lists the side (0 = left,
1 = right) of each arriving record, each side consumed in its own order.
"""

from __future__ import annotations

import random
from typing import Iterable

from .record import Record
from .stream_buffer import StreamBuffer
from .two_stream_join import LEFT, RIGHT

SEED_START_TIME = 1600000000
Series = list[tuple[float, float]]


def alternating_runs(
    n_records: int, run_length: int, start_time: int = SEED_START_TIME, seed: int = 0
) -> tuple[Series, Series, list[int]]:
    """Runs of ``run_length`` left then right records at times start+0, start+1, ..., ingested in time order.

    The seed's one_one (run 1), five_five and five_five_many (run 5) cases.
    """
    rng = random.Random(seed)
    order = ([LEFT] * run_length + [RIGHT] * run_length) * (n_records // (2 * run_length))
    left: Series = []
    right: Series = []
    for index, side in enumerate(order):
        (right if side else left).append((start_time + index, rng.random()))
    return left, right, order


def random_walks(
    n_left: int, n_right: int, start_time: int = SEED_START_TIME, seed: int = 0
) -> tuple[Series, Series, list[int]]:
    """Two series with uniform random gaps in [0, 1) s (left first, then right), ingested in shuffled order.

    The seed's randomized, randomized_many and timeout_randomized cases.
    """
    rng = random.Random(seed)
    series: list[Series] = []
    for count in (n_left, n_right):
        t: float = start_time
        walk: Series = []
        for _ in range(count):
            t += rng.random()
            walk.append((t, rng.random()))
        series.append(walk)
    order = [LEFT] * n_left + [RIGHT] * n_right
    rng.shuffle(order)
    return series[LEFT], series[RIGHT], order


def as_records(series: Series, quantity: str) -> list[Record]:
    """The series as the seed's tests built it: ``Record(timestamp=t, quantity=..., result=v)``."""
    return [Record(timestamp=t, quantity=quantity, result=value) for t, value in series]


def replay(stream_buffer: StreamBuffer, left: Iterable[Record], right: Iterable[Record], order: Iterable[int]) -> None:
    """Ingest ``left`` and ``right`` into ``stream_buffer``, each in its order, interleaved as ``order`` says.

    Given iterators, a further call goes on where this one stopped."""
    ingest = (stream_buffer.ingest_left, stream_buffer.ingest_right)
    next_record = (iter(left).__next__, iter(right).__next__)
    for side in order:
        ingest[side](next_record[side]())
