"""`make clean && make up` once per joiner, on a private stack (own ports and state folder): every process
comes up healthy, and a row replayed with `make data` becomes a joined record in machine.out. Prints how long
the start took and the first join's latency. `make reliability` runs ten starts per joiner."""
from __future__ import annotations

from pathlib import Path

import pytest

from startup_support import PrivateStack, assert_all_healthy

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("joiner", ["spark", "lsb"])
def test_make_up_from_nothing_runs_every_process_and_joins(joiner: str, tmp_path: Path, capsys) -> None:
    stack = PrivateStack(tmp_path / "state")
    try:
        started = stack.start_from_nothing(joiner)
        assert_all_healthy(started)
        joined = stack.first_join()
        assert joined.record["thing"] and joined.record["quantity"]
        with capsys.disabled():
            print(f"\nJOINER={joiner}: make up from nothing {started.seconds:.1f} s "
                  f"(stack up in {started.reported_seconds:.1f} s); first replayed row -> first joined record "
                  f"{joined.latency_s:.2f} s")
    finally:
        stack.down()
