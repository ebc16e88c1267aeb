"""Bounded disorder and the Spark job's checkpoint: the shipped events replayed with up to 2 s of disorder, the
job killed (kill -9, its whole process group) midway through them and restarted from its checkpoint, whose
state store alone holds the reorder buffers: still exactly the 2,748 records of the in-order join, no dead
letter. Two Spark starts on a shared machine take minutes, hence `make reliability`."""
from __future__ import annotations

import pytest

from connector_support import connector  # noqa: F401
from disorder_support import check_displaced, replay, spark_joins_the_disordered_replay

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]


def test_spark_joiner_killed_midway_keeps_its_reorder_buffers(connector, bootstrap, new_topics,  # noqa: F811
                                                              tmp_path) -> None:
    bridge = connector()
    replay(bridge, tmp_path)
    check_displaced(bootstrap, bridge)
    spark_joins_the_disordered_replay(bridge, bootstrap, new_topics(), tmp_path, kill_midway=True)
