"""Ten starts from nothing per joiner (`make clean && make up`), each on the same private stack (own ports and
state folder): every process up and healthy each time, and each time a row replayed with `make data` becomes
a joined record. Prints each start's time and first-join latency, and a summary per joiner."""
from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from startup_support import PrivateStack, StartResult, assert_all_healthy

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STARTS = 10
# Ten starts of the Spark joiner's stack, each up to a few minutes on two busy cores: past the suite's 900 s.
TEN_STARTS_TIMEOUT_S = 3600


@pytest.mark.timeout(TEN_STARTS_TIMEOUT_S)
@pytest.mark.parametrize("joiner", ["spark", "lsb"])
def test_ten_starts_from_nothing(joiner: str, tmp_path: Path, capsys) -> None:
    stack = PrivateStack(tmp_path / "state")
    starts: list[StartResult] = []
    latencies: list[float] = []
    try:
        for attempt in range(1, STARTS + 1):
            started = stack.start_from_nothing(joiner)
            assert_all_healthy(started)
            joined = stack.first_join()
            assert joined.record["thing"] and joined.record["quantity"]
            starts.append(started)
            latencies.append(joined.latency_s)
            with capsys.disabled():
                print(f"\nJOINER={joiner} start {attempt}/{STARTS}: make up {started.seconds:.1f} s "
                      f"(stack up in {started.reported_seconds:.1f} s), first join {joined.latency_s:.2f} s")
    finally:
        stack.down()
    seconds = [start.seconds for start in starts]
    with capsys.disabled():
        print(f"\nJOINER={joiner}: {len(starts)}/{STARTS} starts from nothing healthy; make up "
              f"{min(seconds):.1f}-{max(seconds):.1f} s (median {statistics.median(seconds):.1f}); first join "
              f"{min(latencies):.2f}-{max(latencies):.2f} s (median {statistics.median(latencies):.2f})")
