"""The Kafka joiner's restart bound at scale: a machine quiet for the whole run, a million records of the
others in its partition, kill -9 and a restart. Prints what the restart re-read and how long it took."""
from __future__ import annotations

from pathlib import Path

import pytest

from kafka_joiner_support import joiners, restart_after_a_quiet_machine  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.integration, pytest.mark.slow]



def test_a_restart_after_a_million_records_beside_a_quiet_machine(bootstrap, new_topics, joiners,
                                                                   tmp_path: Path) -> None:
    # The engine's join of a million records is the expected output without join_reference's check: its clock rule
    # takes time quadratic in a stream's length. `make test`'s run of the same path (4,000 ticks) is checked.
    run = restart_after_a_quiet_machine(bootstrap, new_topics(), joiners, tmp_path, by_thing=True,
                                        busy_ticks=170_000, against_reference=False)
    print(f"\nrestart after {run.busy_records:,} records beside a quiet machine: re-read {run.re_read:,} input "
          f"records, restored {run.restored:,} held records from {run.changelog_read:,} changelog records, "
          f"caught up {run.restart_s:.1f} s after the process started (a restart from the oldest held record "
          f"would re-read {run.rebuild_from_oldest_held:,})")
    assert run.busy_records >= 1_000_000
    assert run.re_read <= 500
    assert run.changelog_read < run.busy_records // 100
