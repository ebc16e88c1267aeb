"""What the rolling restart reads without a cluster: DescribeQuorum.java's lines, when a restarted node is back in
the quorum, and how the cluster's sync is said. The restart itself, under a replay on the cluster and across hosts,
is tests/reliability/test_rolling_restart.py's; on the single stack it is refused."""
from __future__ import annotations

import pytest

from stack import rolling
from stack.processes import StackError
from stack.rolling import ClusterSync, Quorum, Replica, parse_quorum

LINES = """leader 2 7 1500
voter 1 1490 1800000009000 1800000008000
voter 2 1500 1800000010000 1800000010000
voter 3 900 1800000001000 1799999990000
observer 4 1500 -1 -1
"""


def test_the_quorum_is_read_from_the_program_s_lines() -> None:
    quorum = parse_quorum("SLF4J: a line of the client's logging\n" + LINES)
    assert (quorum.leader, quorum.epoch, quorum.high_watermark) == (2, 7, 1500)
    assert quorum.replicas[0] == Replica(1, "voter", 1490, 1_800_000_009_000, 1_800_000_008_000)
    assert quorum.replicas[-1] == Replica(4, "observer", 1500, -1, -1)
    with pytest.raises(StackError, match="no leader"):
        parse_quorum("voter 1 1 1 1\n")


def test_a_restarted_node_is_back_once_it_fetched_and_caught_up_since_its_start() -> None:
    quorum = parse_quorum(LINES)
    assert quorum.caught_up_since(1, 1_800_000_005_000)
    assert not quorum.caught_up_since(1, 1_800_000_008_500)  # it fetched since, but caught up before
    assert not quorum.caught_up_since(3, 1_800_000_000_000)  # fetching, ten seconds behind
    assert quorum.caught_up_since(2, 1_900_000_000_000)  # the leader is the quorum
    assert not quorum.caught_up_since(4, 0)  # an observer is no voter


def test_a_voter_seconds_behind_the_leader_is_lagging() -> None:
    assert parse_quorum(LINES).lagging() == [3]
    assert Quorum(1, 1, 10, [Replica(1, "voter", 10, 5_000, 5_000), Replica(2, "voter", 10, 4_000, 3_000)]).lagging() == []


def test_the_cluster_s_sync_says_what_is_missing() -> None:
    assert ClusterSync(111, [], [], {1, 2, 3}).describe() == "every ISR complete on 111 partitions"
    behind = ClusterSync(111, ["machine.data/0", "machine.out/2"], ["__consumer_offsets/7"], {1, 2})
    assert not behind.in_sync
    assert behind.describe() == ("2 of 111 partitions under-replicated, 1 without a leader (e.g. __consumer_offsets/7, "
                                 "machine.data/0, machine.out/2)")


def test_the_single_stack_is_refused(monkeypatch) -> None:
    monkeypatch.setenv("TOPOLOGY", "single")
    with pytest.raises(StackError, match="make restart SERVICE=kafka"):
        rolling.rolling_restart([], lambda service: None, print)
